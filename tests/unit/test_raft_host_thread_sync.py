"""The Raft log's fsync in a worker thread (hutch.server.raft_host, `sync_in_thread`), on three
hosts of one group in this process, each with its own RaftHostStorage, their messages carried
by the test. Raft thesis §10.2.1: a leader sends its entries before its own fsync, which runs
in a worker thread, and counts itself towards a commit only once that fsync returned; a
follower answers only for what it has fsynced; a hard state that only moves the commit index
costs no fsync; a failed fsync in the thread stops the node as one on the loop does. A group whose
entries count once written (streams' `stream.fsync = background`) commits without waiting for any
fsync, and the fsync follows within `WRITTEN_SYNC_INTERVAL_S`; its votes are still fsynced first."""

from __future__ import annotations

import asyncio
import functools
import threading

import pytest

from hutch.cluster.raftlog import RaftHostStorage
from hutch.raft import messages as rm
from hutch.raft.group import LEADER, RaftConfig
from hutch.server import faults
from hutch.server.raft_host import WRITTEN_SYNC_INTERVAL_S, QueueGroups, RaftHost
from hutch.server.worker import WorkerThread

GID = 5
NAMES = {1: "n1@h", 2: "n2@h", 3: "n3@h"}
WAIT_S = 30.0


class App:
    def __init__(self):
        self.applied: list[bytes] = []

    def apply(self, data: bytes, index: int) -> None:
        self.applied.append(data)

    def restore(self, data: bytes) -> None:
        raise AssertionError("no snapshot here")

    def snapshot(self) -> bytes:
        return b""

    def snapshot_due(self, entries_kept: int) -> bool:
        return False


class Node:
    def __init__(self, nid: int, tmp_path, entries_wait_for_fsync: bool = True, own_thread: bool = False):
        self.id = nid
        # the node's own fsync thread (a real node's), or the loop's default executor
        self.worker = WorkerThread(f"raft-fsync-{nid}") if own_thread else None
        self.storage = RaftHostStorage(tmp_path / f"raft-{nid}")
        self.outbox: list[tuple[str, object, bytes]] = []  # sent, not yet delivered
        self.fatal: list[str] = []
        self.scheduled = False
        self.app = App()
        self.host = RaftHost(nid, NAMES[nid], self.storage,
                             RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1, seed=nid),
                             dict(NAMES), 0, send=lambda peer, gid, data: self.outbox.append((peer, gid, data)),
                             schedule=self._schedule, on_leader_known=lambda gid: None,
                             on_leadership=lambda gid, leading: None, fatal=self.fatal.append,
                             sync_in_thread=True, worker=self.worker)
        by_name = {v: k for k, v in NAMES.items()}
        QueueGroups(self.host, by_name.__getitem__, entries_wait_for_fsync=entries_wait_for_fsync).ensure_group(GID, tuple(NAMES.values()), self.app,
                                                                  leader_hint=NAMES[1])

    def _schedule(self) -> None:
        self.scheduled = True

    @property
    def group(self):
        return self.host.multi.groups[GID]

    def propose(self, data: bytes) -> int:
        """Propose as leader and hand the Ready over (its AppendEntries go to the outbox)."""
        index = self.group.propose(data)
        self.host.multi.touched(GID)
        self.host.drain()
        return index

    def sent(self, kind: type) -> list:
        return [rm.decode(data) for _, _, data in self.outbox if isinstance(rm.decode(data), kind)]


