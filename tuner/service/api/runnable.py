"""Can the farm run a job's target? Asked of the tracker when a farm job is submitted.

Without this a job for a device key whose agents cannot run its target (another architecture,
CPU features they lack) is accepted, claimed by a worker, built candidate by candidate and then
refused by the tracker request by request. The rule is the tracker's own
(rpc_tracker.targets.why_cannot_run, applied to the devices the agents reported in its Summary),
so the API refuses exactly what the tracker would refuse, and nothing else.

It refuses only on evidence: with no agent registered under the key, or a tracker that does not
answer, the job is accepted as before (agents may join later; the tracker still checks every
request), so a tracker outage never blocks submissions.
"""

from __future__ import annotations

import logging

log = logging.getLogger("tunefarm.api")

TRACKER_TIMEOUT_S = 2.0     # a submission waits this long at most for the tracker's summary
SHOWN_AGENTS = 3            # reasons quoted in the refusal; the rest are counted


def farm_refusal(address: str, token: str | None, device_key: str, target: str) -> str | None:
    """Why no agent of `device_key` can run `target` (a resolved target string), or None when one
    can, none is registered, or the tracker at `address` cannot say."""
    import grpc

    from rpc_tracker.client import farm_summary
    try:
        summary = farm_summary(address, token, timeout=TRACKER_TIMEOUT_S)
    except grpc.RpcError as e:
        code = e.code().name if callable(getattr(e, "code", None)) else "UNKNOWN"
        log.warning("tracker %s did not answer (%s): job for %r accepted unchecked", address, code, device_key)
        return None
    except (ValueError, OSError) as e:
        log.warning("tracker %s cannot be reached (%s): job for %r accepted unchecked", address, e, device_key)
        return None
    return refusal_from_summary(summary, device_key, target)


def refusal_from_summary(summary, device_key: str, target: str) -> str | None:
    """farm_refusal's judgement on a tracker's FarmSummary (rpc_tracker's protobuf)."""
    from compiler.errors import TargetError
    from rpc_tracker.targets import DeviceSpec, TargetSpec, why_cannot_run

    agents = [a for a in summary.agents if a.device_key == device_key]
    if not agents:
        return None
    try:
        spec = TargetSpec.parse(target)
    except TargetError as e:        # the compiler accepted it; the tracker's grammar is the same one
        return f"the tracker cannot read target {target!r}: {e}"
    reasons = []
    for a in agents:
        why = why_cannot_run(spec, DeviceSpec.make(a.device.triple, a.device.cpu, a.device.features))
        if why is None:
            return None
        reasons.append(f"{a.name or a.agent_id}: {why}")
    more = len(reasons) - SHOWN_AGENTS
    shown = "; ".join(reasons[:SHOWN_AGENTS]) + (f"; and {more} more" if more > 0 else "")
    n = len(agents)
    return (f"no agent of device key {device_key!r} can run target {target!r} "
            f"({n} agent{'s' if n > 1 else ''} registered; {shown})")


__all__ = ["farm_refusal", "refusal_from_summary", "TRACKER_TIMEOUT_S"]
