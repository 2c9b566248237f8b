"""A long-distance link in user space: TUN device pairs that pass IP packets late and sometimes not at all.

    python tests/netns_wire.py --delay-ms 50 --loss 0.02 HUBSIDE:AGENTSIDE [HUBSIDE:AGENTSIDE ...]

What `tc qdisc add ... netem delay 50ms loss 2%` does on a veth, done by a process instead: this
machine's kernel is built without sch_netem (CONFIG_NET_SCH_NETEM is not set), and so are the
kernels CI runs on, so the netns tests cannot rely on it. Each pair is two TUN devices (IP
packets, no Ethernet); whatever the kernel sends into one comes out of the other `delay`
later, unless it is lost (each packet independently, in each direction). One process serves
every pair of a test, so the links cost one event loop, not one process each.

The devices are created here, in the caller's namespace, and stay as long as this process holds
them: the test moves them into its namespaces (`ip link set NAME netns NS`), and they vanish
when this process exits, which it does on SIGTERM or when its parent dies (PR_SET_PDEATHSIG). A
device set down (`ip link set NAME down`) takes nothing in and gives nothing out: that is how a
test cuts a link. It prints `ready` on stdout once every device exists.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import heapq
import os
import random
import selectors
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
PR_SET_PDEATHSIG = 1
MAX_PACKET = 65536


def open_tun(name: str) -> int:
    """A new TUN device called `name` (IP packets without a header of its own), non-blocking."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def die_with_parent() -> None:
    """A test killed by SIGKILL must not leave a wire (and its devices) behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the parent died before the line above
        sys.exit(0)


def forward(pairs: list, delay: float, loss: float, rng: random.Random) -> None:
    """Move packets between the two ends of every pair, `delay` late, dropping a `loss` share."""
    sel = selectors.DefaultSelector()
    for a, b in pairs:
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
    due: list = []  # (when, sequence, out fd, packet): the sequence keeps equal times in order
    seq = 0
    while True:
        timeout = max(0.0, due[0][0] - time.monotonic()) if due else None
        for key, _ in sel.select(timeout):
            for _ in range(64):  # drain what is there, a bounded amount at a time
                try:
                    packet = os.read(key.fd, MAX_PACKET)
                except (BlockingIOError, OSError):
                    break
                if rng.random() >= loss:
                    seq += 1
                    heapq.heappush(due, (time.monotonic() + delay, seq, key.data, packet))
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, out, packet = heapq.heappop(due)
            try:
                os.write(out, packet)
            except OSError:  # the far end is down (a cut link): the packet is lost on it
                pass


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--delay-ms", type=float, default=50.0, help="one-way delay of every packet")
    p.add_argument("--loss", type=float, default=0.02, help="share of packets lost, each direction")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("pairs", nargs="+", metavar="NAME_A:NAME_B")
    args = p.parse_args(argv)
    die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    pairs = []
    for spec in args.pairs:
        a, b = spec.split(":")
        pairs.append((open_tun(a), open_tun(b)))
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"ready (seed {seed})", flush=True)
    forward(pairs, args.delay_ms / 1000.0, args.loss, random.Random(seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
