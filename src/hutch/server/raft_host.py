"""Hosting a node's Raft groups: the catalogue's (group 0) and one per quorum queue member here.

`RaftHost` drives `hutch.raft.multi.MultiRaft` the way etcd's raft asks its application to
(`Ready`, then `Advance`): what a Ready writes is made durable on the node's `RaftHostStorage`
(one fsync for all groups) before the messages that depend on it leave, each group's committed
entries are handed to that group's application (`GroupApp`), then the groups advance, and a
group whose log grew long enough is compacted behind a snapshot of its application.

The fsync runs in a worker thread (`sync_in_thread`, the runtime's choice: a real node's own
`hutch.server.worker.WorkerThread`, else the loop's default executor), so that the event loop
serves clients meanwhile; what may go ahead of it is `MultiReady`'s to say. A leader's
entries (Raft thesis §10.2.1): its AppendEntries leave at once, its Ready is applied and
advanced, and the leader counts those entries as its own towards a commit
(`RaftGroup.persisted_to`) only once the fsync returned. A follower's entries: its answers say
what it holds, so they are held back until that fsync returned and then sent in the order they
were made; its committed entries are applied at once (a majority holds them already), so a
delivery on a follower's node does not wait for its own disk. One fsync runs at a time and
covers everything written before it started; what is written meanwhile waits for the next (a
group commit). A Ready that writes a new term or vote, or installs a snapshot, or the entries
of a leader alone in its group (but a stream's: `alone_fsyncs_first`, see `ensure_group`), is
fsynced here, on the loop, first, as every Ready was before; that fsync
covers every earlier write, so the answers held until then leave with it, but those of the
groups whose term, vote or snapshot it wrote, which are dropped (`_release_held`). A hard state
that only moves the commit index is not fsynced for its own sake (`MultiReady`), nor is a
compaction's snapshot record: what it replaces is released once it is durable
(`RaftHostStorage.settle`), so it waits for the next fsync in the worker thread.

It also tells its owner when a group other than the main (catalogue) group learns a leader
or when this node starts or stops leading it: quorum queues act on that. `QueueGroups` is the
narrow view of the host that quorum queues (`hutch.broker.quorumq`) use.

An entry whose application raises is a bug in that application, and it leaves this node's
copy of the group's state apart from the other members'. A failed fsync leaves the page cache
untrustworthy. Either way the host stops doing anything and asks the node to stop (`fatal`),
as a Ra server crashes: a replica that goes on silently diverged is worse than one that stops.

This module does the I/O of Raft hosting only: it sends what the groups hand it, persists
and applies. It makes no protocol decisions (that is `hutch.raft`) and knows nothing of what
the entries mean (that is each `GroupApp`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Collection
from typing import Any, Protocol

import msgspec

from hutch.cluster.raftlog import RaftHostStorage, RaftLogError
from hutch.raft import messages as rm
from hutch.raft.group import LEADER, NOT_LEADER, NotLeader, ProposalRejected, RaftConfig, RaftError
from hutch.raft.multi import MultiRaft
from hutch.server import faults
from hutch.server.worker import WorkerThread
from hutch.store import StoreClosed, StoreError

log = logging.getLogger("hutch.cluster")

SNAPSHOT_RECORD_SLACK_BYTES = 64 << 10  # a snapshot record's meta (term, index, members) around its data
# groups whose entries count once written (stream.fsync = background): how long their writes may
# wait for the fsync that follows them (an fsync for other groups' sake covers them sooner)
WRITTEN_SYNC_INTERVAL_S = 0.1


class GroupApp(Protocol):
    """What a Raft group hosted by this node applies its committed entries to. An application
    with a `term` attribute has it set to each entry's term before the entry is applied.

    An application may also have `log_needed_from() -> int | None`, the lowest index it still
    reads entries back from (the log keeps them through compactions), and `checkpoint(index,
    conf, take) -> (index, conf, data) | None`: called when `snapshot_due`, it may take a
    snapshot at the applied `index` (`take()`: its data, or None when too large) and keep it;
    it returns the snapshot (taken now or earlier) to compact the log to, or None for none yet.
    A quorum queue compacts only to a snapshot all of whose messages have been settled since,
    so that a follower sent it finds every message it must deliver in the entries after it
    (RabbitMQ's release cursor). And `attach(storage)`: called with the group's recovered
    `RaftLog` before the group starts (a stream sets its `codec` there: `hutch.streams.ahead`)."""

    def apply(self, data: bytes, index: int) -> None: ...

    def restore(self, data: bytes) -> None: ...

    def snapshot(self) -> bytes: ...

    def snapshot_due(self, entries_kept: int) -> bool:
        """Whether compacting now is worth a snapshot (which may be large: a whole queue);
        `entries_kept`: the entries applied since the last snapshot."""


class CallbackApp:
    """A `GroupApp` made of three functions (the catalogue's: its runtime applies, restores
    and snapshots the catalogue); it is snapshotted whenever the log asks."""

    def __init__(self, apply: Callable[[bytes], None], restore: Callable[[bytes], None],
                 snapshot: Callable[[], bytes]):
        self._apply = apply
        self._restore = restore
        self._snapshot = snapshot

    def apply(self, data: bytes, index: int) -> None:
        self._apply(data)

    def restore(self, data: bytes) -> None:
        self._restore(data)

    def snapshot(self) -> bytes:
        return self._snapshot()

    def snapshot_due(self, entries_kept: int) -> bool:
        return True


class RaftHost:
    """This node's Raft groups, their storage and their applications.

    `names` maps Raft node ids to node names; the host shares the dict with its owner (both
    learn names) and only adds to it. `send(peer, gid, message bytes)` puts a Raft message on
    the wire, `schedule()` asks for `drain` on a later loop turn."""

    def __init__(self, my_id: int, my_name: str, storage: RaftHostStorage, cfg: RaftConfig, names: dict[int, str],
                 main_gid: Any, send: Callable[[str, Any, bytes], None], schedule: Callable[[], None],
                 on_leader_known: Callable[[Any], None], on_leadership: Callable[[Any, bool], None],
                 fatal: Callable[[str], None] = lambda reason: None, sync_in_thread: bool = False,
                 flush: Callable[[], None] = lambda: None, worker: WorkerThread | None = None):
        self.id = my_id
        self.name = my_name
        self.storage = storage
        self.names = names
        self.main_gid = main_gid
        self.multi = MultiRaft(my_id, cfg)
        self.apps: dict[Any, GroupApp] = {}
        self.failed = False  # set when this node's Raft state cannot be trusted: nothing more is done
        self._fatal = fatal  # the node stops (hutch.server.runtime.Node.fail_stop)
        # True: a leader's entries are fsynced in a worker thread while the loop goes on (see the
        # module's doc); False: every Ready that writes is fsynced in `drain`, on the loop
        self._sync_in_thread = sync_in_thread
        # the thread those fsyncs run in (hutch.server.worker); None: the loop's default executor
        self._worker = worker
        self._syncing = False  # that fsync, while it runs
        self._unsynced: list = []  # (group id, group, term, index): leader entries for the next one
        # followers' messages waiting for an fsync, (group id, group, peer, data) in the order made:
        # for the next fsync, and for the one running; and how many each group has held
        self._held_next: list = []
        self._held_syncing: list = []
        self._holding: dict[Any, int] = {}
        # entries of groups that do not wait for the fsync (`MultiReady.written_only`): written
        # and not fsynced yet; and the timer that asks for their fsync
        self._written_unsynced = False
        self._written_timer: asyncio.TimerHandle | None = None
        # an fsync nobody waits for is wanted (the timer fired, or a compaction wrote a snapshot
        # record: what it replaces is released once the fsync returned)
        self._sync_wanted = False
        self._send = send
        self._flush = flush  # what was sent leaves now (else at the end of the loop's iteration)
        self._schedule = schedule
        self._on_leader_known = on_leader_known
        self._on_leadership = on_leadership
        self._leading: set[Any] = set()
        self._leaders: dict[Any, int | None] = {}
        # a snapshot must fit one record of the log, with room for the record's own fields
        self._snapshot_bytes_max = storage.log.record_bytes_max - SNAPSHOT_RECORD_SLACK_BYTES
        # groups whose snapshot was too large -> the log length at which to try again
        self._snapshot_refused: dict[Any, int] = {}

    # ------------------------------------------------------------ the Ready loop

    def drain(self, initial: bool = False) -> None:
        """Every group's Ready: persist (one fsync for all), send, apply, advance. `initial`:
        at start, before the transport exists, nothing is sent, and the fsync runs here."""
        while not self.failed:
            try:
                mr = self.multi.ready()
            except StoreClosed:
                return
            except (StoreError, RaftLogError) as e:  # an entry could not be read back
                self._storage_failed(e)
                return
            if mr is None:
                self._leadership()
                return
            if initial or not self._sync_in_thread:
                sync_now = mr.must_sync_plainly() or mr.written_only
            else:
                if mr.written_only:
                    # "written" is the OS's: the log's buffer goes to it before any answer or
                    # commit counts these entries (a killed process then loses none of them)
                    try:
                        self.storage.log.flush()
                    except StoreClosed:
                        return
                    except StoreError as e:
                        self._storage_failed(e)
                        return
                    self._written_unsynced = True
                    if self._written_timer is None:
                        self._written_timer = asyncio.get_running_loop().call_later(WRITTEN_SYNC_INTERVAL_S,
                                                                                    self._sync_written)
                sync_now = mr.needs_fsync()
            if sync_now:
                if not self._sync():
                    return  # nothing may be sent or applied on the strength of writes that may be lost
                self._written_unsynced = False
                self._release_held(mr.hard)
                if not self._finish(mr.groups, initial):
                    return
                if not initial:
                    self._flush()
                    if self._sync_wanted:
                        self._sync_later([])
            else:
                later = mr.follower_writes | {gid for gid, _, _ in mr.leader_writes}
                if not self._finish(mr.groups, initial, later, mr.follower_writes):
                    return
                self._flush()  # before the fsync is handed to the worker thread: the peers wait for these
                if later or self._held_next or self._sync_wanted:
                    groups = self.multi.groups
                    self._sync_later([(gid, groups[gid], term, index) for gid, term, index in mr.leader_writes])

    def _sync_later(self, leader_writes: list) -> None:
        """The fsync of what was written and not yet made durable, in a worker thread while the
        loop goes on; then each leader counts its entries as its own towards a commit
        (`persisted_to`) and the followers' answers held for it leave. One such fsync runs at a
        time; what is written meanwhile waits for the next, which covers every group's writes
        since (a group commit)."""
        self._unsynced.extend(leader_writes)
        if self._syncing or not (self._unsynced or self._held_next or self._sync_wanted):
            return
        self._written_unsynced = self._sync_wanted = False  # this fsync covers them
        writes, self._unsynced = self._unsynced, []
        held, self._held_next = self._held_next, []
        self._held_syncing = held
        # the files the records name (streams' chunk logs) are fsynced first, and only the
        # records appended by now count as durable: a record appended while the worker runs may
        # name a chunk written after that chunk log's fsync
        side = self.storage.take_side()
        upto = self.storage.log.last_seq if side else None
        loop = asyncio.get_running_loop()
        self._syncing = True
        if self._worker is not None:
            self._worker.submit(self._sync_in_worker, loop, writes, held, side, upto)
        else:
            loop.run_in_executor(None, self._sync_in_worker, loop, writes, held, side, upto)

    def _sync_written(self) -> None:
        """The timer's turn: the fsync of entries that nobody waits for (groups whose entries
        count once written), unless another fsync covered them since."""
        self._written_timer = None
        if self._written_unsynced and not self.failed and not self.storage.closed:
            self._sync_wanted = True
            self._sync_later([])

    def _sync_in_worker(self, loop: asyncio.AbstractEventLoop, writes: list, held: list, side: list,
                        upto: int | None) -> None:
        """In the worker thread: the fsync, then `_synced` on the loop, called from here rather
        than as the executor future's callback (that would take the loop one more iteration, on
        every commit's path)."""
        seq, error = 0, None
        try:
            for f in side:
                f.sync()
            seq = self._thread_sync()
            if upto is not None and upto < seq:
                seq = upto
        except BaseException as e:  # noqa: BLE001 - handed to the loop, which stops the node
            error = e
        try:
            loop.call_soon_threadsafe(self._synced, seq, error, writes, held)
        except RuntimeError:
            pass  # the loop is closed: the node stopped

    def _thread_sync(self) -> int:
        """The log's fsync (`SegmentLog.sync` is thread-safe); the durable seq."""
        faults.check_fsync()
        return self.storage.log.sync()

    def _synced(self, seq: int, error: BaseException | None, writes: list, held: list) -> None:
        """On the loop, once the worker thread's fsync returned (`seq`, the log's durable seq) or
        failed (`error`)."""
        self._syncing = False
        if self.failed or self.storage.closed:
            return  # failed before, or the node stopped (and synced and closed the log itself)
        if isinstance(error, StoreClosed):
            return  # the node is stopping
        if error is not None:
            self._disk_failed(error)
            return
        try:
            self.storage.settle(seq)
        except StoreClosed:
            return
        multi = self.multi
        for gid, g, term, index in writes:
            if multi.groups.get(gid) is g:  # not a group dropped (and perhaps made again) since
                g.persisted_to(index, term)
                multi.touched(gid)
        self._send_held(held)
        self._held_syncing = []
        self._sync_later([])
        self._flush()  # a follower's answers: the commit waits for them
        self._schedule()

    def _hold(self, gid: Any, peer: str, data: bytes) -> None:
        """A follower's message that waits for the next fsync (`MultiReady.follower_writes`)."""
        self._held_next.append((gid, self.multi.groups.get(gid), peer, data))
        self._holding[gid] = self._holding.get(gid, 0) + 1

    def _send_held(self, held: list) -> None:
        """Send held messages whose writes are durable now, in the order they were made."""
        multi, holding = self.multi, self._holding
        for gid, g, peer, data in held:
            left = holding.get(gid, 0) - 1
            if left > 0:
                holding[gid] = left
            else:
                holding.pop(gid, None)
            if multi.groups.get(gid) is g:
                self._send(peer, gid, data)
        held.clear()  # the callback of the fsync that was to release them finds nothing more

    def _release_held(self, hard: Collection[Any]) -> None:
        """After an fsync on the loop, which covered every write so far: the held messages go
        now, but those of groups whose term, vote or snapshot this fsync made durable. Their
        answers may speak of entries that the same Ready cut off (a new leader's first
        AppendEntries can both raise the term and truncate), so they are dropped, as a network
        may drop them; the leader asks again."""
        if not self._holding:
            return
        for gid in hard:
            self._holding.pop(gid, None)
        for held in (self._held_syncing, self._held_next):
            if hard:
                held[:] = [h for h in held if h[0] not in hard]
            self._send_held(held)

    def _finish(self, groups: list, initial: bool, not_durable: Collection[Any] = (),
                hold: Collection[Any] = ()) -> bool:
        """The rest of these groups' Readies, whose writes are durable (but for the entries of
        the groups in `not_durable`): send (the messages of groups in `hold`, and of any group
        with messages held already, wait for the next fsync), apply, advance, compact. False
        when the host stopped (an entry could not be applied, the disk failed)."""
        multi = self.multi
        if not initial:
            names = self.names
            holding = self._holding
            for gid, rd in groups:
                later = gid in hold or gid in holding
                for m in rd.messages:
                    peer = names.get(m.to)
                    if peer is None:
                        continue
                    if later:
                        self._hold(gid, peer, rm.encode(m))
                    else:
                        self._send(peer, gid, rm.encode(m))
        compact = []
        for gid, rd in groups:
            app = self.apps.get(gid)
            g = multi.groups.get(gid)
            if app is None or g is None:
                continue
            if rd.snapshot is not None and rd.snapshot.data:
                app.restore(rd.snapshot.data)
            applied = g.applied
            with_term = hasattr(app, "term")  # an application that records each entry's term (streams' epochs)
            for e in rd.committed_entries:
                if e.index > applied and e.kind == rm.ENTRY_NORMAL and e.data:
                    try:
                        if with_term:
                            app.term = e.term
                        app.apply(e.data, e.index)
                    except Exception:
                        self._apply_failed(gid, e.index)
                        return False
            if rd.snapshot_wanted:
                kept = g.entries_since_snapshot()
                if kept >= self._snapshot_refused.get(gid, 0) and app.snapshot_due(kept):
                    compact.append((gid, app))
        multi.advance_groups(groups, not_durable)
        compacted = False
        for gid, app in compact:
            g = multi.groups.get(gid)
            if g is None:
                continue
            checkpoint = getattr(app, "checkpoint", None)
            try:
                if checkpoint is None:
                    data = self._take_snapshot(gid, g, app)
                    point = None if data is None else (g.applied, None, data)
                else:
                    point = checkpoint(g.applied, g.conf_state(), lambda g=g, app=app, gid=gid:
                                       self._take_snapshot(gid, g, app))
            except Exception:
                self._snapshot_failed(gid)
                return False
            if point is None:
                continue  # none to compact to (yet)
            index, conf, data = point
            needed = getattr(app, "log_needed_from", None)
            g.compact(index, data, needed() if needed is not None else None, conf)
            multi.touched(gid)
            compacted = True
        if not compacted:
            return True
        # what a compaction's snapshot record replaces is released only once that record is
        # durable (`RaftHostStorage.settle`), so nothing waits for its fsync: in a worker thread
        # it follows soon (a stream compacts every SNAPSHOT_ENTRIES batches, and an fsync here,
        # on the loop, took tens of milliseconds each time under load); else it is done here
        if self._sync_in_thread and not initial:
            self._sync_wanted = True
            return True
        return self._sync()

    def _sync(self) -> bool:
        """One fsync of every group's log, here; False (and the node stopping) when the disk failed."""
        try:
            faults.check_fsync()
            self.storage.sync()
            return True
        except StoreClosed:
            return False  # the node is stopping
        except (OSError, StoreError) as e:
            self._disk_failed(e)
            return False

    def _disk_failed(self, e: BaseException) -> None:
        self.failed = True
        self._fatal(f"Raft log fsync failed: {e}")

    def _storage_failed(self, e: BaseException) -> None:
        """A write to or a read from the Raft log failed (a failed fsync before it leaves the log
        refusing writes until it is reopened): the node stops, as for a failed fsync."""
        if not self.failed:
            self.failed = True
            self._fatal(f"Raft log failed: {e}")

    def _take_snapshot(self, gid: Any, g: Any, app: GroupApp) -> bytes | None:
        """The application's snapshot now, or None when it is too large to be one record."""
        data = app.snapshot()
        if len(data) > self._snapshot_bytes_max:
            self._snapshot_too_large(gid, len(data), g.entries_since_snapshot())
            return None
        self._snapshot_refused.pop(gid, None)
        return data

    def _snapshot_too_large(self, gid: Any, size: int, kept: int) -> None:
        """A snapshot that cannot be one record of the log: the group keeps its whole log, and
        tries again once it is twice as long (its application should not have asked for it;
        see `GroupApp.snapshot_due`)."""
        first = gid not in self._snapshot_refused
        self._snapshot_refused[gid] = 2 * kept
        if first:
            log.warning("Raft group %s: a snapshot of %d bytes is over the Raft log's record limit of %d bytes; "
                        "its log is not compacted while its state is that large", gid, size,
                        self._snapshot_bytes_max)

    def _apply_failed(self, gid: Any, index: int) -> None:
        """A committed entry this node could not apply: its copy of the group's state has left
        the other members' (a replica that diverges silently is worse than one that stops).
        The node stops; on restart it replays the log, and the other members carry on."""
        log.exception("Raft group %s: applying committed entry %d failed", gid, index)
        self.failed = True
        self._fatal(f"Raft group {gid}: applying committed entry {index} failed, so this node's copy of its "
                    f"state can no longer be trusted")

    def _snapshot_failed(self, gid: Any) -> None:
        """A group's application could not make its snapshot: a stream syncs its chunk log
        first, and that fsync failed. After a failed fsync the page cache cannot be trusted, so
        the node stops, as for its own Raft log's fsync; on restart it recovers from disk."""
        log.exception("Raft group %s: taking a snapshot failed", gid)
        self.failed = True
        self._fatal(f"Raft group {gid}: taking a snapshot failed, so this node's storage can no longer be trusted")

    def _leadership(self) -> None:
        """Tell the owner whose group (other than the main one) learnt a leader, and which this
        node started or stopped leading."""
        for gid, g in self.multi.groups.items():
            if gid == self.main_gid:
                continue
            leading = g.role == LEADER
            if g.leader != self._leaders.get(gid):
                self._leaders[gid] = g.leader
                if g.leader is not None:
                    self._on_leader_known(gid)
            if leading != (gid in self._leading):
                if leading:
                    self._leading.add(gid)
                else:
                    self._leading.discard(gid)
                self._on_leadership(gid, leading)

    # ------------------------------------------------------------ messages, proposals, members

    def step(self, peer: str, payload: Any) -> None:
        """A Raft message `[group id, message bytes]` from `peer`; a malformed one is logged
        and dropped."""
        try:
            gid, data = payload
            self.multi.step(gid, rm.decode(data))
        except StoreClosed:
            return  # the node is stopping
        except (StoreError, RaftLogError) as e:  # this node's log failed, not the message
            self._storage_failed(e)
            return
        except (msgspec.DecodeError, RaftError, ValueError, TypeError) as e:
            log.warning("bad Raft message from %s: %s", peer, e)
        self._schedule()

    def propose(self, gid: Any, data: bytes) -> bool:
        """Append `data` to group `gid`'s log (this node must lead it). False when it cannot
        now: not the leader any more, or too many proposals in flight (the proposer resends)."""
        try:
            self.multi.propose(gid, data)
        except RaftError:
            return False
        except StoreClosed:
            return False  # the node is stopping
        except (StoreError, RaftLogError) as e:
            self._storage_failed(e)
            return False
        self._schedule()
        return True

    def change_member(self, gid: Any, add: bool, nid: int) -> str | None:
        """On the group's leader: propose adding `nid` as a learner (promoted once caught up) or
        removing it. None when proposed, else why not."""
        g = self.multi.groups.get(gid)
        if g is None:
            return "no such group"
        kind = rm.CONF_ADD_LEARNER if add else rm.CONF_REMOVE
        try:
            g.propose_conf_change(rm.ConfChange(kind, (nid,)))
        except (ProposalRejected, NotLeader) as e:
            return str(e)
        self.multi.touched(gid)
        self._schedule()
        return None

    def peer_down(self, nid: int, alive: set[int]) -> None:
        """Node `nid` is unreachable: each group it belongs to stops sending to it, and a group
        it led has its lowest surviving voter stand for election at once."""
        for gid, g in self.multi.groups.items():
            if nid in g.voters or nid in g.learners:
                g.report_unreachable(nid)
                if g.leader == nid:
                    live = [v for v in g.voters if v in alive]
                    g.leader_down(nid, campaign_now=bool(live) and min(live) == g.id)
                self.multi.touched(gid)

    # ------------------------------------------------------------ groups

    def add_main_group(self, storage_of_group: Any, app: GroupApp) -> Any:
        self.apps[self.main_gid] = app
        return self.multi.add_group(self.main_gid, storage_of_group)

    def ensure_group(self, gid: Any, member_ids: dict[int, str], app: GroupApp, campaign: bool,
                     joining: bool, log_entries: tuple[int, int] | None = None,
                     alone_fsyncs_first: bool = True, entries_wait_for_fsync: bool = True) -> None:
        """Host group `gid` here. A new group's first members start from the same bootstrap
        entry; a member added later (`joining`) starts empty and learns everything from the
        leader. `campaign`: this node stands for election at once (alone, it wins at once).
        `log_entries`: (snapshot after, entries kept after a snapshot) for a group whose
        application keeps its own data and compacts sooner than the node's default.
        `alone_fsyncs_first=False`: a leader alone in the group fsyncs its entries in the worker
        thread too, counting them once that returned, while its loop reads on (streams of one
        replica; `MultiRaft.add_group`).
        `entries_wait_for_fsync=False`: its members count and acknowledge entries once written,
        and the fsync follows in the worker thread (`MultiReady.written_only`)."""
        if gid in self.multi.groups:
            return
        self.names.update(member_ids)
        storage = self.storage.group(gid)
        if storage.last_index() == 0 and storage.snapshot().meta.index == 0 and not joining:
            storage = self.storage.bootstrap(gid, tuple(sorted(member_ids)))
        snap = storage.snapshot()
        if snap.data:
            app.restore(snap.data)
        attach = getattr(app, "attach", None)  # an application that keeps what its entries hold itself
        if attach is not None:
            try:
                attach(storage)
            except (StoreError, RaftLogError) as e:
                self._storage_failed(e)
                return
        self.apps[gid] = app
        g = self.multi.add_group(gid, storage, entries_wait_for_fsync, alone_fsyncs_first)
        if log_entries is not None:
            g.cfg = dataclasses.replace(g.cfg, snapshot_after_entries=log_entries[0],
                                        snapshot_trailing_entries=log_entries[1])
        if campaign or tuple(g.voters) == (self.id,):
            for _ in range(g.cfg.election_timeout_ticks * 2):
                if g.role == LEADER:
                    break
                g.tick()
        self.multi.touched(gid)
        self._schedule()

    def drop_group(self, gid: Any) -> None:
        if gid in self.multi.groups:
            self.multi.remove_group(gid)
        self.apps.pop(gid, None)
        self._snapshot_refused.pop(gid, None)
        self._leading.discard(gid)
        self._leaders.pop(gid, None)


