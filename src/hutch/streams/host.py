"""Streams in the broker: one Raft group per stream, every member applying the committed
batches to its own log of chunks, and readers and writers on any node.

The stream's record is in the catalogue (type `stream`, its members in `member_nodes`, its
group id in `journal_id`). Every node has a `StreamQueue` handle; a member also hosts the Raft
group and a `StreamMachine` over its `StreamLog` (under `<data dir>/streams/`).

Writing. A batch of messages (one writer's publishes to the stream in one loop iteration: an
AMQP 0-9-1 channel's, or a stream-protocol publisher's Publish frames, up to `BATCH_BYTES_MAX`)
becomes one entry, proposed to the group's
leader (from another node it travels as `["SP", gid, entry]`). When the entry is committed
every member writes it as one chunk; the leader tells the proposing node (`["SE", answers]`),
which confirms. Unanswered entries are sent again every `RETRY_S` and when a new leader is
known: the writer's publishing ids make the repeat harmless (the machine skips records it has).

Reading. A consumer reads committed chunks from a replica: on a member from its own log, from
anywhere else by a call to a member (`sread`). A member that missed a stretch of the stream
(it restored a snapshot past its log's end) fetches it from another member the same way.

Retention runs on every member every `RETENTION_S`: whole segments go from the old end
(x-max-length-bytes, x-max-age), as RabbitMQ's streams do.

It reaches peers only through `hutch.cluster.peers` and the broker only through
`StreamPort`. Must never: import anything from `hutch.broker` or above.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from hutch.cluster import catalogue as cat
from hutch.cluster.peers import Peers
from hutch.cluster.raftlog import ENTRY_BYTES_MAX
from hutch.store.stream_log import StreamLog, StreamLogError
from hutch.streamproto import chunk as chunks
from hutch.streams import machine as sm
from hutch.streams.ahead import AheadWriter
from hutch.streams.config import StreamArgumentError, StreamConfig, stream_config
from hutch.streams.handle import StreamQueue

log = logging.getLogger("hutch.streams")

RETRY_S = 1.0
RETENTION_S = 5.0
SNAPSHOT_ENTRIES = 64  # compact a stream's Raft log behind a snapshot this often
# A stream's Raft log holds its batches only until every member has written them to its own
# chunk log: it is compacted behind a snapshot of numbers every RAFT_SNAPSHOT_AFTER entries,
# keeping RAFT_TRAILING of them for a follower a little behind (one further behind gets the
# snapshot and reads the chunks it lacks from another member). The node's default (8192) would
# keep thousands of batches of messages in memory per stream; a batch is up to BATCH_BYTES_MAX,
# so these keep up to about 80 MiB per stream.
RAFT_SNAPSHOT_AFTER = 64
RAFT_TRAILING = 16
READ_BYTES_MAX = 8 << 20  # what one read call returns at most
# the records of one writer's batch (so one entry, one chunk): a chunk is delivered in one frame,
# and 1 MiB is the stream protocol's default frame_max
BATCH_BYTES_MAX = 1000 << 10
S_REQUEST = "s"
STATUS_S = 1.0  # how often a member reports a stream's extent to the nodes without a replica


def remove_tree(d: Path) -> None:
    """Remove a deleted replica's files without holding up the event loop: a replica of millions
    of messages is gigabytes, and unlinking them took the node's loop (and with it heartbeats and
    every client) for over ten seconds. A worker thread does it (`in_worker_thread`); what a
    crash leaves behind goes at the next boot (`StreamHost.forget_orphans`)."""
    in_worker_thread(lambda: shutil.rmtree(d, ignore_errors=True), lambda error: None)


def in_worker_thread(work: Callable[[], Any], done: Callable[[BaseException | None], None]) -> None:
    """`work()` in a worker thread, then `done(error or None)` on the loop (at once, inline,
    where no loop runs; never when the loop closes first)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        error = None
        try:
            work()
        except Exception as e:  # noqa: BLE001 - handed to `done`
            error = e
        done(error)
        return
    def finished(f: asyncio.Future) -> None:
        if not f.cancelled():  # (cancelled: the loop is closing with the node)
            done(f.exception())
    loop.run_in_executor(None, work).add_done_callback(finished)


