"""Light agents: a LOAD GENERATOR for bench/farm_throughput.py, not a device agent.

It puts many agents on one tracker from one process, to measure the tracker alone: each light
agent is an asyncio task with its own gRPC channel (its own TCP connection, like a separate
host) that speaks the real farm protocol through the generated stubs, as device_agent.agent
does: Connect(Hello) with the agent token, protocol version, one slot and one request ahead
(Hello.prefetch), read Welcome, Heartbeat every `heartbeat_seconds` with the request ids it holds,
one quiet ResultReport per Work on its Report stream (refusals and duplicates are acknowledged by
request id, the rest by the count in ResultAck.received), Drain before it leaves.

What it does NOT do is measure: it never loads the kernel it is sent. It serves its requests one
at a time, in the order they came: each for a fixed SERVICE TIME (asyncio.sleep, stated by the
bench) from the moment it starts it (when the Work arrives, or when the request before it is
reported if the Work came ahead), and answers costs=[service time] with run_seconds = its own
time from that start to sending the report, so everything else a request spends between the
tuner and the answer is the farm's.

Timestamps are time.monotonic() (CLOCK_MONOTONIC, one clock for every process of the machine),
so the bench can line them up with the tuner's and the tracker's.

Run by the bench as a subprocess:

    python bench/light_agents.py --tracker HOST:PORT --key KEY --agents 32 --service-ms 20 --out FILE

It prints `ready N` once all N agents are welcomed; on a `stop` line (or end of input) every agent
drains and closes, the records go to FILE as JSON and it prints `done`. Records, per Work received:
[request_id, agent_index, t_work, t_start, t_report, outcome] where outcome is "ok" (confirmed by
the tracker's count, not refused), "duplicate", the gRPC status name of a refused report, or
"no ack" (never confirmed). The agent token comes from $TUNEFARM_AGENT_TOKEN.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from rpc_tracker.protocol import MAX_PREFETCH, PROTOCOL_VERSION, auth_metadata, channel_options, client_keepalive_options, pb, pb_grpc  # noqa: E402

_STATUS_NAME = {c.value[0]: c.name for c in grpc.StatusCode}


class LightAgent:
    """One connection of the load: registers, answers every Work after `service` seconds, heartbeats."""

    def __init__(self, index: int, address: str, key: str, service: float, token: str | None,
                 device: pb.DeviceInfo):
        self.index, self.key, self.service = index, key, service
        self.name = f"light-{os.getpid()}-{index}"
        # a local subchannel pool: every light agent its own TCP connection, as agents on other hosts
        self.channel = grpc.aio.insecure_channel(
            address, options=channel_options() + client_keepalive_options() + [("grpc.use_local_subchannel_pool", 1)])
        self.stub = pb_grpc.TrackerStub(self.channel)
        self.md = auth_metadata(token)
        self.device = device
        self.records: list = []
        self.agent_id = ""
        self.heartbeat_seconds = 2.0
        self.holding: set = set()
        self.welcomed = asyncio.Event()
        self.inbox: asyncio.Queue = asyncio.Queue()   # (request, t_work) in arrival order
        self.call = None
        self.report_call = None
        self.serve_task = None
        self.writing = None      # the report being written on the Report stream
        self.sent = 0            # reports written on the Report stream
        self.seq: dict = {}      # request id -> its report's position on the stream (1-based)
        self.refused: dict = {}  # request id -> outcome of an ack that named it ("duplicate", a status name)
        self.confirmed = 0       # the tracker's count: reports of the stream it has handled
        self.acks_task = None

    async def run(self) -> None:
        hello = pb.Hello(protocol_version=PROTOCOL_VERSION, device_key=self.key, slots=1, name=self.name,
                         device=self.device, prefetch=MAX_PREFETCH)
        self.call = self.stub.Connect(hello, metadata=self.md)
        hb = None
        try:
            async for msg in self.call:
                kind = msg.WhichOneof("kind")
                if kind == "welcome":
                    self.agent_id = msg.welcome.agent_id
                    self.heartbeat_seconds = msg.welcome.heartbeat_seconds or 2.0
                    hb = asyncio.ensure_future(self._heartbeats())
                    self.report_call = self.stub.Report(metadata=self.md)
                    self.acks_task = asyncio.ensure_future(self._read_acks(self.report_call))
                    self.serve_task = asyncio.ensure_future(self._serve())
                    self.welcomed.set()
                elif kind == "work":
                    request = msg.work.request
                    self.holding.add(request.request_id)
                    self.inbox.put_nowait((request, time.monotonic()))
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise
        finally:
            if hb is not None:
                hb.cancel()

    async def _serve(self) -> None:
        """One request at a time (one slot), in arrival order: a request that came ahead starts the
        moment the one before it is reported."""
        while True:
            request, t_work = await self.inbox.get()
            if request is None:
                return
            rid = request.request_id
            t_start = time.monotonic()
            await asyncio.sleep(self.service)
            t_report = time.monotonic()
            result = pb.MeasureResult(request_id=rid, costs=[self.service], run_seconds=t_report - t_start,
                                      agent=self.name)
            self.sent += 1
            self.seq[rid] = self.sent
            # the report goes out while the next request runs, as the device agent's slot hands it to
            # its Report stream and goes on (one write at a time on a stream: the last one is long done)
            if self.writing is not None:
                await self.writing
            self.writing = asyncio.ensure_future(
                self.report_call.write(pb.ResultReport(agent_id=self.agent_id, result=result, quiet=True)))
            self.records.append([rid, self.index, t_work, t_start, t_report])
            self.holding.discard(rid)

    async def _read_acks(self, call) -> None:
        """Acks naming a report (a refusal or a duplicate) and the tracker's count of reports handled."""
        try:
            while True:
                ack = await call.read()
                if ack is grpc.aio.EOF:
                    return
                if ack.request_id and (ack.duplicate or ack.status != 0):
                    self.refused[ack.request_id] = "duplicate" if ack.duplicate else _STATUS_NAME.get(ack.status, "UNKNOWN")
                self.confirmed = max(self.confirmed, ack.received)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            try:
                await self.stub.Heartbeat(pb.HeartbeatRequest(agent_id=self.agent_id, holding=sorted(self.holding)),
                                          metadata=self.md, timeout=max(self.heartbeat_seconds, 1.0))
            except grpc.aio.AioRpcError:
                pass  # the stream tells the rest

    async def leave(self) -> None:
        """Drain (the tracker sends nothing more), finish what is held, close."""
        if self.agent_id:
            try:
                await self.stub.Drain(pb.DrainRequest(agent_id=self.agent_id), metadata=self.md, timeout=10)
            except grpc.aio.AioRpcError:
                pass
        if self.serve_task is not None:
            self.inbox.put_nowait((None, 0.0))  # after what is held: finish it all, then stop
            await asyncio.wait_for(self.serve_task, 10)
        if self.writing is not None:
            await self.writing
        if self.report_call is not None:
            await self.report_call.done_writing()  # the tracker confirms what it has, then ends the stream
            await asyncio.wait_for(self.acks_task, 10)
        if self.call is not None:
            self.call.cancel()
        for r in self.records:
            rid = r[0]
            r.append(self.refused.get(rid) or ("ok" if self.seq[rid] <= self.confirmed else "no ack"))
        await self.channel.close()


