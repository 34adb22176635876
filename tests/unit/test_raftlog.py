"""The node's shared Raft log (`hutch.cluster.raftlog`): what a group writes comes back after a
close or a kill -9, truncated entries never come back, many groups share one log, and records
are released once snapshots make them unneeded. The reference for every state is
`MemoryStorage` driven by the same calls (the LogStorage contract of `hutch.raft.storage`)."""

from __future__ import annotations

import dataclasses
import hashlib
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.sim.harness import QUIET, Cluster

from hutch.cluster import catalogue as cat
from hutch.cluster import raftlog
from hutch.cluster.raftlog import HardStateRecord, RaftHostStorage, RaftLog, RaftLogError
from hutch.raft.group import LEADER, RaftGroup
from hutch.raft.messages import ConfState, Entry, HardState, Snapshot, SnapshotMeta
from hutch.raft.storage import MemoryStorage, bootstrap_memory_storage

SMALL = {"segment_bytes_max": 4096}  # segments roll often, so releases delete and rewrite files
GROUPS = (1, 2, 3, (1 << 64) - 1)
REPO = Path(__file__).resolve().parents[2]


def state(s) -> tuple:
    """Everything the LogStorage interface exposes."""
    lo, hi = s.first_index(), s.last_index()
    return lo, hi, s.entries(lo, hi + 1, 1 << 62), s.hard_state(), s.snapshot()


def digest(s) -> bytes:
    return hashlib.sha256(msgspec.msgpack.encode(state(s))).digest()


def random_ops(rng: random.Random, storages: dict, n_ops: int):
    """Exactly one storage write per step (so one log record per step); yields after each.
    The calls depend only on the rng and on the storages' (equal) states."""
    for _ in range(n_ops):
        gid = rng.choice(GROUPS)
        s = storages[gid]
        last, snap, term = s.last_index(), s.snapshot().meta, max(s.hard_state().term, 1)
        op = rng.random()
        if op < 0.5:  # append after the end
            n = rng.randint(1, 4)
            s.append([Entry(term, last + 1 + i, 0, rng.randbytes(rng.choice((3, 40, 300)))) for i in range(n)])
        elif op < 0.62:  # a new leader's entries replace an uncommitted suffix
            lo = max(s.first_index(), snap.index + 1)
            first = rng.randint(lo, last + 1) if lo <= last else lo
            n = rng.randint(1, 3)
            s.append([Entry(term + 1, first + i, 0, rng.randbytes(20)) for i in range(n)])
        elif op < 0.8:
            s.set_hard_state(HardState(term + rng.randint(0, 1), rng.choice((None, 1, 2)), max(last - 1, 0)))
        elif op < 0.96:  # a local snapshot, keeping a few trailing entries
            lo = max(snap.index, s.first_index())
            if last < lo or last < 1:
                s.set_hard_state(HardState(term, None, last))
                yield gid
                continue
            idx = rng.randint(lo, last)
            meta = SnapshotMeta(idx, s.term(idx), ConfState((1, 2, 3)))
            s.create_snapshot(Snapshot(meta, rng.randbytes(rng.randint(0, 200))), idx + 1 - rng.randint(0, 3))
        else:  # a snapshot from the leader replaces the whole log
            idx = rng.randint(snap.index + 1, max(last, snap.index) + 4)  # below the end too: a conflicting log
            s.install_snapshot(Snapshot(SnapshotMeta(idx, term, ConfState((1, 2, 3))), rng.randbytes(50)))
        yield gid


def models() -> dict[int, MemoryStorage]:
    return {g: MemoryStorage() for g in GROUPS}


def host_groups(h: RaftHostStorage) -> dict[int, RaftLog]:
    return {g: h.group(g) for g in GROUPS}


# ---- survival across close / reopen ---------------------------------------------------------


def test_entries_hard_state_and_snapshot_survive_close_and_reopen(tmp_path):
    with RaftHostStorage(tmp_path) as h:
        s = h.bootstrap(5, (1, 2, 3))
        s.append([Entry(1, i, 0, f"e{i}".encode()) for i in range(2, 20)])
        s.set_hard_state(HardState(3, 2, 15))
        s.create_snapshot(Snapshot(SnapshotMeta(10, 1, ConfState((1, 2, 3))), b"state@10"), 8)
        before = state(s)
        h.sync()
    with RaftHostStorage(tmp_path) as h:
        s = h.group(5)
        assert state(s) == before
        assert s.first_index() == 8 and s.last_index() == 19 and s.term(10) == 1
        assert s.snapshot().data == b"state@10" and s.hard_state() == HardState(3, 2, 15)


