"""Synchronising a mirror that joined late (seed 000, "Master/mirror synchronisation"): the
leader sends the queue's messages older than what the mirror has in batches of
`ha-sync-batch-size`, at most `SYNC_INFLIGHT` batches in the ring at once, paced by
`mirroring_sync_max_throughput`; the queue delivers nothing until it is done.

Or, hutch's own (`ha-sync-background`, `mirroring_sync_background`), the queue goes on
delivering and answering basic.get while it runs. That is safe because each batch travels the
ring in order with the queue's own operations: a batch is built when it is sent, from the
entries as they are then (a delivery already counted in), leaving out what was removed; an
operation on a message the mirror does not hold yet is one it will get in a later batch, or
one that removed it, so the mirror may ignore it. Must never: import anything from
`hutch.broker` or above.
"""

from __future__ import annotations

import logging
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from hutch.mirror.placement import SYNC_BATCH_SIZE
from hutch.mirror.replica import SyncBatch, SyncDone, SyncItem, encode_ops

if TYPE_CHECKING:
    from hutch.queues.state import Entry

from hutch.mirror.names import qname

log = logging.getLogger("hutch.mirroring")

SYNC_INFLIGHT = 64  # sync batches in the ring at once
SYNC_INFLIGHT_BYTES_MAX = 8 * 1024 * 1024  # and their bodies' bytes: what a member hands on when the ring
# changes (its unstable broadcasts, in one peer frame of at most 16 MiB) and what one pump builds
SYNC_PROGRESS_S = 1.0