class Cluster:
    def __init__(self, tmp_path, entries_wait_for_fsync: bool = True, own_thread: bool = False):
        self.nodes = {nid: Node(nid, tmp_path, entries_wait_for_fsync, own_thread) for nid in NAMES}
        self.by_name = {NAMES[nid]: n for nid, n in self.nodes.items()}

    def drain_all(self) -> None:
        for n in self.nodes.values():
            n.scheduled = False
            n.host.drain()

    def deliver(self, frm: int, to: int | None = None) -> int:
        """Hand node `frm`'s sent messages (to `to` only, if given) to their nodes."""
        n = self.nodes[frm]
        keep, moved = [], 0
        for peer, gid, data in n.outbox:
            dest = self.by_name[peer]
            if to is None or dest.id == to:
                dest.host.step(NAMES[frm], [gid, data])
                moved += 1
            else:
                keep.append((peer, gid, data))
        n.outbox = keep
        return moved

    def hand_over(self, frm: int, to: int) -> None:
        """Node `to` gets what node `frm` sent it and drains; its own earlier messages are forgotten."""
        self.nodes[to].outbox.clear()
        self.deliver(frm, to=to)
        self.nodes[to].host.drain()

    async def until(self, cond, what: str) -> None:
        """Run the loop (the worker threads' callbacks) and drain scheduled hosts until `cond()`."""
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not cond():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.001)
            for n in self.nodes.values():
                if n.scheduled:
                    n.scheduled = False
                    n.host.drain()

    async def settle(self) -> None:
        """Deliver everything until no node has anything to send and no fsync runs."""
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while True:
            moved = sum(self.deliver(nid) for nid in self.nodes)
            self.drain_all()
            busy = any(n.host._syncing for n in self.nodes.values())
            if not moved and not busy and not any(n.outbox for n in self.nodes.values()):
                return
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError("the cluster did not settle")
            await asyncio.sleep(0.001)

    async def elect_node_1(self) -> Node:
        leader = self.nodes[1]
        self.drain_all()  # each applies the bootstrap entry: now they know the voters
        for _ in range(10 * leader.group.cfg.election_timeout_ticks):  # only node 1's clock runs
            if leader.group.role == LEADER:
                break
            leader.host.multi.tick()
            await self.settle()
        assert leader.group.role == LEADER
        return leader

    def close(self) -> None:
        for n in self.nodes.values():
            if n.worker is not None:
                n.worker.close()
            n.storage.close()


def on_a_loop(test):
    """Run an async test on a fresh event loop (whose default executor runs the fsyncs, unless
    the nodes have their own thread)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        asyncio.run(test(*args, **kwargs))
    return run


@pytest.fixture(params=["default executor", "own thread"])
def cluster(tmp_path, request):
    c = Cluster(tmp_path, own_thread=request.param == "own thread")
    yield c
    c.close()


@on_a_loop
async def test_a_leader_sends_its_entries_before_its_own_fsync_and_counts_itself_once_synced(cluster):
    leader = await cluster.elect_node_1()
    g = leader.group
    fsyncs = leader.storage.log.fsync_count
    index = leader.propose(b"m1")
    sent = leader.sent(rm.AppendEntries)
    assert {m.to for m in sent if m.entries and m.entries[-1].index == index} == {2, 3}  # before the fsync
    assert leader.storage.log.fsync_count == fsyncs and leader.host._syncing
    assert g.progress[1].match < index  # not counted as the leader's own yet
    await cluster.until(lambda: g.progress[1].match >= index, "the leader's fsync")
    assert leader.storage.log.fsync_count > fsyncs
    assert g.commit < index  # one of three members is no majority
    await cluster.settle()
    assert g.commit >= index and leader.app.applied[-1:] == [b"m1"]


def _blocked_fsync(node: Node) -> threading.Event:
    """Hold `node`'s next worker-thread fsyncs until the returned event is set."""
    go = threading.Event()
    real = node.host._thread_sync

    def thread_sync():
        go.wait(5.0)  # a failing test must not hold the loop's executor for long
        return real()

    node.host._thread_sync = thread_sync
    return go


@on_a_loop
async def test_a_follower_answers_only_once_its_fsync_in_the_worker_thread_returned(cluster):
    leader = await cluster.elect_node_1()
    follower = cluster.nodes[2]
    go = _blocked_fsync(follower)
    index = leader.propose(b"m1")
    fsyncs = follower.storage.log.fsync_count
    cluster.hand_over(1, 2)
    await asyncio.sleep(0.05)
    assert follower.host._syncing and not follower.sent(rm.AppendResponse)  # held
    go.set()
    await cluster.until(lambda: follower.sent(rm.AppendResponse), "the follower's answer")
    assert max(m.index for m in follower.sent(rm.AppendResponse)) >= index
    assert follower.storage.log.fsync_count > fsyncs


