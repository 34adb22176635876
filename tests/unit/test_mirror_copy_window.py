"""A durable mirror keeps its copy past the node's memory window by reference: once a message's
ME record is written its body leaves memory (docs/mirroring.md, "Mirrors that remember"), and a
promotion reads back its window's worth, in order, with delivery counts, and pages the rest."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.broker.broker import Broker, Config
from hutch.broker.cluster import ClusterBroker
from hutch.cluster import catalogue as cat
from hutch.mirror.placement import WHEN_SYNCED
from hutch.mirror.replica import CheckedOut, Enqueued, MirrorView, OnDisk, Removed, View

A, B = "a@h", "b@h"
A_MEMBER = "a@h|1.1"
WINDOW = 3


def _enqueued(seq: int, persistent: bool = True) -> Enqueued:
    return Enqueued(seq, "", "orders", b"\x00\x00", b"m%d" % seq, persistent, 0, None, None, "", 0)


def _mirror(tmp_path, durable_queue: bool = True):
    cl = ClusterBroker(Broker(Config(classic_queue_memory_window_messages=WINDOW)), B, lambda peer, payload: True,
                       lambda _n: True, lambda _cmd, _cb: None, lambda fn, *args: None)
    cl.recovering = True
    cl.apply_command(cat.AddVhost("/"))
    cl.broker.open_storage(str(tmp_path))
    cl.apply_command(cat.DeclareQueue("/", "orders", durable=durable_queue, leader_node=A, member_nodes=(B,),
                                      journal_id=7 if durable_queue else 0))
    m = cl.mirroring.mirrors[("/", "orders")]
    m._got_leader([200, A_MEMBER, [(1, 1)]])
    m.replica.apply([View((MirrorView(m.member.id, B, True, 1),), False, WHEN_SYNCED, WHEN_SYNCED, A_MEMBER)])
    return cl, m


def _in_memory(m) -> list[int]:
    return sorted(s for s, e in m.replica.entries.items() if e.body is not None)


def test_past_the_window_a_durable_mirror_keeps_persistent_messages_on_disk_only(tmp_path) -> None:
    cl, m = _mirror(tmp_path)
    r = m.replica
    r.apply([_enqueued(s) for s in range(1, 11)])
    m.persist()
    assert _in_memory(m) == [1, 2, 3] and (r.bodies_held, r.body_bytes_held) == (3, 6)
    assert sorted(seq for _log, seq in r.log_refs()) == list(range(1, 11)), "every message has its ME record"
    assert len(r.on_disk) == 7 and len(r) == 10, "past the window, kept compactly by reference"
    r.apply([Removed((1, 2, 5))])  # two held bodies and one on disk leave
    assert (r.bodies_held, r.body_bytes_held) == (1, 2)
    r.apply([_enqueued(11), _enqueued(12, persistent=False), _enqueued(13)])
    m.persist()
    assert _in_memory(m) == [3, 11, 12]  # 13 is past the window again
    assert r.entries[12].log_seq == 0, "a transient message is never written, and stays in memory"


def test_a_mirror_that_does_not_persist_keeps_every_body(tmp_path) -> None:
    cl, m = _mirror(tmp_path, durable_queue=False)
    m.replica.apply([_enqueued(s) for s in range(1, 11)])
    m.persist()
    assert _in_memory(m) == list(range(1, 11))


def test_a_promoted_mirror_reads_back_the_bodies_it_kept_on_disk(tmp_path) -> None:
    cl, m = _mirror(tmp_path)
    m.replica.apply([_enqueued(s) for s in range(1, 9)])
    m.persist()
    m.replica.apply([CheckedOut((2, 6)), Removed((1,))])
    m.persist()
    assert _in_memory(m) == [2, 3]
    # the leader stops on purpose (its view says so), so the copy is taken as exact: delivery counts
    m.replica.apply([View((MirrorView(m.member.id, B, True, 1),), True, WHEN_SYNCED, WHEN_SYNCED, A_MEMBER)])
    cl.peer_down(A)
    cl.apply_command(cat.SetQueueNodes("/", "orders", B, (), expect_leader=A, promotion=True,
                                       synchronised_only=True))
    q = cl.broker.vhosts["/"].queues["orders"]
    assert q.local and ("/", "orders") in cl.mirroring.leaders
    # the promoted leader pages past the window too: its bodies stay on disk until read back
    assert (q.state.ready_count, q.paged_count) == (WINDOW, 7 - WINDOW)
    assert q.page_in_all() == 7 - WINDOW
    got = [(e.seq, e.message.body, e.message.props, e.delivery_count) for e in q.state.ready()]
    assert got == [(s, b"m%d" % s, b"\x00\x00", 1 if s in (2, 6) else 0) for s in range(2, 9)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["next", "low", "bump", "pop", "pop_old"]), st.integers(0, 6000)),
                max_size=300))
def test_entries_kept_by_reference_behave_as_a_map(ops) -> None:
    """OnDisk (runs of ascending seqs, a few bytes an entry) against a dict: adds at the end
    and below (a sync's run), delivery counts, removals in and out of order."""
    d, model, top = OnDisk(), {}, 10_000
    for op, n in ops:
        if op == "next":
            for _ in range(n % 50 + 1):
                top += n % 3 + 1
                assert d.add(top, 7 * top, n % 2)
                model[top] = [7 * top, n % 2]
        elif op == "low":  # a run below (a sync), taken only where it falls outside every run
            seq = n
            if d.add(seq, 7 * seq, 0):
                assert seq not in model
                model[seq] = [7 * seq, 0]
        elif op == "bump" and model:
            seq = sorted(model)[n % len(model)]
            d.bump(seq)
            model[seq][1] = min(model[seq][1] + 1, 254)
        elif op in ("pop", "pop_old") and model:
            seqs = sorted(model)
            for seq in (seqs[: n % 5000 + 1] if op == "pop_old" else [seqs[n % len(seqs)]]):
                assert d.pop(seq) == model.pop(seq)[0]
            assert d.pop(-1) is None
        assert len(d) == len(model)
    assert list(d.items()) == [(s, log, c) for s, (log, c) in sorted(model.items())]
    assert all(s in d for s in model)


def test_a_long_copy_by_reference_costs_a_few_bytes_a_message() -> None:
    import tracemalloc
    tracemalloc.start()
    d = OnDisk()
    before = tracemalloc.get_traced_memory()[0]
    for s in range(1, 200_001):
        d.add(s, 5000 + 3 * s, 0)
    per = (tracemalloc.get_traced_memory()[0] - before) / 200_000
    tracemalloc.stop()
    assert per < 12, per
    for s in range(1, 150_001):  # drained in order: the front is let go
        d.pop(s)
    assert [x[0] for x in d.items()][:2] == [150_001, 150_002] and len(d) == 50_000
    assert len(d.runs[0].keys) < 100_000
