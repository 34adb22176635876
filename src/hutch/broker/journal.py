"""The message journal: persistent messages of durable classic queues, on the node's segment log.

What is written (msgpack records, keyed by the queue's journal id):

    E  enqueue   [queue id, exchange, routing key, properties, body]
    V  delivered [queue id, [E seqs]]   first delivery: the messages come back `redelivered`
    A  settled   [queue id, [E seqs]]   acked, or discarded (reject, expiry, overflow)
    P  purged    [queue id, [E seqs]]   a purge or a deleted queue's remains
    D  delivered below [0, seq]        every E record before `seq` may have been delivered

(A V or A record written before batching holds one E seq instead of a list; both are read.)

Only persistent messages (delivery_mode 2) on durable queues are journalled; the rest live in
memory only and die with the node, as in RabbitMQ. A publisher's confirm for a journalled
message is sent once an fsync covers its E record (group commit: one fsync per loop iteration
covers every record written before it).

Deliveries and settles are batched: `delivered` and `settled` note the message, and `flush`,
once per loop iteration before the fsync is asked for, releases the settled E records and
writes one V and one A record per queue for all of them. A message delivered and settled
within one iteration gets no V record at all. So draining a backlog writes two records per loop
iteration rather than two per message, and keeps as many guards.

The log forgets released records by deleting whole segments. An E record is released when its
message is settled; the A/V/P records that refer to it ("guards") must outlive it on disk, so a
restart can never revive a settled message. A guard in the same segment as the E records it
refers to is released with them (the segment goes as a whole); a guard in a later segment stays
live until the earlier segment is deleted. Guards always point back, so segments never wait on
each other in a cycle. Recovery replays the log: every E without a matching A or P is a message
still queued, `redelivered` if a V was seen.

A V record is not fsynced before its message goes out, so a node that stops without closing
the journal (a crash, a power loss) may have delivered messages whose V records never reached
the disk. The segment log says whether it was closed cleanly (its `CLEAN` file, left by a
close after the last fsync and removed when the log opens). Opened after a stop without a
clean close, the journal counts every message it recovers as delivered, and writes one D
record saying so, so that the mark outlives the next restart too, clean or not. Only the
newest D record counts; it stays live, and the compactor keeps it when it rewrites its
segment, as any live record. The flag is then set on some messages that were never
delivered, which AMQP allows (it means "may have been delivered"); a redelivery without it
is what must never happen.

A node whose catalogue has not caught up when it starts may not know some of its durable
queues yet (their declaration is applied late): `recover_refs(keep_unknown=True)` then keeps
the messages of every queue it was not asked for, and the queue takes them when it is made
(`take_orphans`), instead of releasing them as a deleted queue's.

A mirror of a durable mirrored queue (hutch.mirror.mirror) keeps the persistent messages of its
copy in the same log, in a namespace of its own: records of kinds that no queue writes, keyed
by a copy id (random, one per copy) rather than by a queue's journal id:

    MH header    [copy id, vhost, queue, queue's journal id, leader's epoch]
    ME enqueue   [copy id, exchange, routing key, properties, body, leader seq, priority,
                  expiration ms, expires at ms]
    MP removed   [copy id, [record seqs]]   messages (or the header) that left the copy
    MA adopted   [copy id, queue's journal id]   a promotion begins to write the copy into
                                                 that queue's E records

MP records guard the ME records they name as A/P guard E records. Recovery collects every copy
whose header survives (`mirror_copies`, by vhost and queue); the mirror claims its own with
`take_mirror_copy`, and copies nobody claims are dropped with `drop_mirror_copy`. A promotion
writes MA, then the copy's messages as E records of the queue, then the MP record that drops
the copy, header first: a copy that survives a crash beside its MA record was not wholly
written into the queue, and the queue's E records after the MA are a part of it (the log keeps
a prefix of what was written), which the node's boot replaces with the whole copy.

Disk-first queues (hutch.queues.paging) keep only the E record's seq of a paged persistent
message and read the message back with `read_enqueue` (the segment log checks its CRC); at
boot `recover_refs` returns each surviving message as its seq, size and flags, without its
body, so a queue can page its backlog instead of holding it. Other paged messages go to the
`ScratchLog`: a second segment log that is never fsynced and is wiped at every boot.

One message that stays queued for long keeps its whole segment on disk, and with it the
guards in later segments that point into it. A compactor thread owned by the journal rewrites
mostly-settled sealed segments every `COMPACT_INTERVAL_S`, keeping only their live records
(same seqs), so such a message costs its own bytes rather than a segment's, and the guards that
pointed at the dropped E records are released at the next `collect()`. Where no thread may
run (the whole-cluster simulation, hutch.sim.cluster), `compactor_thread` is set False before
the journal opens and its owner calls `compact_step()` every `COMPACT_INTERVAL_S` instead.
"""

