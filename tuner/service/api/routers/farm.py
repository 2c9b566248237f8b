"""The measuring farm: agents, device keys and queues.

With a tracker address the app asks the tracker for its live summary (rpc_tracker.client.
farm_summary, with the app's own tracker token: clients never see it), each agent's health with
it (rpc_tracker/health.py); a tracker that does not answer is a 503 naming the reason. Without
one, the agents the store last recorded.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ....records.values import utcnow
from .. import auth
from ..deps import Settings, Store
from ..errors import ApiError, responses
from ..schemas import FarmAgentOut, FarmKeyOut, FarmOut

router = APIRouter(prefix="/farm", tags=["farm"])

TRACKER_TIMEOUT_S = 3.0
HEALTH_STATES = ("healthy", "slow", "degraded", "unknown")


@router.get("", response_model=FarmOut, dependencies=[Depends(auth.read)], responses=responses(503),
            summary="Agents, device keys and queues")
def farm(store: Store, settings: Settings) -> FarmOut:
    if settings.tracker:
        return _from_tracker(settings.tracker, settings.tracker_token)
    now = utcnow()
    agents = [FarmAgentOut.of_store(a, now) for a in store.list_agents()]
    per_key: dict[str, int] = {}
    for a in agents:
        per_key[a.device_key] = per_key.get(a.device_key, 0) + 1
    return FarmOut(source="store", agents=agents, keys=[FarmKeyOut(device_key=k, agents=n) for k, n in sorted(per_key.items())])


def agent_health(a) -> dict:
    """FarmAgentOut's health fields of a tracker's AgentSummary (a tracker before protocol 6 says
    nothing: "unknown"; an unknown state name from a newer one, too)."""
    health = a.health if a.health in HEALTH_STATES else "unknown"
    return {"health": health, "speed_index": a.speed_index if a.speed_index > 0 else None,
            "slow_windows": a.slow_windows, "remeasured": a.remeasured, "replacements": a.replacements}


def _from_tracker(address: str, token: str | None) -> FarmOut:
    import grpc

    from rpc_tracker.client import farm_summary
    try:
        summary = farm_summary(address, token, timeout=TRACKER_TIMEOUT_S)
    except grpc.RpcError as e:
        code = e.code().name if callable(getattr(e, "code", None)) else "UNKNOWN"
        details = e.details() if callable(getattr(e, "details", None)) else str(e)
        raise ApiError(503, f"tracker {address} did not answer: {code}: {details}", headers={"Retry-After": "5"}) from None
    except (ValueError, OSError) as e:
        raise ApiError(503, f"tracker {address} cannot be reached: {e}", headers={"Retry-After": "5"}) from None
    agents = [FarmAgentOut(name=a.name or a.agent_id, device_key=a.device_key, last_seen_seconds_ago=a.last_seen_seconds_ago,
                           info={"agent_id": a.agent_id, "triple": a.device.triple, "cpu": a.device.cpu,
                                 "features": list(a.device.features), "cores": a.device.cores,
                                 "memory_bytes": a.device.memory_bytes, "agent_version": a.device.agent_version,
                                 "hostname": a.device.hostname, "connected_seconds": a.connected_seconds,
                                 "emulated": a.device.emulated, "llvmlite_version": a.device.llvmlite_version},
                           slots=a.slots, in_flight=a.in_flight, completed=a.completed, failed=a.failed,
                           leases_lost=a.leases_lost, draining=a.draining, **agent_health(a))
              for a in summary.agents]
    keys = [FarmKeyOut(device_key=k.device_key, agents=k.agents, queued=k.queued, in_flight=k.in_flight, completed=k.completed,
                       degraded=k.degraded)
            for k in summary.keys]
    return FarmOut(source="tracker", tracker_version=summary.tracker_version, protocol_version=summary.protocol_version,
                   uptime_seconds=summary.uptime_seconds, agents=agents, keys=keys)
