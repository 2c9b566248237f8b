"""The farm protocol as the rest of tunefarm sees it: generated messages, version, auth, limits.

Both the tracker and the agent import the protocol from here, never the generated modules
directly, so a checkout that was not installed fails with one clear message instead of an
ImportError deep in the tracker.
"""

from __future__ import annotations

import re

try:
    from .proto import farm_pb2 as pb
    from .proto import farm_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - only in a checkout that was never installed
    raise ImportError(
        "the farm protocol modules are generated at install time from rpc_tracker/proto/farm.proto; "
        "run `pip install -e .` in the repository") from e

# Bumped on every incompatible change of farm.proto or of the kernel bytes it carries
# (compiler/kernel_format.py). The tracker refuses agents older than MIN_AGENT_PROTOCOL with
# FAILED_PRECONDITION and a message telling them to upgrade.
# 2: kernel format 2 (checksum over header and object, argument roles).
# 3: DeviceInfo.emulated and llvmlite_version, MeasureResult.emulated, error code 8
#    (UNSUPPORTED_TARGET). Agents of protocol 2 are refused: they cannot say whether they run
#    emulated, and their timings must not be mixed with a real device's.
# 4: requests leased ahead (Hello.prefetch) and quiet reports acknowledged by count
#    (ResultReport.quiet, ResultAck.received). Compatible both ways: an agent of protocol 3 is
#    never leased ahead and gets an ack per report; a tracker of protocol 3 ignores both fields.
# 5: what a batch's requests share is sent once: the reference kernels (MeasureBatch.references,
#    MeasureRequest.reference_index) and the target (MeasureBatch.target). Agents are not
#    concerned: the tracker hands them whole requests. A tuner sends a batch this way only to a
#    tracker of protocol 5 or newer, which the Summary's protocol_version tells.
# 6: agent health. Agents calibrate their measuring workers (device_agent/calibration.py) and
#    report their state, speed index and calibrations (Hello.health, HeartbeatRequest.health); the
#    tracker keeps each device key's history per host and hands it back in Welcome.history, sends
#    a degraded agent no work, and passes a result's slow-window marks on to the tuner
#    (MeasureResult.slow_window, remeasured, slow_index). Compatible both ways: an agent of protocol
#    5 reports no health and is served as before ("unknown"); a tracker of protocol 5 ignores it.
PROTOCOL_VERSION = 6
# The first protocol whose tracker takes MeasureBatch.references and MeasureBatch.target.
SHARED_BATCH_FIELDS_PROTOCOL = 5
MIN_AGENT_PROTOCOL = 3

# Requests a tracker leases ahead of an agent's slots at most, whatever its Hello.prefetch says:
# one keeps the agent busy across the dispatch (the next request is there when it reports), more
# would only keep requests from agents that free up meanwhile.
MAX_PREFETCH = 1

# A quiet report is confirmed (a count-only ResultAck) within this of the tracker taking it, one
# count for all taken meanwhile: what an agent re-sends after a broken stream is at most this
# long's worth of reports, and a busy stream hears one ack per interval instead of one per report.
ACK_INTERVAL_SECONDS = 0.25

# The llvmlite releases an agent may load kernels with: [AGENT_LLVMLITE_MIN, AGENT_LLVMLITE_BELOW).
# Kernels reach an agent as object code compiled by the tuner's LLVM, and the agent's own LLVM
# loads them (RuntimeDyld) and parses their target (cpu and feature names). Every tuner of this
# release compiles with an llvmlite in pyproject.toml's range (LLVM 20), so that is what the
# tracker can serve: an older LLVM need not know a newer one's relocations, cpu names or features
# (Debian bookworm's python3-llvmlite 0.39 is LLVM 11/14), and newer ones are the releases the
# project excludes. The tracker knows the range as data (it never imports llvmlite) and refuses an
# agent outside it at Connect with FAILED_PRECONDITION naming both. tests/test_board.py checks
# that this range is pyproject.toml's.
AGENT_LLVMLITE_MIN = (0, 45)
AGENT_LLVMLITE_BELOW = (0, 48)


