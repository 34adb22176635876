"""hutch.raft: Raft consensus as a sans-I/O library (one group, or many per node).

`RaftGroup` is one member of one group: feed it `step(message)`, `tick()` and `propose(data)`,
then take `ready()`, persist / send / apply what it holds, and `advance()`. `MultiRaft` hosts
many groups on a node and batches their Readies so one fsync covers all of them. Messages are
msgspec structs with a msgpack codec in `hutch.raft.messages`; log storage is an interface
with an in-memory implementation in `hutch.raft.storage`. `hutch.raft.sim` is the
deterministic simulator that checks it. The package imports no other hutch layer.
"""

from hutch.raft.group import (
    CANDIDATE,
    FOLLOWER,
    LEADER,
    PRE_CANDIDATE,
    NotLeader,
    ProposalRejected,
    RaftConfig,
    RaftError,
    RaftGroup,
    RaftInvariantError,
    Ready,
)
from hutch.raft.messages import (
    CONF_ADD_LEARNER,
    CONF_PROMOTE,
    CONF_REMOVE,
    ConfChange,
    Entry,
    HardState,
    ReadState,
    Snapshot,
    decode,
    decode_envelope,
    encode,
    encode_envelope,
)
from hutch.raft.multi import MultiRaft, MultiReady
from hutch.raft.storage import LogStorage, MemoryStorage, bootstrap_log, bootstrap_memory_storage

__all__ = [
    "CANDIDATE", "FOLLOWER", "LEADER", "PRE_CANDIDATE", "CONF_ADD_LEARNER", "CONF_PROMOTE", "CONF_REMOVE",
    "ConfChange", "Entry", "HardState", "LogStorage", "MemoryStorage", "MultiRaft", "MultiReady", "NotLeader",
    "ProposalRejected", "RaftConfig", "RaftError", "RaftGroup", "RaftInvariantError", "ReadState", "Ready",
    "Snapshot", "bootstrap_log", "bootstrap_memory_storage", "decode", "decode_envelope", "encode",
    "encode_envelope",
]
