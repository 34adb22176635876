"""The whole-cluster simulation's stream workload and its further mirroring configurations
(hutch.sim.cluster): the stream checks catch what they name, and seeds of each run clean."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pamqp import commands

from hutch.broker.session import Session
from hutch.mirror.replica import MirrorEntry
from hutch.quorum import fifo
from hutch.sim.cluster import FAULT_KINDS, NET_AND_CRASH, QUEUE, ClusterSim, ClusterSimOptions, run_seed
from hutch.streamclient import StreamClient


class _Reader:
    """Stands for a simulated client in the delivery callbacks (they only read `.closed`)."""

    closed = None

    def __init__(self, name: str) -> None:
        self.name = name
        self.acked: list[int] = []

    def ack(self, tag: int) -> None:
        self.acked.append(tag)


def _sim_reading(*readers: tuple[_Reader, int]) -> ClusterSim:
    sim = ClusterSim(ClusterSimOptions(seed=1, queue_type="stream"))
    sim.history.published.update(f"m{i}" for i in range(10))
    for client, start in readers:
        sim._reading[client] = [start, "n1"]
    return sim


def _deliver(sim: ClusterSim, who: str, client: _Reader, offset: int | None, mid: str) -> None:
    headers = None if offset is None else {"x-stream-offset": offset}
    sim._on_delivery(who, [client], 1, False, mid.encode(), commands.Basic.Properties(headers=headers))


def _kinds(sim: ClusterSim) -> set[str]:
    return {kind for kind, _ in sim.failures}


def test_a_subscription_that_delivers_its_offsets_in_sequence_passes_and_moves_the_consumers_resume_point():
    con = _Reader("con")
    sim = _sim_reading((con, 0))
    for i in range(3):
        _deliver(sim, "con", con, i, f"m{i}")
    assert sim.failures == []
    assert sim._resume_at == {"con": 3} and sim._stream_end() == 3
    assert sim.history.delivered == {"m0": 1, "m1": 1, "m2": 1}


def test_a_gap_a_repeat_or_a_missing_header_in_a_subscription_fails_the_offsets_check():
    for offsets in ([0, 2], [0, 1, 1], [0, None]):
        con = _Reader("con")
        sim = _sim_reading((con, 0))
        for i, offset in enumerate(offsets):
            _deliver(sim, "con", con, offset, f"m{i}")
        assert _kinds(sim) == {"offsets"}, (offsets, sim.failures)


def test_a_subscription_must_start_where_it_asked():
    con = _Reader("con")
    sim = _sim_reading((con, 5))
    _deliver(sim, "con", con, 4, "m4")
    assert _kinds(sim) == {"offsets"}


def test_two_replicas_that_hold_different_messages_at_one_offset_fail_the_offsets_check():
    a, b = _Reader("read-n1"), _Reader("read-n2")
    sim = _sim_reading((a, 0), (b, 0))
    _deliver(sim, "read-n1", a, 0, "m0")
    _deliver(sim, "read-n2", b, 0, "m1")
    assert _kinds(sim) == {"offsets"}
    assert "offset 0 holds m0 on one read and m1 on another" in sim.failures[0][1]


def test_a_message_published_once_and_stored_twice_fails_the_duplicate_check():
    con = _Reader("con")
    sim = _sim_reading((con, 0))
    _deliver(sim, "con", con, 0, "m0")
    _deliver(sim, "con", con, 1, "m0")
    assert _kinds(sim) == {"duplicate"}


def test_a_stream_run_reads_every_replica_from_the_start_and_checks_what_each_holds():
    result = run_seed(1, queue_type="stream", faults=FAULT_KINDS, trace=True)
    assert result.ok, result.violation
    assert result.stats["confirmed"] > 0 and result.stats["stream_offsets"] >= result.stats["confirmed"]
    for host in ("n1", "n2", "n3"):
        reached = [line for line in result.trace if f"client read-{host}: read the stream to offset" in line]
        assert reached and reached[0].endswith(f"offset {result.stats['stream_offsets']} of "
                                               f"{result.stats['stream_offsets']}"), reached


def test_stream_clients_neither_get_nor_requeue_which_streams_refuse():
    sim = ClusterSim(ClusterSimOptions(seed=1, queue_type="stream", clients=frozenset({"get", "cancel", "nack"})))
    assert sim._client_kinds() == {"cancel"}


@pytest.mark.parametrize("queue_type", ["mirrored-nodes", "mirrored-automatic-always"])
def test_the_further_mirroring_configurations_set_their_policy_and_keep_every_promise(queue_type):
    from hutch.sim.cluster import MIRROR_POLICIES

    result = run_seed(2, queue_type=queue_type, faults=FAULT_KINDS, trace=True)
    assert result.ok, result.violation
    definition = MIRROR_POLICIES[queue_type]["definition"]
    assert any("policy 'ha' set on" in line and repr(definition["ha-mode"]) in line for line in result.trace)
    assert any("Adding mirror on node" in line for line in result.trace)


# -- the non-durable queue with transient messages (--queue-type transient)


def _sim_that_lost_one(queue_type: str) -> ClusterSim:
    sim = ClusterSim(ClusterSimOptions(seed=1, queue_type=queue_type))
    sim.history.published.update({"m0", "m1"})
    sim.history.confirmed.update({"m0", "m1"})
    sim.history.delivered["m0"] = 1
    return sim


def test_a_transient_message_lost_while_every_node_ran_and_saw_every_other_fails_the_run():
    sim = _sim_that_lost_one("transient")
    sim._watch_log("n1", "started TCP listener on n1:5672")
    sim._check_messages(set())
    assert _kinds(sim) == {"lost"} and "lost_allowed" not in sim.stats


@pytest.mark.parametrize("what", ["a node went down", "a node saw another down", "the queue was deleted"])
def test_a_transient_message_lost_once_its_queue_may_be_gone_is_counted_not_failed(what):
    sim = _sim_that_lost_one("transient")
    if what == "a node went down":
        sim._down("n2", power=False)
    elif what == "a node saw another down":
        sim._watch_log("n1", "node hutch@n2 down: connection_closed (Connection reset by peer)")
    else:
        sim._watch_log("n3", "deleting non-durable queue 'sim-q' in vhost '/': its home node hutch@n1 is down")
    sim._check_messages(set())
    assert not sim.failures and sim.stats["lost_allowed"] == 1


def test_the_same_loss_on_a_durable_classic_queue_fails_the_run_whatever_went_down():
    sim = _sim_that_lost_one("classic")
    sim._down("n2", power=False)
    sim._watch_log("n1", "node hutch@n2 down: connection_closed (Connection reset by peer)")
    sim._check_messages(set())
    assert _kinds(sim) == {"lost"}


def test_a_transient_run_declares_a_non_durable_queue_which_goes_when_its_home_node_is_down():
    result = run_seed(7, queue_type="transient", faults=frozenset({"net", "crash"}), trace=True)
    assert result.ok, result.violation
    assert any("deleting non-durable queue 'sim-q'" in line for line in result.trace)
    assert result.stats["lost_allowed"] > 0  # what its publisher sent on into nothing, confirmed


# -- stream-protocol publishers (--queue-type stream-protocol)


def test_a_stream_protocol_publisher_sends_again_after_reconnecting_and_the_stream_stores_each_message_once():
    result = run_seed(2, queue_type="stream-protocol", faults=FAULT_KINDS, trace=True)
    assert result.ok, result.violation
    assert [line for line in result.trace if "again as publishing id" in line]  # seed 2 sends some again
    assert [line for line in result.trace if "started stream protocol listener on n1:5552" in line]
    assert result.stats["confirmed"] == result.stats["published"] == 40


def test_without_a_publisher_reference_the_same_run_stores_what_was_sent_again_twice_and_fails(monkeypatch):
    monkeypatch.setattr(ClusterSim, "_publisher_reference", lambda _sim, _who: "")  # no deduplication
    result = run_seed(2, queue_type="stream-protocol", faults=FAULT_KINDS)
    assert result.stats["failed"] == ["duplicate"], result.violation


def test_stream_protocol_consumers_read_on_any_node_and_subscribe_again_after_what_they_got():
    result = run_seed(1, queue_type="stream-protocol", faults=FAULT_KINDS, clients=frozenset({"cancel"}), trace=True)
    assert result.ok, result.violation
    assert result.stats["confirmed"] == result.stats["delivered"] == 40
    assert [line for line in result.trace if "client con: connected to" in line and "over the stream protocol" in line]
    resumed = [line for line in result.trace if "client con" in line and "subscribes on" in line
               and not line.endswith("from offset 0")]
    assert resumed, "no consumer subscribed again past offset 0"
    assert [line for line in result.trace if "client con: unsubscribed" in line]  # "cancel"


def test_the_first_stream_protocol_consumer_resumes_from_the_offset_it_stored_on_the_server():
    result = run_seed(1, queue_type="stream-protocol", faults=FAULT_KINDS, trace=True)
    assert result.ok, result.violation
    lines = [line for line in result.trace if "client con:" in line]
    asked = [(i, line) for i, line in enumerate(lines) if " stored for it" in line and "offset None" not in line]
    assert asked, "the consumer never found an offset it had stored"
    i, line = asked[0]
    stored = int(line.split(" has offset ")[1].split()[0])
    assert lines[i + 1].endswith(f"from offset {stored + 1}"), lines[i:i + 2]


def test_a_stored_offset_the_consumer_never_stored_fails_the_offsets_check(monkeypatch):
    real = StreamClient.query_offset

    async def inventing(self, reference, stream):
        stored = await real(self, reference, stream)
        return None if stored is None else stored + 3
    monkeypatch.setattr(StreamClient, "query_offset", inventing)
    result = run_seed(1, queue_type="stream-protocol", faults=FAULT_KINDS)
    assert "offsets" in result.stats["failed"], result.violation


def test_a_stream_protocol_subscription_that_skips_a_chunk_fails_the_offsets_check(monkeypatch):
    real = StreamClient.chunks_from

    async def skipping(self, *args, **kwargs):
        taken = 0
        async for c in real(self, *args, **kwargs):
            taken += 1
            if taken != 2:  # the second chunk of every subscription never arrives
                yield c
    monkeypatch.setattr(StreamClient, "chunks_from", skipping)
    result = run_seed(1, queue_type="stream-protocol", faults=frozenset())
    assert "offsets" in result.stats["failed"], result.violation


# -- the operator replaces a node (the "membership" fault kind)


@pytest.mark.parametrize("queue_type", ["quorum", "stream"])
def test_a_replaced_node_is_forgotten_leaves_the_queue_and_joins_again_and_nothing_confirmed_is_lost(queue_type):
    result = run_seed(1, queue_type=queue_type, faults=frozenset({"membership"}), trace=True)
    assert result.ok, result.violation
    assert result.stats["replaced"] == 1 and result.stats["confirmed"] == result.stats["delivered"] == 40
    assert [line for line in result.trace if "removed member hutch@" in line and "(forgotten)" in line]
    assert [line for line in result.trace if "is a member of the cluster (via hutch@" in line]


def test_no_node_is_replaced_under_a_classic_queue_whose_forget_would_delete_it():
    result = run_seed(1, queue_type="classic", faults=frozenset({"membership"}), trace=True)
    assert result.ok, result.violation
    assert "replaced" not in result.stats


def _leading(epoch: int, confirmed: int) -> SimpleNamespace:
    """A node whose mirrored queue's leader (of `epoch`) has confirmed `confirmed` publishes."""
    ld = SimpleNamespace(epochs=[[epoch, 0]], confirmed=confirmed)
    return SimpleNamespace(clustering=SimpleNamespace(cluster=SimpleNamespace(
        mirroring=SimpleNamespace(leaders={("/", QUEUE): ld}))))


