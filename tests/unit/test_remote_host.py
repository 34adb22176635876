"""The remote-queue protocol's host (hutch.cluster.remote_host) between two nodes, with the
broker replaced by a fake port: publishes are confirmed once their home accepts them and nacked
when it goes down, remote consumers are attached and fed, calls are answered, and the tables
that grow with client input stay bounded."""

from __future__ import annotations

import logging
from typing import Any

from hutch.cluster import catalogue as cat
from hutch.cluster.peers import Peers
from hutch.cluster.remote import (
    REMOTE,
    Consume,
    Credit,
    RemoteQueue,
    decode_batch,
    encode_batch,
)
from hutch.cluster.remote_host import CANCELLED_REMEMBERED_MAX, RemoteHost
from hutch.queues.message import Message


class FakeQueue:
    """A classic queue homed on the node: just what the host looks at."""

    local = True
    quorum = False
    deleted = False
    mirror = None
    flow_waiters = None

    def __init__(self, vhost: str, name: str):
        self.vhost, self.name = vhost, name
        self.consumers: list = []
        self.ever_consumed = False

    message_count = 3
    unacked_count = 1

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    def add_consumer(self, c) -> None:
        self.consumers.append(c)

    def remove_consumer(self, c) -> None:
        self.consumers.remove(c)


class FakePort:
    def __init__(self, queues: dict[str, dict[str, Any]]):
        self.queues = queues
        self.enqueued: list = []
        self.answered: list = []
        self.gone: list = []
        self.delivered_to: list = []

    def queues_of(self, vhost):
        return self.queues.get(vhost)

    def in_catalogue(self, vhost, name):
        return name in self.queues.get(vhost, {})

    def leader_of(self, vhost, name):
        return None

    def local_queues(self):
        return [q for v in self.queues.values() for q in v.values() if q.local]

    def quorum_figures(self):
        return []

    def priority_and_expiration(self, props):
        return 0, None

    def enqueue_local(self, queues, msg, token, maybe_delivered=False):
        self.enqueued.append(([q.name for q in queues], msg.body, token))
        return False, 0

    def after_sync(self, fn, arg):
        fn(arg)

    def schedule(self):
        pass

    def dirty(self, q):
        pass

    def now_s(self):
        return 100.0

    def consumer_gone(self, q):
        self.gone.append(q.name)

    def window_add(self, session):
        pass

    def publish_answered(self, channel, session, seq, accepted):
        self.answered.append((seq, accepted))

    def deliver(self, consumer, q, items):
        self.delivered_to.append((consumer, [d.body for d in items]))

    def node_call(self, kind, args, answer):
        answer([200, kind])


class Net:
    """Two or more hosts whose sends are queued and handed over by pump()."""

    def __init__(self):
        self.up: set[str] = set()
        self.wire: list = []
        self.hosts: dict[str, RemoteHost] = {}

    def add(self, node: str, port: FakePort) -> RemoteHost:
        self.up.add(node)

        def send(peer: str, payload: Any) -> bool:
            if peer not in self.up:
                return False
            self.wire.append((node, peer, payload))
            return True
        peers = Peers(node, send, lambda n: n in self.up, lambda fn, *a: fn(*a))
        peers.deliver_local = lambda _p, payload: self.wire.append((node, node, payload))
        h = self.hosts[node] = RemoteHost(peers, port)
        return h

    def pump(self) -> list:
        seen = []
        while self.wire:
            frm, to, payload = self.wire.pop(0)
            assert payload[0] == REMOTE
            seen.extend(type(m).__name__ for m in decode_batch(payload[1]))
            self.hosts[to].on_batch(frm, payload[1])
            for h in self.hosts.values():
                h.flush()
        return seen


def _rec(name: str, home: str, durable: bool = True) -> cat.QueueRecord:
    return cat.QueueRecord("/", name, durable=durable, leader_node=home)


class Side:
    """What a RemoteQueue on node a needs of its node."""

    def __init__(self, host: RemoteHost):
        self.host = host
        self.broker = type("B", (), {"dirty_queues": set()})()
        self.consumers = host.consumers

    def is_up(self, node):
        return self.host.is_up(node)

    def send(self, peer, msg):
        return self.host.send(peer, msg)

    def cancelled(self, *a):
        self.host.cancelled(*a)

    def new_stats(self):
        return [0] * 8

    def new_id(self):
        return self.host.peers.new_id()

    def call(self, *a):
        self.host.call(*a)

    def expect_reply(self, rid, peer, cb):
        self.host.peers.expect_reply(rid, peer, cb)


