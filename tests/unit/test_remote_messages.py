"""The messages by which a node reaches a classic queue homed on another node
(hutch.cluster.remote): each one survives the wire unchanged, and a payload that does not fit
is refused when it is decoded, with an error that says what is wrong; the broker's cluster
side logs such a payload and drops it instead of failing in a handler."""

from __future__ import annotations

import logging

import msgspec
import pytest

from hutch.broker.broker import Broker, Config
from hutch.broker.cluster import ClusterBroker
from hutch.cluster.remote import (
    ACCEPTED,
    ACK,
    REFUSED,
    REMOTE,
    REQUEUE,
    RETRY,
    Call,
    CallAnswer,
    Cancel,
    Consume,
    ConsumeAnswer,
    ConsumerCancelled,
    Credit,
    Deliveries,
    Delivery,
    FiguresReport,
    Publish,
    PublishAnswer,
    PublishAnswers,
    Publishes,
    QueueFigures,
    Settle,
    decode_batch,
    encode_batch,
)

ALL = [
    Publishes([Publish(7, "/", ["q1", "q2"], "amq.direct", "rk", b"\x80\x00\x02", b"body", True),
               Publish(8, "v", [], "", "", b"", b"", False)]),
    PublishAnswers([PublishAnswer(7, ACCEPTED), PublishAnswer(8, REFUSED), PublishAnswer(9, RETRY)]),
    Consume(11, "/", "q", "ctag", False, True, 5, 100, {"x-priority": 5, "x-cancel-on-ha-failover": True}),
    Consume(12, "/", "q", "", True, False, 0, 0, {}),
    ConsumeAnswer(11, 200, ""),
    ConsumeAnswer(12, 404, "no queue 'q' in vhost '/'"),
    Cancel(11),
    ConsumerCancelled(11),
    Deliveries(11, [Delivery(1, False, b"\x00\x02rk", b"\x00\x00", b"one"),
                    Delivery(2, True, b"\x00\x02rk", b"\x00\x00", b"")]),
    Credit(11, 500),
    Settle("/", "q", 11, ACK, [1, 2, 3]),
    Settle("/", "q", 0, REQUEUE, []),
    Call(21, "stat", ["/", "q"]),
    Call(22, "list", ["connections", {"page": 1}]),
    CallAnswer(21, [200, 3, 1]),
    CallAnswer(22, [200, [{"name": "c1", "bytes": b"\x01"}]]),
    CallAnswer(23, None),
    FiguresReport([QueueFigures("/", "q", 3, 1, 2), QueueFigures("/", "m", 0, 0, 0, ["b@h"], ["b@h"])]),
]


@pytest.mark.parametrize("msg", ALL, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg) -> None:
    assert decode_batch(encode_batch([msg])) == [msg]


def test_a_batch_keeps_its_order() -> None:
    assert decode_batch(encode_batch(ALL)) == ALL


def test_tags_are_distinct() -> None:
    tags = {type(m).__struct_config__.tag for m in ALL}
    assert len(tags) == len({type(m) for m in ALL})


@pytest.mark.parametrize("data, says", [
    (b"\xc1", "malformed"),  # not msgpack
    (msgspec.msgpack.encode([[99, 1]]), "Invalid value 99"),  # unknown tag
    (msgspec.msgpack.encode([[5]]), "Expected `array` of at least length 2"),  # Cancel without its cid
    (msgspec.msgpack.encode([[5, "x"]]), "Expected `int`, got `str`"),
    (msgspec.msgpack.encode([[9, "/", "q", 1, "a", 7]]), "Expected `array`, got `int`"),  # Settle's seqs
    (msgspec.msgpack.encode([[7, 1, [[1, False, b"", b""]]]]), "at least length 5"),  # a Delivery without body
    (msgspec.msgpack.encode([[1, [[1, "/", "q", "", "", b"", b"", True]]]]), "Expected `array`, got `str`"),
    (msgspec.msgpack.encode([5, 1]), "Expected `array`, got `int`"),  # a message, not a batch
])
def test_a_malformed_batch_is_refused_with_a_clear_error(data: bytes, says: str) -> None:
    with pytest.raises(msgspec.DecodeError) as e:
        decode_batch(data)
    assert says in str(e.value)


# -- the broker's side


@pytest.fixture
def node(tmp_path):
    sent: list = []
    soon: list = []
    cl = ClusterBroker(Broker(Config()), "a@h", lambda peer, payload: sent.append((peer, payload)) or True,
                       lambda _n: True, lambda _cmd, _cb: None, lambda fn, *args: soon.append((fn, args)))
    cl.sent = sent
    cl.data_dir = tmp_path
    return cl