def _confirming(steps: list[dict[str, tuple[int, int]]]) -> set[str]:
    """Sample a mirrored run's nodes once per step (host -> (epoch, confirmed so far))."""
    sim = ClusterSim(ClusterSimOptions(seed=1, queue_type="mirrored"))
    for step in steps:
        sim.nodes = {host: _leading(*at) for host, at in step.items()}
        sim._check_confirming_leader()
    return _kinds(sim)


def test_a_mirrored_leader_that_confirms_after_its_successor_did_fails_the_one_leader_check():
    handover = [{"n1": (7, 5)}, {"n1": (7, 9), "n2": (8, 0)}, {"n1": (7, 9), "n2": (8, 3)}, {"n2": (8, 6)}]
    assert _confirming(handover) == set()
    assert _confirming([*handover, {"n1": (7, 10), "n2": (8, 6)}]) == {"two-leaders"}
    # two new leaders confirming at once, and the same node's next leader (another epoch)
    assert _confirming([{"n1": (7, 1)}, {"n1": (7, 1), "n2": (8, 1), "n3": (9, 1)}]) == {"two-leaders"}
    assert _confirming([{"n1": (7, 1)}, {"n1": (11, 1)}, {"n1": (7, 2)}]) == {"two-leaders"}


def test_mirrored_runs_with_crashes_see_their_queue_confirmed_by_one_leader_after_another():
    sims = [ClusterSim(ClusterSimOptions(seed=seed, queue_type="mirrored", faults=NET_AND_CRASH)) for seed in range(1, 9)]
    for sim in sims:
        result = sim.run()
        assert result.ok, (sim.opts.seed, result.violation)
    handed_over = [sim for sim in sims if len(sim._confirmed_by) > 1]
    assert handed_over, "no run's queue was confirmed by more than one leader: the check saw nothing to check"


