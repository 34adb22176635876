"""A booting node and its mirrored queues (docs/mirroring.md, "A node that restarts"): until its
queues are recovered from its disk, it neither leads nor mirrors a mirrored queue and takes no
queue operation from its peers; once they are, it takes its part and handles what its peers
sent meanwhile, in order. Found by hutch sim cluster: a restarted leader confirmed a publish
taken into its queue before the recovery of that queue, and the recovery went on without it."""

from __future__ import annotations

import pytest

from hutch.broker.broker import Broker, Config
from hutch.broker.cluster import ClusterBroker
from hutch.cluster import catalogue as cat
from hutch.cluster.remote import REMOTE, Call, CallAnswer, decode_batch, encode_batch


@pytest.fixture
def node() -> ClusterBroker:
    sent: list = []
    cl = ClusterBroker(Broker(Config()), "a@h", lambda peer, payload: sent.append((peer, payload)) or True,
                       lambda _n: True, lambda _cmd, _cb: None, lambda fn, *args: None)
    cl.sent = sent
    cl.recovering = True  # as the runtime sets it for the boot
    cl.apply_command(cat.AddVhost("/"))
    return cl


def _answers(cl: ClusterBroker) -> list:
    return [(peer, m) for peer, payload in cl.sent if payload[0] == REMOTE for m in decode_batch(payload[1])]


def _stat(rid: int) -> list:
    return [REMOTE, encode_batch([Call(rid, "stat", ["/", "nope"])])]


def test_what_peers_send_waits_for_the_recovery_and_a_peer_gone_meanwhile_is_forgotten(node) -> None:
    node.on_message("b@h", _stat(1))
    node.on_message("c@h", _stat(2))
    node.on_message("b@h", _stat(3))
    assert node.sent == []
    node.peer_down("c@h")  # lost with its link, as if it had not arrived
    node.recovered()
    node.flush()
    assert [(peer, a.rid) for peer, a in _answers(node) if type(a) is CallAnswer] == [("b@h", 1), ("b@h", 3)]
    node.on_message("b@h", _stat(4))
    node.flush()
    assert [a.rid for _p, a in _answers(node)][-1] == 4


def test_a_mirrored_queue_is_led_only_once_the_node_has_recovered_its_queues(node) -> None:
    node.apply_command(cat.DeclareQueue("/", "orders", leader_node="a@h", member_nodes=("b@h",), journal_id=7))
    assert node.broker.vhosts["/"].queues["orders"].local
    assert ("/", "orders") not in node.mirroring.leaders
    node.recovered()
    assert ("/", "orders") in node.mirroring.leaders
