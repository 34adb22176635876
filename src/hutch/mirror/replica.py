"""The operations a mirrored queue's leader sends round its GM ring, and a mirror's copy.

The leader applies every change to its `QueueState` and records the same change as an
operation here; once per loop iteration the operations go out in one GM broadcast, so every
mirror applies them in the leader's order (ARCHITECTURE.md: one queue model, replicated).
A mirror does not need the leader's dispatch decisions, only their outcome, so its copy is a
map from the leader's sequence numbers to entries:

    ["E", seq, exchange, routing_key, props, body, persistent, priority, expiration_ms,
          expires_at_ms, origin, token]          a message joined the queue (origin/token: the
                                                 publishing node's id for it, to deduplicate)
    ["K", [seq, ...]]                            checked out to a consumer (delivery count + 1)
    ["X", [seq, ...]]                            left the queue (ack, reject, expiry, purge, drop)
    ["Y", [[E fields..., delivery_count], ...]]  sync: messages the mirror may lack, oldest first
    ["YD", floor]                                sync done (the leader waits for this to be stable)
    ["H", floor, [seq, ...]]                     a new leader's head: drop what is below `floor`
                                                 except the listed seqs (the leader lacks it)
    ["V", view]                                  the leader's view: who mirrors, since when, synced
    ["Z"]                                        the queue is deleted: its leader leaves, no failover

A mirror that joined late simply lacks the head: operations on seqs it does not hold are
ignored. Whether a message is checked out or ready does not matter to a mirror (a promoted
mirror returns every checked-out message, marked redelivered), so returns are not sent; only
the delivery counts are kept. On promotion the entries are handed to a new `QueueState` in
sequence order, keeping their numbers, so the other mirrors' copies stay keyed the same way.

Nothing here does I/O.
"""

from __future__ import annotations

from collections import deque

import msgspec

from hutch.queues.message import Message

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()
TOKENS_KEPT = 65536  # publish ids remembered for deduplication after a promotion


def encode_ops(ops: list) -> bytes:
    return _enc.encode(ops)


def decode_ops(data: bytes) -> list:
    return _dec.decode(data)


def enqueue_op(seq: int, m: Message, expires_at_ms: int | None, origin: str, token: int) -> list:
    return ["E", seq, m.exchange, m.routing_key, m.props, m.body, m.persistent, m.priority, m.expiration_ms,
            expires_at_ms, origin, token]


class MirrorEntry:
    __slots__ = ("seq", "exchange", "routing_key", "props", "body", "persistent", "priority", "expiration_ms",
                 "expires_at_ms", "delivery_count")

    def __init__(self, op: list, delivery_count: int = 0):
        (_tag, self.seq, self.exchange, self.routing_key, self.props, self.body, self.persistent, self.priority,
         self.expiration_ms, self.expires_at_ms) = op[:10]
        self.delivery_count = delivery_count


class Replica:
    """A mirror's copy of its queue, built from the leader's operations."""

    def __init__(self) -> None:
        self.entries: dict[int, MirrorEntry] = {}
        self.max_seq = 0
        self.tokens: dict[tuple[str, int], None] = {}  # recent publishes, oldest first
        self.view: list = []  # the leader's last view (see MirrorHost)
        self.deleted = False  # the leader said: the queue is deleted (its leaving is no failure)

    def __len__(self) -> int:
        return len(self.entries)

    def apply(self, ops: list) -> None:
        for op in ops:
            tag = op[0]
            if tag == "E":
                self._add(MirrorEntry(op))
                if op[10]:
                    self._remember(op[10], op[11])
            elif tag == "K":
                for seq in op[1]:
                    e = self.entries.get(seq)
                    if e is not None:
                        e.delivery_count += 1
            elif tag == "X":
                for seq in op[1]:
                    self.entries.pop(seq, None)
            elif tag == "Y":
                for item in op[1]:
                    if item[1] not in self.entries:
                        self._add(MirrorEntry(item, item[12]))
            elif tag == "YD":
                pass  # the leader's marker: once it is stable, every mirror has the sync's messages
            elif tag == "H":  # a new leader: what it lacks goes
                keep = set(op[2])
                for seq in [s for s in self.entries if s < op[1] and s not in keep]:
                    del self.entries[seq]
            elif tag == "V":
                self.view = op[1]
            elif tag == "Z":
                self.deleted = True

    def _add(self, e: MirrorEntry) -> None:
        if e.seq in self.entries:
            return
        self.entries[e.seq] = e
        if e.seq > self.max_seq:
            self.max_seq = e.seq

    def _remember(self, origin: str, token: int) -> None:
        t = self.tokens
        t[(origin, token)] = None
        if len(t) > TOKENS_KEPT:
            del t[next(iter(t))]

    def in_order(self) -> list[MirrorEntry]:
        """Every entry by sequence number: what a promoted mirror's queue starts from."""
        return [self.entries[s] for s in sorted(self.entries)]


class Backlog:
    """Broadcasts not yet stable and what waits on them (confirms, tx.commit-ok)."""

    __slots__ = ("waiters", "unstable_msgs", "sizes")

    def __init__(self) -> None:
        self.waiters: deque = deque()  # (gm seq, fn, arg)
        self.unstable_msgs = 0
        self.sizes: deque = deque()  # (gm seq, messages in it)

    def sent(self, gm_seq: int, messages: int) -> None:
        if messages:
            self.sizes.append((gm_seq, messages))
            self.unstable_msgs += messages

    def stable(self, gm_seq: int) -> list:
        while self.sizes and self.sizes[0][0] <= gm_seq:
            self.unstable_msgs -= self.sizes.popleft()[1]
        out = []
        w = self.waiters
        while w and w[0][0] <= gm_seq:
            out.append(w.popleft())
        return out