# -- the copies of a quorum or mirrored queue compared after the drain


def _diverging(monkeypatch, tamper) -> None:
    """Have `tamper(node)` change the second node's copy of the queue just before the check."""
    real = ClusterSim._check_copies

    async def check(self):
        tamper(self.nodes[sorted(self.nodes)[1]])
        await real(self)
    monkeypatch.setattr(ClusterSim, "_check_copies", check)


def _diverging_mirror(monkeypatch, tamper) -> None:
    """Have `tamper(node)` change a mirror's copy each time the check looks at the copies (the
    check waits for them to agree, and the leader's next ops could mend a change made once); at
    a look before the mirror has joined again after the faults, there is none to change."""
    real = ClusterSim._mirrored_copies

    def copies(self):
        mirror = next((n for _h, n in sorted(self.nodes.items())
                       if ("/", QUEUE) in n.clustering.cluster.mirroring.mirrors and not _queue_on(n).local), None)
        if mirror is not None:
            tamper(mirror)
        return real(self)
    monkeypatch.setattr(ClusterSim, "_mirrored_copies", copies)


def _queue_on(node):
    return node.broker.vhosts["/"].queues[QUEUE]


def test_a_quorum_member_that_applied_more_than_the_others_at_the_same_index_fails_the_copies_check(monkeypatch):
    # (untouched, quorum and mirrored runs compare their copies and pass: the CI batches)
    _diverging(monkeypatch, lambda node: _queue_on(node).machine.apply(fifo.Enqueue("", QUEUE, b"\x00\x00", b"x")))
    result = run_seed(2, queue_type="quorum", faults=FAULT_KINDS)  # a seed whose three copies are compared
    assert result.stats["failed"] == ["copies"] and result.stats["copies_compared"] == 3, result.violation