class SyncJob:
    """One run of a sync: the queue's messages as they stood at the start, sent in batches."""

    def __init__(self, leader: Any):  # the hutch.mirror.leader.Leader that runs it
        self.leader = leader
        q = leader.q
        st = q.state
        entries = [*st.ready(), *st.unacked.values()]
        tail = q.tail
        paged = tail.seqs() if tail is not None and tail.count else []
        self.floor_at_start = st.next_seq
        targets = leader.unsynced()
        self.targets = {m.member for m in targets}
        self.recovered = [m for m in targets if m.has is not None]
        if self.recovered:  # mirrors that came back with a copy from disk: send only what one lacks
            live = {e.seq for e in entries}
            live.update(paged)
            lacking = leader.lacking(targets, live)
            entries = [e for e in entries if e.seq in lacking]
            paged = [seq for seq in paged if seq in lacking]
        entries.sort(key=attrgetter("seq"))
        self.entries = entries
        # paged messages: read when their batch is built, from the tail (`BodyStore.peek_paged`:
        # they stay paged) or, if the queue read them back meanwhile, from memory (`loaded`)
        self.paged = paged
        self.ppos = 0
        self.loaded: dict[int, Entry] = {}
        self.total = len(entries) + len(paged)
        p = leader.params()
        self.batch = p.sync_batch_size or leader.host.broker.config.mirroring_sync_batch_size or SYNC_BATCH_SIZE
        self.max_bytes_s = leader.host.broker.config.mirroring_sync_max_throughput
        self.pos = 0
        self.sent_bytes = 0
        self.inflight: list[tuple[int, int]] = []  # (GM seq, body bytes) of batches not yet stable
        self.inflight_bytes = 0
        self.started = leader.host.now()
        self.last_progress = self.started
        self.done_seq = 0
        self.finished = False
        self.removed: set[int] = set()
        background = p.sync_background
        self.blocking = not (leader.host.broker.config.mirroring_sync_background if background is None
                             else background)

    def start(self) -> None:
        q = self.leader.q
        if self.blocking:
            q.dispatch_blocked = True
        if self.recovered:
            log.info("%s: Synchronising: %d messages to synchronise (%s)", qname(q), self.total,
                     ", ".join(f"the mirror on {m.node} recovered {m.recovered} from disk" for m in self.recovered))
        else:
            log.info("%s: Synchronising: %d messages to synchronise", qname(q), self.total)
        if not self.blocking:
            log.info("%s: Synchronising: in the background, the queue goes on serving", qname(q))
        log.info("%s: Synchronising: batch size: %d", qname(q), self.batch)
        self.pump(self.started)

    def members_changed(self) -> None:
        alive = set(self.leader.mirrors)
        self.targets &= alive
        if not self.targets and not self.finished:
            self.finish(cancelled=False, reason="all mirrors to synchronise are gone")

    def pump(self, now: float) -> None:
        if self.finished:
            return
        ld = self.leader
        q = ld.q
        if now - self.last_progress >= SYNC_PROGRESS_S:
            self.last_progress = now
            log.info("%s: Synchronising: %d messages", qname(q), self.pos + self.ppos)
        while (self.left() and len(self.inflight) < SYNC_INFLIGHT
               and self.inflight_bytes < SYNC_INFLIGHT_BYTES_MAX):
            if self.max_bytes_s and self.sent_bytes > (now - self.started) * self.max_bytes_s:
                return  # over mirroring_sync_max_throughput: the next tick (0.1 s) goes on
            items = self._next_batch(q)
            batch_bytes = sum(len(i.body) for i in items)
            self.sent_bytes += batch_bytes
            ld.flush()  # operations recorded before this batch go first
            n = ld.broadcast(encode_ops([SyncBatch(tuple(items))]))
            self.inflight.append((n, batch_bytes))
            self.inflight_bytes += batch_bytes
        if not self.left() and not self.done_seq:
            ld.flush()
            self.done_seq = ld.broadcast(encode_ops([SyncDone(self.floor_at_start)]))

    def left(self) -> bool:
        return self.pos < len(self.entries) or self.ppos < len(self.paged)

    def paged_in(self, entries: list[Entry]) -> None:
        """The queue read these paged messages back into memory."""
        if self.ppos < len(self.paged):
            self.loaded.update((e.seq, e) for e in entries)

    def _next_batch(self, q: Any) -> list[SyncItem]:
        """The next `batch` messages to send, oldest first (the in-memory ones and the paged
        ones merged by seq), as they are now: what was removed meanwhile is left out."""
        entries, paged, removed, loaded = self.entries, self.paged, self.removed, self.loaded
        out: list[Entry | int | tuple[int, int, int | None, int]] = []
        reads: list[tuple[int, int]] = []
        lookups: list[int] = []
        taken = 0
        while taken < self.batch and self.left():
            taken += 1
            if self.ppos >= len(paged) or (self.pos < len(entries) and entries[self.pos].seq < paged[self.ppos]):
                e = entries[self.pos]
                self.pos += 1
                if e.seq not in removed:  # acknowledged meanwhile: its removal went out already
                    out.append(e)
                continue
            seq = paged[self.ppos]
            self.ppos += 1
            if seq in removed:
                continue
            e = loaded.pop(seq, None)
            if e is not None:
                out.append(e)
                continue
            out.append(seq)  # looked up below, with the rest of the batch's
            lookups.append(seq)
        if lookups:
            found = iter(q.tail.find_many(lookups) if q.tail is not None else [None] * len(lookups))
            resolved = []
            for x in out:
                if type(x) is int:
                    got = next(found)
                    if got is None:
                        continue  # no longer paged (read back or gone) and not seen loaded: left out
                    loc, expires, count = got  # still paged: read its body, leave it on disk
                    x = (x, loc, expires, count)
                    reads.append((x[0], loc))
                resolved.append(x)
            out = resolved
        msgs = iter(q.store.peek_paged(q, reads)) if reads else iter(())
        items = []
        for x in out:
            if type(x) is tuple:
                seq, _loc, expires, count = x
                m = next(msgs)
                if m is None:  # unreadable: the queue drops it when it reads it back, and says so
                    continue
            else:
                seq, m, expires, count = x.seq, x.message, x.expires_at_ms, x.delivery_count
            items.append(SyncItem(seq, m.exchange, m.routing_key, m.props, m.body, m.persistent,
                                  m.priority, m.expiration_ms, expires, count))
        return items

    def on_stable(self, seq: int) -> None:
        self.inflight = [b for b in self.inflight if b[0] > seq]
        self.inflight_bytes = sum(b[1] for b in self.inflight)
        if self.done_seq and seq >= self.done_seq:
            for m in self.leader.mirrors.values():
                if m.member in self.targets:
                    m.since = 0  # it has what existed at the start, and everything since it joined
                    m.has = None
            self.finish(cancelled=False)
            return
        self.pump(self.leader.host.now())

    def finish(self, cancelled: bool, reason: str = "") -> None:
        if self.finished:
            return
        self.finished = True
        q = self.leader.q
        if cancelled:
            log.info("%s: Synchronising: cancelled after %d messages", qname(q), self.pos + self.ppos)
        elif reason:
            log.info("%s: Synchronising: stopped, %s", qname(q), reason)
        else:
            log.info("%s: Synchronising: %d messages", qname(q), self.total)
            log.info("%s: Synchronising: complete", qname(q))
        self.leader.send_view()
        self.leader.sync_done(cancelled)
