"""Small helpers for whoever dials the tracker: agents, the tuner's RPC runner, `tunefarm farm status`.

`make_channel` applies the protocol's message limits and keepalive (and TLS when given a CA file) so
every client talks to the tracker the same way, and `make_tracker_channel` adds quick reconnects for
the clients that stay connected; `tls_problem` tells a certificate the client does
not trust from a network that is down; `farm_summary` / `format_summary` are the status view.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from .protocol import auth_metadata, channel_options, client_keepalive_options, pb, pb_grpc


def make_channel(address: str, tls_ca: str | None = None, options: list | None = None) -> grpc.Channel:
    """A channel to the tracker at HOST:PORT; TLS (verified against the CA file `tls_ca`) when given."""
    opts = channel_options() + client_keepalive_options() + list(options or [])
    if tls_ca:
        creds = grpc.ssl_channel_credentials(root_certificates=Path(tls_ca).read_bytes())
        return grpc.secure_channel(address, creds, options=opts)
    return grpc.insecure_channel(address, options=opts)


# gRPC's own reconnect backoff grows to 120 s by default; a channel still backing off answers every
# call with UNAVAILABLE at once, so a tracker back after a restart would go unnoticed for minutes.
# Keep the channel's reconnect attempts at least as frequent as the agent's own backoff.
# grpc.min_reconnect_backoff_ms is, despite its name, the least time gRPC gives one connection
# attempt (TCP, TLS, HTTP/2 settings): at 200 ms every attempt over a 100 ms-RTT link with TLS timed
# out ("timed out before receiving SETTINGS frame") until the backoff had grown. 2 s covers a slow
# link and a lost SYN; a link that is down is still retried every 2 s, not every 20 s (the default).
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 2000),
                     ("grpc.max_reconnect_backoff_ms", 2000)]


def make_tracker_channel(address: str, tls_ca: str | None = None) -> grpc.Channel:
    """The channel of a long-lived client (an agent, the tuner's RPC runner): message limits and
    TLS as every client's, and quick reconnects after the tracker restarts."""
    return make_channel(address, tls_ca=tls_ca, options=RECONNECT_OPTIONS)


def tls_problem(details: str | None, tls_ca: str | None) -> str:
    """What is wrong with TLS, as a sentence for the user, when a failed connection's details say the
    TLS handshake failed; "" when they say anything else (a tracker down or restarting, a lossy
    network: worth retrying, whereas a certificate the client does not trust never gets better).

    gRPC reports these only as UNAVAILABLE with text from BoringSSL ("Tls handshake failed
    (TSI_PROTOCOL_FAILURE): ... CERTIFICATE_VERIFY_FAILED: self signed certificate", "Ssl handshake
    failed" in older releases, "Peer name ... is not in peer certificate"), so the text is all there
    is to go on; tests/test_farm_netns.py pins it for the grpcio this project installs.
    """
    d = details or ""
    low = d.lower()
    ca = f"--tls-ca {tls_ca}" if tls_ca else "--tls-ca"
    if "not in peer certificate" in low:
        return f"the tracker's TLS certificate does not name the address dialled ({d.strip()})"
    if "handshake failed" not in low:
        return ""
    if "certificate_verify_failed" in low or "certificate verify failed" in low:
        reason = d.rsplit("CERTIFICATE_VERIFY_FAILED", 1)[-1].strip(": ").removesuffix(": OK").strip()
        return (f"the tracker's TLS certificate is not trusted: it was not signed by the CA in {ca}"
                + (f" ({reason})" if reason else ""))
    if "wrong_version_number" in low:
        return f"the tracker does not speak TLS (drop {ca}, or start the tracker with --tls-cert and --tls-key)"
    return f"the TLS handshake with the tracker failed ({d.strip()}); check {ca}"


def farm_summary(address: str, token: str | None, tls_ca: str | None = None, timeout: float = 5) -> pb.FarmSummary:
    """The tracker's Summary (agent or tuner token). Raises grpc.RpcError (UNAVAILABLE, UNAUTHENTICATED, ...)."""
    with make_channel(address, tls_ca) as channel:
        return pb_grpc.TrackerStub(channel).Summary(pb.SummaryRequest(), metadata=auth_metadata(token),
                                                     timeout=timeout)


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _table(headers: list, rows: list, right: set) -> list:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(vals):
        return "  ".join(v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths))).rstrip()
    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]


def _health(a) -> tuple[str, str]:
    """(health, speed index) columns of an agent: "unknown" / "—" before anything was judged (or
    for an agent that does not calibrate)."""
    return a.health or "unknown", f"{a.speed_index:.2f}" if a.speed_index > 0 else "—"


def format_summary(summary: pb.FarmSummary) -> str:
    """A readable report: one table of agents (with each one's health and speed index: the
    lowest ratio of its latest calibration to its host's usual speeds), one of device keys."""
    out = [f"tracker {summary.tracker_version} (protocol {summary.protocol_version}), "
           f"up {_ago(summary.uptime_seconds)}, {len(summary.agents)} agent(s)"]
    out.append("")
    if summary.agents:
        rows = [[a.name, a.device_key, (a.device.cpu or "?") + (" (emulated)" if a.device.emulated else ""),
                 str(a.device.cores), str(a.slots), str(a.in_flight),
                 str(a.completed), str(a.failed), str(a.leases_lost), _ago(a.last_seen_seconds_ago) + " ago",
                 "draining" if a.draining else "ready", *_health(a), str(a.slow_windows), str(a.remeasured)]
                for a in summary.agents]
        out += _table(["agent", "key", "cpu", "cores", "slots", "in-flight", "completed", "failed", "lost",
                       "last seen", "state", "health", "speed", "slow windows", "re-measured"], rows,
                      {3, 4, 5, 6, 7, 8, 9, 12, 13, 14})
        degraded = [a.name for a in summary.agents if a.health == "degraded"]
        if degraded:
            out.append("")
            out.append(f"degraded (no work until a calibration shows it recovered): {', '.join(degraded)}")
    else:
        out.append("no agents connected")
    out.append("")
    if summary.keys:
        rows = [[k.device_key, str(k.agents), str(k.degraded), str(k.queued), str(k.in_flight), str(k.completed)]
                for k in summary.keys]
        out += _table(["key", "agents", "degraded", "queued", "in-flight", "completed"], rows, {1, 2, 3, 4, 5})
    else:
        out.append("no device keys yet")
    return "\n".join(out)