def llvmlite_problem(version: str) -> str:
    """Why an agent with llvmlite `version` cannot load this farm's kernels, or '' when it can."""
    wanted = (f"llvmlite>={AGENT_LLVMLITE_MIN[0]}.{AGENT_LLVMLITE_MIN[1]},"
              f"<{AGENT_LLVMLITE_BELOW[0]}.{AGENT_LLVMLITE_BELOW[1]}")
    if not version:
        return f"the agent did not say its llvmlite version; install tunefarm's agent with {wanted}"
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        return f"llvmlite version {version!r} is not a version this tracker can read; install {wanted}"
    got = (int(m.group(1)), int(m.group(2)))
    if not AGENT_LLVMLITE_MIN <= got < AGENT_LLVMLITE_BELOW:
        return (f"llvmlite {version} cannot load the kernels this farm's tuners build (LLVM of {wanted}); "
                f"install {wanted} on the agent")
    return ""


# Metadata key carrying `Bearer <token>` on every call.
AUTH_METADATA_KEY = "authorization"

# A built kernel is tens to hundreds of KiB; a batch of 64 with references stays well under this.
# Larger messages are refused by gRPC with RESOURCE_EXHAUSTED before they reach the tracker.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def auth_metadata(token: str | None) -> tuple:
    """Call metadata for `token` (empty when the farm runs without tokens)."""
    return ((AUTH_METADATA_KEY, f"Bearer {token}"),) if token else ()


def channel_options() -> list:
    return [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


# Keepalive: a link that goes dead without a word (a cable, a NAT's table, a Wi-Fi board out of
# range) leaves a TCP connection that looks open for as long as TCP keeps retransmitting, which
# grows to minutes; calls made on it wait the whole time, even after the link is back. A client
# pings every KEEPALIVE_SECONDS, even with no call open, and drops the connection when a ping is
# not acknowledged within KEEPALIVE_TIMEOUT_SECONDS, so the channel dials a fresh one: an agent
# cut off for a minute is back within seconds of its link (tests/test_farm_netns.py).
KEEPALIVE_SECONDS = 5.0
KEEPALIVE_TIMEOUT_SECONDS = 5.0


def client_keepalive_options() -> list:
    return [("grpc.keepalive_time_ms", int(KEEPALIVE_SECONDS * 1000)),
            ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT_SECONDS * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0)]  # a tuner's stream may wait minutes without data


def server_keepalive_options() -> list:
    """What the tracker accepts: by default gRPC servers close connections that ping more than once
    in 5 minutes without data ("too_many_pings"), which would turn every client's keepalive into a
    reconnect."""
    return [("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", int(KEEPALIVE_SECONDS * 1000 / 2)),
            ("grpc.http2.max_ping_strikes", 0)]


__all__ = ["pb", "pb_grpc", "PROTOCOL_VERSION", "MIN_AGENT_PROTOCOL", "SHARED_BATCH_FIELDS_PROTOCOL",
           "MAX_PREFETCH", "ACK_INTERVAL_SECONDS",
           "AUTH_METADATA_KEY",
           "AGENT_LLVMLITE_MIN", "AGENT_LLVMLITE_BELOW", "llvmlite_problem",
           "MAX_MESSAGE_BYTES", "auth_metadata", "channel_options", "client_keepalive_options",
           "server_keepalive_options"]


# Results per Measure stream message at most, for a tuner that asked for packed results
# (MeasureBatch.pack_results): far under MAX_MESSAGE_BYTES even with long error messages.
MAX_PACKED_RESULTS = 512


def unpack_results(message: pb.MeasureResult) -> list:
    """Every result one Measure stream message carries: itself and those packed in its `more`.

    A tracker answers a tuner that set MeasureBatch.pack_results with as many results per message
    as it had ready (one message instead of one per result is where a busy tracker's time went);
    a tracker from before the field sends one result per message, whose `more` is empty. The
    first result is returned as the message itself: callers read its result fields only.
    """
    return [message, *message.more] if message.more else [message]
