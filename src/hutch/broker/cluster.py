"""The broker in a cluster: the catalogue made into local objects, and queues on other nodes.

Every node of a cluster applies the same committed catalogue commands (the metadata Raft
group, driven by `hutch.server.clustering`). `ClusterBroker.apply_entry` applies one to this
node's `Catalogue` and then brings the broker's own objects in line with it: vhosts, users and
permissions, exchanges and bindings exist on every node; a queue is a real `ClassicQueue` on
its home node and a `RemoteQueue` stand-in everywhere else (RabbitMQ's "Non-mirrored Queue
Behavior in a Cluster"). Routing is therefore local on every node, and an operation on a queue
homed elsewhere travels to its home over the peer transport. `hutch.cluster.remote_host`
(`RemoteHost`) speaks that protocol; it reaches this broker only through `BrokerRemotePort`
below. Its messages are the typed ones of `hutch.cluster.remote` (msgspec structs with an
integer tag); a node sends them in group "q" as `["RQ", bytes]` (`REMOTE`: a list of them,
encoded once) and the receiver decodes them against their union, so a malformed one is logged
and dropped:

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
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from hutch.amqp import codec, spec
from hutch.broker import msgstats
from hutch.broker.broker import priority_and_expiration
from hutch.broker.channel import Channel, ChannelConsumer
from hutch.broker.exchanges import EXCHANGE, QUEUE
from hutch.broker.quorumq import BrokerQuorumPort
from hutch.broker.streamq import BrokerStreamPort
from hutch.broker.streamsac import sac_of
from hutch.broker.topology import NODE_PARAM, Topology
from hutch.cluster import catalogue as cat
from hutch.cluster.peers import Peers
from hutch.cluster.remote import REMOTE, Delivery, ProxyConsumer, RemoteQueue, home_down
from hutch.cluster.remote_host import RemoteHost
from hutch.mirror.failover import Failover
from hutch.mirror.host import MirrorHost
from hutch.mirror.placement import MirrorParams, declare_node, mirrors_for, params_of
from hutch.queues.message import Message
from hutch.quorum.host import QuorumHost
from hutch.store import StoreFailed
from hutch.streamproto import amqp10
from hutch.streams.handle import STREAM
from hutch.streams.host import StreamHost

if TYPE_CHECKING:
    from hutch.broker.broker import Broker

log = logging.getLogger("hutch.cluster")

PUBLISH_WINDOW = 4096  # messages a session may have in flight to other nodes before it is paused
PUBLISH_WINDOW_LOW = 1024
INIT_PARAM = "hutch_initialised"
# the messages of group "q" (lists tagged by a string), and how long each is
# each queue-traffic message: its kind, then fields of these types (anything else is malformed)
_LIST_MESSAGES = {REMOTE: (bytes,), "ST": (bytes,), "QP": (int, bytes), "QE": (bytes,), "G": (str, str, bytes),
                  "NI": (dict,), "CC": (dict,), "SP": (int, bytes), "SE": (list,),
                  "SAC": (list,)}


def _stream_filter_value(props: bytes) -> bytes | None:
    """A publish's `x-stream-filter-value` header (stream filtering, RabbitMQ 3.13): the value
    the chunk's bloom filter records for it."""
    if b"x-stream-filter-value" not in props:
        return None
    v = codec.decode_headers(props, codec.summarize_properties(props).headers_span).get("x-stream-filter-value")
    if isinstance(v, bytes):
        return v or None
    return v.encode() if isinstance(v, str) and v else None


