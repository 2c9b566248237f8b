"""`tunefarm model export MODEL.onnx --out DIR`: the model as one shared library with a C header.

Builds the model like `tunefarm model run` (best records of the target, else default schedules;
`--no-records` for the defaults only) and writes DIR/libNAME.so and DIR/NAME.h
(compiler.graph.export_model): NAME_create / NAME_run / NAME_destroy run the whole model from C,
the weights embedded in the library. NAME defaults to the model file's name. A bad model, an
unwritable directory or a failed link is one error line and nothing is left behind.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from .common import EXIT_OK, UsageError, load_graph, open_store, resolve_target


def cmd_export(args) -> int:
    from compiler.errors import ExportError
    from compiler.graph import GraphError, build_model, export_model
    from compiler.graph.export_model import c_identifier

    target = resolve_target(args.target)
    graph = load_graph(args.model, args.input_shape, args.dim)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {args.out}: cannot create the directory: {e.strerror or e}") from None
    name = c_identifier(args.name or Path(args.model).name.split(".")[0])
    provider = None
    if not args.no_records:
        from ..apply_best import ApplyHistoryBest
        provider = ApplyHistoryBest(open_store(args.db))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # "no tuned schedule": counted below instead
            module = build_model(graph, target, records=provider)
        done = export_model(module, out / f"lib{name}.so", out / f"{name}.h", name=name, cc=args.cc)
    except (GraphError, ExportError) as e:
        raise UsageError(str(e)) from None
    tuned = sum(1 for src in module.sources.values() if src == "records")
    print(f"wrote {done.library} and {done.header}: {name}_create / {name}_run / {name}_destroy run "
          f"{len(module.steps)} kernels ({tuned} of {len(module.sources)} workloads from records), "
          f"weights {done.weight_bytes / 1e6:.2f} MB embedded, buffers {done.arena_bytes / 1e6:.2f} MB")
    print(f"compile against it: cc prog.c -I{out} -L{out} -l{name} -Wl,-rpath,{out.resolve()}")
    return EXIT_OK


def register(msub, common) -> None:
    q = msub.add_parser("export", help="write the model as a shared library with a C header",
                        description="Compile the model (best records, else default schedules) and write "
                                    "DIR/libNAME.so and DIR/NAME.h whose NAME_create / NAME_run / "
                                    "NAME_destroy run the whole model from C (weights embedded).")
    common(q)
    q.add_argument("--out", required=True, metavar="DIR", help="directory to write into (created if need be)")
    q.add_argument("--name", default=None, help="C prefix and library name (default: the model file's name)")
    q.add_argument("--target", default=None, help="target string (default: host)")
    q.add_argument("--db", default=None, help="records database URL (default: $TUNEFARM_DB_URL or "
                                              "sqlite:///~/.tunefarm/records.db)")
    q.add_argument("--no-records", action="store_true", help="default schedules only")
    q.add_argument("--cc", default="cc", help="C compiler that links the library (a cross compiler for "
                                              "another target)")
    q.set_defaults(func=cmd_export)


__all__ = ["register", "cmd_export"]