class Chan:
    closed = False

    def __init__(self):
        self.session = object()


def _two():
    net = Net()
    home_q = FakeQueue("/", "q")
    a = net.add("a", FakePort({"/": {}}))
    b = net.add("b", FakePort({"/": {"q": home_q}}))
    return net, a, b, home_q


def test_a_publish_is_confirmed_once_its_home_accepts_it() -> None:
    net, a, b, _q = _two()
    rq = RemoteQueue(Side(a), _rec("q", "b"))
    ch = Chan()
    assert a.forward([rq], Message("", "q", b"", b"", b"hello"), ch, 7) == (1, False)
    a.flush()
    assert net.pump() == ["Publishes", "PublishAnswers"]
    assert b.port.enqueued == [(["q"], b"hello", ("a", b.port.enqueued[0][2][1]))]
    assert a.port.answered == [(7, True)]
    assert a._pub_tokens == {}


def test_a_publish_to_a_queue_its_home_does_not_know_is_nacked_not_confirmed() -> None:
    """Classic seed 45 (with every client kind): the queue's home node started before its
    catalogue caught up, so the queue's declaration was not applied there yet; it confirmed the
    publishes forwarded to it, which no queue had taken."""
    net, a, b, _q = _two()
    rq = RemoteQueue(Side(a), _rec("late", "b"))  # in a's catalogue; not (yet) in b's
    a.forward([rq], Message("", "late", b"", b"", b"hello"), Chan(), 7)
    a.flush()
    assert net.pump() == ["Publishes", "PublishAnswers"]
    assert b.port.enqueued == [] and a.port.answered == [(7, False)]


def test_a_publish_to_a_home_that_goes_down_is_nacked() -> None:
    net, a, b, _q = _two()
    rq = RemoteQueue(Side(a), _rec("q", "b"))
    a.forward([rq], Message("", "q", b"", b"", b"hello"), Chan(), 7)
    a.flush()
    net.up.discard("b")
    net.wire.clear()
    a.peer_down("b")
    assert a.port.answered == [(7, False)]
    # a durable queue whose home is down refuses it at once
    assert a.forward([rq], Message("", "q", b"", b"", b"x"), Chan(), 8) == (0, True)


def test_a_remote_consumer_is_attached_fed_and_given_credit() -> None:
    net, a, b, home_q = _two()
    rq = RemoteQueue(Side(a), _rec("q", "b"))
    c = type("C", (), {"tag": "t", "no_ack": True, "exclusive": False, "priority": 0, "prefetch": 0,
                       "arguments": {}, "received": 0, "ref": None, "channel": Chan()})()
    c.queue = rq
    answers: list = []
    rq.consume(c, answers.append)
    assert net.pump() == ["Consume", "ConsumeAnswer"]
    assert answers == [None] and a.consumers == {c.ref: c}
    (proxy,) = home_q.consumers
    assert b.proxies == {("a", c.ref): (home_q, proxy)}
    entry = type("E", (), {"seq": 1, "delivery_count": 1, "log_seq": 0,
                           "message": Message("", "q", b"\x00\x01q", b"\x00\x00", b"body")})()
    for _ in range(600):
        proxy.deliver(home_q, entry)
    b.flush()
    assert net.pump() == ["Deliveries", "Credit"]
    assert a.port.delivered_to == [(c, [b"body"] * 600)]
    assert proxy.credit == 2000 - 600 + 600
    # the consumer's node goes: its consumer leaves the queue
    b.peer_down("a")
    assert home_q.consumers == [] and b.proxies == {} and b.port.gone == ["q"]


def _consuming(a: RemoteHost) -> tuple[RemoteQueue, Any]:
    """A consumer on node a of queue q on node b, its Consume sent (not yet pumped)."""
    rq = RemoteQueue(Side(a), _rec("q", "b"))
    c = type("C", (), {"tag": "t", "no_ack": False, "exclusive": False, "priority": 0, "prefetch": 0,
                       "arguments": {}, "received": 0, "ref": None, "channel": Chan()})()
    c.queue = rq
    rq.consume(c, lambda _r: None)
    return rq, c