class StreamPort(Protocol):
    def now_ms(self) -> int: ...
    def schedule(self) -> None: ...
    def dirty(self, q: StreamQueue) -> None: ...
    def new_stats(self) -> Any: ...
    def data_dir(self) -> Path | None: ...
    def fsync(self) -> bool: ...
    def policy_of(self, vhost: str, name: str) -> dict: ...
    def window_add(self, session: Any) -> None: ...
    def publish_answered(self, channel: Any, session: Any, seq: int, accepted: bool) -> None: ...
    def deliver(self, consumer: Any, q: StreamQueue, msg_id: int, delivery_count: int, redelivered: bool,
                route: bytes, props: bytes, body: bytes) -> None: ...
    def cancel_local(self, consumer: Any) -> None: ...


class _StreamApp:
    """The stream's replica as its Raft group's application."""

    __slots__ = ("host", "q", "term", "_syncing", "_synced", "_sync_error")

    def __init__(self, host: StreamHost, q: StreamQueue):
        self.host = host
        self.q = q
        self.term = 0  # the term of the entry being applied (set by the Raft host): the chunk's epoch
        # a snapshot whose chunks the worker thread is fsyncing; one whose chunks it has fsynced
        # (index, membership, data); and the error it met (raised at the next checkpoint)
        self._syncing: tuple[int, Any, bytes] | None = None
        self._synced: tuple[int, Any, bytes] | None = None
        self._sync_error: BaseException | None = None

    def apply(self, data: bytes, index: int) -> None:
        w = self.q.machine.apply(data, self.term)
        if w is not None:
            self.host.written(self.q, w)

    def attach(self, storage: Any) -> None:
        """The group's Raft log, as recovered: the replica writes each batch's chunk as it
        enters it (`AheadWriter`)."""
        q = self.q
        host = self.host
        AheadWriter(lambda: (q.machine, q.log) if q.machine is not None and q.log is not None else None,
                    lambda: host.raft.applied_index(q.gid) if host.raft is not None else None,
                    f"'{q.name}' in vhost '{q.vhost}'").attach(storage)

    def restore(self, data: bytes) -> None:
        m = self.q.machine
        m.restore(data)
        self._syncing = self._synced = None  # taken on the way to a state this one replaces
        if m.missing_from is not None:
            self.host.gap(self.q)

    def snapshot(self) -> bytes:
        return self.q.machine.snapshot()

    def snapshot_due(self, entries_kept: int) -> bool:
        return entries_kept >= SNAPSHOT_ENTRIES

    def checkpoint(self, index: int, conf: Any, take: Callable[[], bytes | None]) -> tuple[int, Any, bytes] | None:
        """The snapshot to compact the Raft log to: one whose chunks are durable in this
        member's log (the entries it replaces hold the only other copy of them). A snapshot is
        taken at the applied `index` and the chunk log fsynced in a worker thread; the
        snapshot is returned at the first call after that fsync returned (a snapshot is due
        every SNAPSHOT_ENTRIES batches, tens of MiB under load, and their fsync on the loop
        took it for 30-40 ms each time). A member with a gap holds the chunks it applies
        meanwhile in memory: its snapshot goes at once (`StreamMachine.snapshot`)."""
        if self._sync_error is not None:
            raise self._sync_error
        ready, self._synced = self._synced, None
        if self._syncing is not None:
            return ready
        data = take()
        if data is None:
            return ready
        m = self.q.machine
        if m.missing_from is not None:
            return index, conf, data
        point = self._syncing = (index, conf, data)
        lg = m.log

        def synced(error: BaseException | None) -> None:
            if self._syncing is not point:
                return  # restored since, or dropped
            self._syncing = None
            if error is None:
                self._synced = point
            elif self.q.log is lg and not lg.closed:
                self._sync_error = error
        in_worker_thread(lg.sync, synced)
        return ready


class _Outgoing:
    """An entry this node proposed, until the leader says it is written."""

    __slots__ = ("q", "entry", "answer", "retry_at")

    def __init__(self, q: StreamQueue, entry: bytes, answer: Callable[[sm.Written | None], None], retry_at: float):
        self.q = q
        self.entry = entry
        self.answer = answer
        self.retry_at = retry_at