def _sent(cl: ClusterBroker) -> list:
    out = []
    for peer, payload in cl.sent:
        assert payload[0] == REMOTE
        out.extend((peer, m) for m in decode_batch(payload[1]))
    return out


@pytest.mark.parametrize("payload", [
    None, [], "RQ", [REMOTE], [REMOTE, b"\xc1"], [REMOTE, [[5, 1]]], [REMOTE, msgspec.msgpack.encode([[99]])],
    ["ST", msgspec.msgpack.encode([[12, [["/", "q"]]]])], ["G", 1], ["QP"], [["RQ"], b""], [1, 2], ["??", 1],
])
def test_a_malformed_payload_is_logged_and_dropped(node: ClusterBroker, payload, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="hutch.cluster"):
        node.on_message("b@h", payload)
    assert [r for r in caplog.records if r.levelno == logging.ERROR], "nothing logged"
    assert node.sent == []


def test_a_call_with_too_few_arguments_is_answered_with_an_error(node: ClusterBroker, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="hutch.cluster"):
        node.on_message("b@h", [REMOTE, encode_batch([Call(5, "get", ["/"])])])
    assert "call 'get' from b@h with 1 arguments" in caplog.text
    assert _sent(node) == [("b@h", CallAnswer(5, [541, "malformed call get"]))]


def test_a_settle_of_an_unknown_kind_is_ignored(node: ClusterBroker, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="hutch.cluster"):
        node.on_message("b@h", [REMOTE, encode_batch([Settle("/", "q", 1, "z", [1])])])
    assert "settle of unknown kind 'z'" in caplog.text


def test_calls_and_consumes_are_answered_typed(node: ClusterBroker) -> None:
    node.on_message("b@h", [REMOTE, encode_batch([Call(5, "stat", ["/", "nope"]),
                                                  Consume(6, "/", "nope", "t", False, False, 0, 0, {}),
                                                  Call(7, "qstatus", [1])])])
    assert _sent(node) == [("b@h", CallAnswer(5, [404, "no queue 'nope' in vhost '/'"])),
                           ("b@h", ConsumeAnswer(6, 404, "no queue 'nope' in vhost '/'")),
                           ("b@h", CallAnswer(7, [200, None]))]


def test_answers_reach_the_request_table(node: ClusterBroker) -> None:
    got: list = []
    node.call("b@h", "stat", ["/", "q"], got.append)
    (peer, call), = _sent(node)
    assert peer == "b@h" and type(call) is Call and call.kind == "stat" and call.args == ["/", "q"]
    node.expect_reply(99, "b@h", got.append)
    node.on_message("b@h", [REMOTE, encode_batch([CallAnswer(call.rid, [200, 1, 0]), ConsumeAnswer(99, 403, "no")])])
    assert got == [[200, 1, 0], [403, "no"]]


def test_figures_reach_the_peers_listing(node: ClusterBroker) -> None:
    report = node.stats()
    assert decode_batch(report) == [FiguresReport([])]
    node.on_message("b@h", ["ST", report])  # as the runtime sends it


def test_a_forwarded_publish_sent_again_to_the_same_leader_is_stored_once(node: ClusterBroker) -> None:
    """Mirrored seed 654: a node re-sends a forwarded publish whose answer was lost with its link
    (hutch.cluster.remote_host.retry_orphans) to a leader that took it the first time. The leader
    remembers the publishes other nodes forwarded, as a promoted mirror does, and answers the
    repeat without storing it again; before, every link reset added a copy."""
    from hutch.cluster import catalogue as cat
    from hutch.cluster.remote import Publish, Publishes

    node.recovering = True
    node.apply_command(cat.AddVhost("/"))
    node.broker.open_storage(str(node.data_dir))
    node.recovering = False
    node.apply_command(cat.DeclareQueue("/", "q", leader_node="a@h", member_nodes=("b@h",), journal_id=3))
    q = node.broker.vhosts["/"].queues["q"]
    assert q.mirror is not None
    pub = Publish(77, "/", ["q"], "", "q", b"\x00\x00", b"once", False)
    node.on_message("b@h", [REMOTE, encode_batch([Publishes([pub])])])
    node.on_message("b@h", [REMOTE, encode_batch([Publishes([msgspec.structs.replace(pub, resent=True)])])])
    assert [e.message.body for e in q.state.ready()] == [b"once"]
    node.broker.close_storage()