def _no_hold(_node: str) -> bool:
    return False


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
        # exclusive owner id -> this node's session, for sessions that declared an exclusive
        # queue. Weak: an entry goes with its session, and a session gone counts as closed
        # (hutch.broker.kinds deletes the queue of an owner it cannot find)
        self.owners: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        # Sessions with publishes in flight to other nodes or Raft leaders: one entry per such
        # session (removed when its last publish is answered); a session with PUBLISH_WINDOW of
        # them is not read from
        self._session_inflight: dict[Any, int] = {}
        self._paused_sessions: set = set()
        self.members: dict[str, str] = {}  # name -> peer address, from the catalogue
        self.local_info: Callable[[], dict] | None = None  # this node's /api/nodes object (set by the runtime)
        self.lister: Callable[[str, dict], list] | None = None  # this node's connections, channels (runtime)
        self.migrator: Callable[[list, Callable], None] | None = None  # migrate_to_quorum here (runtime)
        self.migrations: dict[tuple[str, str], Any] = {}  # classic queue being migrated -> its quorum queue
        self.peer_info: dict[str, dict] = {}  # the last one each peer sent
        # promotion_held(dead leader's node): whether no mirror here may propose its promotion
        # over that leader now (pause_minority's partial-partition handling: set by the runtime,
        # ClusterRuntime.promotion_hold)
        self.promotion_held: Callable[[str], bool] = _no_hold
        self.peer_counts: dict[str, dict] = {}  # each peer's connection and channel counts (for limits)
        self.quorum = QuorumHost(self.peers, BrokerQuorumPort(self))
        self.streams = StreamHost(self.peers, BrokerStreamPort(self))
        self.streams.peers_call = self.call
        self.topology = Topology(self)  # the catalogue, applied to this node's objects
        self.mirroring = MirrorHost(self)
        # classic queues on other nodes, and this node's classic queues for them
        self.remote = RemoteHost(self.peers, BrokerRemotePort(self))
        self.failover = Failover(self, self.mirroring.now)  # consumers following a mirrored queue's leader
        # A booting node's queues are not recovered from its disk yet (Broker.open_storage): until
        # they are, it leads no mirrored queue (nor does a mirror here join: Mirror._claim), and
        # what peers send for queues waits here (a publish taken into a queue before its
        # recovery was confirmed unjournalled, and the recovery went on without it). The
        # runtime sets this for the boot.
        self.recovering = False
        self._held: list[tuple[str, Any]] = []
        self.store_failed = False  # set once the message store refused a peer's operation

    # the remote-queue protocol's tables, as the rest of the broker reaches them
    @property
    def consumers(self) -> dict[int, Any]:
        """cid -> this node's consumer of a queue homed elsewhere."""
        return self.remote.consumers

    @property
    def proxies(self) -> dict[tuple[str, int], tuple[Any, ProxyConsumer]]:
        """(origin, cid) -> (queue here, consumer attached from that node)."""
        return self.remote.proxies

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
        self.streams.channel_closed(channel)

    def cancelled(self, cid: int, home: str, vhost: str, qname: str) -> None:
        self.remote.cancelled(cid, home, vhost, qname)

    def propose_delete(self, q) -> None:
        if self.catalogue.queue(q.vhost, q.name) is not None:
            self.submit(cat.DeleteQueue(q.vhost, q.name), _ignore)

    def send(self, peer: str, payload: Any) -> bool:
        """Send a payload of group "q"; a remote-queue message (hutch.cluster.remote) goes
        encoded, alone in its batch."""
        if isinstance(payload, msgspec.Struct):
            return self.remote.send(peer, payload)
        return self.peers.send(peer, payload)

    def incarnation_of(self, node: str) -> int | None:
        """The run of `node` this node is connected to (this node's own for itself)."""
        return self.peers.incarnation_of(node)

    def running_nodes(self) -> list[str]:
        return sorted(n for n in self.members if n == self.node or self.is_up(n))

    def cut_off(self) -> bool:
        """Under pause_minority, whether this node reaches no majority of the cluster's members:
        then a mirrored queue led here confirms nothing (hutch.mirror.leader)."""
        if self.broker.config.cluster_partition_handling != "pause_minority" or not self.members:
            return False
        return not self.reaches_majority()

    def reaches_majority(self) -> bool:
        """Whether this node reaches more than half of the cluster's members, itself included."""
        return 2 * len(self.running_nodes()) > len(self.members)

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

    def redirect_publishes(self, vhost: str, name: str, old_home: str) -> None:
        self.remote.redirect_publishes(vhost, name, old_home)

    def retry_orphans(self) -> None:
        self.remote.retry_orphans()

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

    def forward(self, queues: list, msg: Message, channel, seq: int) -> tuple[int, bool]:
        """Send a routed message to the home nodes of `queues` (to the Raft leader of a quorum
        queue). Returns (accepts to wait for, refused): a durable queue whose home is down
        refuses it."""
        waits = 0
        classic = []
        for q in queues:
            if q.quorum:
                self.quorum.publish(q, msg, channel, seq)
                waits += 1
            elif q.queue_type == STREAM.name:
                self.streams.publish(q, amqp10.from_basic(msg.props, msg.body, msg.exchange, msg.routing_key),
                                     channel, seq, _stream_filter_value(msg.props))
                waits += 1
            else:
                classic.append(q)
        if not classic:
            return waits, False
        n, refused = self.remote.forward(classic, msg, channel, seq)
        return n + waits, refused

    def tick(self, now_s: float) -> None:
        self.mirroring.tick(now_s)
        self.streams.tick(now_s)
        sac_of(self.broker).tick(now_s)
        self.remote.retry_orphans()
        self.failover.tick(now_s)

    def after_forwarded(self, session, fn: Callable[[Any], None], arg: Any) -> None:
        """fn(arg) once every publish this session sent to other nodes so far is accepted or
        refused (tx.commit-ok waits for it)."""
        self.remote.after_forwarded(session, fn, arg)

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

    def flow_released(self, q) -> None:
        self.remote.flow_released(q)

    # ------------------------------------------------------------ consuming from other nodes

    def queue_delivery(self, origin: str, cid: int, item: Delivery) -> None:
        self.remote.queue_delivery(origin, cid, item)

    def cancel_proxy(self, q, p: ProxyConsumer) -> None:
        """The home queue cancels a consumer attached from another node (queue still there)."""
        self.remote.cancel_proxy(q, p)

    # ------------------------------------------------------------ calls (answered once)

    def expect_reply(self, rid: int, peer: str, callback: Callable[[Any], None]) -> None:
        """callback(answer) for the reply that will carry `rid`, or callback(None) if `peer` goes down."""
        self.peers.expect_reply(rid, peer, callback)

    def call(self, peer: str, kind: str, args: list, callback: Callable[[Any], None]) -> None:
        """Ask `peer`; callback(result) once it answers, or callback(None) if it goes down first."""
        self.remote.call(peer, kind, args, callback)

    def node_call(self, kind: str, args: list, answer: Callable[[Any], None]) -> None:
        """The calls about this node rather than a classic queue homed here (RemoteHost asks)."""
        if kind == "list":  # a management listing of this node's own objects: [what, params]
            answer([200, self.lister(args[0], args[1]) if self.lister is not None else []])
        elif kind == "migrate":  # [vhost, queue, timeout_s]: run here, the classic queue's home
            if self.migrator is None:
                answer([spec.NOT_IMPLEMENTED, "migration is not available here"])
            else:
                self.migrator(args, answer)
        elif kind == "sread":  # a consumer on a node without a replica reads a stream: [gid, start, max_bytes]
            self.streams.read_call(args, answer)
        elif kind == "sraw":  # a replica closing a gap: [gid, offset, max_bytes]
            self.streams.raw_call(args, answer)
        elif kind == "schunks":  # a stream-protocol subscription on a node without a replica: [gid, start, max]
            self.streams.chunks_call(args, answer)
        elif kind == "squery":  # [gid, "offset"|"writer", reference]
            self.streams.query_call(args, answer)
        elif kind == "sstatus":  # this node's replica of a stream: [gid]
            answer([200, self.streams.local_status(args[0])])
        elif kind == "qstatus":  # this node's view of a quorum queue's Raft group: [gid]
            answer([200, self.quorum.local_status(args[0])])
        elif kind == "qmember":  # on a quorum queue's leader: [gid, "add"|"remove", node]
            answer(self.quorum.membership_op(args[0], args[1], args[2]))
        elif kind == "qleader":  # on a quorum queue's leader: [gid, node]: hand it leadership
            answer(self.transfer_quorum_leader(args[0], args[1]))
        elif kind == "gmid":  # a mirror asks which GM member to join: [vhost, queue, (member, epoch, ranges)]
            answer(self.mirroring.leader_member(*args[:5]))
        elif kind == "gmrejoin":  # a leader has no mirror of this node in its ring: [vhost, queue, its member]
            answer(self.mirroring.rejoin(args[0], args[1], args[2]))
        elif kind == "sync":  # sync_queue / cancel_sync_queue on the leader: [vhost, queue, action]
            answer(self.mirroring.sync_action(args[0], args[1], args[2]))
        else:
            answer([spec.NOT_IMPLEMENTED, f"unknown call {kind}"])

    def quorum_leader(self, rec: cat.QueueRecord) -> str | None:
        """The leader this node knows for a quorum queue's group (None: not known here)."""
        groups = self.quorum.raft
        return groups.leader(rec.journal_id) if groups is not None else None

    def transfer_quorum_leader(self, gid: int, node: str) -> list:
        """On a quorum queue's leader: Raft leadership transfer of its group to `node` (thesis
        §3.10, hutch.raft.group.RaftGroup.transfer_leadership): the leader brings `node`'s log up
        to date, then tells it to stand at once. [200] when started, else [code, why]."""
        groups = self.quorum.raft
        if groups is None or groups.status(gid) is None:
            return [spec.NOT_FOUND, "no such queue group here"]
        why = groups.transfer_leader(gid, node)
        return [200] if why is None else [spec.PRECONDITION_FAILED, why]

    # ------------------------------------------------------------ the peer protocol

    def on_message(self, peer: str, payload: Any) -> None:
        fields = _LIST_MESSAGES.get(payload[0]) if type(payload) is list and payload and type(payload[0]) is str \
            else None
        if fields is None or len(payload) != len(fields) + 1 or any(
                type(v) is not t for v, t in zip(payload[1:], fields, strict=True)):
            log.error("malformed message from %s in group q: %.200r; ignored", peer, payload)
            return
        kind = payload[0]
        if self.recovering and kind == REMOTE:
            self._held.append((peer, payload))
            return
        if self.store_failed:
            return  # the node is stopping, as gone for its peers (their links stay until it exits)
        try:
            self._dispatch(peer, kind, payload)
        except StoreFailed as e:
            # A record the message store refused (it failed an fsync before): the node stops, as
            # its next sync reports the failure. Sent again, the operation would be applied again
            # in memory and refused again (a publish enqueued once more each time); nothing more
            # is taken, and the peer is not blamed for it (its link stays).
            self.store_failed = True
            log.error("the message store refused an operation from node %s (%s); this node takes no more "
                      "queue operations from its peers", peer, e)
        self.broker.schedule()

    def _dispatch(self, peer: str, kind: str, payload: list) -> None:
        if kind == REMOTE or kind == "ST":
            self.remote.on_batch(peer, payload[1])
        elif kind == "QP":
            self.quorum.on_forwarded(payload[1], payload[2])
        elif kind == "QE":
            self.quorum.on_effects(payload[1])
        elif kind == "SP":
            self.streams.on_forwarded(payload[1], payload[2])
        elif kind == "SE":
            self.streams.on_answers(payload[1])
        elif kind == "SAC":
            sac_of(self.broker).on_peer(peer, payload[1])
        elif kind == "G":
            self.mirroring.on_gm(peer, payload[1], payload[2], payload[3])
        elif kind == "NI":
            self.peer_info[peer] = payload[1]
        elif kind == "CC":
            self.peer_counts[peer] = payload[1]

    def flush(self) -> None:
        """Send what this loop iteration collected (called once per broker run)."""
        self.remote.flush()
        self.quorum.flush()
        self.streams.flush()
        self.mirroring.flush()

    def stats(self) -> bytes:
        """This node's queue figures for its peers (the runtime sends them as ["ST", stats()])."""
        return self.remote.figures()

    # ------------------------------------------------------------ peers coming and going

    def peer_up(self, peer: str) -> None:
        self.quorum.peer_up(peer)
        self.streams.peer_up(peer)
        self.mirroring.peer_up(peer)
        self.failover.peer_up(peer)  # a mirrored queue's leader is back, unpromoted
        self.remote.retry_orphans()
        self.broker.schedule()

    def recovered(self) -> None:
        """This node's queues are recovered from its disk: it leads its mirrored queues now
        (its mirrors join on their own once storage is open), then handles what peers sent
        meanwhile, in order."""
        self.recovering = False
        vhosts = self.broker.vhosts
        for rec in list(self.catalogue.queues.values()):
            if rec.type != cat.CLASSIC or rec.leader_node != self.node or (v := vhosts.get(rec.vhost)) is None:
                continue
            q = v.queues.get(rec.name)
            if q is not None and q.local and not q.deleted:
                self.mirroring.record_changed(rec, q, recovered=True)
        held, self._held = self._held, []
        for peer, payload in held:
            self.on_message(peer, payload)

    def peer_down(self, peer: str) -> None:
        if self._held:  # lost with the link, as if they had not arrived
            self._held = [(p, payload) for p, payload in self._held if p != peer]
        self.quorum.peer_down(peer)
        self.mirroring.peer_down(peer)
        self.remote.peer_down(peer)  # its publishes, calls and consumers
        sac_of(self.broker).peer_down(peer)  # its single active consumers
        self.broker.schedule()

    def _drop_unacked_of(self, c: ChannelConsumer) -> None:
        ch = c.channel
        for tag in [t for t, (_q, _e, cc) in ch.unacked.items() if cc is c]:
            del ch.unacked[tag]

    def catalogue_leader_of(self, vhost: str, name: str) -> str | None:
        rec = self.catalogue.queue(vhost, name)
        return rec.leader_node if rec is not None else None

    def fenced_nodes(self, vhost: str, name: str) -> tuple[str, ...]:
        """The nodes whose mirror of a classic queue may not be promoted as synchronised."""
        rec = self.catalogue.queue(vhost, name)
        return rec.fenced_nodes if rec is not None else ()

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


