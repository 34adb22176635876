"""The queue-type contract (`hutch.queues.handle`): one `Figures` read model that every handle
gives, the registry of queue types with their capabilities; and quorum member placement
(`hutch.quorum.placement`), a pure function of the catalogue (RabbitMQ's quorum queue guide:
initial group size, `x-queue-leader-locator` client-local or balanced)."""

from __future__ import annotations

import pytest

from hutch.cluster import catalogue as cat
from hutch.queues import handle
from hutch.queues.classic import ClassicQueue
from hutch.queues.message import Message
from hutch.quorum import handle as quorum_handle
from hutch.quorum.placement import place_members
from hutch.streams import handle as stream_handle


def test_classic_quorum_and_stream_are_registered_with_what_they_can_do():
    assert quorum_handle.QUORUM is handle.queue_type("quorum")
    assert {"classic", "quorum"} <= set(handle.queue_types())
    classic = handle.queue_type("classic")
    assert classic.can(handle.PRIORITIES) and classic.can(handle.EXCLUSIVE) and classic.can(handle.MIRRORING)
    quorum = handle.queue_type("quorum")
    assert quorum.can(handle.REPLICATED) and quorum.can(handle.SINGLE_ACTIVE_CONSUMER)
    assert not quorum.can(handle.GLOBAL_QOS) and not quorum.can(handle.PRIORITIES)
    stream = handle.queue_type("stream")
    assert stream is stream_handle.STREAM and stream.can(handle.REPLICATED)
    assert not stream.can(handle.SINGLE_ACTIVE_CONSUMER) and not stream.holds(False, False, False)
    assert handle.queue_type("jms") is None


def test_a_classic_queues_figures_follow_its_state():
    q = ClassicQueue("q", "/")
    assert q.queue_type == "classic"
    for body in (b"a", b"bb", b"ccc"):
        q.publish(Message("", "q", b"\x00\x01q", b"", body), 0)
    entry = q.take_head(no_ack=False)
    f = q.figures()
    assert (f.ready, f.unacked, f.ready_bytes, f.unacked_bytes, f.consumers) == (2, 1, 5, 1, 0)
    assert (f.messages, f.message_bytes) == (3, 6)
    q.settle(entry.seq)
    assert q.figures().unacked == 0


def test_figures_are_never_negative():
    with pytest.raises(AssertionError):
        handle.Figures(-1, 0, 0, 0, 0)


def _catalogue(*queues: cat.QueueRecord) -> cat.Catalogue:
    c = cat.Catalogue()
    for rec in queues:
        c.queues[(rec.vhost, rec.name)] = rec
    return c


def test_default_group_is_three_members_led_by_the_declaring_node():
    leader, members = place_members(_catalogue(), ["a", "b", "c", "d"], "b", {}, "q", "/")
    assert leader == "b" and members[0] == "b" and len(members) == 3 and len(set(members)) == 3


def test_group_size_is_capped_by_the_running_nodes():
    leader, members = place_members(_catalogue(), ["a", "b"], "a", {"x-quorum-initial-group-size": 5}, "q", "/")
    assert (leader, members) == ("a", ("a", "b"))


def test_balanced_locator_prefers_the_node_leading_and_hosting_fewest():
    busy = [cat.QueueRecord("/", f"q{i}", type=cat.QUORUM, leader_node="a", member_nodes=("a", "b"))
            for i in range(3)]
    leader, members = place_members(_catalogue(*busy), ["a", "b", "c"], "a",
                                    {"x-queue-leader-locator": "balanced", "x-quorum-initial-group-size": 2},
                                    "new", "/")
    assert leader == "c" and members == ("c", "a")  # then the least-hosting other node (a ties b: name)


def test_a_node_not_running_is_never_placed():
    _leader, members = place_members(_catalogue(), ["b", "c"], "a", {}, "q", "/")
    assert "a" not in members and set(members) == {"b", "c"}
