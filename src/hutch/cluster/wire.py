"""The node-to-node wire: length-prefixed msgpack frames, a mutual challenge handshake, groups.

Every peer connection carries frames of the form ``u32 length (big-endian) | msgpack body``.
The body is a msgpack array whose first element is the frame kind. The first frames on a
connection are a handshake in which both nodes prove they know the shared cluster secret
without ever sending it, as Erlang distribution does with its cookie: each side sends a fresh
random nonce and the other answers with an HMAC-SHA256 over both nonces, both node names and
its role. Only then do data frames flow: ``Data(group, payload)`` multiplexes the metadata
Raft group, a queue's Raft group, a GM ring or "rpc" over the one connection, and
``Tick`` keeps the connection provably alive (see ``docs/design/transport.md``).

This module is sans-I/O: ``PeerCodec`` takes bytes and returns events, and queues the bytes
the handshake wants sent; the caller owns the socket and the clock. It never sends the
secret, never accepts a frame bigger than its limit (a peer that has not yet proved itself
is held to a much smaller one), and never lets a data frame through before the handshake.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from typing import Any

import msgspec

PROTOCOL_VERSION = 1
FRAME_SIZE_MAX_DEFAULT = 16 * 1024 * 1024
HANDSHAKE_FRAME_SIZE_MAX = 1024
NONCE_SIZE = 32
NODE_NAME_SIZE_MAX = 255

_length = struct.Struct(">I")

Group = str | int


# -- frames -------------------------------------------------------------------------------


class Hello(msgspec.Struct, array_like=True, tag=1, frozen=True):
    """Dialler → listener: who I am, and what I last knew of you (to spot stale links)."""

    version: int
    node: str
    incarnation: int
    seen_incarnation: int  # the listener's incarnation in the dialler's last link with it, 0 if none
    seen_link: int  # that link's number, 0 if none


class Challenge(msgspec.Struct, array_like=True, tag=2, frozen=True):
    """Listener → dialler: who I am, and a nonce to prove the secret on."""

    version: int
    node: str
    incarnation: int
    nonce: bytes


class ChallengeReply(msgspec.Struct, array_like=True, tag=3, frozen=True):
    """Dialler → listener: my proof over your nonce, and my nonce for your proof."""

    nonce: bytes
    proof: bytes


class ChallengeAck(msgspec.Struct, array_like=True, tag=4, frozen=True):
    """Listener → dialler: accepted; my proof over your nonce; the number of this link."""

    proof: bytes
    link: int


class Refuse(msgspec.Struct, array_like=True, tag=5, frozen=True):
    """Either side: the handshake is refused, and why (the connection closes after it)."""

    reason: str


class Data(msgspec.Struct, array_like=True, tag=16, frozen=True):
    group: Group
    payload: Any


class Tick(msgspec.Struct, array_like=True, tag=17, frozen=True):
    pass


Frame = Hello | Challenge | ChallengeReply | ChallengeAck | Refuse | Data | Tick

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Frame)


# -- events returned by PeerCodec.feed ------------------------------------------------------


class PeerVerified(msgspec.Struct, frozen=True):
    """Listener side: the dialler proved the secret. Call accept(link) or refuse(reason)."""

    node: str
    incarnation: int
    seen_incarnation: int
    seen_link: int


class PeerUp(msgspec.Struct, frozen=True):
    """Dialler side: the listener proved the secret and accepted; data may flow."""

    node: str
    incarnation: int
    link: int


class Message(msgspec.Struct, frozen=True):
    group: Group
    payload: Any


class Heartbeat(msgspec.Struct, frozen=True):
    pass


Event = PeerVerified | PeerUp | Message | Heartbeat


# -- errors -------------------------------------------------------------------------------


class PeerProtocolError(Exception):
    """The peer broke the protocol; the connection must be closed. Names the peer when known."""

    def __init__(self, message: str, node: str | None = None):
        super().__init__(message)
        self.node = node


class FrameTooLarge(PeerProtocolError):
    pass


class MalformedMessage(PeerProtocolError):
    """A data frame's payload that does not have the shape its group and kind require; raised by
    the node's handlers, it closes the link like any protocol error."""


