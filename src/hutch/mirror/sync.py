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
    pass

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
        self.floor_at_start = st.next_seq
        targets = leader.unsynced()
        self.targets = {m.member for m in targets}
        self.recovered = [m for m in targets if m.has is not None]
        if self.recovered:  # mirrors that came back with a copy from disk: send only what one lacks
            lacking = leader.lacking(targets, {e.seq for e in entries})
            entries = [e for e in entries if e.seq in lacking]
        entries.sort(key=attrgetter("seq"))
        self.entries = entries
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
            log.info("%s: Synchronising: %d messages to synchronise (%s)", qname(q), len(self.entries),
                     ", ".join(f"the mirror on {m.node} recovered {m.recovered} from disk" for m in self.recovered))
        else:
            log.info("%s: Synchronising: %d messages to synchronise", qname(q), len(self.entries))
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
            log.info("%s: Synchronising: %d messages", qname(q), self.pos)
        while (self.pos < len(self.entries) and len(self.inflight) < SYNC_INFLIGHT
               and self.inflight_bytes < SYNC_INFLIGHT_BYTES_MAX):
            if self.max_bytes_s and self.sent_bytes > (now - self.started) * self.max_bytes_s:
                return  # over mirroring_sync_max_throughput: the next tick (0.1 s) goes on
            chunk = self.entries[self.pos:self.pos + self.batch]
            self.pos += len(chunk)
            items = []
            batch_bytes = 0
            for e in chunk:
                if e.seq in self.removed:  # acknowledged meanwhile: its removal went out already
                    continue
                m = e.message
                items.append(SyncItem(e.seq, m.exchange, m.routing_key, m.props, m.body, m.persistent,
                                      m.priority, m.expiration_ms, e.expires_at_ms, e.delivery_count))
                batch_bytes += len(m.body)
            self.sent_bytes += batch_bytes
            ld.flush()  # operations recorded before this batch go first
            n = ld.broadcast(encode_ops([SyncBatch(tuple(items))]))
            self.inflight.append((n, batch_bytes))
            self.inflight_bytes += batch_bytes
        if self.pos >= len(self.entries) and not self.done_seq:
            ld.flush()
            self.done_seq = ld.broadcast(encode_ops([SyncDone(self.floor_at_start)]))

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
            log.info("%s: Synchronising: cancelled after %d messages", qname(q), self.pos)
        elif reason:
            log.info("%s: Synchronising: stopped, %s", qname(q), reason)
        else:
            log.info("%s: Synchronising: %d messages", qname(q), len(self.entries))
            log.info("%s: Synchronising: complete", qname(q))
        self.leader.send_view()
        self.leader.sync_done(cancelled)
