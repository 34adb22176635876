"""Raft's vocabulary: log entries, hard state, snapshots and the peer messages, plus their wire codec.

Everything here is a plain value: small `msgspec.Struct` classes, encoded as compact msgpack
arrays (field order is the wire format, so fields are only ever appended). The message set is
the Raft paper's (§5 AppendEntries and RequestVote, §7 InstallSnapshot) extended the way
etcd-raft and Ra extend it: a separate heartbeat that also confirms read-index rounds (§8),
a pre-vote flag on vote requests (thesis §9.6) and TimeoutNow for leadership transfer
(thesis §3.10). Node ids are small integers; mapping node names to ids is the cluster
layer's job. This module must never do I/O: `encode`/`decode` are pure functions.
"""

from __future__ import annotations

import msgspec

NodeId = int

# Entry kinds.
ENTRY_NORMAL = 0  # an application command (empty data = the leader's no-op of its term)
ENTRY_CONF = 1  # a ConfChange, applied by the library itself when the entry is applied


class Entry(msgspec.Struct, array_like=True, gc=False, frozen=True):
    term: int
    index: int
    kind: int = ENTRY_NORMAL
    data: bytes = b""


class HardState(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """What must be on disk before any message sent after it: current term, vote, commit index."""

    term: int = 0
    vote: NodeId | None = None
    commit: int = 0


class ConfState(msgspec.Struct, array_like=True, gc=False, frozen=True):
    voters: tuple[NodeId, ...] = ()
    learners: tuple[NodeId, ...] = ()


# ConfChange operations: one member at a time (thesis §4.1, "single-server changes").
CONF_BOOTSTRAP = 0  # the first entry of a group: `nodes` are the initial voters
CONF_ADD_LEARNER = 1  # a new member that receives the log but neither votes nor counts
CONF_PROMOTE = 2  # a caught-up learner becomes a voter
CONF_REMOVE = 3  # a voter or learner leaves


class ConfChange(msgspec.Struct, array_like=True, gc=False, frozen=True):
    op: int
    nodes: tuple[NodeId, ...]


class SnapshotMeta(msgspec.Struct, array_like=True, gc=False, frozen=True):
    index: int = 0
    term: int = 0
    conf: ConfState = ConfState()


class Snapshot(msgspec.Struct, array_like=True, gc=False, frozen=True):
    meta: SnapshotMeta
    data: bytes = b""


class ReadState(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """A linearizable read may be served once the local applied index reaches `index`."""

    index: int
    ctx: bytes


# ---- peer messages ------------------------------------------------------------------------


class AppendEntries(msgspec.Struct, tag=1, array_like=True, gc=False, frozen=True):
    term: int
    frm: NodeId
    to: NodeId
    prev_index: int
    prev_term: int
    entries: list[Entry]
    commit: int


class AppendResponse(msgspec.Struct, tag=2, array_like=True, gc=False, frozen=True):
    """`index` is the follower's new match index, or the prev_index it rejected."""

    term: int
    frm: NodeId
    to: NodeId
    index: int
    reject: bool = False
    hint_index: int = 0  # on reject: the follower's last index, to skip back quickly


class Heartbeat(msgspec.Struct, tag=3, array_like=True, gc=False, frozen=True):
    term: int
    frm: NodeId
    to: NodeId
    commit: int
    read_seq: int = 0


class HeartbeatResponse(msgspec.Struct, tag=4, array_like=True, gc=False, frozen=True):
    term: int
    frm: NodeId
    to: NodeId
    read_seq: int = 0


class RequestVote(msgspec.Struct, tag=5, array_like=True, gc=False, frozen=True):
    term: int  # for a pre-vote: the term the candidate would campaign in (its term + 1)
    frm: NodeId
    to: NodeId
    last_index: int
    last_term: int
    pre_vote: bool = False
    transfer: bool = False  # a leadership transfer: ignore the leader lease


class VoteResponse(msgspec.Struct, tag=6, array_like=True, gc=False, frozen=True):
    term: int
    frm: NodeId
    to: NodeId
    granted: bool
    pre_vote: bool = False


class InstallSnapshot(msgspec.Struct, tag=7, array_like=True, gc=False, frozen=True):
    term: int
    frm: NodeId
    to: NodeId
    snapshot: Snapshot


class TimeoutNow(msgspec.Struct, tag=8, array_like=True, gc=False, frozen=True):
    term: int
    frm: NodeId
    to: NodeId


Message = (
    AppendEntries
    | AppendResponse
    | Heartbeat
    | HeartbeatResponse
    | RequestVote
    | VoteResponse
    | InstallSnapshot
    | TimeoutNow
)

GroupId = int | str


class Envelope(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """A message addressed to one group of a multi-group node."""

    group: GroupId
    msg: Message


_encoder = msgspec.msgpack.Encoder()
_msg_decoder = msgspec.msgpack.Decoder(Message)
_env_decoder = msgspec.msgpack.Decoder(Envelope)
_conf_decoder = msgspec.msgpack.Decoder(ConfChange)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    return _msg_decoder.decode(data)


def encode_envelope(group: GroupId, msg: Message) -> bytes:
    return _encoder.encode(Envelope(group, msg))


def decode_envelope(data: bytes) -> Envelope:
    return _env_decoder.decode(data)


def encode_conf_change(cc: ConfChange) -> bytes:
    return _encoder.encode(cc)


def decode_conf_change(data: bytes) -> ConfChange:
    return _conf_decoder.decode(data)


def entry_size_bytes(e: Entry) -> int:
    """What an entry counts against byte limits: its payload plus a fixed framing estimate."""
    return len(e.data) + 16