class HandshakeFailed(PeerProtocolError):
    """A proof did not verify, versions differ, or the peer is not the node we meant to reach."""


class HandshakeRefused(PeerProtocolError):
    """The listener refused us (sent a Refuse frame)."""

    def __init__(self, reason: str, node: str | None = None):
        super().__init__(f"refused by node {node}: {reason}", node)
        self.reason = reason


def _proof(secret: bytes, role: bytes, dialler: str, listener: str, dialler_nonce: bytes,
           listener_nonce: bytes) -> bytes:
    # The role label makes a proof useless in the other direction (no reflection), the names
    # bind it to this pair and the two fresh nonces to this connection (no replay).
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in (b"hutch-peer-v1", role, dialler.encode(), listener.encode(), dialler_nonce,
                 listener_nonce):
        mac.update(_length.pack(len(part)))
        mac.update(part)
    return mac.digest()


SPLIT_PAYLOAD_MIN = 64 * 1024  # bytes at least this large at a payload's end are handed on as their own part (encode_parts)
_EMPTY_BIN = b"\xc4\x00"


def _bin_header(n: int) -> bytes:
    """msgpack's header of a bin of n bytes."""
    if n < 0x100:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 0x10000:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def encode_data_parts(group: Group, payload: Any, tail: bytes,
                      frame_size_max: int = FRAME_SIZE_MAX_DEFAULT) -> tuple[bytes, bytes]:
    """The bytes of `encode_frame(Data(group, payload))` as (everything before `tail`, `tail`
    itself), where `payload` ends with `tail`: it is `tail`, or a list whose last element is
    `tail` (a Raft message carrying a stream's batch, `[group id, message]`). A large `tail` goes
    to the socket as it is, not copied into a frame and then into the write."""
    if payload is tail:
        head = _encoder.encode(Data(group, b""))
    else:
        head = _encoder.encode(Data(group, [*payload[:-1], b""]))
    if not head.endswith(_EMPTY_BIN):
        raise AssertionError("the split bytes are not the last thing in the frame")
    n = len(tail)
    bin_header = _bin_header(n)
    size = len(head) - len(_EMPTY_BIN) + len(bin_header) + n
    if size > frame_size_max:
        raise FrameTooLarge(f"frame of {size} bytes exceeds frame_size_max {frame_size_max}")
    return _length.pack(size) + head[:-len(_EMPTY_BIN)] + bin_header, tail


def encode_frame(frame: Frame, frame_size_max: int = FRAME_SIZE_MAX_DEFAULT) -> bytes:
    body = _encoder.encode(frame)
    if len(body) > frame_size_max:
        raise FrameTooLarge(f"frame of {len(body)} bytes exceeds frame_size_max {frame_size_max}")
    return _length.pack(len(body)) + body


# -- the codec ----------------------------------------------------------------------------

# Which frame kinds each state accepts; anything else is a protocol error.
_STATES: dict[str, tuple[type, ...]] = {
    "listener_await_hello": (Hello,),
    "dialler_await_challenge": (Challenge, Refuse),
    "listener_await_reply": (ChallengeReply,),
    "listener_await_decision": (),
    "dialler_await_ack": (ChallengeAck, Refuse),
    "open": (Data, Tick),
    "closed": (),
}