class QueueGroups:
    """The quorum queues' view of this node's Raft groups (hutch.broker.quorumq calls these)."""

    def __init__(self, host: RaftHost, node_id: Callable[[str], int], alone_fsyncs_first: bool = True,
                 entries_wait_for_fsync: bool = True):
        self.host = host
        self.node_id = node_id
        self.alone_fsyncs_first = alone_fsyncs_first  # see RaftHost.ensure_group
        self.entries_wait_for_fsync = entries_wait_for_fsync

    def ensure_group(self, gid: int, members: tuple[str, ...], app: GroupApp, leader_hint: str = "",
                     joining: bool = False, log_entries: tuple[int, int] | None = None) -> None:
        """Host the group here. A new group's first members start from the same bootstrap entry;
        a member added later (`joining`) starts empty and learns everything from the leader. The
        node the queue was placed on (`leader_hint`) campaigns at once."""
        self.host.ensure_group(gid, {self.node_id(m): m for m in members}, app, leader_hint == self.host.name,
                               joining, log_entries, self.alone_fsyncs_first, self.entries_wait_for_fsync)

    def drop_group(self, gid: int) -> None:
        self.host.drop_group(gid)

    def leader(self, gid: int) -> str | None:
        g = self.host.multi.groups.get(gid)
        if g is None or g.leader is None:
            return None
        return self.host.names.get(g.leader)

    def propose(self, gid: int, data: bytes) -> bool:
        return self.host.propose(gid, data)

    def applied_index(self, gid: int) -> int | None:
        """The index of the group's last applied entry on this node (None: no such group here)."""
        g = self.host.multi.groups.get(gid)
        return g.applied if g is not None else None

    def snapshot_index(self, gid: int) -> int:
        """The index of the group's snapshot on this node (0: none)."""
        g = self.host.multi.groups.get(gid)
        return g.storage.snapshot().meta.index if g is not None else 0

    def entry_data(self, gid: int, index: int) -> bytes | None:
        """The data of the group's log entry `index` on this node (None: not in the log)."""
        g = self.host.multi.groups.get(gid)
        if g is None:
            return None
        st = g.storage
        if not st.first_index() <= index <= st.last_index():
            return None
        return st.entries(index, index + 1, 1 << 62)[0].data

    def status(self, gid: int) -> dict | None:
        g = self.host.multi.groups.get(gid)
        if g is None:
            return None
        names = self.host.names
        st = g.status()
        st["snapshot_index"] = g.storage.snapshot().meta.index
        st["voters"] = [names.get(n, str(n)) for n in st["voters"]]
        st["learners"] = [names.get(n, str(n)) for n in st["learners"]]
        st["leader"] = names.get(st["leader"]) if st["leader"] is not None else None
        st.pop("progress", None)
        return st

    def transfer_leader(self, gid: int, node: str) -> str | None:
        """On the group's leader: Raft leadership transfer to `node` (thesis §3.10,
        `RaftGroup.transfer_leadership`): the leader brings `node`'s log up to date, then tells it
        to stand at once. None when started, else why not."""
        g = self.host.multi.groups.get(gid)
        if g is None:
            return "no such queue group here"
        try:
            g.transfer_leadership(self.node_id(node))
        except NotLeader:
            return NOT_LEADER
        except RaftError as e:
            return str(e)
        self.host.multi.touched(gid)
        return None

    def change_members(self, gid: int, op: str, node: str) -> str | None:
        """On the group's leader: add (as a learner that is promoted once caught up) or remove
        one member. None when proposed (or already so), else why not (yet)."""
        g = self.host.multi.groups.get(gid)
        if g is None or g.role != LEADER:
            return NOT_LEADER
        nid = self.node_id(node)
        self.host.names[nid] = node
        member = nid in g.voters or nid in g.learners
        if (op == "add") == member:
            return None
        return self.host.change_member(gid, op == "add", nid)

    def members(self, gid: int) -> list[str] | None:
        g = self.host.multi.groups.get(gid)
        if g is None:
            return None
        names = self.host.names
        return sorted(names.get(n, str(n)) for n in (*g.voters, *g.learners))


__all__ = ["GroupApp", "CallbackApp", "RaftHost", "QueueGroups"]
