"""`tunefarm tracker`, `tunefarm farm status` (and `tunefarm agent`): the farm's command line.

Everything is imported inside the command functions: on a device agent's install (numpy,
llvmlite, grpcio, protobuf and nothing of the tuner's heavy dependencies) `tunefarm agent` and
`tunefarm farm status` must work, and registering these subcommands must not import grpc at all
for the commands that do not need it.
"""

from __future__ import annotations

import os
import sys


def cmd_tracker(args) -> int:
    from rpc_tracker.daemon import serve
    return serve(args)


def cmd_agent(args) -> int:
    from device_agent.cli import run_from_args
    return run_from_args(args)


def cmd_farm_status(args) -> int:
    import grpc

    from rpc_tracker.client import farm_summary, format_summary

    try:
        summary = farm_summary(args.tracker, args.token, tls_ca=args.tls_ca, timeout=args.timeout)
    except grpc.RpcError as e:
        print(f"tunefarm farm status: error: tracker {args.tracker}: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    except OSError as e:  # an unreadable --tls-ca file
        print(f"tunefarm farm status: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        import json

        from google.protobuf.json_format import MessageToDict
        print(json.dumps(MessageToDict(summary, preserving_proto_field_name=True,
                                       always_print_fields_with_no_presence=True), indent=2))
    else:
        print(format_summary(summary))
    return 0


def register(sub) -> None:
    """Add the farm's subcommands to the `tunefarm` parser."""
    p = sub.add_parser("tracker", help="run the measurement farm's tracker (until SIGINT/SIGTERM)",
                       description="Run the gRPC tracker: agents of each device key register with it, tuners "
                                   "submit measurement batches, and it hands each request to a free agent.")
    from rpc_tracker.daemon import add_arguments  # argparse only: imports no grpc at parse time
    add_arguments(p)
    p.set_defaults(func=cmd_tracker)

    farm = sub.add_parser("farm", help="inspect the measurement farm")
    farm_sub = farm.add_subparsers(dest="farm_command", metavar="FARM_COMMAND", required=True)
    p = farm_sub.add_parser("status", help="agents, device keys, queues and in-flight requests of a tracker")
    p.add_argument("--tracker", required=True, metavar="HOST:PORT", help="the tracker's address")
    p.add_argument("--token", default=os.environ.get("TUNEFARM_TUNER_TOKEN") or os.environ.get("TUNEFARM_AGENT_TOKEN"),
                   help="tuner or agent token (default $TUNEFARM_TUNER_TOKEN, else $TUNEFARM_AGENT_TOKEN)")
    p.add_argument("--tls-ca", default=None, help="CA certificate (PEM) when the tracker serves TLS")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the tracker")
    p.add_argument("--json", action="store_true", help="the summary as JSON")
    p.set_defaults(func=cmd_farm_status)

    p = sub.add_parser("agent", help="join the measurement farm as a device agent (until SIGINT/SIGTERM)",
                       description="Run a device agent: register with the tracker under a device key, measure "
                                   "the candidates it sends in an isolated worker process, report the results. "
                                   "Exits 0 after draining on SIGTERM/SIGINT, 3 if the tracker refuses it.")
    from device_agent.cli import add_arguments as add_agent_arguments  # argparse only: no grpc, no LLVM
    add_agent_arguments(p)
    p.set_defaults(func=cmd_agent)