from __future__ import annotations

import logging
import shutil
import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from hutch.amqp import codec
from hutch.amqp.spec import AMQPError
from hutch.queues.columns import KeyedColumns
from hutch.store import SegmentLog, StoreError

log = logging.getLogger("hutch.journal")

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()

GUARD_CHECK_MAX = 4096  # guard records examined per collect() call
MIRROR_REMOVED_PER_RECORD = 65536  # seqs in one MP record (a dropped copy of millions takes several)
SEQS_PER_RECORD = 65536  # E seqs in one V or A record
COMPACT_INTERVAL_S = 2.0  # the compactor's pace; each pass copies at most one segment's live bytes


@dataclass
class RecoveredMessage:
    log_seq: int
    exchange: str
    routing_key: str
    props: bytes
    body: bytes
    delivered: bool


@dataclass
class MirrorCopy:
    """A mirror's copy as recovered: its header and its surviving messages by reference, ME
    record seq -> the leader's seq of its message, in log order (`CopyRefs`). The messages stay
    on disk (`read_mirror_enqueue` reads one back), so a copy of millions costs a few bytes each."""

    copy_id: int
    header_seq: int
    vhost: str
    name: str
    queue_journal_id: int
    epoch: int
    items: CopyRefs
    adopted_seq: int = 0  # its newest MA record: a promotion began to write it into its queue


class _MirrorEnqueueRef(msgspec.Struct, array_like=True, gc=False):
    """The head of an ME record as recovery reads it: the message's fields are left undecoded
    (msgspec.Raw views, dropped at once) and the fields after `seq` are not read."""

    kind: str
    copy_id: int
    exchange: msgspec.Raw
    routing_key: msgspec.Raw
    props: msgspec.Raw
    body: msgspec.Raw
    seq: int


_me_ref_dec = msgspec.msgpack.Decoder(_MirrorEnqueueRef)


class _EnqueueRef(msgspec.Struct, array_like=True, gc=False):
    """An E record as recovery reads it: the properties (for expiration and priority) and the
    body's extent, not the body (a msgspec.Raw view, dropped at once)."""

    kind: str
    queue_id: int
    exchange: msgspec.Raw
    routing_key: msgspec.Raw
    props: bytes
    body: msgspec.Raw


_e_ref_dec = msgspec.msgpack.Decoder(_EnqueueRef)
_BIN_HEADER_BYTES = {0xC4: 2, 0xC5: 3, 0xC6: 5}  # msgpack bin 8/16/32: type byte and length


class Unreadable(Exception):
    """A stored message could not be read back: its record is corrupt, gone, or not a message."""


# recover_refs packs what it keeps of a surviving message into one int: size | flags
REF_SIZE_MASK = (1 << 40) - 1
REF_DELIVERED = 1 << 40
REF_EXPIRATION = 1 << 41  # its properties carry `expiration` (read it back to know when it expires)
REF_PRIORITY_SHIFT = 42  # bits 42-49: its `priority` property (0 without one), for a priority queue's levels


def _has_expiration(props: bytes) -> bool:
    """The basic properties' flag word has bit 8 (expiration) set: byte 0, bit 0."""
    return len(props) >= 2 and bool(props[0] & 0x01)


def _priority_of(props: bytes) -> int:
    """The basic properties' priority (flag bit 11: byte 0, bit 3), 0 without one or when the
    list does not parse (the message is then delivered as one of priority 0, as before)."""
    if len(props) < 3 or not props[0] & 0x08:
        return 0
    try:
        return min(codec.summarize_properties(props).priority, 255)
    except AMQPError:
        return 0


def _message_of(payload: bytes, kind: str) -> tuple[str, str, bytes, bytes]:
    try:
        item = _dec.decode(payload)
    except msgspec.DecodeError as e:
        raise Unreadable(f"undecodable record: {e}") from None
    if not isinstance(item, (list, tuple)) or len(item) < 6 or item[0] != kind:
        raise Unreadable("not a message record")
    return item[2], item[3], item[4], item[5]