class _Batch:
    """One writer's publishes to one stream in this loop iteration: an AMQP 0-9-1 channel's
    (confirmed message by message) or a stream-protocol publisher's Publish frames (answered
    frame by frame). They become one entry, so one chunk: their records are kept framed as the
    chunk's data (`chunk.frame`), in pieces joined once."""

    __slots__ = ("writer", "parts", "count", "pids", "confirms", "answers", "filters", "size")

    def __init__(self, writer: str, dedup: bool) -> None:
        self.writer = writer
        self.parts: list[bytes | memoryview] = []  # the records framed, in pieces
        self.count = 0  # records
        self.pids: list[int] | None = [] if dedup else None  # None: the writer is not deduplicated
        self.filters: list[bytes | None] | None = None  # each record's filter value, once one has one
        self.confirms: list[tuple[Any, Any, int]] = []  # (channel, session, seq)
        self.answers: list[Callable[[sm.Written | None], None]] = []
        self.size = 0  # bytes of records

    def add(self, pids: list[int] | None, records: list[bytes], filters: list[bytes | None] | None) -> None:
        self.add_framed(pids, [chunks.frame(records)], len(records), sum(map(len, records)), filters)

    def add_framed(self, pids: list[int] | None, parts: list, n: int, size: int,
                   filters: list[bytes | None] | None = None) -> None:
        """`n` records of `size` bytes, framed in `parts`."""
        if filters is not None and self.filters is None:
            self.filters = [None] * self.count
        self.parts += parts
        self.count += n
        if self.pids is not None and pids is not None:
            self.pids += pids
        if self.filters is not None:
            self.filters += filters if filters is not None else [None] * n
        self.size += size