def test_conflicting_entries_replaced_by_a_truncating_append_stay_replaced_after_reopen(tmp_path):
    with RaftHostStorage(tmp_path) as h:
        s = h.bootstrap(1, (1, 2, 3))
        s.append([Entry(1, i, 0, b"old") for i in range(2, 10)])
        s.append([Entry(2, 5, 0, b"new5"), Entry(2, 6, 0, b"new6")])  # §5.3: 5..9 conflict, 7..9 go
        assert s.truncations == 1
        h.sync()
    with RaftHostStorage(tmp_path) as h:
        s = h.group(1)
        assert s.last_index() == 6
        assert [e.data for e in s.entries(5, 7, 1 << 20)] == [b"new5", b"new6"]
        assert s.term(7) is None


def test_installed_snapshot_replaces_the_whole_log_after_reopen(tmp_path):
    with RaftHostStorage(tmp_path) as h:
        s = h.bootstrap(1, (1, 2, 3))
        s.append([Entry(1, i, 0, b"x") for i in range(2, 10)])
        s.install_snapshot(Snapshot(SnapshotMeta(20, 4, ConfState((1, 2, 3))), b"leader state"))
        h.sync()
    with RaftHostStorage(tmp_path) as h:
        s = h.group(1)
        assert (s.first_index(), s.last_index(), s.term(20)) == (21, 20, 4)
        assert s.snapshot().data == b"leader state"


def test_a_snapshot_installed_below_the_end_of_a_conflicting_log_drops_the_rest_after_reopen(tmp_path):
    with RaftHostStorage(tmp_path) as h:
        s = h.bootstrap(1, (1, 2, 3))
        s.append([Entry(1, i, 0, b"stale") for i in range(2, 31)])
        s.install_snapshot(Snapshot(SnapshotMeta(20, 3, ConfState((1, 2, 3))), b"leader state"))
        h.sync()
    with RaftHostStorage(tmp_path) as h:
        s = h.group(1)
        assert (s.first_index(), s.last_index(), s.term(20), s.term(25)) == (21, 20, 3, None)
        s.append([Entry(3, 21, 0, b"fresh")])
    with RaftHostStorage(tmp_path) as h:
        s = h.group(1)
        assert (s.first_index(), s.last_index()) == (21, 21)
        assert s.entries(21, 22, 100)[0].data == b"fresh"


def test_many_groups_interleaved_in_one_log_each_get_their_own_state_back(tmp_path):
    rng = random.Random(7)
    model = models()
    with RaftHostStorage(tmp_path, **SMALL) as h:
        disk = host_groups(h)
        for _ in zip(random_ops(random.Random(7), model, 600), random_ops(rng, disk, 600), strict=True):
            pass
        h.sync()
        assert h.log.segment_count > 1
    with RaftHostStorage(tmp_path, **SMALL) as h:
        assert sorted(h.groups) == sorted(GROUPS)
        for g in GROUPS:
            assert state(h.group(g)) == state(model[g]), g


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 1 << 32), reopen_every=st.integers(5, 120), maintain_every=st.integers(3, 50))
def test_random_writes_with_reopens_and_compaction_always_recover_the_model_state(tmp_path_factory, seed,
                                                                                  reopen_every, maintain_every):
    directory = tmp_path_factory.mktemp("raftlog")
    model = models()
    h = RaftHostStorage(directory, **SMALL)
    try:
        disk = host_groups(h)
        steps = zip(random_ops(random.Random(seed), model, 300), random_ops(random.Random(seed), disk, 300),
                    strict=True)
        for n, _ in enumerate(steps, 1):
            if n % 3 == 0:
                h.sync()
            if n % maintain_every == 0:
                h.maintain()
            if n % reopen_every == 0:
                h.close()
                h = RaftHostStorage(directory, **SMALL)
                disk.update(host_groups(h))  # the generator holds `disk`: hand it the new storages
                for g in GROUPS:
                    assert state(disk[g]) == state(model[g]), (seed, n, g)
        h.sync()
        h.maintain()
        # Compaction keeps only what the groups need, plus records kept by the release rules.
        needed = sum(len(disk[g].record_seqs()) for g in GROUPS)
        assert h.log.live_records <= needed + h.waiting_count
    finally:
        h.close()
    with RaftHostStorage(directory, **SMALL) as h:
        for g in GROUPS:
            assert state(h.group(g)) == state(model[g]), (seed, g)


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 1 << 32), window=st.integers(1, 6), reopen_every=st.integers(20, 120))
def test_a_log_that_keeps_few_entries_in_memory_reads_the_others_back_the_same(tmp_path_factory, monkeypatch, seed,
                                                                                window, reopen_every):
    """Every read after every write, with only `window` entries in memory: entries paged out
    come back from their records as they were, across truncations, compactions and reopens,
    and no more than the window stays in memory."""
    monkeypatch.setattr(raftlog, "MEMORY_ENTRIES", window)
    directory = tmp_path_factory.mktemp("raftlog")
    model = models()
    h = RaftHostStorage(directory, **SMALL)
    reads = 0
    try:
        disk = host_groups(h)
        steps = zip(random_ops(random.Random(seed), model, 300), random_ops(random.Random(seed), disk, 300),
                    strict=True)
        for n, (g, _) in enumerate(steps, 1):
            if n % 3 == 0:
                h.sync()
            assert state(disk[g]) == state(model[g]), (seed, n, g)
            assert sum(e is not None for e in disk[g]._entries) <= window, (seed, n, g)
            if n % reopen_every == 0:
                reads += sum(disk[g].reads for g in GROUPS)
                h.close()
                h = RaftHostStorage(directory, **SMALL)
                disk.update(host_groups(h))
        assert reads + sum(disk[g].reads for g in GROUPS) > 0
    finally:
        h.close()


