"""AheadWriter over a real node Raft log (RaftHostStorage) and a real StreamLog: a stream member
writes each batch's chunk when the batch enters its Raft log, and the Raft log's record keeps
the batch without its records.

The Raft group is played by hand here (appends, truncations, applying what is committed), so
that each case of the log's life is set up exactly: written once, read back whole, a replaced
suffix, duplicates, a snapshot from the leader, a crash that kept a record but not its chunk or
a chunk but not its record, and retention under entries still in the Raft log.
"""

from __future__ import annotations

import msgspec
import pytest

from hutch.cluster.raftlog import EntriesRecord, RaftHostStorage, _decode
from hutch.raft.messages import ENTRY_NORMAL, Entry, Snapshot, SnapshotMeta
from hutch.store.stream_log import StreamLog
from hutch.streamproto import chunk
from hutch.streams import machine as sm
from hutch.streams.ahead import AheadWriter

GID = 7
BODY = b"x" * 300


def write(req: int, pids: list[int], writer: str = "w") -> bytes:
    return sm.write_entry("n1", req, 0, 1000 + req, writer, pids, [BODY + f"{p}".encode() for p in pids])


class Replica:
    """One member: its Raft log (in the node's shared log), chunk log and applied machine."""

    def __init__(self, tmp_path, attach: bool = True, segment_bytes: int = 1 << 20):
        self.tmp = tmp_path
        self.host = RaftHostStorage(tmp_path / "raft")
        self.lg = StreamLog(tmp_path / "s", max_segment_bytes=segment_bytes, fsync=False)
        self.m = sm.StreamMachine(self.lg)
        self.applied = 0
        self.storage = self.host.group(GID)
        snap = self.storage.snapshot()
        if snap.data:
            self.m.restore(snap.data)
            self.applied = snap.meta.index
        self.writer = AheadWriter(lambda: (self.m, self.lg), lambda: self.applied, "test")
        if attach:
            self.writer.attach(self.storage)

    def append(self, term: int, index: int, *datas: bytes) -> None:
        self.storage.append([Entry(term, index + i, ENTRY_NORMAL, d) for i, d in enumerate(datas)])

    def apply_to(self, index: int) -> list[sm.Written | None]:
        out = [self.m.apply(e.data, e.term) for e in self.storage.entries(self.applied + 1, index + 1, 1 << 62)]
        self.applied = index
        return out

    def records(self) -> list[tuple[int, bytes]]:
        """(index, data) of every entry as the Raft log's records keep them."""
        out = []
        for rec in self.host.log.replay(GID):
            r = _decode(rec.payload)
            if type(r) is EntriesRecord:
                out += [(e.index, e.data) for e in r.entries]
        return out

    def stored(self) -> list[bytes]:
        out = []
        for _info, data in self.lg.read(self.lg.first_offset, 1 << 30):
            out += chunk.records(data)
        return out

    def close(self) -> None:
        self.host.close()
        self.lg.close()

    def __enter__(self) -> Replica:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@pytest.fixture
def rep(tmp_path):
    r = Replica(tmp_path)
    yield r
    r.close()


def test_a_batch_is_written_to_the_chunk_log_as_it_enters_the_raft_log_and_only_once(rep):
    rep.append(2, 1, write(1, [1, 2, 3]))
    assert rep.lg.next_offset == 3 and rep.lg.chunk_count == 1  # written before any commit
    assert rep.m.committed == 0  # readers do not see it yet
    (index, data), = rep.records()
    assert index == 1 and sm.is_reference(data) and len(data) < 100  # the record holds no record
    w, = rep.apply_to(1)
    assert (w.first, w.written, w.duplicates) == (0, 3, 0)
    assert rep.lg.chunk_count == 1 and rep.m.committed == 3  # applying wrote nothing more
    assert rep.stored() == [BODY + b"1", BODY + b"2", BODY + b"3"]
    assert rep.lg.read(0, 1)[0][0].epoch == 2  # the chunk's epoch is the entry's term