class PeerCodec:
    """One end of one peer connection: handshake, then framed messages.

    ``role`` is "dialler" (we connected) or "listener" (we accepted). A dialler may name the
    node it expects to reach; reaching another is a ``HandshakeFailed``.
    """

    def __init__(self, node: str, secret: bytes | str, role: str, *, incarnation: int = 0,
                 expected_peer: str | None = None, seen_incarnation: int = 0, seen_link: int = 0,
                 frame_size_max: int = FRAME_SIZE_MAX_DEFAULT):
        if role not in ("dialler", "listener"):
            raise ValueError(f"role must be 'dialler' or 'listener', not {role!r}")
        if not node or len(node.encode()) > NODE_NAME_SIZE_MAX:
            raise ValueError(f"node name must be 1..{NODE_NAME_SIZE_MAX} bytes")
        self.node = node
        self.role = role
        self.incarnation = incarnation
        self.frame_size_max = frame_size_max
        self.peer: str | None = expected_peer if role == "dialler" else None
        self.peer_incarnation = 0
        self.link = 0
        self._secret = secret.encode() if isinstance(secret, str) else bytes(secret)
        self._expected_peer = expected_peer
        self._seen = (seen_incarnation, seen_link)
        self._nonce = secrets.token_bytes(NONCE_SIZE)
        self._peer_nonce = b""
        self._in = bytearray()
        self._out: list[bytes] = []
        if role == "dialler":
            self.state = "dialler_await_challenge"
            self._send(Hello(PROTOCOL_VERSION, node, incarnation, *self._seen))
        else:
            self.state = "listener_await_hello"

    @property
    def is_open(self) -> bool:
        return self.state == "open"

    def data_to_send(self) -> bytes:
        """The handshake bytes queued since the last call (empty once the handshake is over)."""
        out = b"".join(self._out)
        self._out.clear()
        return out

    def encode(self, group: Group, payload: Any) -> bytes:
        """One data frame. Raises FrameTooLarge (nothing is sent) when it would exceed the limit."""
        self._check_data(group)
        return encode_frame(Data(group, payload), self.frame_size_max)

    def encode_parts(self, group: Group, payload: Any) -> tuple[bytes, ...]:
        """One data frame as the parts to write one after the other: large bytes at the end of
        the payload (the payload itself, or the last element of a list) are a part of their
        own (`encode_data_parts`); the bytes are those of `encode`."""
        tail = payload[-1] if type(payload) is list and payload else payload
        if type(tail) is bytes and len(tail) >= SPLIT_PAYLOAD_MIN:
            self._check_data(group)
            return encode_data_parts(group, payload, tail, self.frame_size_max)
        return (self.encode(group, payload),)

    def _check_data(self, group: Group) -> None:
        if self.state != "open":
            raise PeerProtocolError(f"cannot send data before the handshake completes (state {self.state})",
                                    self.peer)
        if isinstance(group, bool) or not isinstance(group, str | int):
            raise TypeError(f"group must be a str or an int, not {type(group).__name__}")

    def encode_tick(self) -> bytes:
        return encode_frame(Tick())

    def feed(self, data: bytes) -> list[Event]:
        """Bytes from the socket in; complete frames out as events. Raises PeerProtocolError."""
        if self.state == "closed":
            raise PeerProtocolError("connection is closed", self.peer)
        self._in += data
        events: list[Event] = []
        buf = self._in
        pos = 0
        try:
            while len(buf) - pos >= 4:
                (size,) = _length.unpack_from(buf, pos)
                limit = self.frame_size_max if self.state == "open" else HANDSHAKE_FRAME_SIZE_MAX
                if size > limit:
                    raise FrameTooLarge(
                        f"peer {self.peer or '(unauthenticated)'} sent a frame of {size} bytes; "
                        f"the limit in state {self.state} is {limit}", self.peer)
                if len(buf) - pos - 4 < size:
                    break
                with memoryview(buf) as view:  # one copy of the frame (a bytearray slice is a copy too)
                    body = bytes(view[pos + 4:pos + 4 + size])
                pos += 4 + size
                try:
                    frame = _decoder.decode(body)
                except msgspec.DecodeError as e:
                    raise PeerProtocolError(f"undecodable frame from {self.peer or '(unauthenticated)'}: {e}",
                                            self.peer) from None
                event = self._handle(frame)
                if event is not None:
                    events.append(event)
                if self.state == "listener_await_decision":
                    break  # the caller decides before anything further is read
        except PeerProtocolError:
            self.state = "closed"
            raise
        finally:
            del buf[:pos]
        return events

    # listener side, after PeerVerified
    def accept(self, link: int) -> None:
        assert self.state == "listener_await_decision", self.state
        self.link = link
        self._send(ChallengeAck(self._make_proof(b"listener"), link))
        self.state = "open"

    def refuse(self, reason: str) -> None:
        self._send(Refuse(reason))
        self.state = "closed"

    def pending_events(self) -> list[Event]:
        """After accept(): frames that arrived behind the handshake, decoded."""
        return self.feed(b"") if self.state == "open" else []

    def _send(self, frame: Frame) -> None:
        self._out.append(encode_frame(frame, HANDSHAKE_FRAME_SIZE_MAX))

    def _make_proof(self, role: bytes) -> bytes:
        if self.role == "dialler":
            return _proof(self._secret, role, self.node, self.peer or "", self._nonce, self._peer_nonce)
        return _proof(self._secret, role, self.peer or "", self.node, self._peer_nonce, self._nonce)

    def _handle(self, frame: Frame) -> Event | None:
        allowed = _STATES[self.state]
        if not isinstance(frame, allowed):
            raise PeerProtocolError(
                f"unexpected {type(frame).__name__} frame from {self.peer or '(unauthenticated)'} "
                f"in state {self.state}", self.peer)
        match frame:
            case Data(group, payload):
                return Message(group, payload)
            case Tick():
                return Heartbeat()
            case Hello():
                self.peer = frame.node
                self.peer_incarnation = frame.incarnation
                self._seen = (frame.seen_incarnation, frame.seen_link)
                if frame.version != PROTOCOL_VERSION:
                    self.refuse(f"unsupported protocol version {frame.version}")
                    raise HandshakeFailed(f"node {frame.node} speaks protocol version {frame.version}, "
                                          f"we speak {PROTOCOL_VERSION}", frame.node)
                if frame.node == self.node:
                    self.refuse("node name clash")
                    raise HandshakeFailed(f"a node connected under our own name {frame.node}", frame.node)
                self._send(Challenge(PROTOCOL_VERSION, self.node, self.incarnation, self._nonce))
                self.state = "listener_await_reply"
                return None
            case Challenge():
                if frame.version != PROTOCOL_VERSION:
                    raise HandshakeFailed(f"node {frame.node} speaks protocol version {frame.version}, "
                                          f"we speak {PROTOCOL_VERSION}", frame.node)
                if self._expected_peer is not None and frame.node != self._expected_peer:
                    raise HandshakeFailed(f"dialled node {self._expected_peer} but reached node {frame.node}",
                                          frame.node)
                if len(frame.nonce) != NONCE_SIZE:
                    raise HandshakeFailed(f"node {frame.node} sent a nonce of {len(frame.nonce)} bytes",
                                          frame.node)
                self.peer = frame.node
                self.peer_incarnation = frame.incarnation
                self._peer_nonce = frame.nonce
                self._send(ChallengeReply(self._nonce, self._make_proof(b"dialler")))
                self.state = "dialler_await_ack"
                return None
            case ChallengeReply():
                self._peer_nonce = frame.nonce
                if len(frame.nonce) != NONCE_SIZE or not hmac.compare_digest(
                        frame.proof, self._make_proof(b"dialler")):
                    self.refuse("invalid challenge reply")
                    raise HandshakeFailed(f"Connection attempt from node {self.peer} rejected: "
                                          "invalid challenge reply", self.peer)
                self.state = "listener_await_decision"
                return PeerVerified(self.peer or "", self.peer_incarnation, *self._seen)
            case ChallengeAck():
                if not hmac.compare_digest(frame.proof, self._make_proof(b"listener")):
                    raise HandshakeFailed(f"Connection to node {self.peer} rejected: invalid challenge ack "
                                          "(the node does not know our cluster secret)", self.peer)
                self.link = frame.link
                self.state = "open"
                return PeerUp(self.peer or "", self.peer_incarnation, frame.link)
            case Refuse(reason):
                raise HandshakeRefused(reason, self.peer)
        raise AssertionError(frame)  # pragma: no cover