def test_entries_paged_out_are_read_back_ahead_in_one_go(tmp_path, monkeypatch):
    monkeypatch.setattr(raftlog, "MEMORY_ENTRIES", 4)
    with RaftHostStorage(tmp_path) as h:
        s = h.bootstrap(7, (1, 2, 3))
        for i in range(2, 1002):
            s.append([Entry(1, i, 0, b"x%d" % i)])  # one record each, as a leader writes them
        assert sum(e is not None for e in s._entries) == 4
        got = [e.data for lo in range(2, 1002, 50) for e in s.entries(lo, lo + 50, 1 << 62)]
        assert got == [b"x%d" % i for i in range(2, 1002)]
        # read ahead: a read brings the next records with it, not one read per entry
        assert s.reads <= 1000 // raftlog.READ_AHEAD_RECORDS + 2


def test_snapshots_release_compacted_records_and_the_log_shrinks(tmp_path):
    with RaftHostStorage(tmp_path, **SMALL) as h:
        s = h.bootstrap(9, (1,))
        for i in range(2, 2000):
            s.append([Entry(1, i, 0, b"p" * 50)])
        h.sync()
        grown = h.log.segment_count
        s.create_snapshot(Snapshot(SnapshotMeta(1990, 1, ConfState((1,))), b"s"), 1991)
        h.sync()
        h.maintain()
        assert grown > 20 and h.log.segment_count <= 2
        assert h.log.live_records == len(s.record_seqs()) == 1 + 1 + 9  # hard state, snapshot, 9 entries
    with RaftHostStorage(tmp_path, **SMALL) as h:
        s = h.group(9)
        assert (s.first_index(), s.last_index()) == (1991, 1999)


def test_a_record_is_not_released_before_the_record_replacing_it_is_durable(tmp_path):
    with RaftHostStorage(tmp_path) as h:
        s = h.bootstrap(1, (1,))
        first_hs = s.record_seqs()
        s.set_hard_state(HardState(2, 1, 1))
        assert all(h.log.is_live(q) for q in first_hs)  # the new hard state is not synced yet
        h.sync()
        assert [q for q in first_hs if h.log.is_live(q)] == [min(first_hs)]  # the entry stays, the old hs goes


def test_group_ids_must_be_stream_keys(tmp_path):
    with RaftHostStorage(tmp_path) as h:
        with pytest.raises(RaftLogError):
            h.group(1 << 64)
        with pytest.raises(RaftLogError):
            h.bootstrap(1, (1,)) and h.bootstrap(1, (1,))


def test_storage_errors_match_memory_storage(tmp_path):
    with RaftHostStorage(tmp_path) as h:
        s, m = h.bootstrap(1, (1,)), bootstrap_memory_storage((1,))
        for st_ in (s, m):
            with pytest.raises(IndexError):
                st_.append([Entry(1, 5)])  # a gap
            with pytest.raises(IndexError):
                st_.entries(0, 2, 100)
            with pytest.raises(IndexError):
                st_.create_snapshot(Snapshot(SnapshotMeta(3, 1)), 3)
        assert state(s) == state(m)