def _device() -> pb.DeviceInfo:
    """What this host is (the same fields a real agent sends; the tracker routes on them)."""
    from device_agent.host import describe_host
    return pb.DeviceInfo(**describe_host())


async def main_async(args) -> int:
    device = _device()
    token = os.environ.get("TUNEFARM_AGENT_TOKEN") or None
    agents = [LightAgent(args.first_index + i, args.tracker, args.key, args.service_ms / 1000.0, token, device)
              for i in range(args.agents)]
    tasks = [asyncio.ensure_future(a.run()) for a in agents]
    welcomed = asyncio.ensure_future(asyncio.gather(*(a.welcomed.wait() for a in agents)))
    await asyncio.wait([welcomed, *tasks], timeout=60, return_when=asyncio.FIRST_COMPLETED)
    for t in tasks:
        if t.done():   # an agent's stream ended before all were welcomed: say why
            raise SystemExit(f"a light agent's stream ended: {t.exception() or 'the tracker closed it'}")
    if not welcomed.done():
        raise SystemExit(f"only {sum(a.welcomed.is_set() for a in agents)} of {len(agents)} light agents welcomed "
                         "within 60 s")
    print(f"ready {len(agents)}", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "stop":
            break
    await asyncio.gather(*(a.leave() for a in agents))
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    records = [r for a in agents for r in a.records]
    Path(args.out).write_text(json.dumps({"host": socket.gethostname(), "records": records}))
    print("done", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tracker", required=True, help="HOST:PORT of the tracker")
    p.add_argument("--key", required=True, help="device key the light agents register under")
    p.add_argument("--agents", type=int, default=32, help="light agents in this process")
    p.add_argument("--first-index", type=int, default=0, help="index of the first agent (names and records)")
    p.add_argument("--service-ms", type=float, default=20.0, help="fixed service time per request")
    p.add_argument("--out", required=True, help="file the records are written to (JSON)")
    args = p.parse_args(argv)
    try:  # the tracker's loop too (rpc_tracker.server): the load costs this machine less CPU
        import uvloop
    except ImportError:
        return asyncio.run(main_async(args))
    return uvloop.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