class Journal:
    compactor_thread = True  # False: nothing runs in a thread; the owner calls compact_step()

    def __init__(self, directory: str, segment_bytes_max: int = 64 * 1024 * 1024):
        # (guard record seq, E seqs it protects): released once none of them is on disk
        self._guards: deque[tuple[int, list[int]]] = deque()
        self._delivered: dict[int, int] = {}  # E seq -> its V record, while the message is queued
        # a V record's messages still queued, and those settled since (the guard's E seqs once none is left)
        self._v_left: dict[int, int] = {}
        self._v_settled: dict[int, list[int]] = {}
        # what the log's records say, gathered while the log recovers (read once), until
        # `recover_refs` is told which queues there are
        self._replay: _Replay | None = _Replay(self)
        self.log = SegmentLog(directory, segment_bytes_max=segment_bytes_max, visit=self._replay.visit)
        # False after a crash or a power loss: recovery counts every message as delivered
        self.closed_cleanly = self.log.closed_cleanly
        # noted since the last flush: E seq -> queue id (delivered), queue id -> E seqs (settled)
        self._to_deliver: dict[int, int] = {}
        self._to_settle: dict[int, list[int]] = {}
        self.appended = 0
        self.synced_seq = self.log.durable_seq
        self._deleted_at_collect = self.log.segments_deleted
        self.mirror_copies: dict[tuple[str, str], MirrorCopy] = {}  # recovered, not claimed yet
        self.orphans: dict[int, _RefTable] = {}  # queue id -> messages kept for a queue declared late
        self._stop = threading.Event()
        self._compactor = threading.Thread(target=self._compact_loop, name="journal-compactor", daemon=True)

    # ---------------------------------------------------------------- writing

    def enqueue(self, queue_id: int, exchange: str, routing_key: str, props: bytes, body: bytes) -> int:
        self.appended += 1
        return self.log.append(_enc.encode(("E", queue_id, exchange, routing_key, props, body)), queue_id)

    def read_enqueue(self, e_seq: int) -> tuple[str, str, bytes, bytes]:
        """(exchange, routing key, properties, body) of the E record `e_seq`, read back from the
        log with its CRC checked. Raises Unreadable."""
        try:
            rec = self.log.read(e_seq)
        except (StoreError, OSError) as e:
            raise Unreadable(str(e)) from None
        return _message_of(rec.payload, "E")

    def read_enqueues(self, e_seqs: list[int]) -> list[tuple[str, str, bytes, bytes] | Unreadable]:
        """`read_enqueue` of many E records at once (`SegmentLog.read_many`: records that lie
        together come from one read), each the message or the Unreadable it would raise."""
        try:
            recs = self.log.read_many(e_seqs)
        except (StoreError, OSError) as e:
            return [Unreadable(str(e)) for _ in e_seqs]
        out: list[tuple[str, str, bytes, bytes] | Unreadable] = []
        for rec in recs:
            if isinstance(rec, StoreError):
                out.append(Unreadable(str(rec)))
                continue
            try:
                out.append(_message_of(rec.payload, "E"))
            except Unreadable as e:
                out.append(e)
        return out

    def delivered(self, queue_id: int, e_seq: int) -> None:
        """The message's first delivery: its V record goes out with the next `flush`."""
        self._to_deliver[e_seq] = queue_id

    def settled(self, queue_id: int, e_seq: int) -> None:
        """The message left its queue for good: with the next `flush` its E record is released
        and its A record written (durable, like any record, once the fsync after it has run)."""
        self._to_deliver.pop(e_seq, None)  # delivered and settled since the last flush: no V record
        settles = self._to_settle.get(queue_id)
        if settles is None:
            self._to_settle[queue_id] = [e_seq]
        else:
            settles.append(e_seq)

    def flush(self) -> None:
        """Write the V and A records of what was delivered and settled since the last flush: one
        of each per queue (per `SEQS_PER_RECORD` messages). The loop thread calls it once per
        iteration, before it asks for the fsync; `collect`, `close` and `after_sync`'s callers
        rely on it too."""
        to_deliver = self._to_deliver
        if to_deliver:
            self._to_deliver = {}
            by_queue: dict[int, list[int]] = {}
            for e, qid in to_deliver.items():
                if e in self._delivered:
                    continue  # a V record names it already
                seqs = by_queue.get(qid)
                if seqs is None:
                    by_queue[qid] = [e]
                else:
                    seqs.append(e)
            delivered, v_left, v_settled = self._delivered, self._v_left, self._v_settled
            for qid, seqs in by_queue.items():
                for i in range(0, len(seqs), SEQS_PER_RECORD):
                    chunk = seqs[i:i + SEQS_PER_RECORD]
                    v = self.log.append(_enc.encode(("V", qid, chunk)), qid)
                    v_left[v] = len(chunk)
                    v_settled[v] = []
                    for e in chunk:
                        delivered[e] = v
        to_settle = self._to_settle
        if to_settle:
            self._to_settle = {}
            for qid, seqs in to_settle.items():
                self.log.release_many(seqs)
                for i in range(0, len(seqs), SEQS_PER_RECORD):
                    chunk = seqs[i:i + SEQS_PER_RECORD]
                    a = self.log.append(_enc.encode(("A", qid, chunk)), qid)
                    for v, deps in self._settle_delivered(chunk):
                        self._guard(v, deps)
                    self._guard(a, chunk)  # (last: it trims the list it is given)

    def _settle_delivered(self, e_seqs: list[int]) -> list[tuple[int, list[int]]]:
        """These messages are settled or purged. Returns the V records that named them and now
        name no queued message, each with its E seqs: guards, to go once those are off the disk."""
        done = []
        delivered, v_left, v_settled = self._delivered, self._v_left, self._v_settled
        for e in e_seqs:
            v = delivered.pop(e, None)
            if v is None:
                continue
            v_settled[v].append(e)
            left = v_left[v] - 1
            if left:
                v_left[v] = left
            else:
                del v_left[v]
                done.append((v, v_settled.pop(v)))
        return done

    def purged(self, queue_id: int, e_seqs: list[int]) -> None:
        if not e_seqs:
            return
        p = self.log.append(_enc.encode(("P", queue_id, e_seqs)), queue_id)
        to_deliver = self._to_deliver
        for s in e_seqs:
            self.log.release(s)
            to_deliver.pop(s, None)
        self._guard(p, list(e_seqs))
        for v, deps in self._settle_delivered(e_seqs):
            self._guard(v, deps)

    # ---------------------------------------------------------------- mirror copies

    def mirror_header(self, copy_id: int, vhost: str, name: str, queue_journal_id: int, epoch: int) -> int:
        return self.log.append(_enc.encode(("MH", copy_id, vhost, name, queue_journal_id, epoch)), copy_id)

    def mirror_enqueue(self, copy_id: int, exchange: str, routing_key: str, props: bytes, body: bytes, seq: int,
                       priority: int, expiration_ms: int | None, expires_at_ms: int | None) -> int:
        self.appended += 1
        return self.log.append(_enc.encode(("ME", copy_id, exchange, routing_key, props, body, seq, priority,
                                            expiration_ms, expires_at_ms)), copy_id)

    def read_mirror_enqueue(self, record_seq: int) -> tuple[str, str, bytes, bytes, int, int | None, int | None] | None:
        """A mirror copy's message back from its ME record (CRC checked): exchange, routing key,
        properties, body, priority, per-message TTL, expiry time. None when it cannot be read
        (a corrupt or missing record; the caller logs it with its queue)."""
        try:
            item = _dec.decode(self.log.read(record_seq).payload)
        except (StoreError, OSError, msgspec.DecodeError):
            return None
        if not isinstance(item, (list, tuple)) or len(item) < 10 or item[0] != "ME":
            return None
        return item[2], item[3], item[4], item[5], item[7], item[8], item[9]

    def mirror_adopted(self, copy_id: int, queue_journal_id: int) -> int:
        """A promotion begins to write this copy into the queue's E records (MA)."""
        return self.log.append(_enc.encode(("MA", copy_id, queue_journal_id)), copy_id)

    def mirror_removed(self, copy_id: int, record_seqs: list[int]) -> None:
        """These ME records (or a header) left the copy: one MP record guards them all."""
        for i in range(0, len(record_seqs), MIRROR_REMOVED_PER_RECORD):
            chunk = record_seqs[i:i + MIRROR_REMOVED_PER_RECORD]
            p = self.log.append(_enc.encode(("MP", copy_id, chunk)), copy_id)
            for s in chunk:
                self.log.release(s)
            self._guard(p, list(chunk))

    def take_mirror_copy(self, vhost: str, name: str) -> MirrorCopy | None:
        return self.mirror_copies.pop((vhost, name), None)

    def shelve_mirror_copy(self, copy_id: int, header_seq: int, vhost: str, name: str, queue_journal_id: int,
                           epoch: int, items: Iterable[tuple[int, int]], adopted_seq: int = 0) -> None:
        """A running mirror's copy goes back among the recovered ones (its node stopped mirroring
        the queue; a mirror made again may take it). It replaces an older one of the queue.
        `items`: (ME record seq, leader seq) of its messages, in record order."""
        old = self.mirror_copies.pop((vhost, name), None)
        if old is not None:
            self.drop_mirror_copy(old)
        refs = CopyRefs()
        for log_seq, seq in items:
            refs[log_seq] = seq
        self.mirror_copies[(vhost, name)] = MirrorCopy(copy_id, header_seq, vhost, name, queue_journal_id, epoch, refs,
                                                       adopted_seq)

    def drop_mirror_copy(self, copy: MirrorCopy) -> None:
        """Header first: a copy is gone as soon as its header is (see MA above)."""
        self.mirror_removed(copy.copy_id, [copy.header_seq, *([copy.adopted_seq] if copy.adopted_seq else []),
                                           *copy.items])
        copy.items = CopyRefs()

    def _guard(self, g: int, deps: list[int]) -> None:
        """Release the guard record g now if its released E records share its segment (or are
        gone); otherwise keep it until their segment is deleted."""
        deps.sort()  # (SegmentLog.outlives takes them in order)
        if self._needed(g, deps):
            self._guards.append((g, deps))
        else:
            self.log.release(g)

    def _needed(self, g: int, deps: list[int]) -> bool:
        return self.log.outlives(g, deps)

    @property
    def unsynced(self) -> bool:
        """Records appended and not yet fsynced (call `flush` first: what it would write counts
        only once written)."""
        return self.log.last_seq > self.synced_seq

    def sync(self) -> int:
        """fsync (may run in a worker thread). Returns the highest durable seq."""
        return self.log.sync()

    def collect(self, force: bool = False) -> int:
        """Release guard records whose E records are all gone from disk. Returns how many.

        E records only leave the disk when a whole segment is deleted, so this does nothing
        until the log has lost a segment since the last look (or `force`). Guards are examined
        oldest first and the scan stops at the first one still needed: E records die roughly
        in the order they were written."""
        self.flush()
        deleted = self.log.segments_deleted
        if not force and deleted == self._deleted_at_collect:
            return 0
        n = 0
        guards = self._guards
        misses = 0
        checked = min(len(guards), GUARD_CHECK_MAX)
        for _ in range(checked):
            g, deps = guards[0]
            if self._needed(g, deps):
                misses += 1
                if misses > 16:
                    break
                guards.rotate(-1)
                continue
            guards.popleft()
            self.log.release(g)
            n += 1
        if misses > 16 or checked < GUARD_CHECK_MAX or not guards:
            self._deleted_at_collect = deleted  # caught up: wait for the next deleted segment
        # else the bound stopped a scan that was still releasing: the next call goes on (a drained
        # backlog's settles, in later segments than their messages, leave a segment's worth of
        # guards, some 120,000 for 1 KiB messages, when its segment goes)
        return n

    def compact(self) -> None:
        self.collect(force=True)
        self.log.compact()

    def _compact_loop(self) -> None:
        """The compactor thread: store calls only (the guard list belongs to the loop thread)."""
        while not self._stop.wait(COMPACT_INTERVAL_S):
            if not self.compact_step():
                return

    def compact_step(self) -> bool:
        """One round of the compactor; False once it has failed (no further compaction)."""
        if self._stop.is_set():
            return False
        try:
            self.log.compact(quiet_only=True)  # a segment still being settled is left to go whole
        except Exception:  # a failed store is reported by the next sync; stop rewriting
            log.exception("Message journal: compaction failed; no further compaction")
            self._stop.set()
            return False
        return True

    def close(self) -> None:
        self._stop.set()
        if self._compactor.is_alive():
            self._compactor.join()
        try:
            self.flush()
        except StoreError:
            pass  # a failed log: its sync has reported it, and nothing more is written
        self.log.close()

    # ---------------------------------------------------------------- recovery

    def recover(self, live_queue_ids: Iterable[int]) -> dict[int, list[RecoveredMessage]]:
        """As `recover_refs`, with every surviving message read back whole (for tests and small
        journals; a node recovers by reference)."""
        out: dict[int, list[RecoveredMessage]] = {}
        for qid, refs in self.recover_refs(live_queue_ids).items():
            items = list(refs.items())
            msgs = self.read_enqueues([seq for seq, _ref in items])
            out[qid] = [RecoveredMessage(seq, *m, bool(ref & REF_DELIVERED))
                        for (seq, ref), m in zip(items, msgs, strict=True) if not isinstance(m, Unreadable)]
        return out

    def recover_refs(self, live_queue_ids: Iterable[int], keep_unknown: bool = False) -> dict[int, _RefTable]:
        """The messages still queued, per queue id, without their bodies: a table of E seq ->
        size | flags (REF_DELIVERED, REF_EXPIRATION) | priority << REF_PRIORITY_SHIFT whose
        `items()` come in publish order, about six bytes a message, so a node can come back with
        a backlog far larger than its memory; read the messages with `read_enqueue`. Called
        once, after the journal is opened (which read the log: this reads nothing more).

        Records of queues that no longer exist, and every record that only settles something,
        are released or kept as guards so the log can shrink. `keep_unknown`: the messages of
        queues not in `live_queue_ids` are kept, not released, for `take_orphans` (the node's
        catalogue is behind: such a queue may be declared late). They are released at a later
        start that does not ask for them."""
        live = set(live_queue_ids)
        found = self._finish_recovery(None if keep_unknown else live)
        self.orphans = {qid: refs for qid, refs in found.items() if qid not in live}
        return {qid: refs for qid, refs in found.items() if qid in live}

    def take_orphans(self, queue_id: int) -> _RefTable | None:
        """The messages `recover_refs(keep_unknown=True)` kept for a queue it did not know."""
        return self.orphans.pop(queue_id, None)

    def _mark_delivered_below(self, pending: dict[int, _RefTable], delivered_below: int,
                              d_seqs: list[int]) -> list[int]:
        """Flag the recovered messages the newest D record names, or after a stop without a clean
        close all of them, writing the D record that says so. Returns the D records no longer
        needed: all but the newest. That one stays even when no queue recovered here needs it,
        for a queue this start does not know yet (its catalogue behind) may come back later."""
        if not self.closed_cleanly and self.log.last_seq:
            delivered_below = self.log.last_seq + 1
            self.log.append(_enc.encode(("D", 0, delivered_below)))
            stale = d_seqs
        else:
            stale = d_seqs[:-1]
        marked = sum(q.flag_delivered_below(delivered_below) for q in pending.values()) if delivered_below else 0
        if marked and not self.closed_cleanly:
            log.warning("Message journal: not closed cleanly; %d recovered message(s) will be delivered as "
                        "redelivered", marked)
        return stale

    def _finish_recovery(self, live_queue_ids: Iterable[int] | None) -> dict[int, _RefTable]:
        """Every queue's surviving messages, from what the log's recovery handed `_Replay`; the
        messages of queues not in `live_queue_ids` are released (None: every queue is live).
        Writes what recovery decided (a D record) and starts the compactor."""
        rp = self._replay
        if rp is None:
            raise RuntimeError("the journal was recovered already")
        self._replay = None
        pending, dead, copies = rp.pending, rp.dead, rp.copies
        if live_queue_ids is not None:
            live = set(live_queue_ids)
            for qid in [qid for qid in pending if qid not in live]:  # a deleted queue's remains
                seqs = [seq for seq, _ref in pending.pop(qid).items()]
                dead.extend(seqs)
                for v, deps in self._settle_delivered(seqs):  # V records naming them guard them now
                    rp.settles.append((v, qid, deps))
        self.mirror_copies = {}
        for c in copies.values():
            if not c.header_seq:  # its header was removed: the copy was dropped
                dead.extend(c.items)
                if c.adopted_seq:
                    dead.append(c.adopted_seq)
                continue
            old = self.mirror_copies.get((c.vhost, c.name))
            if old is not None:  # two copies of one queue: the later one counts
                if old.header_seq > c.header_seq:
                    old, c = c, old
                dead.extend(old.items)
                dead.append(old.header_seq)
                if old.adopted_seq:
                    dead.append(old.adopted_seq)
            self.mirror_copies[(c.vhost, c.name)] = c
        dead.extend(self._mark_delivered_below(pending, rp.delivered_below, rp.d_seqs))
        for s in dead:
            if self.log.is_live(s):
                self.log.release(s)
        for g, _qid, deps in rp.settles:
            self._guard(g, deps)
        self.collect(force=True)
        self.synced_seq = self.log.durable_seq
        if self.compactor_thread and not self._compactor.is_alive():
            self._compactor.start()  # after the replay: nothing rewrites segments under it
        return {qid: msgs for qid, msgs in pending.items() if msgs}