# ---- kill -9 ------------------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import random, sys
    from hutch.cluster.raftlog import RaftHostStorage
    from tests.unit.test_raftlog import GROUPS, SMALL, random_ops
    h = RaftHostStorage(sys.argv[1], **SMALL)
    disk = {g: h.group(g) for g in GROUPS}
    seed, batch, total = (int(a) for a in sys.argv[2:5])
    for n, _ in enumerate(random_ops(random.Random(seed), disk, total), 1):
        if n % batch == 0:
            h.sync()
            if n % (batch * 5) == 0:
                h.maintain()
            print(n, flush=True)
    print("done", flush=True)
    sys.stdin.read()  # wait to be killed
""")


@pytest.mark.parametrize("seed,batch,reports_before_kill", [(1, 1, 40), (2, 7, 25), (3, 25, 12)])
def test_kill_9_keeps_every_write_reported_durable_and_recovers_a_prefix_of_the_writes(tmp_path, seed, batch,
                                                                                       reports_before_kill):
    total = 1200
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), str(seed), str(batch), str(total)],
                            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        durable_ops = 0
        for _ in range(reports_before_kill):
            line = proc.stdout.readline()
            assert line and line != "done\n", f"child stopped early: {proc.stderr.read()}"
            durable_ops = int(line)
        proc.kill()  # SIGKILL, while the child keeps writing
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()

    with RaftHostStorage(tmp_path, **SMALL) as h:
        recovered = {g: digest(h.group(g)) for g in GROUPS}
    # The model after each write: the recovered state must be the state after some write at
    # or after the last one reported durable (a kill loses only what was still buffered).
    model = models()
    current = {g: digest(model[g]) for g in GROUPS}
    matches = []
    for n, gid in enumerate(random_ops(random.Random(seed), model, total), 1):
        current[gid] = digest(model[gid])
        if n >= durable_ops and current == recovered:
            matches.append(n)
    assert matches, f"recovered state is no prefix at or after write {durable_ops}"


# ---- a Raft cluster on disk ----------------------------------------------------------------


class DiskCluster(Cluster):
    """The scripted-test cluster of tests/sim with each node's log in its own RaftHostStorage;
    every Ready's writes are synced before its messages can be delivered, and committed
    entries are applied to a catalogue per node (snapshots are catalogue snapshots)."""

    GROUP = 0

    def __init__(self, root: Path, ids=(1, 2, 3), cfg=QUIET, fresh: bool = True):
        self.root = root
        self.hosts = {i: RaftHostStorage(root / f"n{i}", segment_bytes_max=64 * 1024) for i in ids}
        self.catalogues: dict[int, cat.Catalogue] = {}
        storages = {}
        for i in ids:
            h = self.hosts[i]
            storages[i] = h.bootstrap(self.GROUP, ids) if fresh else h.group(self.GROUP)
            snap = storages[i].snapshot()
            self.catalogues[i] = cat.Catalogue.from_snapshot(snap.data) if snap.data else cat.Catalogue()
        super().__init__(ids, cfg, storages=storages)

    def process(self) -> None:
        moved = True
        while moved:
            moved = False
            for i, g in self.groups.items():
                if g.has_ready():
                    rd = g.ready()
                    moved = True
                    self.hosts[i].sync()  # persist before anything of this Ready leaves
                    self.inbox.extend(rd.messages)
                    if rd.snapshot is not None:
                        self.catalogues[i].restore(rd.snapshot.data)
                    for e in rd.committed_entries:
                        if e.index > g.applied and e.kind == 0 and e.data:
                            self.catalogues[i].apply_encoded(e.data)
                    g.advance(rd)

    def close(self) -> None:
        for h in self.hosts.values():
            h.close()


def test_a_three_node_catalogue_group_on_disk_restarts_with_every_committed_command(tmp_path):
    cfg = dataclasses.replace(QUIET, snapshot_trailing_entries=2)
    c = DiskCluster(tmp_path, cfg=cfg)
    try:
        c.elect(1)
        c[1].propose(cat.encode_command(cat.AddVhost("/")))
        for i in range(30):
            c[1].propose(cat.encode_command(cat.DeclareQueue("/", f"q{i}", journal_id=i + 1, leader_node="n1")))
            c.deliver()
        # Node 3 misses the rest, and node 1 and 2 snapshot past it: it will need InstallSnapshot.
        c.isolate(3)
        for i in range(30, 40):
            c[1].propose(cat.encode_command(cat.DeclareQueue("/", f"q{i}", journal_id=i + 1)))
            c.deliver()
        c.stabilize(2)
        for i in (1, 2):
            g = c[i]
            g.compact(g.applied, c.catalogues[i].snapshot())
            c.hosts[i].sync()
        assert c[1].storage.first_index() > c[3].storage.last_index()
        expected = c.catalogues[1].snapshot()
        assert c.catalogues[2].snapshot() == expected
    finally:
        c.close()

    # Every node restarts from its disk only.
    c = DiskCluster(tmp_path, cfg=cfg, fresh=False)
    try:
        assert c[1].storage.snapshot().data == expected
        c.elect(2)
        c[2].propose(cat.encode_command(cat.DeclareExchange("/", "after-restart", "topic")))
        c.stabilize(3)
        assert [i for i in (1, 2, 3) if c[i].role == LEADER] == [2]
        snaps = {i: c.catalogues[i].snapshot() for i in (1, 2, 3)}
        assert snaps[1] == snaps[2] == snaps[3]
        assert c.catalogues[3].queue("/", "q39") is not None  # caught up by snapshot
        assert c.catalogues[3].exchange("/", "after-restart") is not None
    finally:
        c.close()


def test_raft_groups_restarted_from_disk_keep_term_vote_and_log(tmp_path):
    with RaftHostStorage(tmp_path) as h:
        g = RaftGroup(1, h.bootstrap(3, (1,)), QUIET)
        for _ in range(2 * QUIET.election_timeout_ticks):  # a single voter elects itself
            g.tick()
            while g.has_ready():
                rd = g.ready()
                h.sync()
                g.advance(rd)
        assert g.is_leader
        idx = g.propose(b"cmd")
        while g.has_ready():
            rd = g.ready()
            h.sync()
            g.advance(rd)
        term, commit = g.term, g.commit
        assert commit == idx
    with RaftHostStorage(tmp_path) as h:
        g = RaftGroup(1, h.group(3), QUIET)
        assert (g.term, g.vote, g.commit) == (term, 1, commit)
        assert g.storage.entries(idx, idx + 1, 100)[0].data == b"cmd"



def test_a_log_with_a_corrupt_record_is_refused_rather_than_replayed_around_it(tmp_path):
    """A damaged newest hard state would otherwise bring back an older vote (a double vote)."""
    with RaftHostStorage(tmp_path) as h:
        s = h.bootstrap(5, (1, 2, 3))
        s.set_hard_state(HardState(2, 1, 1))
        s.set_hard_state(HardState(3, 2, 1))  # the newest term and vote
        s.append([Entry(3, 2, 0, b"after")])
        h.sync()
    newest = msgspec.msgpack.encode(HardStateRecord(HardState(3, 2, 1)))
    [seg] = [p for p in tmp_path.iterdir() if p.is_file() and newest in p.read_bytes()]
    data = bytearray(seg.read_bytes())
    at = data.rfind(newest)
    data[at + len(newest) - 1] ^= 0xFF  # the vote's commit index: the CRC no longer matches
    seg.write_bytes(bytes(data))
    with pytest.raises(RaftLogError, match="corrupt data .* will not serve its Raft groups"):
        RaftHostStorage(tmp_path)


def test_damage_to_a_synced_vote_at_the_end_of_the_log_is_refused_not_cut_as_a_torn_write(tmp_path):
    """A torn write can only hit bytes that were never synced. The newest term and vote, synced
    and then damaged at the log's very end, must not be cut away like a torn tail: an older vote
    would come back."""
    with RaftHostStorage(tmp_path) as h:
        s = h.bootstrap(5, (1, 2, 3))
        s.set_hard_state(HardState(2, 1, 1))
        h.sync()
        s.set_hard_state(HardState(3, 2, 1))  # the newest term and vote, the log's last record
        h.sync()
    newest = msgspec.msgpack.encode(HardStateRecord(HardState(3, 2, 1)))
    [seg] = [p for p in tmp_path.iterdir() if p.is_file() and newest in p.read_bytes()]
    data = bytearray(seg.read_bytes())
    assert data.endswith(newest)
    data[-1] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(RaftLogError, match="corrupt data .* will not serve its Raft groups"):
        RaftHostStorage(tmp_path)