@on_a_loop
async def test_a_follower_applies_what_is_committed_while_its_own_fsync_runs(cluster):
    leader = await cluster.elect_node_1()
    follower = cluster.nodes[2]
    leader.propose(b"m1")
    await cluster.settle()
    assert leader.app.applied == [b"m1"]
    go = _blocked_fsync(follower)
    index = leader.propose(b"m2")  # its AppendEntries carries m1's commit
    cluster.hand_over(1, 2)
    assert follower.app.applied == [b"m1"]  # applied before the fsync of m2
    assert not [m for m in follower.sent(rm.AppendResponse) if m.index >= index]
    go.set()
    await cluster.settle()
    assert [n.app.applied for n in cluster.nodes.values()] == [[b"m1", b"m2"]] * 3


@on_a_loop
async def test_an_answer_held_across_a_new_term_is_dropped_and_the_vote_leaves_at_once(cluster):
    leader = await cluster.elect_node_1()
    follower = cluster.nodes[2]
    go = _blocked_fsync(follower)
    index = leader.propose(b"m1")
    cluster.hand_over(1, 2)  # its answer for m1 waits for the blocked fsync
    g = follower.group
    vote = rm.RequestVote(g.term + 1, 3, 2, index + 10, g.term, transfer=True)
    follower.host.step(NAMES[3], [GID, rm.encode(vote)])
    follower.host.drain()  # a new term and vote: fsynced on the loop before the answer leaves
    votes = follower.sent(rm.VoteResponse)
    assert votes and votes[-1].granted and g.term == vote.term
    go.set()
    await asyncio.sleep(0.1)
    await cluster.until(lambda: not follower.host._syncing, "the blocked fsync")
    # the answer made in the old term never leaves: the same fsync wrote the new term
    assert not [m for m in follower.sent(rm.AppendResponse) if m.term < vote.term]
    assert follower.host._holding == {} and follower.host._held_next == []


@on_a_loop
async def test_moving_the_commit_index_alone_costs_no_fsync(cluster):
    leader = await cluster.elect_node_1()
    leader.propose(b"m1")
    cluster.deliver(1)
    cluster.drain_all()
    followers = [cluster.nodes[2], cluster.nodes[3]]
    await cluster.until(lambda: all(f.sent(rm.AppendResponse) for f in followers), "the followers' answers")
    cluster.deliver(2)
    cluster.deliver(3)
    cluster.drain_all()
    assert leader.app.applied == [b"m1"]  # committed by the followers' copies, applied
    fsyncs = {n.id: n.storage.log.fsync_count for n in cluster.nodes.values()}
    cluster.deliver(1)  # the new commit index
    cluster.drain_all()
    assert [f.app.applied for f in followers] == [[b"m1"], [b"m1"]]
    assert {n.id: n.storage.log.fsync_count for n in cluster.nodes.values()} == fsyncs


@on_a_loop
async def test_a_failed_fsync_in_the_worker_thread_stops_the_node(cluster, tmp_path, monkeypatch):
    leader = await cluster.elect_node_1()
    fault = tmp_path / "fsync-fails"
    fault.touch()
    monkeypatch.setattr(faults, "_fsync_file", str(fault))  # what HUTCH_FAULT_FSYNC_FILE switches on
    leader.propose(b"m1")
    await cluster.until(lambda: leader.host.failed, "the node to stop")
    assert len(leader.fatal) == 1 and "Raft log fsync failed" in leader.fatal[0]
    assert leader.group.progress[1].match < leader.group.storage.last_index()  # never counted as its own
    leader.group.propose(b"m2")
    leader.host.drain()  # a failed host does nothing more
    assert leader.app.applied == []


@pytest.fixture(params=["default executor", "own thread"])
def written_cluster(tmp_path, request):
    c = Cluster(tmp_path, entries_wait_for_fsync=False, own_thread=request.param == "own thread")
    yield c
    c.close()


