"""The tracker's settings, and the error of a tracker that cannot start.

Kept apart from server.py so the command line can build its options (and defaults) without
importing grpc: `tunefarm --help` stays fast and works before grpc is even needed.
"""

from __future__ import annotations

from dataclasses import dataclass


class TrackerStartError(RuntimeError):
    """The tracker could not start (port taken, unreadable certificate, bad setting)."""


@dataclass
class TrackerConfig:
    host: str = "127.0.0.1"
    port: int = 9190                     # 0: pick a free port (see TrackerServer.port)
    agent_token: str | None = None       # None: agents need no token
    tuner_token: str | None = None       # None: tuners need no token
    heartbeat_seconds: float = 2.0       # told to agents in Welcome
    agent_timeout_seconds: float = 6.0   # an agent silent this long is dropped
    lease_slack_seconds: float = 5.0     # lease = options.timeout_seconds + this
    lease_renewals: int = 3              # a holder's heartbeats extend a lease by this many leases at most
    max_attempts: int = 3                # lost leases before a request is answered with an error
    default_timeout_seconds: float = 10.0  # run timeout of requests that give none
    result_ttl_seconds: float = 600.0    # answered results kept for re-submissions
    result_cache_size: int = 100_000
    unknown_key_grace_seconds: float = 30.0  # after start, requests for never-seen keys are queued
    tls_cert: str | None = None          # PEM files; both or neither
    tls_key: str | None = None
    reap_interval_seconds: float | None = None  # None: min(0.25, agent_timeout / 4)
