"""A queue as a node sees it when the queue is homed on another node (`RemoteQueue`), and a
consumer attached from another node as the queue's home sees it (`ProxyConsumer`).

RabbitMQ's "Non-mirrored Queue Behavior in a Cluster": a queue lives on one node and every
other node reaches it over the cluster. Operations travel to the home node over the peer
protocol (`hutch.cluster.remote_host` speaks it) as the typed messages below;
acknowledgements made on this node are collected on the handle and sent home once per loop
iteration. The home node feeds a remote consumer within a credit (`CONSUMER_CREDIT`
deliveries ahead of the consumer node's receipts).

The peer messages. Each is a frozen msgspec struct sent as an array whose first element is
its integer tag; a node sends a list of them, encoded once (`encode_batch`), inside the
transport's group "q" envelope `[REMOTE, bytes]` (`["ST", bytes]` for the once-a-second
`FiguresReport`), and the receiver decodes it against `RemoteMessage`, the union of them
(`decode_batch`), so a payload that does not fit fails there with a `msgspec.ValidationError`
or `DecodeError` naming what is wrong, never later in a handler.

A `RemoteQueue` sees the rest of the node through `RemoteSide` (the peers, the consumers
attached here, the broker's loop); a `ProxyConsumer` through `ProxySide` (the node's
`hutch.cluster.remote_host.RemoteHost`). Must never: import anything from `hutch.broker` or above, or write to a
client's connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from hutch.amqp import spec
from hutch.amqp.spec import AMQPError
from hutch.cluster import catalogue as cat
from hutch.queues.handle import CLASSIC, PENDING, Figures, Got, HeldEntry

CONSUMER_CREDIT = 2000  # deliveries a home node sends ahead of the consumer node's receipts
REMOTE = "RQ"  # the group "q" envelope of a batch of the messages below: [REMOTE, encode_batch(...)]

# PublishAnswer.outcome
ACCEPTED = 0
REFUSED = 1  # nacked: overflow, or no such queue
RETRY = 2  # not here yet (a leader that moved): the publisher's node sends it again, or nacks it

# Settle.op
ACK = "a"
REQUEUE = "r"
DISCARD = "d"  # rejected without requeue: dead-lettered
SETTLE_OPS = (ACK, REQUEUE, DISCARD)


# -- the peer messages --------------------------------------------------------------------


class Publish(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One message routed to queues homed on the receiving node."""

    token: int  # the publisher's node's id for it, answered in a PublishAnswer
    vhost: str
    queues: list[str]
    exchange: str
    routing_key: str
    props: bytes
    body: bytes
    persistent: bool
    # sent again to a promoted mirror: the old leader may have delivered it before it died, so
    # it is delivered as `redelivered` (unless the ring had it: then it is dropped as a repeat)
    resent: bool = False


class Publishes(msgspec.Struct, tag=1, array_like=True, frozen=True, gc=False):
    """Publisher's node → home: messages for queues there (one per home and loop iteration)."""

    items: list[Publish]


class PublishAnswer(msgspec.Struct, array_like=True, frozen=True, gc=False):
    token: int
    outcome: int  # ACCEPTED, REFUSED or RETRY


class PublishAnswers(msgspec.Struct, tag=2, array_like=True, frozen=True, gc=False):
    """Home → publisher's node: accepted (on disk first when persistent to a durable queue),
    refused (overflow) or not here yet."""

    items: list[PublishAnswer]


class Consume(msgspec.Struct, tag=3, array_like=True, frozen=True, gc=False):
    """Consumer's node → home: basic.consume; answered by a ConsumeAnswer with the same cid."""

    cid: int
    vhost: str
    queue: str
    tag: str
    no_ack: bool
    exclusive: bool
    priority: int
    prefetch: int
    arguments: dict[str, Any]


class ConsumeAnswer(msgspec.Struct, tag=4, array_like=True, frozen=True, gc=False):
    """Home → consumer's node: 200, or the AMQP error code and text."""

    cid: int
    code: int
    text: str