class _Replay:
    """What the journal rebuilds from its records while its log recovers (`SegmentLog`'s
    `visit`: the log is read once, checked and replayed in one pass): every queue's surviving
    messages as a `_RefTable`, the mirror copies, and the records found no longer needed
    (`dead`) or guarding others (`settles`). The journal's delivered-message bookkeeping is
    rebuilt as it goes; `Journal._finish_recovery` does the rest once the queues are known."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.delivered_below = 0  # the seq the newest D record names
        self.d_seqs: list[int] = []  # every D record's own
        self.pending: dict[int, _RefTable] = {}
        self.settles: list[tuple[int, int, list[int]]] = []  # (record seq, queue, E seqs)
        self.dead: list[int] = []
        self.copies: dict[int, MirrorCopy] = {}

    def _copy(self, copy_id: int) -> MirrorCopy:
        c = self.copies.get(copy_id)
        if c is None:
            c = self.copies[copy_id] = MirrorCopy(copy_id, 0, "", "", 0, 0, CopyRefs())
        return c

    def visit(self, seq: int, _key: int, payload: memoryview) -> None:
        if payload[1:3] == b"\xa1E":  # a message (the most of a backlog): read without its body
            try:
                e = _e_ref_dec.decode(payload)
                body = len(e.body)
                body -= _BIN_HEADER_BYTES[payload[len(payload) - body]]
            except (msgspec.DecodeError, KeyError):
                pass  # decoded the general way below, to be reported as the others are
            else:
                q = self.pending.get(e.queue_id)
                if q is None:
                    q = self.pending[e.queue_id] = _RefTable()
                props = e.props
                q.add(seq, body, _has_expiration(props), _priority_of(props))
                return
        if payload[1:4] == b"\xa2ME":  # a mirror copy's message: only its seqs are kept
            try:
                me = _me_ref_dec.decode(payload)
            except msgspec.DecodeError:
                pass  # decoded the general way below, to be reported as the others are
            else:
                self._copy(me.copy_id).items[seq] = me.seq
                return
        try:
            item = _dec.decode(payload)
        except msgspec.DecodeError:
            log.error("Message journal: undecodable record %d skipped", seq)
            self.dead.append(seq)
            return
        kind, qid = item[0], item[1]
        if kind == "E":  # one the reader above could not take
            log.error("Message journal: malformed message record %d skipped", seq)
            self.dead.append(seq)
        elif kind == "V":
            j = self.journal
            q = self.pending.get(qid)
            queued: list[int] = []
            gone: list[int] = []
            for s in (item[2] if isinstance(item[2], list) else [item[2]]):
                if q is not None and s in q:
                    q.set_delivered(s)
                    queued.append(s)
                else:
                    gone.append(s)
            if queued:
                j._v_left[seq] = len(queued)
                j._v_settled[seq] = gone
                for s in queued:
                    j._delivered[s] = seq
            else:
                self.settles.append((seq, qid, gone))
        elif kind == "A" or kind == "P":
            q = self.pending.get(qid)
            seqs = item[2] if isinstance(item[2], list) else [item[2]]
            for s in seqs:
                if q is not None and q.pop(s, None) is not None:
                    self.dead.append(s)
            self.settles.append((seq, qid, list(seqs)))
            for v, deps in self.journal._settle_delivered(seqs):
                self.settles.append((v, qid, deps))
        elif kind == "D":
            self.d_seqs.append(seq)
            self.delivered_below = item[2]  # each D names a later seq than the one before
        elif kind == "ME":  # one the mirror copy's reader above could not take
            log.error("Message journal: malformed mirror copy record %d skipped", seq)
            self.dead.append(seq)
        elif kind == "MH":
            c = self._copy(qid)
            if c.header_seq:  # a newer header replaces the older (which the mirror released)
                self.dead.append(c.header_seq)
            c.header_seq, c.vhost, c.name, c.queue_journal_id, c.epoch = seq, item[2], item[3], item[4], item[5]
        elif kind == "MA":
            c = self._copy(qid)
            if c.adopted_seq:
                self.dead.append(c.adopted_seq)
            c.adopted_seq = seq
        elif kind == "MP":
            c = self.copies.get(qid)
            for s in item[2]:
                if c is not None:
                    if c.items.pop(s, None) is not None:
                        self.dead.append(s)
                    elif s == c.header_seq:
                        c.header_seq = 0
                        self.dead.append(s)
                    elif s == c.adopted_seq:
                        c.adopted_seq = 0
                        self.dead.append(s)
            self.settles.append((seq, qid, list(item[2])))


class _RefTable(KeyedColumns):
    """One queue's surviving messages during `recover_refs`, about six bytes a message instead of
    a dict entry's hundred: E seq -> size, flags (delivered, expiration) as the mark and, once
    one has a priority, a priority byte each."""

    _DELIVERED, _EXPIRATION = 1, 2

    __slots__ = ("prios",)

    def __init__(self) -> None:
        super().__init__()
        self.prios: bytearray | None = None

    def add(self, seq: int, size: int, expiration: bool, priority: int) -> None:
        """A message recovered (not delivered yet: `set_delivered`); `priority` 0 for none."""
        self.append(seq, size, self._EXPIRATION if expiration else 0)
        if priority and self.prios is None:
            self.prios = bytearray(len(self.keys) - 1)
        if self.prios is not None:
            self.prios.append(priority)

    def _drop_front(self, h: int) -> None:
        if self.prios is not None:
            del self.prios[:h]
        super()._drop_front(h)

    def pop(self, seq: int, default: Any = None) -> Any:
        """Settle the message `seq`: True if it was here, else `default`."""
        i = self.index(seq)
        if i < 0:
            return default
        self.take(i)
        return True

    def flag_delivered_below(self, below: int) -> int:
        """Flag every surviving message before seq `below` delivered; how many there were."""
        marks, gone, marked = self.marks, self.GONE, 0
        for i in range(self.head, bisect_left(self.keys, max(below - self.base, 0))):
            if marks[i] != gone:
                marks[i] |= self._DELIVERED
                marked += 1
        return marked

    def set_delivered(self, seq: int) -> None:
        i = self.index(seq)
        if i >= 0:
            self.marks[i] |= self._DELIVERED

    def items(self) -> Iterator[tuple[int, int]]:
        """(E seq, size | REF_DELIVERED | REF_EXPIRATION | priority << REF_PRIORITY_SHIFT) of each
        surviving message, in seq order."""
        prios = self.prios
        for i, seq, size, f in self.entries():
            ref = size | (REF_DELIVERED if f & self._DELIVERED else 0) | (REF_EXPIRATION if f & self._EXPIRATION else 0)
            if prios is not None:
                ref |= prios[i] << REF_PRIORITY_SHIFT
            yield seq, ref


class CopyRefs(KeyedColumns):
    """A mirror copy's messages by reference: ME record seq -> the leader's seq of its message,
    in record order, about six bytes a message (a copy of millions is read back at boot)."""

    __slots__ = ()

    def __setitem__(self, log_seq: int, seq: int) -> None:
        self.append(log_seq, seq)

    def pop(self, log_seq: int, default: Any = None) -> Any:
        """Take the message out: its leader seq, or `default` if it is not here."""
        i = self.index(log_seq)
        return self.take(i) if i >= 0 else default

    def __iter__(self) -> Iterator[int]:
        """The record seqs."""
        for _i, log_seq, _seq, _m in self.entries():
            yield log_seq

    def items(self) -> Iterator[tuple[int, int]]:
        """(ME record seq, leader seq) of each message, in record order."""
        for _i, log_seq, seq, _m in self.entries():
            yield log_seq, seq


class ScratchLog:
    """Bodies of paged messages that are not in the journal (transient messages, non-durable
    queues): a segment log under the data directory that is never fsynced and is emptied at
    every boot, so such messages die with the node as they always did. A record is released
    when its message is read back into memory or leaves its queue unread."""

    def __init__(self, directory: str, segment_bytes_max: int = 64 * 1024 * 1024):
        shutil.rmtree(directory, ignore_errors=True)
        self.log = SegmentLog(directory, segment_bytes_max=segment_bytes_max)
        self.appended = 0

    def write(self, exchange: str, routing_key: str, props: bytes, body: bytes, persistent: bool) -> int:
        self.appended += 1
        return self.log.append(_enc.encode(("S", 0, exchange, routing_key, props, body, persistent)))

    def read(self, seq: int) -> tuple[str, str, bytes, bytes, bool]:
        """The message of record `seq`, CRC checked. Raises Unreadable."""
        got = self.read_many([seq])[0]
        if isinstance(got, Unreadable):
            raise got
        return got

    def read_many(self, seqs: list[int]) -> list[tuple[str, str, bytes, bytes, bool] | Unreadable]:
        """The messages of many records at once (`SegmentLog.read_many`), each (exchange, routing
        key, properties, body, persistent) or the Unreadable that stands for it."""
        try:
            recs = self.log.read_many(seqs)
        except (StoreError, OSError) as e:
            return [Unreadable(str(e)) for _ in seqs]
        out: list[tuple[str, str, bytes, bytes, bool] | Unreadable] = []
        for rec in recs:
            if isinstance(rec, StoreError):
                out.append(Unreadable(str(rec)))
                continue
            try:
                item = _dec.decode(rec.payload)
            except msgspec.DecodeError as e:
                out.append(Unreadable(f"undecodable record: {e}"))
                continue
            if not isinstance(item, (list, tuple)) or len(item) < 6 or item[0] != "S":
                out.append(Unreadable("not a message record"))
                continue
            out.append((item[2], item[3], item[4], item[5], bool(item[6]) if len(item) > 6 else False))
        return out

    def release(self, seq: int) -> None:
        try:
            self.log.release(seq)
        except StoreError:
            pass  # already gone (its segment was deleted): nothing to free

    def flush(self) -> None:
        """Hand buffered records to the OS (no fsync, ever)."""
        if self.log.last_seq > self.log.written_seq:
            self.log.flush()

    def close(self) -> None:
        directory = self.log.directory
        try:
            self.log.close()
        finally:
            shutil.rmtree(directory, ignore_errors=True)


__all__ = ["CopyRefs", "Journal", "MirrorCopy", "RecoveredMessage", "ScratchLog", "Unreadable", "REF_DELIVERED", "REF_EXPIRATION",
           "REF_PRIORITY_SHIFT", "REF_SIZE_MASK"]
