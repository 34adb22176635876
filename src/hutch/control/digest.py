"""Replica digests: what one node's copy of a replicated queue holds, in a few numbers and a hash,
so copies on different nodes can be compared (ARCHITECTURE.md: the same operations in the same
order give the same state; a copy that differs has diverged).

    GET /api/hutch/digest/{vhost}/{name}            this node's copy of the queue
    GET /api/hutch/digest/{vhost}/{name}?from=A&to=B  a stream's chunks in [A, B) only

The answer describes the copy *on the node asked* (a monitoring tool asks every node):

- **quorum queue**: the Raft index the state machine has applied, counters (ready, checked out,
  next sequence number, consumers, publishers, dead letters owed), a hash of the ready
  messages' sequence numbers in delivery order and one of the checked-out ones, and a hash of
  the whole state (`QuorumQueueState.snapshot(SNAP_DIGEST)`, canonical: equal states give equal
  bytes, wherever each member keeps its messages' contents);
- **mirrored classic queue**: the highest sequence number the copy has seen (the leader's
  last one given out) and a hash of the sequence numbers the copy holds, in order;
- **stream**: the committed offset, the first offset, and a hash of the chunks wholly in
  [from, to) (default: the whole log), each chunk's id, record count and bytes; replicas write
  every committed entry as the same chunk, so equal ranges give equal hashes.

`hutch.control.copies.compare` judges the answers of every node side by side, as the fault
campaigns (over HTTP) and the whole-cluster simulation (in process, `copy_digest`) do: copies
that reached the same point must agree.

Reading a stream's log is file I/O; it runs in a worker thread. What this must never do:
change a queue, or answer for another node's copy.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from hutch.control.errors import bad_request, not_found
from hutch.control.http import api_of, requires
from hutch.control.listing import int_param
from hutch.quorum.fifo import SNAP_DIGEST

routes = web.RouteTableDef()
STREAM_READ_BYTES = 4 << 20  # one read of a stream's log while hashing it


def hash_ints(values: Iterable[int]) -> str:
    """sha256 of a sequence of non-negative integers (order matters), hex, first 32 characters."""
    h = hashlib.sha256()
    for v in values:
        h.update(v.to_bytes(8, "big"))
    return h.hexdigest()[:32]


def quorum_digest(machine: Any, applied: int) -> dict:
    """A quorum queue member's digest from its state machine (`hutch.quorum.fifo.QuorumQueueState`)."""
    q = machine.queue
    ready = [e.seq for e in q.ready()]
    held = sorted(q.unacked)
    return {"type": "quorum", "applied": applied,
            "counters": {"ready": len(ready), "unacked": len(held), "next_seq": q.next_seq,
                         "next_msg_id": machine.next_msg_id, "consumers": len(machine.consumers),
                         "publishers": len(machine.publishers), "dlx_pending": len(machine.dlx_pending)},
            "ready_hash": hash_ints(ready), "unacked_hash": hash_ints(held),
            "state_hash": hashlib.sha256(machine.snapshot(SNAP_DIGEST)).hexdigest()[:32]}


def mirror_digest(seqs: Iterable[int], last_seq: int, role: str) -> dict:
    """A mirrored queue copy's digest: the sequence numbers it holds (leader or mirror)."""
    held = sorted(seqs)
    return {"type": "mirrored", "role": role, "applied": last_seq, "counters": {"messages": len(held)},
            "held_hash": hash_ints(held)}


def stream_digest(chunks: Iterable[tuple[int, int, bytes]], committed: int, first: int, lo: int, hi: int) -> dict:
    """A stream replica's digest: (chunk id, record count, bytes) of its chunks wholly in [lo, hi)."""
    h = hashlib.sha256()
    count = 0
    for chunk_id, records, data in chunks:
        if chunk_id < lo or chunk_id + records > hi:
            continue
        h.update(chunk_id.to_bytes(8, "big") + records.to_bytes(4, "big") + len(data).to_bytes(4, "big"))
        h.update(data)
        count += 1
    return {"type": "stream", "applied": committed, "first_offset": first, "range": [lo, hi],
            "counters": {"chunks": count}, "chunks_hash": h.hexdigest()[:32]}


def copy_digest(broker: Any, q: Any) -> dict | None:
    """The digest of this node's copy of a quorum or mirrored classic queue `q` (None when this
    node holds no copy of it). Streams are read from their logs: `replica_digest` does that."""
    cluster = broker.cluster
    if q.quorum:
        st = cluster.quorum.local_status(q.gid) if cluster is not None else None
        return quorum_digest(q.machine, st["applied"]) if q.machine is not None and st is not None else None
    copy = mirror_copy(broker, q)
    return mirror_digest(copy[1], copy[2], copy[0]) if copy is not None else None


def mirror_copy(broker: Any, q: Any) -> tuple[str, list[int], int] | None:
    """This node's copy of a mirrored classic queue `q`: its role ("leader" or "mirror"), the
    sequence numbers it holds, and the last one it saw; None when it holds no copy."""
    if q.local and getattr(q, "mirror", None) is not None:
        return "leader", list(q.live_seqs()), q.state.next_seq - 1
    cluster = broker.cluster
    m = cluster.mirroring.mirrors.get((q.vhost, q.name)) if cluster is not None else None
    return ("mirror", sorted(m.replica.seqs()), m.replica.max_seq) if m is not None else None


def _read_chunks(log: Any, lo: int, hi: int) -> list[tuple[int, int, bytes]]:
    out = []
    offset = max(lo, log.first_offset)
    while offset < hi:
        batch = log.read(offset, STREAM_READ_BYTES)
        if not batch:
            break
        for info, data in batch:
            if info.next_offset > hi:
                return out
            out.append((info.chunk_id, info.num_records, bytes(data)))
            offset = info.next_offset
    return out


def _offset_arg(request: web.Request, name: str, default: int) -> int:
    value = int_param(request, name, default)
    if value < 0:
        raise bad_request(f"{name} must be an integer offset, got {value}")
    return value


@routes.get("/api/hutch/digest/{vhost}/{name}")
@requires("monitoring")
async def replica_digest(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    v = broker.vhosts.get(request.match_info["vhost"])
    q = v.queues.get(request.match_info["name"]) if v is not None else None
    if q is None:
        raise not_found()
    cluster = broker.cluster
    here = cluster.node if cluster is not None else broker.config.node_name
    answer: dict | None = None
    if getattr(q, "stream", False):
        if q.machine is not None and q.log is not None:
            lg = q.log
            committed, first = q.machine.committed, lg.first_offset
            lo, hi = _offset_arg(request, "from", first), _offset_arg(request, "to", committed)
            chunks = await asyncio.to_thread(_read_chunks, lg, lo, min(hi, committed))
            answer = stream_digest(chunks, committed, first, lo, hi)
    else:
        answer = copy_digest(broker, q)
    if answer is None:
        return web.json_response({"node": here, "vhost": q.vhost, "name": q.name, "replica": False})
    return web.json_response({"node": here, "vhost": q.vhost, "name": q.name, "replica": True, **answer})