class Cancel(msgspec.Struct, tag=5, array_like=True, frozen=True, gc=False):
    """Consumer's node → home: basic.cancel, or the channel closed."""

    cid: int


class ConsumerCancelled(msgspec.Struct, tag=6, array_like=True, frozen=True, gc=False):
    """Home → consumer's node: the home node cancelled the consumer (the queue went)."""

    cid: int


class Delivery(msgspec.Struct, array_like=True, frozen=True, gc=False):
    seq: int
    redelivered: bool
    route: bytes  # exchange and routing key as encoded in basic.deliver
    props: bytes
    body: bytes


class Deliveries(msgspec.Struct, tag=7, array_like=True, frozen=True, gc=False):
    """Home → consumer's node: deliveries to one consumer (one per consumer and loop iteration)."""

    cid: int
    items: list[Delivery]


class Credit(msgspec.Struct, tag=8, array_like=True, frozen=True, gc=False):
    """Consumer's node → home: `n` more deliveries may be in flight."""

    cid: int
    n: int


class Settle(msgspec.Struct, tag=9, array_like=True, frozen=True, gc=False):
    """Consumer's node → home: ack (ACK), requeue (REQUEUE) or reject (DISCARD) deliveries
    (cid 0: of any consumer of the queue from that node, or of basic.get)."""

    vhost: str
    queue: str
    cid: int
    op: str
    seqs: list[int]


class Call(msgspec.Struct, tag=10, array_like=True, frozen=True, gc=False):
    """Any → any: a call answered once by a CallAnswer with the same rid. `kind` is one of
    stat, get, purge, take (a queue homed there: args start [vhost, queue]), list, migrate,
    qstatus, qmember, gmid, sync; `args` are the kind's own (ClusterBroker._on_call)."""

    rid: int
    kind: str
    args: list[Any]


class CallAnswer(msgspec.Struct, tag=11, array_like=True, frozen=True, gc=False):
    """The answer to a Call: [200, ...] or [code, text]."""

    rid: int
    result: Any