class BrokerRemotePort:
    """`hutch.cluster.remote_host.RemotePort` on a broker: the remote host's only way into it.
    The hot-path services are the broker's bound methods themselves (no extra call per message)."""

    def __init__(self, cl: ClusterBroker):
        self.cl = cl
        b = self.broker = cl.broker
        self.schedule = b.schedule
        self.after_sync = b.after_sync
        self.settled = b.settled
        self.delivered = b.delivered
        self.dead_letter = b.dead_letter
        self.purge_queue = b.purge_queue
        self.take_messages = b.take_messages
        self.consumer_gone = b.consumer_gone
        self.window_add = cl.window_add
        self.priority_and_expiration = priority_and_expiration

    def now_s(self) -> float:
        return self.cl.mirroring.now()

    def queues_of(self, vhost: str) -> dict[str, Any] | None:
        v = self.broker.vhosts.get(vhost)
        return v.queues if v is not None else None

    def in_catalogue(self, vhost: str, name: str) -> bool:
        return self.cl.catalogue.queue(vhost, name) is not None

    def leader_of(self, vhost: str, name: str) -> str | None:
        return self.cl.catalogue_leader_of(vhost, name)

    def local_queues(self) -> Iterable[Any]:
        return [q for v in self.broker.vhosts.values() for q in v.queues.values() if q.local]

    def quorum_figures(self) -> list:
        return self.cl.quorum.stats()

    def enqueue_local(self, queues: tuple, msg: Message, token: tuple[str, int],
                      maybe_delivered: bool = False) -> tuple[bool, int]:
        """Enqueue a message another node published; mirrors learn its publisher's `token`."""
        mirroring = self.cl.mirroring
        mirroring.token = token
        result = self.broker.enqueue_local(queues, msg, maybe_delivered)
        mirroring.token = ("", 0)
        return result

    def dirty(self, q: Any) -> None:
        self.broker.dirty_queues.add(q)

    def publish_answered(self, ch: Any, session: Any, seq: int, accepted: bool) -> None:
        """A publish a home node answered: the session's window moves on, the channel confirms."""
        cl = self.cl
        cl.window_done(session)
        if seq and not ch.closed:
            if accepted:
                ch.accepted(seq)
            else:
                ch.nack_publish(seq)
            cl.output(session)

    def deliver(self, c: ChannelConsumer, q: Any, items: list[Delivery]) -> None:
        ch = c.channel
        deliver = ch.deliver_held
        for d in items:
            redelivered = d.redelivered
            deliver(c, q, d.seq, 2 if redelivered else 1, redelivered, d.route, d.props, d.body)
        self.cl.output(ch.session)

    def cancel_local(self, c: ChannelConsumer) -> None:
        self.cl._cancel_local(c)

    def forget_unacked(self, ch: Any, q: Any) -> None:
        self.cl.forget_unacked(ch, q)

    def drop_unacked_of(self, c: ChannelConsumer) -> None:
        self.cl._drop_unacked_of(c)

    def node_call(self, kind: str, args: list, answer: Callable[[Any], None]) -> None:
        self.cl.node_call(kind, args, answer)


def _ignore(_result: cat.Result) -> None:
    return None


__all__ = ["ClusterBroker", "RemoteQueue", "ProxyConsumer", "home_down", "EXCHANGE", "QUEUE", "NODE_PARAM",
           "INIT_PARAM"]