class StreamHost:
    """This node's side of every stream."""

    def __init__(self, peers: Peers, port: StreamPort):
        self.peers = peers
        self.port = port
        self.raft: Any = None  # the runtime's group host (QueueGroups)
        self.queues: dict[int, StreamQueue] = {}  # gid -> handle
        self._out: dict[int, _Outgoing] = {}  # req -> entry in flight from here
        self._answers: dict[str, list] = {}  # node -> [req, first, written, duplicates] to send it
        self._batches: dict[tuple[int, str], _Batch] = {}  # (gid, writer) -> this iteration's publishes
        self._writer_ids: dict[Any, str] = {}  # channel -> its writer id (a cluster-wide owner id)
        self._writer_seqs: dict[tuple[str, int], int] = {}  # (writer, gid) -> last publishing id
        self._gaps: set[int] = set()
        self._next_retention_s = 0.0
        # stream-protocol sessions with subscriptions: pumped once per loop iteration after a
        # stream they read grew (insertion-ordered, values unused)
        self.watchers: dict[Any, None] = {}
        self._wake = False

    def now_ms(self) -> int:
        return self.port.now_ms()

    def owner_id(self) -> str:
        return self.peers.owner_id()

    # -- the catalogue's records, applied
    def config_of(self, rec: cat.QueueRecord) -> StreamConfig:
        policy = self.port.policy_of(rec.vhost, rec.name)
        try:
            return stream_config(dict(rec.arguments), rec.name, rec.vhost, policy=policy)
        except StreamArgumentError as e:  # checked at declare; a policy set since may be wrong
            log.error("stream '%s' in vhost '%s': %s", rec.name, rec.vhost, e.text)
            return stream_config(dict(rec.arguments), rec.name, rec.vhost)

    def make_handle(self, rec: cat.QueueRecord, declared: bool = False) -> StreamQueue | None:
        try:
            config = self.config_of(rec)
        except StreamArgumentError as e:
            log.error("stream '%s' in vhost '%s': %s", rec.name, rec.vhost, e.text)
            return None
        old = self.queues.get(rec.journal_id)
        if old is not None:
            return old
        q = StreamQueue(self, rec, config)
        self.queues[q.gid] = q
        if self.peers.node in q.members:
            self._host_replica(q, joining=not declared, leader_hint=rec.leader_node)
        return q

    def _dir(self, q: StreamQueue) -> Path | None:
        base = self.port.data_dir()
        return None if base is None else base / "streams" / f"{q.gid:016x}"

    def _host_replica(self, q: StreamQueue, joining: bool, leader_hint: str = "") -> None:
        d = self._dir(q)
        if self.raft is None or d is None:
            return
        try:
            q.log = StreamLog(d, max_segment_bytes=q.config.segment_bytes, fsync=self.port.fsync())
        except (OSError, StreamLogError) as e:
            log.error("stream '%s' in vhost '%s': cannot open its log in %s: %s", q.name, q.vhost, d, e)
            return
        if not q.log.recovery.clean:
            log.warning("stream '%s' in vhost '%s': %s", q.name, q.vhost, q.log.recovery)
        q.machine = sm.StreamMachine(q.log, q.config.filter_size)
        self.raft.ensure_group(q.gid, q.members, _StreamApp(self, q), leader_hint=leader_hint, joining=joining,
                               log_entries=(RAFT_SNAPSHOT_AFTER, RAFT_TRAILING))

    def _close_replica(self, q: StreamQueue, delete: bool) -> None:
        if self.raft is not None and q.machine is not None:
            self.raft.drop_group(q.gid)
        lg = q.log
        q.machine = None
        q.log = None
        if lg is not None:
            try:
                lg.close()
            except (OSError, StreamLogError):
                pass
        if delete:
            d = self._dir(q)
            if d is not None and d.exists():
                remove_tree(d)

    def members_changed(self, q: StreamQueue, members: tuple[str, ...]) -> None:
        before = q.members
        q.members = members
        me = self.peers.node
        if me in members and me not in before:
            self._host_replica(q, joining=True)
        elif me in before and me not in members:
            self._close_replica(q, delete=True)

    def drop_handle(self, q: StreamQueue) -> None:
        """The stream is deleted: its handle goes, and a member's replica with its files."""
        q.deleted = True
        self.queues.pop(q.gid, None)
        q.drop_parked_reads()
        for c in list(q.local_consumers.values()):
            q.remove_consumer(c)
            self.port.cancel_local(c)
        self._close_replica(q, delete=True)
        for req in [r for r, o in self._out.items() if o.q is q]:
            self._out.pop(req).answer(None)
        self._wake_watchers()

    def _wake_watchers(self) -> None:
        """The stream-protocol sessions look again (a leader is known, a stream went)."""
        if self.watchers:
            self._wake = True
            self.port.schedule()

    def forget_orphans(self) -> None:
        """After the catalogue is read at boot: a replica's files for a stream the catalogue no
        longer has (deleted while this node was down, or this node no longer a member) go."""
        base = self.port.data_dir()
        d = base / "streams" if base is not None else None
        if d is None or not d.is_dir():
            return
        keep = {f"{q.gid:016x}" for q in self.queues.values() if self.peers.node in q.members}
        for child in d.iterdir():
            if child.is_dir() and child.name not in keep:
                log.info("removing the files of stream replica %s: the stream is gone or no longer has a "
                         "replica on this node", child.name)
                shutil.rmtree(child, ignore_errors=True)

    def reconfigure(self, q: StreamQueue) -> None:
        """Policies changed: retention and the rest follow at once."""
        rec = cat.QueueRecord(q.vhost, q.name, "stream", arguments=q.arguments, journal_id=q.gid)
        q.config = self.config_of(rec)

    def shutdown(self) -> None:
        for q in self.queues.values():
            if q.log is not None:
                try:
                    q.log.sync()
                    q.log.close()
                except (OSError, StreamLogError):
                    pass

    # -- leadership
    def leader_of(self, q: StreamQueue) -> str | None:
        return self.raft.leader(q.gid) if self.raft is not None else None

    def is_leader(self, q: StreamQueue) -> bool:
        return self.leader_of(q) == self.peers.node

    def leadership_changed(self, gid: int, leading: bool) -> None:
        q = self.queues.get(gid)
        if q is not None and leading:
            log.info("stream '%s' in vhost '%s': this node is the leader", q.name, q.vhost)

    def leader_known(self, gid: int) -> None:
        q = self.queues.get(gid)
        if q is None:
            return
        self._wake_watchers()
        for o in self._out.values():
            if o.q is q:
                self._send(q, o.entry)

    # -- writing
    def publish(self, q: StreamQueue, record: bytes, channel: Any, seq: int, filter_value: bytes | None = None) -> None:
        """An AMQP 0-9-1 publish (already the stored AMQP 1.0 message): batched with the
        channel's others to the stream this loop iteration; its confirm follows the write."""
        writer = self._writer_ids.get(channel)
        if writer is None:
            writer = self._writer_ids[channel] = self.peers.owner_id()
        pid = self._writer_seqs.get((writer, q.gid), 0) + 1
        self._writer_seqs[(writer, q.gid)] = pid
        b = self._batch(q, writer, [pid], len(record))
        b.add([pid], [record], None if filter_value is None else [filter_value])
        session = channel.session if channel is not None else None
        b.confirms.append((channel, session, seq))
        if session is not None:
            self.port.window_add(session)
        self.port.schedule()

    def channel_closed(self, channel: Any) -> None:
        w = self._writer_ids.pop(channel, None)
        if w is not None:
            self.forget_writer(w)

    def forget_writer(self, writer: str) -> None:
        """A writer numbered here is gone (an AMQP channel, a stream publisher without a reference)."""
        for k in [k for k in self._writer_seqs if k[0] == writer]:
            del self._writer_seqs[k]

    def write(self, q: StreamQueue, writer: str, pids: list[int] | None, records: list[bytes],
              filters: list[bytes | None] | None, answer: Callable[[sm.Written | None], None]) -> None:
        """A batch from a stream-protocol publisher: `answer(Written)` once the stream has it
        (or None when the stream went). It joins the writer's other batches of this loop
        iteration in one entry. `pids` None: a publisher without a reference, whose own ids are
        not deduplicated (as in RabbitMQ: what it sends twice is stored twice). Its records are
        numbered here instead, under its writer id (unique in the cluster), so that an entry this
        node sends again after a leader change, which the old leader may have replicated before
        it died, is stored once (`forget_writer` when the publisher goes)."""
        self.write_framed(q, writer, pids, [chunks.frame(records)], len(records), sum(map(len, records)), answer,
                          filters)

    def write_framed(self, q: StreamQueue, writer: str, pids: list[int] | None, parts: list, n: int, size: int,
                     answer: Callable[[sm.Written | None], None],
                     filters: list[bytes | None] | None = None) -> None:
        """`write` for `n` records of `size` bytes already framed as a chunk's data, in `parts`
        (a Publish frame's messages as parsed: `frames.FramedMessages`)."""
        if pids is None and writer:
            last = self._writer_seqs.get((writer, q.gid), 0)
            pids = list(range(last + 1, last + 1 + n))
            self._writer_seqs[(writer, q.gid)] = last + n
        b = self._batch(q, writer, pids, size)
        b.add_framed(pids, parts, n, size, filters)
        b.answers.append(answer)
        self.port.schedule()

    def _batch(self, q: StreamQueue, writer: str, pids: list[int] | None, size: int) -> _Batch:
        """The writer's batch to the stream in this loop iteration that `size` more bytes with
        publishing ids `pids` may join. A batch is proposed now, and a new one started, when it
        would grow past `BATCH_BYTES_MAX`, or when the ids do not follow its own (a client
        sending ids again): the machine deduplicates an entry's ids in ascending order."""
        key = (q.gid, writer)
        b = self._batches.get(key)
        if b is not None and b.count and (
                b.size + size > BATCH_BYTES_MAX or (b.pids is None) != (pids is None)
                or (pids and b.pids and pids[0] <= b.pids[-1])):
            self._propose_batch(q, self._batches.pop(key))
            b = None
        if b is None:
            b = self._batches[key] = _Batch(writer, pids is not None)
        return b

    def _propose_batch(self, q: StreamQueue | None, b: _Batch) -> None:
        confirms = b.confirms
        answers = b.answers

        def written(w: sm.Written | None) -> None:
            if confirms:
                self._confirm(confirms, w is not None)
            for answer in answers:
                answer(w)
        if q is None or q.deleted:
            written(None)
        else:
            self._propose(q, b.writer, b.pids, b"".join(b.parts), b.count, b.filters, written)

    def store_offset(self, q: StreamQueue, reference: str, offset: int) -> None:
        self._propose_raw(q, sm.track_entry(reference, offset), _ignore)

    def _propose(self, q: StreamQueue, writer: str, pids: list[int] | None, framed: bytes, count: int,
                 filters: list[bytes | None] | None, answer: Callable[[sm.Written | None], None]) -> None:
        req = self.peers.new_id()
        epoch = 0
        entry = sm.framed_write_entry(self.peers.node, req, epoch, self.now_ms(), writer, pids, framed, count, filters)
        if len(entry) > ENTRY_BYTES_MAX:
            log.warning("stream '%s' in vhost '%s': refused %d message(s) of %d bytes, over the largest "
                        "entry a stream takes (%d bytes)", q.name, q.vhost, count, len(entry), ENTRY_BYTES_MAX)
            answer(None)
            return
        self._out[req] = _Outgoing(q, entry, answer, self.now_ms() / 1000 + RETRY_S)
        self._send(q, entry)

    def _propose_raw(self, q: StreamQueue, entry: bytes, answer: Callable[[Any], None]) -> None:
        self._send(q, entry)

    def _send(self, q: StreamQueue, entry: bytes) -> bool:
        raft = self.raft
        if raft is None:
            return False
        leader = raft.leader(q.gid)
        if leader == self.peers.node:
            return raft.propose(q.gid, entry)
        if leader is None or not self.peers.is_up(leader):
            up = [n for n in q.members if n != self.peers.node and self.peers.is_up(n)]
            leader = up[0] if up else None
        return leader is not None and self.peers.send(leader, ["SP", q.gid, entry])

    def on_forwarded(self, gid: int, entry: bytes) -> None:
        q = self.queues.get(gid)
        if q is None or self.raft is None:
            return
        leader = self.raft.leader(gid)
        if leader == self.peers.node:
            self.raft.propose(gid, entry)
        elif leader is not None and self.peers.is_up(leader):
            self.peers.send(leader, ["SP", gid, entry])

    def written(self, q: StreamQueue, w: sm.Written) -> None:
        """An entry applied on this member: the leader answers its proposer; every member's
        readers may read on."""
        q.readable()
        self._wake_watchers()
        if not self.is_leader(q):
            return
        if w.origin == self.peers.node:
            self._answered(w.req, w)
        else:
            self._answers.setdefault(w.origin, []).append([w.req, w.first, w.written, w.duplicates])

    def on_answers(self, items: list) -> None:
        for req, first, n, dups in items:
            self._answered(req, sm.Written(self.peers.node, req, first, n, dups))

    def _answered(self, req: int, w: sm.Written) -> None:
        o = self._out.pop(req, None)
        if o is not None:
            o.answer(w)

    def flush(self) -> None:
        """Once per loop iteration: propose this iteration's batches, send answers, let the
        stream-protocol subscriptions read what was written."""
        if self._wake:
            self._wake = False
            for session in list(self.watchers):
                session.pump()
        if self._batches:
            batches, self._batches = self._batches, {}
            for (gid, _writer), b in batches.items():
                self._propose_batch(self.queues.get(gid), b)
        if self._answers:
            answers, self._answers = self._answers, {}
            for node, items in answers.items():
                self.peers.send(node, ["SE", items])

    def _confirm(self, confirms: list, accepted: bool) -> None:
        answered = self.port.publish_answered
        for channel, session, seq in confirms:
            answered(channel, session, seq, accepted)

    # -- reading
    def read_local(self, q: StreamQueue, start: Any, max_bytes: int) -> tuple[int, list] | None:
        """On a member: (the offset `start` resolves to, [(first offset, records)] of the
        committed chunks from there, up to max_bytes). None when the replica here cannot say."""
        m = q.machine
        lg = q.log
        if m is None or lg is None:
            return None
        end = m.committed
        offset = self._resolve(q, start)
        out = []
        if offset < end:
            for info, data in lg.read(offset, max_bytes):
                if info.chunk_id >= end:
                    break
                out.append((info.chunk_id, chunks.records(data)))
        return offset, out

    def read_raw(self, q: StreamQueue, offset: int, max_bytes: int) -> tuple[int, list[bytes]] | None:
        """On a member: whole committed chunks from `offset` as stored (for a replica closing a
        gap, and for stream-protocol deliveries)."""
        m = q.machine
        lg = q.log
        if m is None or lg is None:
            return None
        end = m.committed
        out = []
        start = max(offset, lg.first_offset)
        for info, data in lg.read(start, max_bytes):
            if info.chunk_id >= end:
                break
            out.append(bytes(data))
        return start, out

    def read_chunks(self, q: StreamQueue, start: Any, max_bytes: int, callback: Callable[[Any], None]) -> None:
        """callback((offset start resolves to, [chunk bytes as stored], committed chunk id)) from
        the replica here or a member's (None when none answers): stream-protocol deliveries."""
        if q.machine is not None and q.machine.missing_from is None:
            callback(self._raw_from(q, start, max_bytes))
            return
        target = self._member_to_ask(q)
        if target is None:
            callback(None)
            return

        def got(answer: Any) -> None:
            callback(tuple(answer[1]) if answer is not None and answer[0] == 200 and answer[1] is not None else None)
        self.peers_call(target, "schunks", [q.gid, list(start) if isinstance(start, tuple) else start, max_bytes], got)

    def _raw_from(self, q: StreamQueue, start: Any, max_bytes: int) -> tuple[int, list[bytes], int] | None:
        m = q.machine
        lg = q.log
        if m is None or lg is None:
            return None
        offset = self._resolve(q, start)
        end = m.committed
        last = lg.chunk_containing(end - 1) if end > lg.first_offset else None
        committed = last.chunk_id if last is not None else 0
        out = []
        if offset < end:
            for info, data in lg.read(offset, max_bytes):
                if info.chunk_id >= end:
                    break
                out.append(bytes(data))
        return offset, out, committed

    def _resolve(self, q: StreamQueue, start: Any) -> int:
        lg = q.log
        end = q.machine.committed
        if start == "first":
            return lg.first_offset
        if start == "next":
            return end
        if start == "last":
            last = lg.chunk_containing(end - 1) if end > lg.first_offset else None
            return last.chunk_id if last is not None else end
        if isinstance(start, (list, tuple)) and start and start[0] == "ts":
            ci = lg.first_chunk_at_or_after_timestamp(int(start[1]))
            return ci.chunk_id if ci is not None else end
        return max(int(start), lg.first_offset)

    def _member_to_ask(self, q: StreamQueue) -> str | None:
        up = [n for n in q.members if n != self.peers.node and self.peers.is_up(n)]
        leader = self.leader_of(q)
        if leader in up:
            return leader
        return up[0] if up else None

    def chunks_call(self, args: list, answer: Callable[[Any], None]) -> None:
        """Another node's stream-protocol subscription reads: [gid, start, max_bytes]."""
        q = self.queues.get(args[0]) if args and isinstance(args[0], int) else None
        if q is None or q.machine is None:
            answer([404, None])
            return
        start = tuple(args[1]) if isinstance(args[1], list) else args[1]
        answer([200, self._raw_from(q, start, min(int(args[2]), READ_BYTES_MAX))])

    def query(self, q: StreamQueue, kind: str, key: str, callback: Callable[[Any], None]) -> None:
        """A stored consumer offset ("offset") or a writer's last publishing id ("writer"), from
        the replica here or a member's; callback(None) when none is known."""
        m = q.machine
        if m is not None:
            callback(m.stored_offset(key) if kind == "offset" else m.writer_sequence(key))
            return
        target = self._member_to_ask(q)
        if target is None:
            callback(None)
            return
        self.peers_call(target, "squery", [q.gid, kind, key],
                        lambda a: callback(a[1] if a is not None and a[0] == 200 else None))

    def query_call(self, args: list, answer: Callable[[Any], None]) -> None:
        q = self.queues.get(args[0]) if args and isinstance(args[0], int) else None
        if q is None or q.machine is None:
            answer([404, None])
            return
        m = q.machine
        answer([200, m.stored_offset(args[2]) if args[1] == "offset" else m.writer_sequence(args[2])])

    def read(self, q: StreamQueue, start: Any, max_bytes: int, callback: Callable[[Any], None]) -> None:
        """callback((offset, [(first, records)])) from a replica here or on a member."""
        if q.machine is not None and q.machine.missing_from is None:
            callback(self.read_local(q, start, max_bytes))
            return
        up = [n for n in q.members if n != self.peers.node and self.peers.is_up(n)]
        leader = self.leader_of(q)
        if leader in up:
            up.remove(leader)
            up.insert(0, leader)
        if not up:
            callback(None)
            return
        arg = list(start) if isinstance(start, tuple) else start

        def got(answer: Any) -> None:
            if answer is None or answer[0] != 200 or answer[1] is None:
                callback(None)
                return
            offset, items = answer[1]
            callback((offset, [(f, list(recs)) for f, recs in items]))
        self.peers_call(up[0], "sread", [q.gid, arg, max_bytes], got)

    peers_call: Callable[[str, str, list, Callable[[Any], None]], None]  # set by the broker's cluster glue

    def read_call(self, args: list, answer: Callable[[Any], None]) -> None:
        """Another node reads: [gid, start, max_bytes] -> [200, (offset, [(first, records)])]."""
        q = self.queues.get(args[0]) if args and isinstance(args[0], int) else None
        if q is None:
            answer([404, None])
            return
        start = args[1]
        if isinstance(start, list):
            start = tuple(start)
        max_bytes = min(int(args[2]), READ_BYTES_MAX)
        got = self.read_local(q, start, max_bytes)
        if got is not None and not got[1]:  # at the end: answered when more is written (or empty later)
            q.park_read(got[0], max_bytes, answer, self.now_ms() / 1000)
            return
        answer([200, got])

    def raw_call(self, args: list, answer: Callable[[Any], None]) -> None:
        """A replica closing a gap: [gid, offset, max_bytes] -> [200, (start, [chunk bytes])]."""
        q = self.queues.get(args[0]) if args and isinstance(args[0], int) else None
        if q is None:
            answer([404, None])
            return
        answer([200, self.read_raw(q, int(args[1]), min(int(args[2]), READ_BYTES_MAX))])

    # -- a replica's gap
    def gap(self, q: StreamQueue) -> None:
        self._gaps.add(q.gid)
        self.port.schedule()

    def _fill_gaps(self) -> None:
        for gid in list(self._gaps):
            q = self.queues.get(gid)
            m = q.machine if q is not None else None
            if m is None or m.missing_from is None:
                self._gaps.discard(gid)
                continue
            if getattr(q, "_gap_fetching", False):
                continue
            up = [n for n in q.members if n != self.peers.node and self.peers.is_up(n)]
            if not up:
                continue
            q._gap_fetching = True

            def got(answer: Any, q: StreamQueue = q) -> None:
                q._gap_fetching = False
                m = q.machine
                if m is None or answer is None or answer[0] != 200 or answer[1] is None:
                    return
                start, raw = answer[1]
                if m.missing_from is not None and start > m.missing_from:
                    m.restart_at(start)
                m.fill(raw)
                q.readable()
                self.port.schedule()
            self.peers_call(up[0], "sraw", [gid, m.missing_from, READ_BYTES_MAX], got)

    # -- time
    def tick(self, now_s: float) -> None:
        for q in self.queues.values():
            q.tick(now_s)
        for req, o in list(self._out.items()):
            if o.q.deleted:
                self._out.pop(req).answer(None)
            elif now_s >= o.retry_at:
                o.retry_at = now_s + RETRY_S
                self._send(o.q, o.entry)
        if self._gaps:
            self._fill_gaps()
        if now_s >= self._next_retention_s:
            self._next_retention_s = now_s + RETENTION_S
            now_ms = int(now_s * 1000)
            for q in self.queues.values():
                lg = q.log
                cfg = q.config
                # also before the first snapshot: a restart applies the Raft log again from offset 0,
                # and the machine numbers the entries whose chunks retention removed without writing them
                if lg is not None and (cfg.max_bytes is not None or cfg.max_age_ms is not None):
                    try:
                        gone = lg.retain(cfg.max_bytes, cfg.max_age_ms, now_ms)
                    except (OSError, StreamLogError) as e:
                        log.error("stream '%s' in vhost '%s': retention failed: %s", q.name, q.vhost, e)
                        continue
                    if gone:
                        log.info("stream '%s' in vhost '%s': retention removed %d segment(s); the stream now "
                                 "starts at offset %d", q.name, q.vhost, gone, lg.first_offset)

    def peer_up(self, peer: str) -> None:
        if self._gaps:
            self._fill_gaps()

    def peer_down(self, peer: str) -> None:
        return None

    # -- status
    def local_status(self, gid: int) -> dict | None:
        q = self.queues.get(gid)
        if q is None or q.log is None or self.raft is None:
            return None
        st = self.raft.status(gid) or {}
        lg = q.log
        return {"first_offset": lg.first_offset, "committed_offset": q.machine.committed, "bytes": lg.bytes,
                "segments": lg.segment_count, "role": st.get("role"), "term": st.get("term"),
                "leader": st.get("leader"), "commit_index": st.get("commit"), "missing_from": q.machine.missing_from}


def _ignore(_a: Any) -> None:
    return None