class QueueFigures(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A queue led by the sending node, as listings show it."""

    vhost: str
    name: str
    ready: int
    unacked: int
    consumers: int
    mirror_nodes: list[str] = []  # a mirrored classic queue's mirrors, and those in sync
    synced_nodes: list[str] = []


class FiguresReport(msgspec.Struct, tag=12, array_like=True, frozen=True, gc=False):
    """Home → all, every second: figures of the queues it leads (classic and quorum)."""

    queues: list[QueueFigures]


RemoteMessage = (Publishes | PublishAnswers | Consume | ConsumeAnswer | Cancel | ConsumerCancelled | Deliveries
                 | Credit | Settle | Call | CallAnswer | FiguresReport)
_enc = msgspec.msgpack.Encoder()
_batch_dec = msgspec.msgpack.Decoder(list[RemoteMessage])


def encode_batch(msgs: list) -> bytes:
    """The messages for one peer, encoded once."""
    return _enc.encode(msgs)


def decode_batch(data: bytes) -> list:
    """A peer's batch; raises msgspec.DecodeError (ValidationError) when it does not fit."""
    return _batch_dec.decode(data)


class RemoteSide(Protocol):
    """What these need of the node's cluster glue (`hutch.broker.cluster.ClusterBroker`)."""

    broker: Any  # dirty_queues, settled, delivered
    consumers: dict[int, Any]

    def is_up(self, node: str) -> bool: ...
    def send(self, peer: str, payload: Any) -> bool: ...  # a RemoteMessage is sent encoded
    def cancelled(self, cid: int, home: str, vhost: str, qname: str) -> None: ...
    def new_stats(self) -> list[int]: ...
    def new_id(self) -> int: ...
    def call(self, peer: str, kind: str, args: list, callback: Callable[[Any], None]) -> None: ...
    def expect_reply(self, rid: int, peer: str, callback: Callable[[Any], None]) -> None: ...


class ProxySide(Protocol):
    """What a ProxyConsumer needs of the node (`hutch.cluster.remote_host.RemoteHost`)."""

    port: Any  # settled, delivered

    def is_up(self, node: str) -> bool: ...
    def queue_delivery(self, origin: str, cid: int, item: Delivery) -> None: ...


def home_down(q) -> AMQPError:
    """A queue whose home node is down: a durable one waits for its node; a non-durable one is
    being deleted (RabbitMQ's rule), so it is already reported missing."""
    if not q.durable:
        return AMQPError(spec.NOT_FOUND, f"no queue '{q.name}' in vhost '{q.vhost}'")
    return AMQPError(spec.NOT_FOUND, f"home node '{q.home_node}' of durable queue '{q.name}' in vhost "
                                     f"'{q.vhost}' is down or inaccessible")


class RemoteQueue:
    """A queue whose home is another node: the catalogue's record plus its last known figures.
    Acknowledgements made on this node are collected here and sent home once per loop."""

    local = False
    quorum = False
    queue_type = CLASSIC.name
    message_ttl_ms = None
    expires_ms = None
    journal_id = 0
    single_active = False

    def __init__(self, cluster: RemoteSide, rec: cat.QueueRecord):
        self.cluster = cluster
        self.name = rec.name
        self.vhost = rec.vhost
        self.durable = rec.durable
        self.auto_delete = rec.auto_delete
        self.exclusive_owner = rec.exclusive_owner  # a string: never this node's session
        self.arguments = dict(rec.arguments)
        self.home_node = rec.leader_node
        self.mirrored = bool(rec.member_nodes)
        self.mirror_nodes: list[str] = []  # as the leader last reported them
        self.synced_nodes: list[str] = []
        self.deleted = False
        self.ready = 0
        self.unacked_remote = 0
        self.consumers_remote = 0
        self.local_consumers: dict[int, Any] = {}  # cid -> the broker's consumer object
        self._ops: dict[tuple[int, str], list[int]] = {}
        self.mstats = cluster.new_stats()  # what this node's channels did with the queue

    def __repr__(self) -> str:
        return f"RemoteQueue({self.vhost!r}, {self.name!r} on {self.home_node})"

    @property
    def message_count(self) -> int:
        return self.ready

    @property
    def unacked_count(self) -> int:
        return self.unacked_remote

    @property
    def consumer_count(self) -> int:
        return self.consumers_remote

    def figures(self) -> Figures:
        """As its home node last reported them (bytes are not reported)."""
        return Figures(self.ready, self.unacked_remote, 0, 0, self.consumers_remote, paged=None)

    def active_consumer(self) -> None:
        return None

    def is_up(self) -> bool:
        return self.cluster.is_up(self.home_node)

    def check_up(self) -> None:
        if not self.is_up():
            raise home_down(self)

    # the channel's acknowledgement paths call these
    def _op(self, seq: int, op: str) -> None:
        self._ops.setdefault((0, op), []).append(seq)
        self.cluster.broker.dirty_queues.add(self)

    def settle(self, seq: int) -> None:
        self._op(seq, ACK)

    def requeue(self, seq: int) -> None:
        self._op(seq, REQUEUE)

    def discard(self, seq: int) -> None:
        self._op(seq, DISCARD)

    def flush(self) -> None:
        if self._ops:
            ops, self._ops = self._ops, {}
            for (cid, op), seqs in ops.items():
                self.cluster.send(self.home_node, Settle(self.vhost, self.name, cid, op, seqs))

    def add_consumer(self, c: Any) -> None:
        self.local_consumers[c.ref] = c
        self.cluster.consumers[c.ref] = c

    def remove_consumer(self, c: Any) -> bool:
        if self.local_consumers.pop(c.ref, None) is None:
            return False
        self.cluster.consumers.pop(c.ref, None)
        self.cluster.cancelled(c.ref, self.home_node, self.vhost, self.name)
        self.flush()  # acks before the cancel
        self.cluster.send(self.home_node, Cancel(c.ref))
        return True

    def consumers(self) -> list[Any]:
        return list(self.local_consumers.values())

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.local_consumers.values())

    def dispatch(self) -> int:
        self.flush()
        return 0

    # -- client operations (hutch.queues.handle): asked of the home node
    def _answer(self, result: Any) -> Any:
        """The home node's answer (None: it went down) as a result, or the error it carries."""
        if result is None:
            return home_down(self)
        if result[0] != 200:
            return AMQPError(result[0], result[1])
        return result

    def _call(self, kind: str, args: list, reply: Callable[[Any], None], answer: Callable[[list], Any]) -> Any:
        self.check_up()

        def got(result: Any) -> None:
            r = self._answer(result)
            reply(r if isinstance(r, Exception) else answer(r))
        self.cluster.call(self.home_node, kind, [self.vhost, self.name, *args], got)
        return PENDING

    def stat(self, reply: Callable[[Any], None]) -> Any:
        return self._call("stat", [], reply, lambda r: (r[1], r[2]))

    def purge(self, reply: Callable[[Any], None]) -> Any:
        return self._call("purge", [], reply, lambda r: r[1])

    def get(self, no_ack: bool, reply: Callable[[Any], None]) -> Any:
        return self._call("get", [no_ack], reply, _got)

    def consume(self, c: Any, reply: Callable[[Any], None]) -> Any:
        """The home node attaches a `ProxyConsumer` for `c`; `c.ref` is the id both know it by."""
        self.check_up()
        cl = self.cluster
        c.ref = cid = cl.new_id()

        def answered(result: Any) -> None:
            r = self._answer(result)
            if not isinstance(r, Exception):
                r = None
                if c.channel.closed:
                    # The channel closed while the home node attached the consumer: nobody is
                    # left to settle what it gets, so the home drops it at once, and what it
                    # already sent comes back (see RemoteHost._orphan_deliveries).
                    cl.cancelled(cid, self.home_node, self.vhost, self.name)
                    cl.send(self.home_node, Cancel(cid))
                else:
                    self.add_consumer(c)
            reply(r)
        cl.expect_reply(cid, self.home_node, answered)
        cl.send(self.home_node, Consume(cid, self.vhost, self.name, c.tag, c.no_ack, c.exclusive, c.priority,
                                        c.prefetch, c.arguments))
        return PENDING


