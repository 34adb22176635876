"""Clustering: the peer transport between nodes, the failure detector, and (next) the catalogue on Raft."""

from hutch.cluster.detector import FailureDetector
from hutch.cluster.transport import PeerTransport
from hutch.cluster.wire import (
    PROTOCOL_VERSION,
    FrameTooLarge,
    HandshakeFailed,
    HandshakeRefused,
    MalformedMessage,
    PeerCodec,
    PeerProtocolError,
)

__all__ = [
    "PROTOCOL_VERSION",
    "FailureDetector",
    "FrameTooLarge",
    "HandshakeFailed",
    "HandshakeRefused",
    "PeerCodec",
    "MalformedMessage",
    "PeerProtocolError",
    "PeerTransport",
]
