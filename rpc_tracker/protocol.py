"""The farm protocol as the rest of tunefarm sees it: generated messages, version, auth, limits.

Both the tracker and the agent import the protocol from here, never the generated modules
directly, so a checkout that was not installed fails with one clear message instead of an
ImportError deep in the tracker.
"""

from __future__ import annotations

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
PROTOCOL_VERSION = 2
MIN_AGENT_PROTOCOL = 2

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


__all__ = ["pb", "pb_grpc", "PROTOCOL_VERSION", "MIN_AGENT_PROTOCOL", "AUTH_METADATA_KEY",
           "MAX_MESSAGE_BYTES", "auth_metadata", "channel_options", "client_keepalive_options",
           "server_keepalive_options"]