def test_a_mirror_that_still_holds_a_message_the_leader_settled_fails_the_copies_check(monkeypatch):
    def keep_one(node):
        mirror = node.clustering.cluster.mirroring.mirrors[("/", QUEUE)]
        mirror.replica.entries[1] = MirrorEntry.on_disk(1, 0)  # the first message, settled long before
    _diverging_mirror(monkeypatch, keep_one)
    result = run_seed(1, queue_type="mirrored-nodes", faults=FAULT_KINDS)
    assert result.stats["failed"] == ["copies"] and result.stats["copies_compared"] == 2, result.violation


# -- an exclusive queue (--queue-type exclusive)


def test_an_exclusive_queue_goes_with_its_owners_connection_and_the_owner_declares_it_again():
    result = run_seed(4, queue_type="exclusive", faults=FAULT_KINDS, trace=True)
    assert result.ok, result.violation
    locked = [i for i, line in enumerate(result.trace) if "client con: could not set up" in line
              and "405 RESOURCE_LOCKED" in line]
    assert locked, "the owner never found its old queue still there"
    assert [line for line in result.trace[locked[0]:] if "client con: connected to" in line]
    assert result.stats["lost_allowed"] >= 1  # what the old queue held went with it, counted


def test_an_exclusive_queue_left_behind_by_its_closed_connection_fails_the_exclusive_check(monkeypatch):
    def teardown_keeping_exclusive_queues(self):
        self.exclusive_queues.clear()  # forgotten, not deleted
        real_teardown(self)
    real_teardown = Session.teardown
    monkeypatch.setattr(Session, "teardown", teardown_keeping_exclusive_queues)
    result = run_seed(3, queue_type="exclusive", faults=frozenset())
    assert "exclusive" in result.stats["failed"], result.violation
