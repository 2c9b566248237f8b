"""The tuner side of the netns tests: a small tuning run through the farm, run inside the service namespace.

    python tests/netns_tuner.py --tracker HOST:PORT --key KEY --db sqlite:///FILE [--trials N] [--batch B] ...

A process of its own because the tuner must live in the tracker's namespace (gRPC opens its
sockets on threads of its own, so this pytest process could not lend it a namespace). It is the
same `tune()` a `tunefarm tune --tracker` runs, with the measure options the tests need (short
or deliberately slow requests, one thread per kernel on this 2-core machine) and without the
end-of-run re-timing, so every request the tracker sees is one trial. It prints `contact` once
the tracker answered and exits 0 when the run is done; a refused run (token, certificate) exits 1
with the runner's message on stderr, as the CLI does.
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tracker", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--db", required=True)
    p.add_argument("--token", default=None)
    p.add_argument("--tls-ca", default=None)
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--size", type=int, default=32, help="M = N = K of the matmul")
    p.add_argument("--min-repeat-ms", type=float, default=1.0, help="how long each request takes, about")
    p.add_argument("--result-timeout", type=float, default=150.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("tunefarm").setLevel(logging.INFO)

    from tuner.measure import BuilderPool, FarmError, MeasureOptions, RPCRunner
    from tuner.records import open_store
    from tuner.tune import tune
    from tuner.workload import Task, Workload

    task = Task.create(Workload("matmul", dict(M=args.size, N=args.size, K=args.size)), device_key=args.key)
    store = open_store(args.db)
    options = MeasureOptions(number=1, repeat=2, min_repeat_ms=args.min_repeat_ms, num_threads=1, timeout=20.0)
    runner = RPCRunner(args.tracker, args.key, token=args.token, tls_ca=args.tls_ca, options=options,
                       result_timeout=args.result_timeout, connect_timeout=20.0)
    try:
        runner._first_contact()
        print("contact", flush=True)
        with BuilderPool(n_workers=1, timeout=60) as builder:
            res = tune(task, store, space="sketch", strategy="random", trials=args.trials, batch_size=args.batch,
                       builder=builder, runner=runner, top_k=0, baseline=False)
    except FarmError as e:
        print(f"netns_tuner: error: {e}", file=sys.stderr)
        return 1
    finally:
        runner.close()
        store.close()
    print(f"done: {res.trials} trials", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
