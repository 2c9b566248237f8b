"""The records store at scale, without the API: bulk import, streamed export and every read the
tuner and the API make, at `--records` records (1 000 000) against a `--reference` store (10 000)
in the same run, on PostgreSQL (a fresh database, dropped at the end) or on the embedded SQLite
file (`--db sqlite`: a single user's default store).

Each store is filled the way `tunefarm records import` fills it, from the JSON-lines file
bench/service_load.py writes (matmul workloads of 8000 records each, real template-space
candidates, synthetic costs); its export goes to /dev/null through the same code as `tunefarm
records export`. Reads, one client, `--repeats` times each: the newest records page, one
workload's, a deep keyset page, a workload's fastest first, best, the best of every task, the
workload listing, and what a resumed tuning run reads (its task's sample and fingerprints).
Prints a table (median ms per read at both sizes, their ratio) and, last, one JSON object:
import and export seconds and microseconds per record, peak RSS of the export, per read the
median and slowest ms at the big store and the ratio of medians.

    .venv/bin/python bench/records_scale.py [--records 1000000] [--reference 10000] [--db postgresql|sqlite]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from service_load import PG_SERVER, write_seed_file  # noqa: E402 - the bench's own helpers


def reads(store, tasks: list) -> dict:
    """The reads timed: {name: () -> anything}."""
    from tuner.workload import Task, Workload
    key, target = tasks[len(tasks) // 2]
    workload = next(w for w in store.list_workloads(limit=500) if w["key"] == key)
    task = Task(Workload(workload["name"], workload["params"]), target, "local")
    oldest = store.records_sorted("oldest", limit=1)[0].id
    deep = oldest + store.count() // 10
    return {
        "records page, newest": lambda: store.records_page(limit=50),
        "records page, one workload": lambda: store.records_page(workload_key=key, limit=50),
        "records page, deep cursor": lambda: store.records_page(before_id=deep, limit=50),
        "fastest of a workload": lambda: store.records_sorted("fastest", workload_key=key, limit=50),
        "best": lambda: store.best(key, target, k=5),
        "best of every task (50)": lambda: store.best_per_task(limit=50),
        "workloads listing": lambda: store.list_workloads(limit=50),
        "count": lambda: store.count(),
        "a resumed run's sample": lambda: store.task_sample(task),
        "a resumed run's fingerprints": lambda: store.measured_fingerprints(task),
    }


def one_store(n: int, kind: str, tmp: str, repeats: int) -> dict:
    from tuner.records import open_store
    seed = os.path.join(tmp, f"seed{n}.jsonl")
    tasks = write_seed_file(seed, n)
    admin = name = None
    if kind == "sqlite":
        url = f"sqlite:///{os.path.join(tmp, f'records{n}.db')}"
    else:
        import psycopg
        name = f"tunefarm_scale_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        admin = psycopg.connect(f"{PG_SERVER}/test", autocommit=True)
        admin.execute(f'CREATE DATABASE "{name}"')
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    try:
        store = open_store(url, upgrade=True)
        t0 = time.perf_counter()
        with open(seed) as f:
            added = store.import_jsonl(f)
        import_s = time.perf_counter() - t0
        os.remove(seed)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        with open(os.devnull, "w") as f:
            exported = store.export_jsonl(f)
        export_s = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        times = {}
        for name_, read in reads(store, tasks).items():
            read()                                      # the first call fills the store's caches
            ms = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                read()
                ms.append((time.perf_counter() - t0) * 1e3)
            times[name_] = ms
        store.close()
        print(f"{kind} {n:,} records: import {import_s:.1f} s, export {export_s:.1f} s", flush=True)
        return {"added": added, "exported": exported, "import_s": import_s, "export_s": export_s,
                "peak_rss_mb": max(rss, rss0) / 1024, "reads": times}
    finally:
        if admin is not None:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--reference", type=int, default=10_000)
    ap.add_argument("--db", choices=("postgresql", "sqlite"), default="postgresql")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        ref = one_store(args.reference, args.db, tmp, args.repeats)
        big = one_store(args.records, args.db, tmp, args.repeats)
    assert big["added"] == big["exported"] == args.records, (big["added"], big["exported"])

    print(f"\n{args.db}: median ms of {args.repeats} reads (one client)")
    print(f"{'read':30s} {args.reference:>10,} {args.records:>12,}   slowest   ratio")
    figures = {}
    for name, ms in big["reads"].items():
        r, b = statistics.median(ref["reads"][name]), statistics.median(ms)
        figures[name] = {"median_ms": round(b, 2), "max_ms": round(max(ms), 2), "reference_median_ms": round(r, 2),
                         "ratio": round(b / r, 2) if r > 0 else None}
        print(f"{name:30s} {r:10.2f} {b:12.2f} {max(ms):9.2f} {b / r:7.2f}")
    per = {k: round(big[f"{k}_s"] / args.records * 1e6, 1) for k in ("import", "export")}
    print(f"import {big['import_s']:.1f} s ({per['import']} us a record; reference {ref['import_s']:.2f} s), "
          f"export {big['export_s']:.1f} s ({per['export']} us a record), peak RSS {big['peak_rss_mb']:.0f} MB")
    print(json.dumps({"db": args.db, "records": args.records, "reference_records": args.reference,
                      "import_seconds": round(big["import_s"], 1), "export_seconds": round(big["export_s"], 1),
                      "import_us_per_record": per["import"], "export_us_per_record": per["export"],
                      "reference_import_us_per_record": round(ref["import_s"] / args.reference * 1e6, 1),
                      "peak_rss_mb": round(big["peak_rss_mb"]), "reads": figures,
                      "max_read_ms": max(f["max_ms"] for f in figures.values())}))


if __name__ == "__main__":
    main()
