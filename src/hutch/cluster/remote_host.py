"""The protocol by which a node reaches classic queues homed on other nodes, and serves its
own queues to them: `RemoteHost`, this node's side of it.

On the publisher's node it forwards routed messages to the queues' home nodes and waits for
their answers (publisher confirms: a publish waits for one accept per home node it went to;
a home node that goes down nacks what it had not accepted, and a publish to a mirrored queue
waits up to `ORPHAN_TIMEOUT_S` for its promoted mirror instead). On the consumer's node it
hands deliveries to the node's consumers and returns credit. On the home node it enqueues
what other nodes publish, attaches their consumers (`ProxyConsumer`), settles what they
acknowledge, and answers their calls (`stat`, `get`, `purge`, `take`; the node-wide kinds go
to the port). The messages are the typed ones of `hutch.cluster.remote`, sent encoded.

It reaches peers only through `hutch.cluster.peers` and the broker only through `RemotePort`
(queue lookup, enqueueing, the journal, settling, dead letters, the loop, publisher windows
and confirms, and delivering to a consumer's channel). Must never: import anything from
`hutch.broker` or above, touch a channel's or a session's fields itself, or name a publisher,
consumer or requester by `id()`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import msgspec

from hutch.amqp import codec, spec
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
    Settle,
    decode_batch,
    encode_batch,
)
from hutch.queues.handle import PENDING
from hutch.queues.message import Message

log = logging.getLogger("hutch.cluster")

CREDIT_RETURN = 500  # deliveries a consumer's node takes before it returns credit to the home node
CANCELLED_REMEMBERED_MAX = 4096  # recently cancelled remote consumers whose late deliveries go back
ORPHAN_TIMEOUT_S = 30.0  # a publish to a mirrored queue waits this long for a promoted leader
# the arguments each kind of Call takes at least (others: [vhost, queue, ...])
CALL_ARGS = {"list": 2, "migrate": 3, "qstatus": 1, "qmember": 3, "qleader": 2, "gmid": 2, "gmrejoin": 3, "sync": 3,
             "stat": 2, "purge": 2, "get": 3, "take": 5, "sread": 3, "sraw": 3, "schunks": 3, "squery": 3, "sstatus": 1}
NODE_CALLS = ("list", "migrate", "qstatus", "qmember", "qleader", "gmid", "gmrejoin", "sync",
              "sread", "sraw", "schunks", "squery", "sstatus")  # answered by the port


class RemotePort(Protocol):
    """The few things the host asks of the broker it serves (`hutch.broker.cluster`)."""

    def queues_of(self, vhost: str) -> dict[str, Any] | None: ...  # a vhost's queues by name, None: no vhost
    def in_catalogue(self, vhost: str, name: str) -> bool: ...
    def leader_of(self, vhost: str, name: str) -> str | None: ...  # the catalogue's leader node of a queue
    def local_queues(self) -> Iterable[Any]: ...  # the classic queues homed here
    def quorum_figures(self) -> list: ...  # [vhost, name, ready, unacked, consumers] of quorum queues led here
    def priority_and_expiration(self, props: bytes) -> tuple[int, int | None]: ...
    def enqueue_local(self, queues: tuple, msg: Message, token: tuple[str, int],
                      maybe_delivered: bool = False) -> tuple[bool, int]: ...
    def after_sync(self, fn: Callable[[Any], None], arg: Any) -> None: ...
    def schedule(self) -> None: ...
    def dirty(self, q: Any) -> None: ...
    def now_s(self) -> float: ...
    def settled(self, q: Any, entry: Any) -> None: ...
    def delivered(self, q: Any, entry: Any) -> None: ...
    def dead_letter(self, q: Any, entries: list, reason: str) -> None: ...
    def purge_queue(self, q: Any) -> int: ...
    def take_messages(self, q: Any, count: int, requeue: bool, reject: bool) -> list: ...
    def consumer_gone(self, q: Any) -> None: ...
    def window_add(self, session: Any) -> None: ...
    def publish_answered(self, channel: Any, session: Any, seq: int, accepted: bool) -> None: ...
    def deliver(self, consumer: Any, q: Any, items: list[Delivery]) -> None: ...
    def cancel_local(self, consumer: Any) -> None: ...
    def forget_unacked(self, channel: Any, q: Any) -> None: ...
    def drop_unacked_of(self, consumer: Any) -> None: ...
    def node_call(self, kind: str, args: list, answer: Callable[[Any], None]) -> None: ...


class RemoteHost:
    """This node's side of the remote-queue protocol; see the module docstring."""

    def __init__(self, peers: Peers, port: RemotePort):
        self.peers = peers
        self.port = port
        self.node = peers.node
        self.is_up = peers.is_up
        # Maps that grow with client input, and what bounds them:
        # cid -> this node's consumer of a queue homed elsewhere: one per such basic.consume,
        # held by its channel too and removed when it is cancelled or its home goes down
        self.consumers: dict[int, Any] = {}
        # (origin, cid) -> (queue, proxy): one per consumer another node attached here, removed
        # when it cancels, its queue goes or its node goes down
        self.proxies: dict[tuple[str, int], tuple[Any, ProxyConsumer]] = {}
        # origin -> [(queue, seq)]: one per unacknowledged basic.get from that node (what its
        # channels hold), given back when the node goes down
        self.get_inflight: dict[str, list[tuple[Any, int]]] = {}
        # Publishes in flight to other nodes: a session with PUBLISH_WINDOW of them is not read
        # from (port.window_add), so _pub_tokens, _pub_items, _orphans and _token_waiters hold
        # about PUBLISH_WINDOW per session (plus what one read brought, and the broker's own
        # publishes such as dead letters, which no window holds)
        self._pub_tokens: dict[int, tuple[str, Any, int, Any]] = {}  # token -> (home, channel, seq, session)
        # publishes to mirrored queues, kept until accepted so that they can be sent again to a
        # promoted mirror; and those waiting for a new leader
        self._pub_items: dict[int, Publish] = {}
        self._orphans: dict[int, float] = {}  # token -> give up (nack) at this time
        self._token_waiters: dict[int, list] = {}  # token -> countdowns waiting for its accept
        # flow-limited queue -> accepts held back: bounded by the publishing nodes' windows
        self._held: dict[Any, list[tuple[str, int, bool]]] = {}
        self._cancelled: dict[int, tuple[str, str, str]] = {}  # cid -> (home, vhost, queue); CANCELLED_REMEMBERED_MAX
        # emptied every loop iteration (flush)
        self._out_pubs: dict[str, list[Publish]] = {}
        self._out_acks: dict[str, list[PublishAnswer]] = {}
        self._out_deliveries: dict[tuple[str, int], list[Delivery]] = {}

    def send(self, peer: str, msg: Any) -> bool:
        """Send one message of hutch.cluster.remote, encoded, alone in its batch."""
        return self.peers.send(peer, [REMOTE, encode_batch([msg])])

    def cancelled(self, cid: int, home: str, vhost: str, qname: str) -> None:
        if len(self._cancelled) >= CANCELLED_REMEMBERED_MAX:
            self._cancelled.pop(next(iter(self._cancelled)))
        self._cancelled[cid] = (home, vhost, qname)

    # ------------------------------------------------------------ publishing to other nodes

    def forward(self, queues: list, msg: Message, channel, seq: int) -> tuple[int, bool]:
        """Send a routed message to the home nodes of the classic `queues` (hutch.cluster.remote
        handles). Returns (accepts to wait for, refused): a durable queue whose home is down
        refuses it."""
        by_home: dict[str, list[str]] = {}
        mirrored_homes: set[str] = set()
        refused = False
        is_up = self.is_up
        for q in queues:
            if not is_up(q.home_node) and not q.mirrored:
                refused = refused or q.durable
                continue
            by_home.setdefault(q.home_node, []).append(q.name)
            if q.mirrored:
                mirrored_homes.add(q.home_node)
        if not by_home:
            return 0, refused
        session = channel.session if channel is not None else None
        vhost = queues[0].vhost
        for home, names in by_home.items():
            token = self.peers.new_id()
            self._pub_tokens[token] = (home, channel, seq, session)
            item = Publish(token, vhost, names, msg.exchange, msg.routing_key, msg.props, msg.body, msg.persistent)
            if session is not None:
                self.port.window_add(session)
            if home in mirrored_homes:
                self._pub_items[token] = item  # kept to send again to a promoted mirror
                # its leader is down: wait for a promotion; earlier publishes to the queue wait
                # for theirs: this one goes after them, in order
                if not is_up(home) or (self._orphans and self._orphans_for(vhost, names)):
                    self._orphans[token] = self.port.now_s() + ORPHAN_TIMEOUT_S
                    continue
            self._out_pubs.setdefault(home, []).append(item)
        return len(by_home), refused

    def _orphans_for(self, vhost: str, names: list[str]) -> bool:
        """Whether a publish to one of these queues waits for its queue's new leader."""
        items = self._pub_items
        for token in self._orphans:
            item = items.get(token)
            if item is not None and item.vhost == vhost and not set(item.queues).isdisjoint(names):
                return True
        return False

    def redirect_publishes(self, vhost: str, name: str, old_home: str) -> None:
        """A mirrored queue's leader moved away from `old_home`: the publishes to it that
        `old_home` has not answered (sent, or still waiting to go) become orphans now, to go to
        the new leader ahead of any later publish; waiting for `old_home` to be declared down
        would let later publishes of the same channel overtake them."""
        now = self.port.now_s()
        moved = set()
        for token, (home, *_rest) in self._pub_tokens.items():
            item = self._pub_items.get(token)
            if home == old_home and item is not None and item.vhost == vhost and name in item.queues:
                self._orphans.setdefault(token, now + ORPHAN_TIMEOUT_S)
                moved.add(token)
        unsent = self._out_pubs.get(old_home)
        if moved and unsent:
            unsent[:] = [p for p in unsent if p.token not in moved]

    def retry_orphans(self) -> None:
        """Publishes whose mirrored queue lost its leader: send them to the new one (it drops
        those it already has), or nack them once waiting is pointless. In token order, which is
        the order they were published in."""
        if not self._orphans:
            return
        port = self.port
        now = port.now_s()
        for token, deadline in sorted(self._orphans.items()):
            item = self._pub_items.get(token)
            entry = self._pub_tokens.get(token)
            if item is None or entry is None:
                self._orphans.pop(token, None)
                continue
            homes = {h for h in (port.leader_of(item.vhost, n) for n in item.queues) if h is not None}
            if len(homes) == 1:
                home = homes.pop()
                if home == self.node or self.is_up(home):
                    del self._orphans[token]
                    self._pub_tokens[token] = (home, *entry[1:])
                    if not item.resent:
                        item = self._pub_items[token] = msgspec.structs.replace(item, resent=True)
                    self._out_pubs.setdefault(home, []).append(item)
                    continue
            if now >= deadline or not homes or len(homes) > 1:
                del self._orphans[token]
                self._publish_accepted(token, True)
        port.schedule()

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
        self.port.publish_answered(ch, session, seq, not refused)

    def _on_publish_answers(self, answers: list[PublishAnswer]) -> None:
        for a in answers:
            token = a.token
            if a.outcome == RETRY and token in self._pub_items:
                self._orphans.setdefault(token, self.port.now_s() + ORPHAN_TIMEOUT_S)
            else:
                self._publish_accepted(token, a.outcome != ACCEPTED)

    def _on_publishes(self, origin: str, pubs: list[Publish]) -> None:
        port = self.port
        for pub in pubs:
            token, vhost, names = pub.token, pub.vhost, pub.queues
            vq = port.queues_of(vhost)
            queues = tuple(q for q in (vq.get(n) for n in names) if q is not None and not q.deleted
                           and q.local) if vq is not None else ()
            if len(queues) < len(names) and (vq is None or any(
                    not port.in_catalogue(vhost, n) or _led_elsewhere(vq.get(n)) for n in names)):
                # A queue that has just moved to another leader (or whose promotion here is not
                # done yet), or one this node's catalogue does not hold: deleted, or declared by
                # an entry not applied here yet (a node that started before its catalogue caught
                # up). Its publisher's node sends it again when it can, or nacks it: never a
                # confirm for a message no queue took.
                self._out_acks.setdefault(origin, []).append(PublishAnswer(token, RETRY))
                continue
            if not queues:
                self._out_acks.setdefault(origin, []).append(PublishAnswer(token, ACCEPTED))
                continue
            mirrored = [q for q in queues if q.mirror is not None]
            if mirrored and any((origin, token) in q.mirror.recent_tokens for q in mirrored):
                # Sent again: its answer was lost with a link, or the old leader had passed it on
                # before a promotion. It is here already; the answer waits as the first one's
                # would (its fsync, its mirrors), for the first may still be waiting.
                refused, journalled = False, True
            else:
                exchange, rk, props = pub.exchange, pub.routing_key, pub.props
                priority, expiration_ms = port.priority_and_expiration(props)
                msg = Message(exchange, rk, codec.route_encoding(exchange, rk), props, pub.body, pub.persistent,
                              priority, expiration_ms)
                refused, journalled = port.enqueue_local(queues, msg, (origin, token), pub.resent)
            arg = (origin, token, refused, queues)
            if mirrored and not refused:
                arg = (self._ack_publish, arg, mirrored)
                fn = self._after_mirrors
            else:
                fn = self._ack_publish
            if journalled and not refused:
                port.after_sync(fn, arg)
            else:
                fn(arg)
        port.schedule()

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
            q.mirror.after_stable(self._after_mirrors, (fn, inner, queues[1:]), self._moved_away)

    def _moved_away(self, arg: tuple) -> None:
        """A mirrored queue's leader moved away from here before the publish reached all its
        mirrors (`_after_mirrors`): its node sends it again to the new leader."""
        origin, token = arg[1][0], arg[1][1]
        self._out_acks.setdefault(origin, []).append(PublishAnswer(token, RETRY))
        self.port.schedule()

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
        self.port.schedule()

    def flow_released(self, q) -> None:
        for origin, token, refused in self._held.pop(q, ()):
            self._out_acks.setdefault(origin, []).append(PublishAnswer(token, REFUSED if refused else ACCEPTED))
        self.port.schedule()

    # ------------------------------------------------------------ consuming from other nodes

    def queue_delivery(self, origin: str, cid: int, item: Delivery) -> None:
        self._out_deliveries.setdefault((origin, cid), []).append(item)

    def _on_deliveries(self, peer: str, cid: int, items: list[Delivery]) -> None:
        c = self.consumers.get(cid)
        if c is None:
            # cancelled meanwhile: give them back
            return self._orphan_deliveries(cid, [it.seq for it in items])
        q = c.queue
        if peer != q.home_node:
            # From a node that led the queue before a failover this node has applied (the
            # consumer follows the new leader under the same id): the client must not get them.
            # The new leader delivers those messages again, flagged redelivered; the old one is
            # told to drop the consumer (what it holds of the queue is stale).
            log.info("queue '%s' in vhost '%s': %d delivery(ies) from %s, which no longer leads it, not passed "
                     "on", q.name, q.vhost, len(items), peer)
            self.send(peer, Cancel(cid))
            return
        self.port.deliver(c, q, items)
        c.received += len(items)
        if c.received >= CREDIT_RETURN:
            self.send(q.home_node, Credit(cid, c.received))
            c.received = 0

    def _orphan_deliveries(self, cid: int, seqs: list[int]) -> None:
        """Deliveries that crossed a cancel on the wire: the client never saw them."""
        where = self._cancelled.get(cid)
        if where is not None:
            home, vhost, qname = where
            self.send(home, Settle(vhost, qname, cid, REQUEUE, seqs))

    def _local_queue(self, vhost: str, qname: str) -> Any:
        """The classic queue homed here by that name, or None."""
        vq = self.port.queues_of(vhost)
        q = vq.get(qname) if vq is not None else None
        if q is None or not q.local or q.deleted:
            return None
        return q

    def _on_consume(self, origin: str, m: Consume) -> None:
        cid, vhost, qname = m.cid, m.vhost, m.queue
        q = self._local_queue(vhost, qname)
        if q is None:
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
        self.port.dirty(q)
        self.port.schedule()

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
        self.port.consumer_gone(q)

    def _on_credit(self, origin: str, cid: int, n: int) -> None:
        item = self.proxies.get((origin, cid))
        if item is not None:
            item[1].credit += n
            self.port.dirty(item[0])
            self.port.schedule()

    def _on_consumer_cancelled(self, cid: int) -> None:
        """The home node cancelled our consumer."""
        c = self.consumers.pop(cid, None)
        if c is not None:
            c.queue.local_consumers.pop(c.ref, None)
            self.port.cancel_local(c)

    def _on_settle(self, origin: str, m: Settle) -> None:
        port = self.port
        vhost, qname, op, seqs = m.vhost, m.queue, m.op, m.seqs
        if op not in SETTLE_OPS:
            log.error("settle of unknown kind %r from %s for queue '%s' in vhost '%s': ignored", op, origin, qname,
                      vhost)
            return
        q = self._local_queue(vhost, qname)
        if q is None:
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
                port.settled(q, entry)
            elif op == REQUEUE:
                q.requeue(seq)
            else:
                q.discard(seq)
                dead.append(entry)
        if dead:
            port.dead_letter(q, dead, "rejected")
        port.dirty(q)
        port.schedule()

    # ------------------------------------------------------------ calls (answered once)

    def call(self, peer: str, kind: str, args: list, callback: Callable[[Any], None]) -> None:
        """Ask `peer`; callback(result) once it answers, or callback(None) if it goes down first."""
        self.peers.call(peer, lambda rid: [REMOTE, encode_batch([Call(rid, kind, args)])], callback)

    def _on_call(self, origin: str, rid: int, kind: str, args: list) -> None:
        port = self.port
        need = CALL_ARGS.get(kind, 2)
        if len(args) < need:
            log.error("call %r from %s with %d arguments (it takes %d): refused", kind, origin, len(args), need)
            self.send(origin, CallAnswer(rid, [spec.INTERNAL_ERROR, f"malformed call {kind}"]))
            return
        if kind in NODE_CALLS:
            port.node_call(kind, args, lambda result: self.send(origin, CallAnswer(rid, result)))
            return
        vhost, qname = args[0], args[1]
        q = self._local_queue(vhost, qname)
        if q is None:
            self.send(origin, CallAnswer(rid, [spec.NOT_FOUND, f"no queue '{qname}' in vhost '{vhost}'"]))
            return
        if kind == "stat":
            result = [200, q.message_count, q.consumer_count]
        elif kind == "purge":
            result = [200, port.purge_queue(q)]
        elif kind == "take" and q.mirror is not None and q.mirror.sync_holds_clients:
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
            taken = port.take_messages(q, args[2], args[3], args[4])
            result = [200, [[e.message.exchange, e.message.routing_key, e.message.props, e.message.body,
                             e.delivery_count > 1, left] for e, left in taken]]
        else:
            result = [spec.NOT_IMPLEMENTED, f"unknown call {kind}"]
        self.send(origin, CallAnswer(rid, result))

    # ------------------------------------------------------------ the wire

    def on_batch(self, peer: str, data: Any) -> None:
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
                self._on_publish_answers(m.items)
            elif t is Deliveries:
                self._on_deliveries(peer, m.cid, m.items)
            elif t is Settle:
                self._on_settle(peer, m)
            elif t is Credit:
                self._on_credit(peer, m.cid, m.n)
            elif t is Consume:
                self._on_consume(peer, m)
            elif t is Cancel:
                self._on_cancel(peer, m.cid)
            elif t is ConsumerCancelled:
                self._on_consumer_cancelled(m.cid)
            elif t is Call:
                self._on_call(peer, m.rid, m.kind, m.args)
            elif t is CallAnswer:
                self.peers.requests.answer(m.rid, m.result)
            elif t is ConsumeAnswer:
                self.peers.requests.answer(m.cid, [m.code, m.text])
            elif t is FiguresReport:
                self._on_figures(m.queues)

    def flush(self) -> None:
        """Send what this loop iteration collected: one message per home, publisher's node and
        consumer, each encoded once in a frame of its own."""
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

    def figures(self) -> bytes:
        """This node's queue figures for its peers, encoded (the runtime sends ["ST", figures])."""
        rows = [QueueFigures(q.vhost, q.name, q.message_count, q.unacked_count, q.consumer_count,
                             *(q.mirror.mirror_nodes() if q.mirror is not None else ()))
                for q in self.port.local_queues()]
        rows.extend(QueueFigures(*row) for row in self.port.quorum_figures())
        return encode_batch([FiguresReport(rows)])

    def _on_figures(self, rows: list[QueueFigures]) -> None:
        port = self.port
        for f in rows:
            vq = port.queues_of(f.vhost)
            q = vq.get(f.name) if vq is not None else None
            if q is not None and q.quorum:
                q.reported = (f.ready, f.unacked, f.consumers)
            elif q is not None and not q.local:
                q.ready, q.unacked_remote, q.consumers_remote = f.ready, f.unacked, f.consumers
                q.mirror_nodes, q.synced_nodes = list(f.mirror_nodes), list(f.synced_nodes)

    # ------------------------------------------------------------ peers going

    def peer_down(self, peer: str) -> None:
        port = self.port
        # publishes it had not accepted: nacked, never silently confirmed; those to a mirrored
        # queue wait for its promoted mirror
        now = port.now_s()
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
                port.consumer_gone(q)
        for q, seq in reversed(self.get_inflight.pop(peer, [])):
            if not q.deleted and seq in q.state.unacked:
                q.requeue(seq)
                port.dirty(q)
        # consumers here of queues there: the queue is gone for now (a mirrored queue's
        # consumers wait for its promoted mirror; what they had is redelivered by it)
        for c in list(self.consumers.values()):
            if c.queue.home_node == peer and c.queue.mirrored:
                port.forget_unacked(c.channel, c.queue)
            elif c.queue.home_node == peer:
                c.queue.local_consumers.pop(c.ref, None)
                self.consumers.pop(c.ref, None)
                port.drop_unacked_of(c)
                port.cancel_local(c)


def _led_elsewhere(q: Any) -> bool:
    """A handle of a queue whose messages another node holds (a classic queue homed elsewhere,
    or a quorum queue)."""
    return q is not None and not q.local
