"""A quorum queue as the broker holds it in a vhost, on every node of the cluster
(`QuorumQueue`): the catalogue's record, the queue's own state machine when this node is a
member of its Raft group (`machine`), the last figures its leader reported otherwise, the
consumers attached on this node, and the acknowledgements collected this loop iteration.

Every operation is a command proposed to the queue's leader through the host
(`hutch.quorum.host`); acknowledgements are batched per consumer and proposed once per loop
iteration (`flush`), at most `IDS_PER_COMMAND_MAX` message ids per command.

Credit ahead. A consumer with a prefetch registers in the state machine with a credit larger
than its prefetch (`credit_ahead`), and the deliveries beyond what its channel can take now
wait here, in order (`_held`). An ack frees the client's credit at once: the next message goes out from
here in the same loop iteration, while the settle travels through the Raft log and the
leader sends more. Without it a consumer gets at most prefetch messages per commit round
trip (acks go through the log as publishes do), so a small prefetch starved it. What is held
is checked out to the consumer in the state machine; when the consumer is cancelled it is
returned, counted as a delivery (`x-delivery-count` one more, `redelivered` set), which
AMQP allows for any message the client may have seen. The state machine sends the ahead only
while the consumer is the queue's only one (`fifo.Checkout.ahead`): with several, each gets its
prefetch and no more, so a busy consumer never holds messages an idle one could take (fair
dispatch, as the work-queue pattern with prefetch 1 relies on). The ahead is a multiple of the
prefetch (8, within 64..1,024).

Acks, a few at a time. Each settle the leader applies is a Raft round: an AppendEntries to
every follower, an fsync on each member, the answers. Proposed one per ack, a consumer keeping
up with a steady publisher doubles the rounds, and a publish that arrives while a settle's
round is under way waits behind it for its fsync. So the acks of one iteration are not
proposed at once: they wait here, up to SETTLE_HOLD_MS, and go together, with the first
proposal of anything else to the queue, or as soon as they might hold a consumer back: its
acks waiting here and its unacknowledged deliveries reach half its prefetch (a consumer with
prefetch 1 never waits), or a command's worth of ids is collected. The state machine counts a
message as checked out until its settle is applied, so the bound keeps the consumer's credit
there. What waits is lost with the node if it crashes, as acks on their way are: those
messages come back with `redelivered` set. Returns and discards never wait: one collected sends
the acks waiting with it.

Missed deliveries. Each delivery names the one made to the same consumer before it
(`prev_msg_id`). One that names a delivery this node never had shows a gap: it and the ones
after it wait here (`_gaps`) while the host asks the leader for what is checked out to the
consumer (`fifo.Resend`); the answer (`resent`) gives the client the missing ones, then the
waiting ones, in order. Nothing is given twice: a delivery at or below the last given one is a
repeat (a replaced leader's, or a new leader's unasked resend) and is dropped, so the client
never sees a message again without `redelivered`.

Must never: touch a channel or a connection (deliveries go out through the host's port), do
I/O, or import anything from `hutch.broker` or above.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from hutch.amqp import codec, spec
from hutch.amqp.spec import AMQPError
from hutch.cluster import catalogue as cat
from hutch.cluster.peers import Peers
from hutch.queues.handle import (
    PENDING,
    REPLICATED,
    SINGLE_ACTIVE_CONSUMER,
    Figures,
    Got,
    GroupHandle,
    HeldEntry,
    QueueType,
    register,
)
from hutch.quorum import fifo

IDS_PER_COMMAND_MAX = min(1000, fifo.MSG_IDS_PER_COMMAND_MAX)  # msg ids per settle/return/discard
# Acks wait on the consumer's node at most this long to be proposed together (see the module's
# paragraph "Acks, a few at a time").
SETTLE_HOLD_MS = 20
# Deliveries a consumer with a prefetch may have on its way beyond it, held on its node until
# its channel can take them (see the module's paragraph): CREDIT_AHEAD_PER_PREFETCH times its
# prefetch, within [CREDIT_AHEAD_MIN, CREDIT_AHEAD_MAX]. Each holds a message body in memory,
# and is not given to another consumer of the queue while it waits there.
CREDIT_AHEAD_PER_PREFETCH = 8
CREDIT_AHEAD_MIN = 64
CREDIT_AHEAD_MAX = 1024


def credit_ahead(prefetch: int) -> int:
    """How many deliveries a consumer with this prefetch may have held on its node."""
    return min(CREDIT_AHEAD_MAX, max(CREDIT_AHEAD_MIN, CREDIT_AHEAD_PER_PREFETCH * prefetch))

QUORUM = register(QueueType("quorum", (SINGLE_ACTIVE_CONSUMER, REPLICATED)))


class PortOps(Protocol):
    def dirty(self, q: Any) -> None: ...
    def schedule(self) -> None: ...
    def call_later(self, delay_ms: int, fn: Callable[[], None]) -> bool: ...
    def new_stats(self) -> Any: ...
    def deliver(self, consumer: Any, q: Any, msg_id: int, delivery_count: int, redelivered: bool,
                route: bytes, props: bytes, body: bytes) -> None: ...


class HostOps(Protocol):
    """What a handle needs of its host (`hutch.quorum.host.QuorumHost`)."""

    port: PortOps
    peers: Peers
    consumers: dict[str, Any]

    def leader_of(self, q: QuorumQueue) -> str | None: ...
    def owner_id(self) -> str: ...
    def now_ms(self) -> int: ...
    def propose(self, q: QuorumQueue, cmd: Any, callback: Callable[[Any], None] | None = None) -> None: ...
    def ask_resend(self, q: QuorumQueue, consumer_id: str, after_msg_id: int) -> None: ...


class _Gap:
    """A consumer's deliveries waiting behind one its node never had (see the module's paragraph)."""

    __slots__ = ("asked_s", "waiting")

    def __init__(self, asked_s: float):
        self.asked_s = asked_s
        # msg_id -> (prev_msg_id, delivery_count, redelivered, route, props, body); at most what the
        # state machine checks out to the consumer (its prefetch and credit ahead)
        self.waiting: dict[int, tuple] = {}


class QuorumQueue(GroupHandle):
    """A quorum queue's handle in a vhost, on every node."""

    local = False  # its messages are in the Raft group, not in a classic queue homed here
    quorum = True
    queue_type = QUORUM.name
    message_ttl_ms = None
    expires_ms = None
    journal_id = 0
    exclusive_owner = None
    durable = True
    auto_delete = False

    def __init__(self, host: HostOps, rec: cat.QueueRecord, config: fifo.QuorumConfig):
        self.host = host
        self.name = rec.name
        self.vhost = rec.vhost
        self.arguments = dict(rec.arguments)
        self.gid = rec.journal_id
        self.members = tuple(rec.member_nodes)
        self.declared_leader = rec.leader_node
        self.config = config
        self.single_active = config.single_active
        self.dead_letter_exchange = config.dead_letter_exchange
        self.dead_letter_routing_key = config.dead_letter_routing_key
        self.deleted = False
        # on the leader: the publishes applied lately, by log index, so that a message's first
        # delivery takes its content from here rather than from the log (QuorumHost.content)
        self.recent: dict[int, Any] = {}
        self.local_consumers: dict[str, Any] = {}
        self._owner: dict[int, str] = {}  # msg_id -> the consumer or requester it went to
        self._ops: dict[tuple[str, str], list[int]] = {}
        self._ops_due_ms: int | None = None  # when the acks in _ops must be proposed at the latest
        self._wake_due_ms = 0  # when the port is to call _acks_due
        # consumer id -> deliveries its channel could not take yet, oldest first; at most
        # credit_ahead(prefetch) each (the state machine's credit for it is its prefetch plus that)
        self._held: dict[str, deque[tuple]] = {}
        # consumer id -> the highest msg_id delivered to it: the state machine numbers deliveries
        # in order (a message that comes back gets a new number), so a lower one is a repeat
        self._last_msg_id: dict[str, int] = {}
        self._gaps: dict[str, _Gap] = {}  # consumer id -> deliveries waiting behind a missed one
        self.machine: Any = None  # the QuorumQueueState when this node is a member
        self.reported = (0, 0, 0)  # ready, unacked, consumers: from the leader when not a member
        self.mstats = host.port.new_stats()  # what this node's channels did with the queue
        self.last_used_ms = 0

    def __repr__(self) -> str:
        return f"QuorumQueue({self.vhost!r}, {self.name!r}, group {self.gid})"

    # -- figures
    def _counts(self) -> tuple[int, int, int]:
        st = self.machine
        if st is not None:
            return st.messages_ready, st.messages_unacknowledged, st.consumer_count
        return self.reported

    @property
    def message_count(self) -> int:
        return self._counts()[0]

    @property
    def unacked_count(self) -> int:
        return self._counts()[1]

    @property
    def consumer_count(self) -> int:
        return self._counts()[2]

    def figures(self) -> Figures:
        """From the state machine on a member; as the leader last reported them elsewhere
        (ready bytes only on a member)."""
        ready, unacked, consumers = self._counts()
        return Figures(ready, unacked, self.machine.message_bytes if self.machine is not None else 0, 0, consumers)

    def active_consumer(self) -> Any:
        return None

    # -- acknowledgements (the channel calls these with the msg_id as the entry's seq)
    def _op(self, msg_id: int, op: str) -> None:
        owner = self._owner.pop(msg_id, None)
        if owner is None:
            return
        self._ops.setdefault((owner, op), []).append(msg_id)
        self.host.port.dirty(self)

    def settle(self, msg_id: int) -> None:
        self._op(msg_id, "a")

    def requeue(self, msg_id: int) -> None:
        self._op(msg_id, "r")

    def discard(self, msg_id: int) -> None:
        self._op(msg_id, "d")

    def flush(self) -> None:
        """The loop iteration's flush: held deliveries the channels can take now go out, and
        the acks, nacks and rejects collected are proposed, acks perhaps later (`_hold_acks`)."""
        if self._held:
            self._release_held()
        if self._ops and not self._hold_acks():
            self.flush_all()

    def _hold_acks(self) -> bool:
        """Whether the acks collected may wait (the module's paragraph "Acks, a few at a time");
        the port is asked to call `_acks_due` when they are due."""
        now = self.host.now_ms()
        due = self._ops_due_ms
        if due is None:
            due = self._ops_due_ms = now + SETTLE_HOLD_MS
        if now >= due:
            return False
        held = 0
        consumers = self.local_consumers
        for (owner, op), ids in self._ops.items():
            if op != "a":
                return False
            c = consumers.get(owner)
            if c is not None and c.prefetch and 2 * (len(ids) + c.unacked) >= c.prefetch:
                return False
            held += len(ids)
        if held >= IDS_PER_COMMAND_MAX:
            return False
        if self._wake_due_ms != due:
            if not self.host.port.call_later(due - now, self._acks_due):
                return False
            self._wake_due_ms = due
        return True

    def _acks_due(self) -> None:
        """The port's timer: the acks waiting go at the next flush (whatever the node's clock
        says by then: it may have been set back). A timer asked for acks that went earlier may
        send later ones before their time: that only shortens their wait."""
        if self._ops_due_ms is not None and not self.deleted:
            self._ops_due_ms = 0
            self.host.port.dirty(self)
            self.host.port.schedule()

    def flush_all(self) -> None:
        """Propose every ack, nack and reject collected: one command per consumer and kind, in
        the order each first came (the messages are distinct, so their order does not matter)."""
        self._ops_due_ms = None
        if self._ops:
            ops, self._ops = self._ops, {}
            make = {"a": fifo.Settle, "r": fifo.Return, "d": fifo.Discard}
            for (owner, op), ids in ops.items():
                for i in range(0, len(ids), IDS_PER_COMMAND_MAX):
                    self.host.propose(self, make[op](owner, ids[i:i + IDS_PER_COMMAND_MAX]))

    def dispatch(self) -> int:
        self.flush()
        return 0

    # -- deliveries to consumers on this node
    def deliver(self, c: Any, msg_id: int, prev_msg_id: int, delivery_count: int, redelivered: bool, route: bytes,
                props: bytes, body: bytes) -> None:
        """A delivery the leader sent: to the consumer's channel now, or held until it can take
        it; or, when it shows that one before it never arrived, kept until that one is here."""
        cid = c.ref
        last = self._last_msg_id.get(cid, 0)
        if msg_id <= last:
            return  # sent again by a leader that had not yet learnt it was replaced: given already
        gap = self._gaps.get(cid)
        if prev_msg_id > last and not c.no_ack:  # the one before it has not come (yet)
            if gap is None:
                gap = self._gaps[cid] = _Gap(self.host.now_ms() / 1000)
                self.host.ask_resend(self, cid, last)
            gap.waiting[msg_id] = (prev_msg_id, delivery_count, redelivered, route, props, body)
            return
        self._give(c, msg_id, delivery_count, redelivered, route, props, body)
        if gap is not None:
            self._behind_gap(c, gap)

    def _behind_gap(self, c: Any, gap: _Gap) -> bool:
        """Give what waited behind deliveries that are now here, in order; True when nothing
        waits any more (the gap is closed)."""
        cid = c.ref
        waiting = gap.waiting
        for msg_id in sorted(waiting):
            prev_msg_id, *rest = waiting[msg_id]
            last = self._last_msg_id.get(cid, 0)
            if msg_id > last:
                if prev_msg_id > last:
                    return False
                self._give(c, msg_id, *rest)
            del waiting[msg_id]
        del self._gaps[cid]
        return True

    def resent(self, c: Any, upto_msg_id: int, deliveries: list[tuple]) -> None:
        """The leader's answer to a Resend, or a new leader's unasked one: `deliveries` (msg_id,
        delivery_count, redelivered, route, props, body) are what is checked out to the consumer,
        and every other delivery to it up to upto_msg_id is settled or no longer its own. The
        ones never given go to the client in order, then those that waited behind them."""
        cid = c.ref
        for msg_id, *rest in sorted(deliveries, key=lambda d: d[0]):
            if msg_id > self._last_msg_id.get(cid, 0):
                self._give(c, msg_id, *rest)
        if upto_msg_id > self._last_msg_id.get(cid, 0):
            self._last_msg_id[cid] = upto_msg_id
        gap = self._gaps.get(cid)
        if gap is not None and not self._behind_gap(c, gap):  # another one missing further on
            gap.asked_s = self.host.now_ms() / 1000
            self.host.ask_resend(self, cid, self._last_msg_id.get(cid, 0))

    def ask_again(self, asked_before_s: float) -> bool:
        """Ask again for the missed deliveries of consumers whose question went unanswered since
        before asked_before_s (the host's tick); False when no consumer here waits for any."""
        for cid, gap in self._gaps.items():
            if gap.asked_s < asked_before_s:
                gap.asked_s = self.host.now_ms() / 1000
                self.host.ask_resend(self, cid, self._last_msg_id.get(cid, 0))
        return bool(self._gaps)

    def _give(self, c: Any, msg_id: int, delivery_count: int, redelivered: bool, route: bytes, props: bytes,
              body: bytes) -> None:
        self._last_msg_id[c.ref] = msg_id
        if c.no_ack:
            self.host.port.deliver(c, self, msg_id, delivery_count, redelivered, route, props, body)
            return
        held = self._held.get(c.ref)
        if held is None and c.can_take():
            self._owner[msg_id] = c.ref
            self.host.port.deliver(c, self, msg_id, delivery_count, redelivered, route, props, body)
            return
        if held is None:
            held = self._held[c.ref] = deque()
        held.append((msg_id, delivery_count, redelivered, route, props, body))

    def _release_held(self) -> None:
        """Hand held deliveries to the consumers whose channels can take them now (after acks)."""
        deliver = self.host.port.deliver
        for cid, held in list(self._held.items()):
            c = self.local_consumers.get(cid)
            if c is None:
                del self._held[cid]
                continue
            while held and c.can_take():
                msg_id, delivery_count, redelivered, route, props, body = held.popleft()
                self._owner[msg_id] = cid
                deliver(c, self, msg_id, delivery_count, redelivered, route, props, body)
            if not held:
                del self._held[cid]

    def held_count(self) -> int:
        return sum(len(h) for h in self._held.values())

    # -- consumers on this node
    def add_consumer(self, c: Any) -> None:
        self.local_consumers[c.ref] = c
        self.host.consumers[c.ref] = c

    def remove_consumer(self, c: Any) -> bool:
        if self.local_consumers.pop(c.ref, None) is None:
            return False
        self.host.consumers.pop(c.ref, None)
        self._last_msg_id.pop(c.ref, None)
        held = self._held.pop(c.ref, None)
        gap = self._gaps.pop(c.ref, None)
        requeue = c.channel.closed
        self.flush_all()
        ids = [h[0] for h in held or ()] + sorted(gap.waiting if gap is not None else ())
        if ids and not requeue:  # never reached the client: back to the queue (Cancel keeps the rest)
            for i in range(0, len(ids), IDS_PER_COMMAND_MAX):
                self.host.propose(self, fifo.Return(c.ref, ids[i:i + IDS_PER_COMMAND_MAX]))
        self.host.propose(self, fifo.Cancel(c.ref, requeue=requeue, now_ms=self.host.now_ms()))
        return True

    def consumers(self) -> list[Any]:
        return list(self.local_consumers.values())

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.local_consumers.values())

    # -- client operations (hutch.queues.handle): commands proposed to the leader
    def _no_leader(self) -> AMQPError:
        return AMQPError(spec.INTERNAL_ERROR, f"timed out waiting for a leader of queue '{self.name}' in vhost "
                                              f"'{self.vhost}': no majority of its members "
                                              f"({', '.join(self.members)}) is reachable")

    def _propose(self, cmd: Any, reply: Callable[[Any], None], answer: Callable[[Any], Any],
                 undo: Callable[[], Any] | None = None) -> Any:
        """Propose `cmd`; reply(answer(result)), or the 541 error when no leader answers within
        metadata_timeout_ms (after undo())."""
        def got(result: Any) -> None:
            if result is None:
                if undo is not None:
                    undo()
                reply(self._no_leader())
                return
            reply(answer(result))
        self.host.propose(self, cmd, got)
        return PENDING

    def stat(self, reply: Callable[[Any], None]) -> tuple[int, int]:
        return self.message_count, self.consumer_count

    def purge(self, reply: Callable[[Any], None]) -> Any:
        return self._propose(fifo.Purge(self.host.now_ms()), reply, lambda r: r[1])

    def get(self, no_ack: bool, reply: Callable[[Any], None]) -> Any:
        requester = self.host.owner_id()

        def unanswered() -> None:
            # The Get may have been applied, and its answer lost with the leader that applied it
            # (killed before it went out): the message is then checked out to a requester that
            # no channel stands for, and nothing would ever settle or return it. A Cancel gives
            # back whatever that requester holds; it is resent until applied, and is nothing
            # when the Get never was. (An answer that comes after all is returned on arrival:
            # QuorumHost._orphan_answer.)
            self.host.propose(self, fifo.Cancel(requester, requeue=True, now_ms=self.host.now_ms()))
        return self._propose(fifo.Get(requester, no_ack, self.host.now_ms()), reply,
                             lambda r: self._got(requester, r, no_ack), undo=None if no_ack else unanswered)

    def _got(self, requester: str, answer: list, no_ack: bool) -> Got | None:
        """A Get's answer: the message with its x-delivery-count header, or None."""
        m, count = answer[1], answer[2]
        if m is None:
            return None
        msg_id, delivery_count, redelivered, exchange, routing_key, props, body = m
        props = codec.edit_properties(props, set_headers={"x-delivery-count": codec.typed_value(delivery_count)})
        if not no_ack:
            self._owner[msg_id] = requester
        return Got(HeldEntry(msg_id, 2 if redelivered else 1), redelivered, codec.route_encoding(exchange, routing_key),
                   props, body, count)

    def consume(self, c: Any, reply: Callable[[Any], None]) -> Any:
        """A checkout in the state machine; `c.ref` is the consumer id it knows. The consumer is
        attached at once: deliveries may follow the commit before the answer does."""
        if c.channel.global_prefetch:
            raise not_implemented_global_qos(self)  # as RabbitMQ 3.10: a connection error
        c.ref = consumer_id = self.host.owner_id()
        self.add_consumer(c)
        ahead = credit_ahead(c.prefetch) if c.prefetch and not c.no_ack else 0

        def registered(_result: Any) -> None:
            # The channel closed while the registration waited for a leader: its close did not
            # cancel a consumer the queue did not have yet, so the queue now has one that no
            # channel takes deliveries for, and would keep what it checks out to it for ever.
            if c.channel.closed and self.local_consumers.get(c.ref) is c:
                self.remove_consumer(c)

        return self._propose(fifo.Checkout(consumer_id, c.tag, c.prefetch, c.priority, c.no_ack, self.host.now_ms(),
                                           ahead),
                             reply, registered, undo=lambda: self.remove_consumer(c))


def not_implemented_global_qos(q: QuorumQueue) -> AMQPError:
    return AMQPError(spec.NOT_IMPLEMENTED, f"queue '{q.name}' in vhost '{q.vhost}' does not support global qos")