def test_an_entry_read_back_from_its_record_is_the_entry_appended(rep):
    datas = [write(i, [i]) for i in range(1, 6)]
    rep.append(3, 1, *datas)
    rep.storage.memory_bytes = 0
    rep.storage.append([Entry(3, 6, ENTRY_NORMAL, write(6, [6]))])  # pages the others out
    assert [e.data for e in rep.storage.entries(1, 6, 1 << 62)] == datas
    assert rep.storage.reads > 0


def test_the_records_of_an_entry_with_duplicates_stay_in_its_record(rep):
    rep.append(2, 1, write(1, [1, 2]))
    again = write(2, [2, 3])  # id 2 again: its chunk holds only id 3's record
    rep.append(2, 2, again)
    assert [d == again for _i, d in rep.records()] == [False, True]
    assert rep.stored()[-1] == BODY + b"3" and rep.lg.next_offset == 3
    assert [(w.written, w.duplicates) for w in rep.apply_to(2)] == [(2, 0), (1, 1)]
    assert rep.lg.next_offset == 3


def test_a_suffix_the_leader_replaces_takes_its_chunks_with_it(rep):
    rep.append(2, 1, write(1, [1]), write(2, [2]), write(3, [3], writer="old"))
    rep.apply_to(1)
    assert rep.lg.next_offset == 3
    rep.append(3, 2, write(9, [1], writer="new"))  # a new leader's entry 2 replaces 2 and 3
    assert rep.stored() == [BODY + b"1", BODY + b"1"]
    assert rep.lg.read(1, 1)[0][0].epoch == 3
    assert [w.first for w in rep.apply_to(2)] == [1]
    assert rep.m.writer_sequence("w") == 1 and rep.m.writer_sequence("old") == 0


def test_a_snapshot_from_the_leader_cuts_the_chunks_not_applied(rep):
    rep.append(2, 1, write(1, [1]), write(2, [2]))
    rep.apply_to(1)
    leader = sm.StreamMachine(rep.lg)
    leader.next_offset = 10  # the leader's state at its snapshot
    rep.storage.install_snapshot(Snapshot(SnapshotMeta(index=20, term=3), leader.snapshot()))
    rep.m.restore(leader.snapshot())
    assert rep.lg.next_offset == 1 and rep.m.missing_from == 1  # entry 2's chunk went; the gap is fetched
    rep.append(3, 21, write(3, [3]))  # while the gap is open the entry is written when applied, whole
    assert rep.lg.next_offset == 1 and not sm.is_reference(rep.records()[-1][1])


def test_the_side_file_is_handed_to_the_next_fsync_of_the_raft_log(rep):
    assert rep.host.take_side() == []
    rep.append(2, 1, write(1, [1]))
    assert rep.host.take_side() == [rep.writer]
    assert rep.host.take_side() == []


def test_a_record_that_survived_a_crash_without_its_chunk_is_cut_from_the_raft_log(tmp_path):
    r = Replica(tmp_path)
    r.append(2, 1, write(1, [1]), write(2, [2]), write(3, [3]))
    r.host.sync()
    r.lg.truncate(1)  # the chunks of entries 2 and 3 were not on the disk yet
    r.close()
    with Replica(tmp_path) as again:
        assert again.storage.last_index() == 1
        assert again.lg.next_offset == 1
        again.append(3, 2, write(4, [4]))  # the log goes on from there
        assert [w.first for w in again.apply_to(2)] == [0, 1]
        assert again.stored() == [BODY + b"1", BODY + b"4"]
    with Replica(tmp_path) as once_more:  # the cut is in the log itself
        assert once_more.storage.last_index() == 2 and once_more.lg.next_offset == 2