def test_deliveries_from_a_node_that_no_longer_leads_the_queue_are_not_passed_on() -> None:
    """Mirrored seed 343: the queue's leader moved from b to another node while b still had
    deliveries for the consumer on the wire; the consumer follows the new leader under the same
    id, so b's deliveries must not reach its client (the new leader delivers those messages
    again, flagged redelivered). b is told to drop the consumer."""
    net, a, b, home_q = _two()
    rq, c = _consuming(a)
    net.pump()
    (proxy,) = home_q.consumers
    rq.home_node = "c"  # the catalogue moved the queue's leader (hutch.mirror.failover.leader_moved)
    entry = type("E", (), {"seq": 1, "delivery_count": 1, "log_seq": 0,
                           "message": Message("", "q", b"\x00\x01q", b"\x00\x00", b"body")})()
    proxy.deliver(home_q, entry)
    b.flush()
    assert net.pump() == ["Deliveries", "Cancel"]
    assert a.port.delivered_to == []
    assert home_q.consumers == [] and b.proxies == {}


def test_a_consumer_whose_channel_closed_before_its_home_attached_it_is_dropped_there() -> None:
    """Mirrored seed 7 (with every client kind): the client's connection closed while the
    queue's home attached its consumer; the home then sent it half the queue's messages, which
    no channel would settle, for ever. Now the consumer's node cancels it at once, and what
    was sent meanwhile goes back."""
    net, a, b, home_q = _two()
    rq, c = _consuming(a)
    c.channel.closed = True  # the connection goes before the answer comes
    assert net.pump() == ["Consume", "ConsumeAnswer", "Cancel"]
    assert a.consumers == {} and rq.local_consumers == {}
    assert home_q.consumers == [] and b.proxies == {}
    assert c.ref in a._cancelled  # a delivery that crossed the cancel is given back


def test_a_consume_of_a_missing_queue_is_refused_and_calls_are_answered() -> None:
    net, a, b, _q = _two()
    got: list = []
    a.peers.expect_reply(5, "b", got.append)
    a.send("b", Consume(5, "/", "nope", "t", False, False, 0, 0, {}))
    a.call("b", "stat", ["/", "q"], got.append)
    a.call("b", "qstatus", [1], got.append)
    a.call("b", "get", ["/"], got.append)  # one argument short
    net.pump()
    assert got == [[404, "no queue 'nope' in vhost '/'"], [200, 3, 0], [200, "qstatus"], [541, "malformed call get"]]


def test_credit_for_an_unknown_consumer_and_malformed_batches_are_harmless(caplog) -> None:
    net, a, b, _q = _two()
    b.on_batch("a", encode_batch([Credit(12345, 10)]))
    with caplog.at_level(logging.ERROR, logger="hutch.cluster"):
        b.on_batch("a", b"\x93\x01")
        b.on_batch("a", [1, 2])
    assert caplog.text.count("remote-queue messages from a") == 2


def test_cancelled_consumers_are_remembered_up_to_a_limit() -> None:
    _net, a, _b, _q = _two()
    for cid in range(CANCELLED_REMEMBERED_MAX + 10):
        a.cancelled(cid, "b", "/", "q")
    assert len(a._cancelled) == CANCELLED_REMEMBERED_MAX
    assert 0 not in a._cancelled and CANCELLED_REMEMBERED_MAX + 9 in a._cancelled


def test_figures_round_trip() -> None:
    _net, a, b, _q = _two()
    rq = RemoteQueue(Side(a), _rec("q", "b"))
    a.port.queues["/"]["q"] = rq
    a.on_batch("b", b.figures())
    assert (rq.ready, rq.unacked_remote, rq.consumers_remote) == (3, 1, 0)


def test_a_publish_to_a_queue_that_has_just_moved_is_sent_again_or_nacked_never_confirmed() -> None:
    net = Net()
    a = net.add("a", FakePort({"/": {}}))
    b_port = FakePort({"/": {}})
    b = net.add("b", b_port)
    # on b the queue is led elsewhere now (its promotion moved it, or is not done here yet)
    b_port.queues["/"]["q"] = RemoteQueue(Side(b), _rec("q", "c"))
    b_port.queues["/"]["m"] = RemoteQueue(Side(b), _rec("m", "c"))
    plain = RemoteQueue(Side(a), _rec("q", "b"))
    mirrored = RemoteQueue(Side(a), cat.QueueRecord("/", "m", leader_node="b", member_nodes=("c",)))
    a.forward([plain], Message("", "q", b"", b"", b"one"), Chan(), 1)
    a.forward([mirrored], Message("", "m", b"", b"", b"two"), Chan(), 2)
    a.flush()
    assert net.pump() == ["Publishes", "PublishAnswers"]
    assert b_port.enqueued == []
    assert a.port.answered == [(1, False)]  # not confirmed: nothing holds it
    assert list(a._orphans) == list(a._pub_items)  # waits for the new leader
    assert len(a._orphans) == 1