@on_a_loop
async def test_a_group_counting_written_entries_commits_with_every_fsync_held_and_fsyncs_soon_after(written_cluster):
    cluster = written_cluster
    fsyncs_before_election = cluster.nodes[1].storage.log.fsync_count
    leader = await cluster.elect_node_1()
    assert leader.storage.log.fsync_count > fsyncs_before_election  # the term and the vote: fsynced all the same
    gos = [_blocked_fsync(n) for n in cluster.nodes.values()]
    fsyncs = {n.id: n.storage.log.fsync_count for n in cluster.nodes.values()}
    index = leader.propose(b"m1")
    for _ in range(3):  # AppendEntries, the answers, the commit: no fsync waited for on the way
        for nid in cluster.nodes:
            cluster.deliver(nid)
        cluster.drain_all()
    assert leader.group.commit >= index
    assert [n.app.applied for n in cluster.nodes.values()] == [[b"m1"]] * 3
    assert {n.id: n.storage.log.fsync_count for n in cluster.nodes.values()} == fsyncs
    for go in gos:
        go.set()
    # nobody waits for it, and it comes all the same: the timer hands it to the worker thread
    started = asyncio.get_running_loop().time()
    await cluster.until(lambda: all(n.storage.log.fsync_count > fsyncs[n.id] for n in cluster.nodes.values())
                        and all(not n.host._syncing for n in cluster.nodes.values()), "the fsyncs that follow")
    assert asyncio.get_running_loop().time() - started < WRITTEN_SYNC_INTERVAL_S + 5.0
    assert not any(n.host._written_unsynced for n in cluster.nodes.values())


async def elected_alone(n: Node, solo: int, app: App | None = None, log_entries: tuple[int, int] | None = None,
                        **options):
    """Group `solo` of node `n`'s voter alone (QueueGroups `options`; its application `app`, else
    the node's), once it leads with its election's entries committed (they may go through the
    worker thread too)."""
    by_name = {v: k for k, v in NAMES.items()}
    QueueGroups(n.host, by_name.__getitem__, **options).ensure_group(solo, (NAMES[1],), app or n.app,
                                                                     leader_hint=NAMES[1], log_entries=log_entries)
    g = n.host.multi.groups[solo]
    for _ in range(10 * g.cfg.election_timeout_ticks):  # the bootstrap entry applied, it elects itself
        n.host.drain()
        await asyncio.sleep(0.01)
        if g.role == LEADER and g.commit == g.storage.last_index():
            break
        n.host.multi.tick()
    assert g.role == LEADER
    return g


@on_a_loop
async def test_a_group_counting_written_entries_alone_fsyncs_nothing_on_the_loop(tmp_path):
    n = Node(1, tmp_path, entries_wait_for_fsync=False)
    try:
        solo = GID + 1
        g = await elected_alone(n, solo, entries_wait_for_fsync=False)
        fsyncs = n.storage.log.fsync_count
        index = g.propose(b"alone")
        n.host.multi.touched(solo)
        n.host.drain()
        assert g.commit >= index and n.app.applied == [b"alone"]  # a one-voter group commits what it wrote
        assert n.storage.log.fsync_count == fsyncs
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while n.storage.log.fsync_count == fsyncs:
            assert asyncio.get_running_loop().time() < deadline, "no fsync followed"
            await asyncio.sleep(0.01)
    finally:
        n.storage.close()


@on_a_loop
async def test_a_leader_alone_that_does_not_fsync_first_commits_once_the_worker_threads_fsync_returned(tmp_path):
    """A stream of one replica (`alone_fsyncs_first=False`): its entries go to the worker thread
    like a leader of several voters', and are committed and applied once that fsync returned."""
    n = Node(1, tmp_path)
    try:
        solo = GID + 2
        g = await elected_alone(n, solo, alone_fsyncs_first=False)
        go = _blocked_fsync(n)
        fsyncs = n.storage.log.fsync_count
        index = g.propose(b"alone")
        n.host.multi.touched(solo)
        n.host.drain()
        assert n.storage.log.fsync_count == fsyncs and g.commit < index and b"alone" not in n.app.applied
        go.set()
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while b"alone" not in n.app.applied:
            assert asyncio.get_running_loop().time() < deadline, "never committed"
            await asyncio.sleep(0.001)
            if n.scheduled:
                n.scheduled = False
                n.host.drain()
        assert g.commit >= index and n.storage.log.fsync_count > fsyncs
    finally:
        n.storage.close()