def _got(result: list) -> Got | None:
    """A home node's answer to a get: [200, None] or [200, [seq, redelivered, route, count,
    props, body]] (it says only whether the message was delivered before)."""
    item = result[1]
    if item is None:
        return None
    seq, redelivered, route, count, props, body = item
    return Got(HeldEntry(seq, 2 if redelivered else 1), redelivered, route, props, body, count)


class ProxyConsumer:
    """On a queue's home node: a consumer attached on another node."""

    proxy = True
    __slots__ = ("cid", "origin", "tag", "no_ack", "exclusive", "priority", "prefetch", "credit", "inflight",
                 "cluster", "arguments", "channel", "queue")

    def __init__(self, cluster: ProxySide, queue: Any, origin: str, cid: int, tag: str, no_ack: bool,
                 exclusive: bool, priority: int, prefetch: int, arguments: dict):
        self.cluster = cluster
        self.queue = queue
        self.origin = origin
        self.cid = cid
        self.tag = tag
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.priority = priority
        self.prefetch = prefetch
        self.credit = CONSUMER_CREDIT
        self.inflight: dict[int, Any] = {}
        self.arguments = arguments
        self.channel = None

    def can_take(self) -> bool:
        if self.credit <= 0 or not self.cluster.is_up(self.origin):
            return False
        return not self.waits_for_acks()

    def waits_for_acks(self) -> bool:
        """At its prefetch limit: it takes more only once its client acknowledges."""
        return not self.no_ack and bool(self.prefetch) and len(self.inflight) >= self.prefetch

    def deliver(self, queue, entry) -> None:
        self.credit -= 1
        port = self.cluster.port
        if self.no_ack:
            if entry.log_seq:
                port.settled(queue, entry)
        else:
            self.inflight[entry.seq] = entry
            if entry.log_seq:
                port.delivered(queue, entry)
        m = entry.message
        self.cluster.queue_delivery(self.origin, self.cid,
                                    Delivery(entry.seq, entry.delivery_count > 1, m.route_enc, m.props, m.body))
