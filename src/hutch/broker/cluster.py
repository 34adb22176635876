"""The broker in a cluster: the catalogue made into local objects, and queues on other nodes.

Every node of a cluster applies the same committed catalogue commands (the metadata Raft
group, driven by `hutch.server.clustering`). `ClusterBroker.apply_entry` applies one to this
node's `Catalogue` and then brings the broker's own objects in line with it: vhosts, users and
permissions, exchanges and bindings exist on every node; a queue is a real `ClassicQueue` on
its home node and a `RemoteQueue` stand-in everywhere else (RabbitMQ's "Non-mirrored Queue
Behavior in a Cluster"). Routing is therefore local on every node, and an operation on a queue
homed elsewhere travels to its home over the peer transport:

Each is a typed message of `hutch.cluster.remote` (a msgspec struct with an integer tag); a
node sends them in group "q" as `["RQ", bytes]` (`REMOTE`: a list of them, encoded once) and
the receiver decodes them against their union, so a malformed one is logged and dropped:

| message | from → to | meaning |
|---|---|---|
| `Publishes([Publish(token, vhost, queues, exchange, routing_key, props, body, persistent), ...])` | publisher's node → home | messages routed to queues there, one batch per home and loop iteration |
| `PublishAnswers([PublishAnswer(token, outcome), ...])` | home → publisher's node | ACCEPTED (on disk first when persistent to a durable queue), REFUSED (overflow) or RETRY (not here yet: a leader that moved) |
| `Consume(cid, vhost, queue, tag, no_ack, exclusive, priority, prefetch, arguments)` | consumer's node → home | basic.consume; answered by `ConsumeAnswer(cid, code, text)` |
| `Cancel(cid)` | consumer's node → home | basic.cancel, or the channel closed |
| `ConsumerCancelled(cid)` | home → consumer's node | the home node cancelled the consumer |
| `Deliveries(cid, [Delivery(seq, redelivered, route, props, body), ...])` | home → consumer's node | deliveries |
| `Credit(cid, n)` | consumer's node → home | n more deliveries may be in flight |
| `Settle(vhost, queue, cid, op, [seq, ...])` | consumer's node → home | ack (`a`), requeue (`r`) or reject (`d`) |
| `Call(rid, kind, args)` / `CallAnswer(rid, result)` | any | calls answered once: `stat`, `get`, `purge`, `take`, `list`, `migrate`, `qstatus`, `qmember`, `gmid`, `sync` |
| `FiguresReport([QueueFigures(vhost, name, ready, unacked, consumers, mirror_nodes, synced_nodes), ...])` | home → all | queue figures, every second, for listings (the runtime sends `["ST", stats()]`) |

The other messages of group "q" stay lists tagged by a string: quorum queues' `["QP", gid,
envelope]` and `["QE", outcomes]` (typed and encoded by `hutch.quorum.host`), mirroring's GM
envelope `["G", from, to, gm message]` (the GM message itself encoded by `hutch.mirror.gm`), and
the runtime's `["NI", node info]` and `["CC", connection counts]`; one of the wrong length is
logged and dropped.

Publisher confirms keep their meaning: a publish waits for one accept per home node it went
to (and for the local journal), and a home node that goes down nacks what it had not accepted.
A publisher whose messages to other nodes are not yet accepted beyond a window is not read
from until they are (credit flow, as RabbitMQ's between channel and queue).

When a queue's home node is down, operations on its durable queues fail with 404 NOT_FOUND
"home node 'n' of durable queue 'q' in vhost '/' is down or inaccessible", and the catalogue
leader deletes its non-durable and exclusive queues. Nothing here does I/O: messages go out
through `send(peer, payload)`, catalogue changes through `submit(command, callback)`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from hutch.amqp import codec, spec
from hutch.broker import msgstats
from hutch.broker.broker import priority_and_expiration
from hutch.broker.channel import Channel, ChannelConsumer
from hutch.broker.exchanges import EXCHANGE, QUEUE
from hutch.broker.quorumq import BrokerQuorumPort
from hutch.broker.topology import NODE_PARAM, Topology
from hutch.cluster import catalogue as cat
from hutch.cluster.peers import Peers
from hutch.cluster.remote import (
    ACCEPTED,
    ACK,
    REFUSED,
    REMOTE,
    REQUEUE,
    RETRY,
    SETTLE_OPS,
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
    ProxyConsumer,
    Publish,
    PublishAnswer,
    PublishAnswers,
    Publishes,
    QueueFigures,
    RemoteQueue,
    Settle,
    decode_batch,
    encode_batch,
    home_down,
)
from hutch.mirror.failover import Failover
from hutch.mirror.host import MirrorHost
from hutch.mirror.placement import MirrorParams, declare_node, mirrors_for, params_of
from hutch.queues.handle import PENDING
from hutch.queues.message import Message
from hutch.quorum.host import QuorumHost

if TYPE_CHECKING:
    from hutch.broker.broker import Broker

log = logging.getLogger("hutch.cluster")

PUBLISH_WINDOW = 4096  # messages a session may have in flight to other nodes before it is paused
PUBLISH_WINDOW_LOW = 1024
CREDIT_RETURN = 500
CANCELLED_REMEMBERED_MAX = 4096  # recently cancelled remote consumers whose late deliveries go back
ORPHAN_TIMEOUT_S = 30.0  # a publish to a mirrored queue waits this long for a promoted leader
INIT_PARAM = "hutch_initialised"
# the arguments each kind of Call takes at least (others: [vhost, queue, ...])
CALL_ARGS = {"list": 2, "migrate": 3, "qstatus": 1, "qmember": 3, "gmid": 2, "sync": 3, "stat": 2, "purge": 2,
             "get": 3, "take": 5}
# the other messages of group "q" (lists tagged by a string), and how long each is
_LIST_MESSAGES = {REMOTE: 2, "ST": 2, "QP": 3, "QE": 2, "G": 4, "NI": 2, "CC": 2}



class _Stale:
    """What a channel's unacknowledged delivery points to once its queue's leader is gone:
    the new leader has requeued the message, so an ack or reject of the old tag does nothing."""

    deleted = True
    local = False
    quorum = False
    journal_id = 0
    mstats = msgstats.new()  # the channel counts an ack of an old tag somewhere: here, and nobody reads it


STALE = _Stale()


class ClusterBroker:
    """Attached to a Broker as `broker.cluster` when the node is part of a cluster."""

    def __init__(self, broker: Broker, node: str, send: Callable[[str, Any], bool], is_up: Callable[[str], bool],
                 submit: Callable[[cat.Command, Callable[[cat.Result], None]], None],
                 call_soon: Callable[..., Any], status: Callable[[], dict] | None = None):
        self.broker = broker
        self.status = status or (lambda: {})
        # who this node is, the way to its peers, ids, and the one table of requests in flight
        self.peers = Peers(node, send, is_up, call_soon)
        self.peers.deliver_local = self.on_message
        self.incarnation = self.peers.incarnation  # this run of the node
        self.node = node
        self.is_up = is_up
        self.submit = submit
        self.call_soon = call_soon
        self.catalogue = cat.Catalogue()
        self.consumers: dict[int, ChannelConsumer] = {}  # cid -> consumer on this node of a remote queue
        self.proxies: dict[tuple[str, int], tuple[Any, ProxyConsumer]] = {}  # (origin, cid) -> (queue, proxy)
        self.owners: dict[str, Any] = {}  # exclusive owner id -> this node's session
        # Bounds of the maps below that grow with client input: a session with PUBLISH_WINDOW
        # publishes in flight to other nodes is not read from, so _pub_tokens, _pub_items,
        # _orphans and _token_waiters hold about PUBLISH_WINDOW per session (plus what one read
        # brought, and the broker's own publishes such as dead letters, which no window holds);
        # the _out_* lists are emptied every loop iteration (flush); proxies hold one entry per
        # consumer attached from another node, get_inflight one per unacknowledged basic.get.
        self._pub_tokens: dict[int, tuple[str, Any, int, Any]] = {}  # token -> (home, channel, seq, session)
        self._session_inflight: dict[Any, int] = {}
        self._paused_sessions: set = set()
        self._out_pubs: dict[str, list] = {}
        self._out_acks: dict[str, list] = {}
        self._out_deliveries: dict[tuple[str, int], list] = {}
        self.members: dict[str, str] = {}  # name -> peer address, from the catalogue
        self.get_inflight: dict[str, list[tuple[Any, int]]] = {}  # origin -> [(queue, seq)] from basic.get
        self.local_info: Callable[[], dict] | None = None  # this node's /api/nodes object (set by the runtime)
        self.lister: Callable[[str, dict], list] | None = None  # this node's connections, channels (runtime)
        self.migrator: Callable[[list, Callable], None] | None = None  # migrate_to_quorum here (runtime)
        self.migrations: dict[tuple[str, str], Any] = {}  # classic queue being migrated -> its quorum queue
        self.peer_info: dict[str, dict] = {}  # the last one each peer sent
        self.peer_counts: dict[str, dict] = {}  # each peer's connection and channel counts (for limits)
        self._held: dict[Any, list[tuple[str, int, bool]]] = {}  # flow-limited queue -> accepts held back
        self._cancelled: dict[int, tuple[str, str, str]] = {}  # recently cancelled cid -> (home, vhost, queue)
        self.quorum = QuorumHost(self.peers, BrokerQuorumPort(self))
        self.topology = Topology(self)  # the catalogue, applied to this node's objects
        self.mirroring = MirrorHost(self)
        # publishes to mirrored queues, kept until accepted so that they can be sent again to a
        # promoted mirror: token -> [vhost, names, pub item]; and those waiting for a new leader
        self._pub_items: dict[int, list] = {}
        self._orphans: dict[int, float] = {}  # token -> give up (nack) at this time
        self._token_waiters: dict[int, list] = {}  # token -> countdowns waiting for its accept
        self.failover = Failover(self, self.mirroring.now)  # consumers following a mirrored queue's leader

    # ------------------------------------------------------------ ids and sending

    @property
    def peer_incarnation(self) -> Callable[[str], int | None]:
        return self.peers.peer_incarnation

    @peer_incarnation.setter
    def peer_incarnation(self, fn: Callable[[str], int | None]) -> None:
        self.peers.peer_incarnation = fn  # set by the runtime

    def new_id(self) -> int:
        return self.peers.new_id()

    def owner_id(self, session) -> str:
        oid = getattr(session, "cluster_owner_id", None)
        if oid is None:
            oid = session.cluster_owner_id = f"{self.node}/{self.new_id()}"
            self.owners[oid] = session
        return oid

    def new_stats(self) -> list[int]:
        return msgstats.new()

    def channel_closed(self, channel: Channel) -> None:
        self.quorum.channel_closed(channel)

    def cancelled(self, cid: int, home: str, vhost: str, qname: str) -> None:
        if len(self._cancelled) >= CANCELLED_REMEMBERED_MAX:
            self._cancelled.pop(next(iter(self._cancelled)))
        self._cancelled[cid] = (home, vhost, qname)

    def propose_delete(self, q) -> None:
        if self.catalogue.queue(q.vhost, q.name) is not None:
            self.submit(cat.DeleteQueue(q.vhost, q.name), _ignore)

    def send(self, peer: str, payload: Any) -> bool:
        """Send a payload of group "q"; a remote-queue message (hutch.cluster.remote) goes
        encoded, alone in its batch."""
        if isinstance(payload, msgspec.Struct):
            payload = [REMOTE, encode_batch([payload])]
        return self.peers.send(peer, payload)

    def incarnation_of(self, node: str) -> int | None:
        """The run of `node` this node is connected to (this node's own for itself)."""
        return self.peers.incarnation_of(node)

    def running_nodes(self) -> list[str]:
        return sorted(n for n in self.members if n == self.node or self.is_up(n))

    # ------------------------------------------------------------ the catalogue, applied

    def apply_command(self, cmd: cat.Command) -> cat.Result:
        """Apply one committed catalogue command here (hutch.broker.topology)."""
        return self.topology.apply_command(cmd)

    def rebuild(self) -> None:
        self.topology.rebuild()

    def drop_queue(self, q, keep_bindings: bool = False) -> None:
        self.topology.drop_queue(q, keep_bindings)


    def leader_here(self, cur: RemoteQueue, q) -> None:
        """A mirror here was promoted (hutch.mirror.failover)."""
        self.failover.leader_here(cur, q)
        self.broker.dirty_queues.add(q)

    def _leader_moved(self, q: RemoteQueue, new_home: str) -> None:
        self.failover.leader_moved(q, new_home)

    # the broker side of hutch.mirror.failover (FailoverSide)
    def forget_unacked(self, ch, q) -> None:
        """Deliveries from a leader that is gone: the new leader requeued them, so their tags
        settle nothing (a late ack must not settle the message's next delivery)."""
        for tag, (uq, entry, c) in list(ch.unacked.items()):
            if uq is q:
                ch.unacked[tag] = (STALE, entry, c)

    def cancel_consumer(self, c: ChannelConsumer) -> None:
        self._cancel_local(c)

    def adopt_consumer(self, c: ChannelConsumer, q) -> None:
        """A consumer of a queue led elsewhere becomes a local consumer of the queue led here."""
        lc = ChannelConsumer(c.tag, q, c.channel, c.no_ack, c.exclusive, c.priority, c.prefetch, c.arguments)
        c.channel.consumers[c.tag] = lc
        q.add_consumer(lc)

    def retry_orphans(self) -> None:
        self._retry_orphans()

    def _cancel_local(self, c: ChannelConsumer) -> None:
        self.broker.cancel_notify(c)

    # ------------------------------------------------------------ placing queues

    def choose_home(self, arguments: dict, exclusive: bool, vhost: str, name: str) -> str:
        if exclusive:
            return self.node
        strategy = arguments.get("x-queue-master-locator")
        if isinstance(strategy, bytes):
            strategy = strategy.decode()
        if strategy is None:
            pol = self.catalogue.policy_for(vhost, name, cat.QUEUE)
            if pol is not None:
                strategy = pol.definition.get("queue-master-locator")
        strategy = strategy or self.broker.config.queue_master_locator
        nodes = self.running_nodes() or [self.node]
        params = self.mirror_params(vhost, name)
        if params is not None and params.mode == "nodes":  # seed 000: listed nodes, else the client's
            return declare_node(params, self.node, nodes)
        if strategy == "random":
            return random.choice(nodes)
        if strategy == "min-masters":
            counts = dict.fromkeys(nodes, 0)
            for rec in self.catalogue.queues.values():
                if rec.leader_node in counts:
                    counts[rec.leader_node] += 1
            return min(nodes, key=lambda n: (counts[n], n))
        return self.node

    def mirror_params(self, vhost: str, name: str) -> MirrorParams | None:
        """The ha-* settings of the policy that applies to a classic queue (None: not mirrored)."""
        pol = self.catalogue.policy_for(vhost, name, cat.QUEUE)
        return params_of(pol.definition if pol is not None else None)

    def initial_mirrors(self, vhost: str, name: str, home: str) -> tuple[str, ...]:
        """The mirrors a new classic queue starts with, from the policy that matches it."""
        params = self.mirror_params(vhost, name)
        if params is None:
            return ()
        return mirrors_for(params, home, (), list(self.members) or [self.node], self.running_nodes() or [self.node])

    # ------------------------------------------------------------ publishing to other nodes

    def forward(self, queues: list[RemoteQueue], msg: Message, channel, seq: int) -> tuple[int, bool]:
        """Send a routed message to the home nodes of `queues` (to the Raft leader of a quorum
        queue). Returns (accepts to wait for, refused): a durable queue whose home is down
        refuses it."""
        by_home: dict[str, list[str]] = {}
        mirrored_homes: set[str] = set()
        refused = False
        waits = 0
        for q in queues:
            if q.quorum:
                self.quorum.publish(q, msg, channel, seq)
                waits += 1
                continue
            if not self.is_up(q.home_node) and not q.mirrored:
                refused = refused or q.durable
                continue
            by_home.setdefault(q.home_node, []).append(q.name)
            if q.mirrored:
                mirrored_homes.add(q.home_node)
        session = channel.session if channel is not None else None
        vhost = queues[0].vhost
        for home, names in by_home.items():
            token = self.new_id()
            self._pub_tokens[token] = (home, channel, seq, session)
            item = Publish(token, vhost, names, msg.exchange, msg.routing_key, msg.props, msg.body, msg.persistent)
            if session is not None:
                self.window_add(session)
            if home in mirrored_homes:
                self._pub_items[token] = item  # kept to send again to a promoted mirror
                if not self.is_up(home):  # its leader is down: wait for a promotion
                    self._orphans[token] = self.mirroring.now() + ORPHAN_TIMEOUT_S
                    continue
            self._out_pubs.setdefault(home, []).append(item)
        return len(by_home) + waits, refused

    def _retry_orphans(self) -> None:
        """Publishes whose mirrored queue lost its leader: send them to the new one (it drops
        those it already has), or nack them once waiting is pointless."""
        if not self._orphans:
            return
        now = self.mirroring.now()
        for token, deadline in list(self._orphans.items()):
            item = self._pub_items.get(token)
            entry = self._pub_tokens.get(token)
            if item is None or entry is None:
                self._orphans.pop(token, None)
                continue
            homes = {rec.leader_node for rec in (self.catalogue.queue(item.vhost, n) for n in item.queues)
                     if rec is not None}
            if len(homes) == 1:
                home = homes.pop()
                if home == self.node or self.is_up(home):
                    del self._orphans[token]
                    self._pub_tokens[token] = (home, *entry[1:])
                    self._out_pubs.setdefault(home, []).append(item)
                    continue
            if now >= deadline or not homes or len(homes) > 1:
                del self._orphans[token]
                self._publish_accepted(token, True)
        self.broker.schedule()

    def tick(self, now_s: float) -> None:
        self.mirroring.tick(now_s)
        self._retry_orphans()
        self.failover.tick(now_s)

    def after_forwarded(self, session, fn: Callable[[Any], None], arg: Any) -> None:
        """fn(arg) once every publish this session sent to other nodes so far is accepted or
        refused (tx.commit-ok waits for it)."""
        tokens = [t for t, (_h, _ch, _s, sess) in self._pub_tokens.items() if sess is session]
        if not tokens:
            fn(arg)
            return
        countdown = [len(tokens), fn, arg]
        for t in tokens:
            self._token_waiters.setdefault(t, []).append(countdown)

    def _publish_accepted(self, token: int, refused: bool) -> None:
        item = self._pub_tokens.pop(token, None)
        if item is None:
            return
        self._pub_items.pop(token, None)
        for countdown in self._token_waiters.pop(token, ()):
            countdown[0] -= 1
            if countdown[0] == 0:
                countdown[1](countdown[2])
        _home, ch, seq, session = item
        if session is None:
            return
        self.window_done(session)
        if seq and not ch.closed:
            if refused:
                ch.nack_publish(seq)
            else:
                ch.accepted(seq)
            self.output(session)

    def window_add(self, session) -> None:
        """One more of this session's publishes is in flight to another node (or a Raft leader)."""
        n = self._session_inflight.get(session, 0) + 1
        self._session_inflight[session] = n
        if n >= PUBLISH_WINDOW and session not in self._paused_sessions and session.transport_hooks:
            self._paused_sessions.add(session)
            session.transport_hooks.pause_reading()

    def window_done(self, session) -> None:
        n = self._session_inflight.get(session, 1) - 1
        if n <= 0:
            self._session_inflight.pop(session, None)
        else:
            self._session_inflight[session] = n
        if session in self._paused_sessions and n <= PUBLISH_WINDOW_LOW:
            self._paused_sessions.discard(session)
            if not session.closed and not session.flow_queues and not session.blocked and session.transport_hooks:
                session.transport_hooks.resume_reading()

    def output(self, session) -> None:
        """Something was queued for this session's client: have the loop write it."""
        if session is not None and not session.output_pending:
            session.output_pending = True
            self.broker.output_due(session)

    def _on_publishes(self, origin: str, pubs: list[Publish]) -> None:
        b = self.broker
        for pub in pubs:
            token, vhost, names = pub.token, pub.vhost, pub.queues
            v = b.vhosts.get(vhost)
            queues = tuple(q for q in (v.queues.get(n) for n in names) if q is not None and not q.deleted
                           and q.local) if v is not None else ()
            if len(queues) < len(names) and v is not None and any(
                    self.catalogue.queue(vhost, n) is not None and getattr(v.queues.get(n), "remote", False)
                    for n in names):
                # a queue that has just moved to another leader (or whose promotion here is not
                # done yet): its publisher's node sends it again when it can, or nacks it
                self._out_acks.setdefault(origin, []).append(PublishAnswer(token, RETRY))
                continue
            if not queues:
                self._out_acks.setdefault(origin, []).append(PublishAnswer(token, ACCEPTED))
                continue
            mirrored = [q for q in queues if q.mirror is not None]
            if mirrored and any((origin, token) in q.mirror.recent_tokens for q in mirrored):
                # sent again after a promotion, and the old leader had passed it on: it is here
                self._out_acks.setdefault(origin, []).append(PublishAnswer(token, ACCEPTED))
                continue
            exchange, rk, props = pub.exchange, pub.routing_key, pub.props
            priority, expiration_ms = priority_and_expiration(props)
            msg = Message(exchange, rk, codec.route_encoding(exchange, rk), props, pub.body, pub.persistent, priority,
                          expiration_ms)
            self.mirroring.token = (origin, token)
            refused, journalled = b.enqueue_local(queues, msg)
            self.mirroring.token = ("", 0)
            arg = (origin, token, refused, queues)
            if mirrored and not refused:
                arg = (self._ack_publish, arg, mirrored)
                fn = self._after_mirrors
            else:
                fn = self._ack_publish
            if journalled and not refused:
                b.after_sync(fn, arg)
            else:
                fn(arg)
        b.schedule()

    def _after_mirrors(self, arg: tuple) -> None:
        """Then fn(arg) once every mirrored queue in `queues` has passed the message to all its mirrors."""
        fn, inner, queues = arg
        if not queues:
            fn(inner)
            return
        q = queues[0]
        if q.mirror is None or q.deleted:
            self._after_mirrors((fn, inner, queues[1:]))
        else:
            q.mirror.after_stable(self._after_mirrors, (fn, inner, queues[1:]))

    def _ack_publish(self, arg: tuple[str, int, bool, tuple]) -> None:
        """Accept a publish from another node, unless a queue it went to holds publishers back
        (consumers busy behind a backlog): then the accept waits, and the publishing node's
        window stops its publisher — the same backpressure a local publisher gets."""
        origin, token, refused, queues = arg
        for q in queues:
            if q.flow_waiters is not None and not q.deleted:
                self._held.setdefault(q, []).append((origin, token, refused))
                return
        self._out_acks.setdefault(origin, []).append(PublishAnswer(token, REFUSED if refused else ACCEPTED))
        self.broker.schedule()

    def flow_released(self, q) -> None:
        for origin, token, refused in self._held.pop(q, ()):
            self._out_acks.setdefault(origin, []).append(PublishAnswer(token, REFUSED if refused else ACCEPTED))
        self.broker.schedule()

    # ------------------------------------------------------------ consuming from other nodes

    def queue_delivery(self, origin: str, cid: int, item: Delivery) -> None:
        self._out_deliveries.setdefault((origin, cid), []).append(item)

    def _on_deliveries(self, cid: int, items: list[Delivery]) -> None:
        c = self.consumers.get(cid)
        if c is None:
            # cancelled meanwhile: give them back
            return self._orphan_deliveries(cid, [it.seq for it in items])
        ch = c.channel
        session = ch.session
        q = c.queue
        deliver = ch.deliver_held
        for d in items:
            redelivered = d.redelivered
            deliver(c, q, d.seq, 2 if redelivered else 1, redelivered, d.route, d.props, d.body)
        c.received += len(items)
        if c.received >= CREDIT_RETURN:
            self.send(q.home_node, Credit(cid, c.received))
            c.received = 0
        if not session.output_pending:
            session.output_pending = True
            self.broker.output_due(session)

    def _orphan_deliveries(self, cid: int, seqs: list[int]) -> None:
        """Deliveries that crossed a cancel on the wire: the client never saw them."""
        where = self._cancelled.get(cid)
        if where is not None:
            home, vhost, qname = where
            self.send(home, Settle(vhost, qname, cid, REQUEUE, seqs))

    def _on_consume(self, origin: str, m: Consume) -> None:
        b = self.broker
        cid, vhost, qname = m.cid, m.vhost, m.queue
        v = b.vhosts.get(vhost)
        q = v.queues.get(qname) if v is not None else None
        if q is None or not q.local or q.deleted:
            self.send(origin, ConsumeAnswer(cid, spec.NOT_FOUND, f"no queue '{qname}' in vhost '{vhost}'"))
            return
        if q.has_exclusive_consumer() or (m.exclusive and q.consumer_count):
            self.send(origin, ConsumeAnswer(cid, spec.ACCESS_REFUSED,
                                            f"queue '{qname}' in vhost '{vhost}' in exclusive use"))
            return
        p = ProxyConsumer(self, q, origin, cid, m.tag, m.no_ack, m.exclusive, m.priority, m.prefetch,
                          m.arguments if m.arguments is not None else {})
        self.proxies[(origin, cid)] = (q, p)
        q.add_consumer(p)
        q.ever_consumed = True
        self.send(origin, ConsumeAnswer(cid, 200, ""))
        b.dirty_queues.add(q)
        b.schedule()

    def cancel_proxy(self, q, p: ProxyConsumer) -> None:
        """The home queue cancels a consumer attached from another node (queue still there)."""
        self.proxies.pop((p.origin, p.cid), None)
        self.send(p.origin, ConsumerCancelled(p.cid))

    def _on_cancel(self, origin: str, cid: int) -> None:
        item = self.proxies.pop((origin, cid), None)
        if item is None:
            return
        q, p = item
        q.remove_consumer(p)
        self.broker.consumer_gone(q)

    def _on_settle(self, origin: str, m: Settle) -> None:
        b = self.broker
        vhost, qname, op, seqs = m.vhost, m.queue, m.op, m.seqs
        if op not in SETTLE_OPS:
            log.error("settle of unknown kind %r from %s for queue '%s' in vhost '%s': ignored", op, origin, qname,
                      vhost)
            return
        v = b.vhosts.get(vhost)
        q = v.queues.get(qname) if v is not None else None
        if q is None or not q.local or q.deleted:
            return
        proxies = [p for (o, _c), (pq, p) in self.proxies.items() if o == origin and pq is q]
        dead = []
        for seq in seqs:
            for p in proxies:
                if p.inflight.pop(seq, None) is not None:
                    break
            entry = q.state.unacked.get(seq)
            if entry is None:
                continue
            if op == ACK:
                q.settle(seq)
                b.settled(q, entry)
            elif op == REQUEUE:
                q.requeue(seq)
            else:
                q.discard(seq)
                dead.append(entry)
        if dead:
            b.dead_letter(q, dead, "rejected")
        b.dirty_queues.add(q)
        b.schedule()

    # ------------------------------------------------------------ calls (answered once)

    def expect_reply(self, rid: int, peer: str, callback: Callable[[Any], None]) -> None:
        """callback(answer) for the reply that will carry `rid`, or callback(None) if `peer` goes down."""
        self.peers.expect_reply(rid, peer, callback)

    def call(self, peer: str, kind: str, args: list, callback: Callable[[Any], None]) -> None:
        """Ask `peer`; callback(result) once it answers, or callback(None) if it goes down first."""
        self.peers.call(peer, lambda rid: [REMOTE, encode_batch([Call(rid, kind, args)])], callback)

    def _on_call(self, origin: str, rid: int, kind: str, args: list) -> None:
        b = self.broker
        need = CALL_ARGS.get(kind, 2)
        if len(args) < need:
            log.error("call %r from %s with %d arguments (it takes %d): refused", kind, origin, len(args), need)
            self.send(origin, CallAnswer(rid, [spec.INTERNAL_ERROR, f"malformed call {kind}"]))
            return
        if kind == "list":  # a management listing of this node's own objects: [what, params]
            rows = self.lister(args[0], args[1]) if self.lister is not None else []
            self.send(origin, CallAnswer(rid, [200, rows]))
            return
        if kind == "migrate":  # [vhost, queue, timeout_s]: run here, the classic queue's home
            if self.migrator is None:
                self.send(origin, CallAnswer(rid, [spec.NOT_IMPLEMENTED, "migration is not available here"]))
            else:
                self.migrator(args, lambda result: self.send(origin, CallAnswer(rid, result)))
            return
        if kind == "qstatus":  # this node's view of a quorum queue's Raft group: [gid]
            self.send(origin, CallAnswer(rid, [200, self.quorum.local_status(args[0])]))
            return
        if kind == "qmember":  # on a quorum queue's leader: [gid, "add"|"remove", node]
            self.send(origin, CallAnswer(rid, self.quorum.membership_op(args[0], args[1], args[2])))
            return
        if kind == "gmid":  # a mirror asks which GM member to join: [vhost, queue]
            self.send(origin, CallAnswer(rid, self.mirroring.leader_member(args[0], args[1])))
            return
        if kind == "sync":  # sync_queue / cancel_sync_queue on the leader: [vhost, queue, action]
            self.send(origin, CallAnswer(rid, self.mirroring.sync_action(args[0], args[1], args[2])))
            return
        vhost, qname = args[0], args[1]
        v = b.vhosts.get(vhost)
        q = v.queues.get(qname) if v is not None else None
        if q is None or not q.local or q.deleted:
            self.send(origin, CallAnswer(rid, [spec.NOT_FOUND, f"no queue '{qname}' in vhost '{vhost}'"]))
            return
        if kind == "stat":
            result = [200, q.message_count, q.consumer_count]
        elif kind == "purge":
            result = [200, b.purge_queue(q)]
        elif kind == "take" and q.mirror is not None and q.mirror.syncing:
            # a synchronising queue answers nothing else until it is done (seed 000)
            q.mirror.after_sync(lambda _r: self._on_call(origin, rid, kind, args))
            return
        elif kind == "get":
            no_ack = args[2]

            def answer(got) -> None:
                if got is None:
                    self.send(origin, CallAnswer(rid, [200, None]))
                    return
                if not no_ack:
                    self.get_inflight.setdefault(origin, []).append((q, got.entry.seq))
                self.send(origin, CallAnswer(rid, [200, [got.entry.seq, got.redelivered, got.route,
                                                         got.message_count, got.props, got.body]]))
            got = q.get(no_ack, answer)
            if got is not PENDING:
                answer(got)
            return
        elif kind == "take":  # the management API's get: [count, requeue, reject]
            taken = b.take_messages(q, args[2], args[3], args[4])
            result = [200, [[e.message.exchange, e.message.routing_key, e.message.props, e.message.body,
                             e.delivery_count > 1, left] for e, left in taken]]
        else:
            result = [spec.NOT_IMPLEMENTED, f"unknown call {kind}"]
        self.send(origin, CallAnswer(rid, result))

    # ------------------------------------------------------------ the peer protocol

    def on_message(self, peer: str, payload: Any) -> None:
        if (type(payload) is not list or not payload or type(payload[0]) is not str
                or _LIST_MESSAGES.get(payload[0]) != len(payload)):
            log.error("malformed message from %s in group q: %.200r; ignored", peer, payload)
            return
        kind = payload[0]
        if kind == REMOTE or kind == "ST":
            self._on_batch(peer, payload[1])
        elif kind == "QP":
            self.quorum.on_forwarded(payload[1], payload[2])
        elif kind == "QE":
            self.quorum.on_effects(payload[1])
        elif kind == "G":
            self.mirroring.on_gm(peer, payload[1], payload[2], payload[3])
        elif kind == "NI":
            if isinstance(payload[1], dict):
                self.peer_info[peer] = payload[1]
        elif kind == "CC":
            if isinstance(payload[1], dict):
                self.peer_counts[peer] = payload[1]
        self.broker.schedule()

    def _on_batch(self, peer: str, data: Any) -> None:
        """A batch of remote-queue messages (hutch.cluster.remote) from `peer`."""
        if type(data) is not bytes:
            log.error("remote-queue messages from %s are not encoded (%s); ignored", peer, type(data).__name__)
            return
        try:
            msgs = decode_batch(data)
        except msgspec.DecodeError as e:  # ValidationError too: a message that does not fit its type
            log.error("undecodable remote-queue messages from %s: %s; ignored", peer, e)
            return
        for m in msgs:
            t = type(m)
            if t is Publishes:
                self._on_publishes(peer, m.items)
            elif t is PublishAnswers:
                for a in m.items:
                    token = a.token
                    if a.outcome == RETRY and token in self._pub_items:
                        self._orphans.setdefault(token, self.mirroring.now() + ORPHAN_TIMEOUT_S)
                    else:
                        self._publish_accepted(token, a.outcome != ACCEPTED)
            elif t is Deliveries:
                self._on_deliveries(m.cid, m.items)
            elif t is Settle:
                self._on_settle(peer, m)
            elif t is Credit:
                item = self.proxies.get((peer, m.cid))
                if item is not None:
                    item[1].credit += m.n
                    self.broker.dirty_queues.add(item[0])
                    self.broker.schedule()
            elif t is Consume:
                self._on_consume(peer, m)
            elif t is Cancel:
                self._on_cancel(peer, m.cid)
            elif t is ConsumerCancelled:  # the home node cancelled our consumer
                c = self.consumers.pop(m.cid, None)
                if c is not None:
                    c.queue.local_consumers.pop(c.ref, None)
                    self._cancel_local(c)
            elif t is Call:
                self._on_call(peer, m.rid, m.kind, m.args)
            elif t is CallAnswer:
                self.peers.requests.answer(m.rid, m.result)
            elif t is ConsumeAnswer:
                self.peers.requests.answer(m.cid, [m.code, m.text])
            elif t is FiguresReport:
                self._on_stats(m.queues)

    def flush(self) -> None:
        """Send what this loop iteration collected (called once per broker run): one message
        per home, publisher's node and consumer, each encoded once in a frame of its own (as
        large as the old protocol's, well within the transport's frame limit)."""
        if self._out_pubs:
            pubs, self._out_pubs = self._out_pubs, {}
            for home, items in pubs.items():
                if not self.send(home, Publishes(items)):
                    for it in items:
                        self._publish_accepted(it.token, True)
        if self._out_acks:
            acks, self._out_acks = self._out_acks, {}
            for origin, answers in acks.items():
                self.send(origin, PublishAnswers(answers))
        if self._out_deliveries:
            dels, self._out_deliveries = self._out_deliveries, {}
            for (origin, cid), ds in dels.items():
                self.send(origin, Deliveries(cid, ds))
        self.quorum.flush()
        self.mirroring.flush()

    def stats(self) -> bytes:
        """This node's queue figures for its peers (the runtime sends them as ["ST", stats()])."""
        rows = [QueueFigures(q.vhost, q.name, q.message_count, q.unacked_count, q.consumer_count,
                             *(q.mirror.mirror_nodes() if q.mirror is not None else ()))
                for v in self.broker.vhosts.values() for q in v.queues.values() if q.local]
        rows.extend(QueueFigures(*row) for row in self.quorum.stats())
        return encode_batch([FiguresReport(rows)])

    def _on_stats(self, rows: list[QueueFigures]) -> None:
        for f in rows:
            v = self.broker.vhosts.get(f.vhost)
            q = v.queues.get(f.name) if v is not None else None
            if q is not None and q.quorum:
                q.reported = (f.ready, f.unacked, f.consumers)
            elif q is not None and not q.local:
                q.ready, q.unacked_remote, q.consumers_remote = f.ready, f.unacked, f.consumers
                q.mirror_nodes, q.synced_nodes = list(f.mirror_nodes), list(f.synced_nodes)

    # ------------------------------------------------------------ peers coming and going

    def peer_up(self, peer: str) -> None:
        self.quorum.peer_up(peer)
        self.mirroring.peer_up(peer)
        self.failover.peer_up(peer)  # a mirrored queue's leader is back, unpromoted
        self._retry_orphans()
        self.broker.schedule()

    def peer_down(self, peer: str) -> None:
        b = self.broker
        self.quorum.peer_down(peer)
        self.mirroring.peer_down(peer)
        # publishes it had not accepted: nacked, never silently confirmed; those to a mirrored
        # queue wait for its promoted mirror
        now = self.mirroring.now()
        for token, (home, *_rest) in list(self._pub_tokens.items()):
            if home == peer:
                if token in self._pub_items:
                    self._orphans.setdefault(token, now + ORPHAN_TIMEOUT_S)
                else:
                    self._publish_accepted(token, True)
        # calls it will not answer
        self.peers.peer_down(peer)
        # its consumers of queues here: what they had is requeued
        for (origin, cid), (q, p) in list(self.proxies.items()):
            if origin == peer:
                del self.proxies[(origin, cid)]
                q.remove_consumer(p)
                for seq in sorted(p.inflight, reverse=True):
                    if seq in q.state.unacked:
                        q.requeue(seq)
                b.consumer_gone(q)
        for q, seq in reversed(self.get_inflight.pop(peer, [])):
            if not q.deleted and seq in q.state.unacked:
                q.requeue(seq)
                b.dirty_queues.add(q)
        # consumers here of queues there: the queue is gone for now (a mirrored queue's
        # consumers wait for its promoted mirror; what they had is redelivered by it)
        for c in list(self.consumers.values()):
            if c.queue.home_node == peer and c.queue.mirrored:
                self.forget_unacked(c.channel, c.queue)
            elif c.queue.home_node == peer:
                c.queue.local_consumers.pop(c.ref, None)
                self.consumers.pop(c.ref, None)
                self._drop_unacked_of(c)
                self._cancel_local(c)
        b.schedule()

    def _drop_unacked_of(self, c: ChannelConsumer) -> None:
        ch = c.channel
        for tag in [t for t, (_q, _e, cc) in ch.unacked.items() if cc is c]:
            del ch.unacked[tag]

    def catalogue_leader_of(self, vhost: str, name: str) -> str | None:
        rec = self.catalogue.queue(vhost, name)
        return rec.leader_node if rec is not None else None

    def mirror_status(self, vhost: str, name: str) -> tuple[list[str], list[str]]:
        """(mirror nodes, synchronised mirror nodes) of a classic queue, as its leader reports them."""
        v = self.broker.vhosts.get(vhost)
        q = v.queues.get(name) if v is not None else None
        if q is None or q.quorum:
            return [], []
        if not q.local:
            return list(q.mirror_nodes), list(q.synced_nodes)
        return q.mirror.mirror_nodes() if q.mirror is not None else ([], [])

    def queues_homed_on(self, node: str) -> list[cat.QueueRecord]:
        return [rec for rec in self.catalogue.queues.values() if rec.leader_node == node]


def _ignore(_result: cat.Result) -> None:
    return None


__all__ = ["ClusterBroker", "RemoteQueue", "ProxyConsumer", "home_down", "EXCHANGE", "QUEUE", "NODE_PARAM",
           "INIT_PARAM"]