def test_chunks_whose_records_did_not_survive_a_crash_are_cut_from_the_chunk_log(tmp_path):
    r = Replica(tmp_path)
    r.append(2, 1, write(1, [1]))
    r.host.sync()
    r.lg.append(chunk.encode([b"lost"], 1001, 2, 1), 1, 1, 1001, 2)  # written ahead; its record was lost
    r.close()
    with Replica(tmp_path) as again:
        assert again.storage.last_index() == 1 and again.lg.next_offset == 1


def test_a_restart_applies_entries_over_the_chunks_written_ahead(tmp_path):
    r = Replica(tmp_path)
    r.append(2, 1, write(1, [1, 2]), write(2, [3]))
    r.apply_to(1)
    r.host.sync()
    r.close()
    with Replica(tmp_path) as again:  # applied state starts empty: the whole Raft log is applied again
        assert again.lg.next_offset == 3 and again.m.committed == 0
        assert [w.first for w in again.apply_to(2)] == [0, 2]
        assert again.lg.chunk_count == 2 and again.m.committed == 3


def test_an_entry_whose_chunk_retention_removed_reads_back_as_its_reference_and_applies(tmp_path):
    with Replica(tmp_path, segment_bytes=400) as r:  # a chunk a segment
        r.append(2, 1, write(1, [1]), write(2, [2]), write(3, [3]))
        assert r.lg.retain(max_bytes=1) == 2 and r.lg.first_offset == 2  # before any snapshot
        r.storage.memory_bytes = 0
        r.append(2, 4, write(4, [4]))  # pages the others out
        e1, e2, e3 = r.storage.entries(1, 4, 1 << 62)
        assert sm.is_reference(e1.data) and sm.is_reference(e2.data) and not sm.is_reference(e3.data)
        assert [(w.first, w.written) for w in r.apply_to(4)] == [(0, 1), (1, 1), (2, 1), (3, 1)]
        assert r.m.writer_sequence("w") == 4 and r.stored() == [BODY + b"3", BODY + b"4"]


def test_reference_entries_are_the_write_entries_without_their_records():
    data = write(4, [7, 8], writer="pub")
    framed = msgspec.msgpack.decode(data)[7]
    c = chunk.encode_framed(framed, 2, 1004, 5, 40)
    ref = sm.reference_entry(data, 40, chunk.read_header(c).crc)
    assert sm.is_reference(ref) and sm.reference_offset(ref) == 40
    assert sm.full_entry(ref, bytes(c)) == data
    with pytest.raises(ValueError):
        sm.full_entry(ref, bytes(chunk.encode_framed(framed, 2, 1004, 5, 41)))


def test_a_follower_sent_an_entry_whose_chunk_every_other_member_removed_starts_its_log_after_it(tmp_path):
    with Replica(tmp_path) as r:
        r.append(2, 1, write(1, [1, 2]))
        r.apply_to(1)
        # the leader reads entry 2 back as a reference: its chunk (offsets 2..4) is gone everywhere
        ref = sm.reference_entry(write(2, [3, 4, 5]), 2, 12345)
        r.append(2, 2, ref, write(3, [6]))
        assert (r.lg.first_offset, r.lg.next_offset) == (5, 6)
        assert [w.first for w in r.apply_to(3)] == [2, 5]
        assert r.stored() == [BODY + b"6"] and r.m.writer_sequence("w") == 6


def test_an_entry_after_a_snapshot_not_yet_restored_is_not_written_ahead(rep):
    """The leader's snapshot is in the Raft log, but the machine restores it only at the Raft
    host's next pass: an entry appended meanwhile must not be numbered from the old state."""
    rep.append(2, 1, write(1, [1]), write(2, [2]))
    rep.apply_to(1)
    leader = sm.StreamMachine(rep.lg)
    leader.next_offset = 10
    rep.storage.install_snapshot(Snapshot(SnapshotMeta(index=20, term=3), leader.snapshot()))
    rep.append(3, 21, write(3, [3]))  # before the machine restored the snapshot
    assert rep.lg.next_offset == 1 and not sm.is_reference(rep.records()[-1][1])