class CompactingApp(App):
    def snapshot(self) -> bytes:
        return b"%d" % len(self.applied)

    def snapshot_due(self, entries_kept: int) -> bool:
        return True


@on_a_loop
async def test_a_compactions_snapshot_record_is_fsynced_in_the_worker_thread_and_releases_only_then(tmp_path):
    """A compaction writes a snapshot record and releases the records it replaces once that one
    is durable (`RaftHostStorage.settle`): the fsync runs in the worker thread, not on the loop
    (a stream compacts every few dozen batches, and that fsync took its loop for tens of ms)."""
    n = Node(1, tmp_path)
    try:
        solo = GID + 3
        app = CompactingApp()
        g = await elected_alone(n, solo, app=app, log_entries=(4, 0))
        for i in range(6):  # past the first compaction
            g.propose(b"e%d" % i)
            n.host.multi.touched(solo)
            n.host.drain()
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while n.host._syncing:
            assert asyncio.get_running_loop().time() < deadline, "the fsyncs did not end"
            await asyncio.sleep(0.001)
        snap_at = g.storage.snapshot().meta.index
        fsyncs = n.storage.log.fsync_count
        go = _blocked_fsync(n)
        for i in range(8):  # a lone leader fsyncs its entries on the loop, applies them, compacts
            g.propose(b"f%d" % i)
            n.host.multi.touched(solo)
            n.host.drain()
            if g.storage.snapshot().meta.index > snap_at:
                break
        assert g.storage.snapshot().meta.index > snap_at  # compacted
        assert n.host._syncing  # the snapshot record's fsync: in the worker thread, held
        snap_seq = g.storage._snap_seq  # the snapshot record, and the records it replaces
        replaced = [seq for seq, by in n.storage._retiring if by == snap_seq]
        assert replaced and n.storage.log.durable_seq < snap_seq  # not durable yet, so none released
        go.set()
        while n.storage.log.durable_seq < snap_seq or any(by == snap_seq for _, by in n.storage._retiring):
            assert asyncio.get_running_loop().time() < deadline, "the replaced records were never released"
            await asyncio.sleep(0.001)
        assert n.storage.log.fsync_count > fsyncs and not n.fatal
    finally:
        n.storage.close()


@on_a_loop
async def test_a_side_file_is_fsynced_before_the_raft_log_and_records_appended_meanwhile_are_not_durable_yet(cluster):
    """A stream's chunk log (a side file) holds what the Raft log's records name: the worker
    thread fsyncs it first, and a record appended while it runs (its chunk may have been
    written after that fsync) is not counted durable by this round."""
    leader = await cluster.elect_node_1()
    st = leader.storage
    order: list[tuple[str, int]] = []
    settled: list[int] = []
    late: list[int] = []

    class Side:
        def sync(self):
            order.append(("side", st.log.fsync_count))
            late.append(st.log.append(b"appended while the worker thread runs", key=99))

    real_settle = st.settle
    st.settle = lambda seq: (settled.append(seq), real_settle(seq))[1]
    fsyncs = st.log.fsync_count
    st.side_written(Side())
    leader.propose(b"m1")
    await cluster.until(lambda: st.log.fsync_count > fsyncs and settled, "the leader's fsync")
    assert order == [("side", fsyncs)]  # once, before the Raft log's fsync
    assert settled[0] < late[0]
    assert st.take_side() == []


@on_a_loop
async def test_entries_that_count_once_written_are_with_the_os_before_the_follower_answers(written_cluster):
    """`entries_wait_for_fsync=False`: a follower answers before its fsync, but not before its
    log's buffer went to the OS (a killed process must lose none of what it acknowledged)."""
    leader = await written_cluster.elect_node_1()
    follower = written_cluster.nodes[2]
    log_ = follower.storage.log
    index = leader.propose(b"m1")  # a small entry: the log buffers its record
    written_cluster.hand_over(1, 2)
    answers = [m for m in follower.sent(rm.AppendResponse) if m.index >= index]
    assert answers and log_.written_seq == log_.last_seq
