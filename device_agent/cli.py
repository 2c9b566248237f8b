"""The agent's command line, shared by `python -m device_agent` and `tunefarm agent`.

    python -m device_agent --tracker HOST:PORT --key KEY [--token T] [--slots N] [--prefetch N] [--name NAME] [--tls-ca FILE]
                           [--no-calibration] [--recheck SECONDS] [--degrade-after N] [--replacements N]
                           [--recovery-wait SECONDS]

The token may come from $TUNEFARM_AGENT_TOKEN instead of the command line (where other users of
the machine could read it). Exit status: 0 after a drain (SIGTERM/SIGINT), 2 on a usage error,
3 when the tracker refuses the agent (wrong token, protocol or llvmlite it cannot serve, a key held
by agents of the other kind, emulated or native).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

TOKEN_ENV = "TUNEFARM_AGENT_TOKEN"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tracker", required=True, metavar="HOST:PORT", help="the tracker to join")
    p.add_argument("--key", required=True, help="device key to serve, e.g. x86-avx512, rpi4")
    p.add_argument("--token", default=None, help=f"agent token (default: ${TOKEN_ENV})")
    p.add_argument("--slots", type=int, default=1,
                   help="requests measured at once (default 1, so timings do not disturb each other)")
    p.add_argument("--prefetch", type=int, default=1, metavar="N",
                   help="requests taken ahead of the slots, started the moment a slot frees (default 1; "
                        "0 on a single-core board, where receiving one while a kernel is timed takes its core)")
    p.add_argument("--name", default=None, help="agent name in results and summaries (default hostname-pid)")
    p.add_argument("--tls-ca", default=None, metavar="FILE",
                   help="PEM certificate of the CA that signed the tracker's certificate (enables TLS)")
    p.add_argument("--drain-grace", type=float, default=60.0, metavar="SECONDS",
                   help="on SIGTERM, how long to wait for held requests to finish (default 60)")
    p.add_argument("--no-calibration", action="store_true",
                   help="do not calibrate the measuring workers (no drift checks, no health reports; a window's "
                        "calibration costs about a tenth of a second)")
    p.add_argument("--recheck", type=float, default=30.0, metavar="SECONDS",
                   help="an idle measuring worker calibrates again after this long (default 30): how a degraded "
                        "agent, which gets no work, is seen to recover")
    p.add_argument("--degrade-after", type=int, default=None, metavar="N",
                   help="slow windows in a row (fresh workers slow too) before the agent reports itself degraded "
                        "(default 3)")
    p.add_argument("--replacements", type=int, default=None, metavar="N",
                   help="fresh measuring workers tried for a slow window before it is marked (default 2)")
    p.add_argument("--recovery-wait", type=float, default=None, metavar="SECONDS",
                   help="when every fresh worker reads slow too, calibrate the last one again for this long for a "
                        "host-wide slow spell to pass before the window is marked (default 8; 0: mark at once)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request")


def run_from_args(args) -> int:
    """Run the agent in this process until it is stopped or refused; returns the exit status."""
    from .agent import EXIT_USAGE, Agent, AgentConfig

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.tls_ca and not os.path.isfile(args.tls_ca):
        print(f"tunefarm agent: error: --tls-ca {args.tls_ca}: no such file", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = AgentConfig(tracker=args.tracker, device_key=args.key,
                             token=args.token or os.environ.get(TOKEN_ENV) or None, slots=args.slots,
                             prefetch=args.prefetch,
                             name=args.name, tls_ca=args.tls_ca, drain_grace_seconds=args.drain_grace,
                             calibrate=not args.no_calibration, recheck_seconds=args.recheck,
                             degrade_after=args.degrade_after, max_replacements=args.replacements,
                             recovery_wait_seconds=args.recovery_wait)
    except ValueError as e:
        print(f"tunefarm agent: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    agent = Agent(config)
    signal.signal(signal.SIGTERM, agent.request_stop)
    signal.signal(signal.SIGINT, agent.request_stop)
    return agent.run()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m device_agent",
                                     description="tunefarm device agent: measure candidates for the farm.")
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))
