"""A channel's semantics: consumers, prefetch, acknowledgements, confirms and transactions.

Delivery tags count per channel from 1. Unacknowledged deliveries are kept in tag order;
`basic.ack`/`nack`/`reject` settle, requeue or discard them in their queues, and closing the
channel requeues whatever is left (redelivered set). Prefetch is RabbitMQ's: `basic.qos` with
global=false limits each consumer created afterwards, global=true limits the channel as a
whole; both may apply at once.

Publisher confirms are counted per channel from 1 and sent batched: after a loop iteration's
publishes, one `basic.ack` with multiple=true covers every sequence number up to the lowest
one still waiting (a message that must reach disk, or a replica, waits). A refused message
gets `basic.nack`. In transactional mode, publishes and acknowledgements are held until
`tx.commit` and dropped by `tx.rollback`; one transaction holds at most `TX_HELD_MAX` of them
(RabbitMQ sets no limit: there a client can hold the whole node's memory in one transaction).

Consumer timeout (RabbitMQ's `consumer_timeout`, 3.8.15+): a channel that holds a delivery
unacknowledged longer than the timeout of that delivery's queue is closed with 406 and its
deliveries requeued (`hutch.broker.session.check_consumer_timeouts`). Deliveries are not
timestamped: the node's coarse timer (once a second) notes the highest delivery tag handed out
since its last visit and the time (`delivery_marks`), so a delivery's time is known to within
one visit, never earlier than it was. Nothing is added to the delivery path.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any, Protocol

from hutch.amqp import codec, spec
from hutch.amqp.spec import AMQPError, precondition_failed
from hutch.broker import msgstats
from hutch.broker.msgstats import DELIVER, DELIVER_NO_ACK, REDELIVER
from hutch.queues.classic import ClassicQueue
from hutch.queues.handle import HeldEntry
from hutch.queues.state import Entry

TX_HELD_MAX = 1_000_000  # publishes, acks and rejects one transaction may hold before tx.commit
TX_HELD_BYTES_MAX = 512 * 2**20  # ... and the bodies of its held publishes, in bytes
DELIVERY_MARKS_MAX = 64  # (tag, time) marks a channel keeps for the consumer timeout; then the last moves


class ChannelOutput(Protocol):
    """What a channel needs of the connection it belongs to (`hutch.broker.session.Session`):
    the broker, its vhost, a way to write frames, and the rest of the connection's state that
    decides whether deliveries may go out."""

    broker: Any
    vhost: Any
    frame_max: int
    writable: bool
    counting: list  # consumers that delivered since the last write (ChannelConsumer.count_deliveries)

    def send_frames(self, frames: Any) -> None: ...
    def send_bytes(self, data: bytes) -> None: ...
    def confirms_due(self, channel: Channel) -> None: ...
    def new_consumer_tag(self) -> str: ...


class ChannelConsumer:
    """A basic.consume, whatever the queue's type: a classic queue homed here calls `can_take`
    and `deliver`; a queue whose messages live elsewhere knows the consumer by `ref` (a queue on
    another node: the id its home node knows; a quorum queue: its consumer id in the state
    machine) and delivers through `Channel.deliver_held`."""

    __slots__ = ("tag", "ctag_enc", "queue", "channel", "no_ack", "exclusive", "priority", "prefetch",
                 "unacked", "arguments", "ref", "received", "counter", "delivered")

    def __init__(self, tag: str, queue: ClassicQueue, channel: Channel, no_ack: bool, exclusive: bool,
                 priority: int, prefetch: int, arguments: dict[str, Any], ref: Any = None):
        self.ref = ref
        self.received = 0  # a queue on another node: deliveries not yet returned to it as credit
        self.tag = tag
        self.ctag_enc = codec.shortstr(tag)
        self.queue = queue
        self.channel = channel
        self.no_ack = no_ack
        self.counter = DELIVER_NO_ACK if no_ack else DELIVER  # where its deliveries count (msgstats)
        self.delivered = 0  # deliveries not yet added to the counters (see count_deliveries)
        self.exclusive = exclusive
        self.priority = priority
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments

    def __repr__(self) -> str:
        return f"ChannelConsumer({self.tag!r} on {self.queue.name!r})"

    def can_take(self) -> bool:
        ch = self.channel
        if not (ch.flow_active and ch.session.writable):
            return False
        return self.no_ack or not self.waits_for_acks()

    def waits_for_acks(self) -> bool:
        """At its prefetch limit (its own or its channel's): it takes more only once its client
        acknowledges."""
        if self.no_ack:
            return False
        if self.prefetch and self.unacked >= self.prefetch:
            return True
        ch = self.channel
        return bool(ch.global_prefetch and len(ch.unacked) >= ch.global_prefetch)

    def deliver(self, queue: ClassicQueue, entry: Entry) -> None:
        ch = self.channel
        ch.delivery_tag += 1
        tag = ch.delivery_tag
        if not self.delivered:
            ch.session.counting.append(self)
        self.delivered += 1
        if not self.no_ack:
            ch.unacked[tag] = (queue, entry, self)
            self.unacked += 1
            if entry.log_seq:
                ch.session.broker.delivered(queue, entry)
        elif entry.log_seq:
            ch.session.broker.settled(queue, entry)
        redelivered = entry.delivery_count > 1
        if redelivered:
            ch.mstats[REDELIVER] += 1
            queue.mstats[REDELIVER] += 1
        m = entry.message
        ch.session.send_frames(codec.deliver_frames(ch.number, self.ctag_enc, tag, redelivered,
                                                    m.route_enc, m.props, m.body, ch.frame_max))


    def count_deliveries(self) -> None:
        """Add the deliveries made since the last count to the channel's and the queue's counters:
        once per batch of frames the connection writes (`Session.take_output`), and before the
        channel's counters are read for good (`Channel.close`)."""
        n = self.delivered
        if n:
            self.delivered = 0
            i = self.counter
            self.channel.mstats[i] += n
            self.queue.mstats[i] += n


class Channel:
    def __init__(self, session: ChannelOutput, number: int):
        self.session = session
        self.number = number
        self.frame_max = session.frame_max  # settled by tune-ok, before any channel opens
        self.consumers: dict[str, ChannelConsumer] = {}
        self.unacked: OrderedDict[int, tuple[ClassicQueue, Entry, ChannelConsumer | None]] = OrderedDict()
        self.delivery_tag = 0
        # consumer timeout: (highest delivery tag, time by which it had been delivered), oldest first
        self.delivery_marks: deque[tuple[int, int]] = deque()
        self.last_queue = ""  # the queue most recently declared on this channel (spec: "" means it)
        self.prefetch = 0  # for consumers created from now on
        self.global_prefetch = 0
        self.flow_active = True
        self.closed = False
        # confirms
        self.confirm = False
        self.publish_seq = 0
        self.confirm_waiting: deque[int] = deque()  # seqs that wait for an accept, in order
        self.confirm_wait_count: dict[int, int] = {}
        self.confirm_acked = 0  # highest seq covered by an ack already sent
        self.confirm_nacked: set[int] = set()  # nacked past confirm_acked: never in a later ack
        self.confirm_dirty = False
        # transactions
        self.tx: list[tuple] | None = None
        self.tx_bytes = 0  # body bytes of the publishes `tx` holds
        # direct reply-to: this channel's pseudo-queue for replies
        self.reply_token: str | None = None
        self.reply_tag = ""
        # message counters (hutch.broker.msgstats), read by the statistics sampler
        self.mstats = msgstats.new()
        msgstats.node_counters(session.broker)[msgstats.CHANNELS_OPENED] += 1

    # ---------------------------------------------------------------- consumers

    def consumer_tag(self) -> str:
        return self.session.new_consumer_tag()

    def add_consumer(self, c: ChannelConsumer) -> None:
        self.consumers[c.tag] = c
        c.queue.add_consumer(c)

    def remove_consumer(self, tag: str) -> ChannelConsumer | None:
        c = self.consumers.pop(tag, None)
        if c is not None:
            c.queue.remove_consumer(c)
        return c

    def deliver_held(self, c: ChannelConsumer, queue: Any, seq: int, delivery_count: int, redelivered: bool,
                     route: bytes, props: bytes, body: bytes) -> None:
        """basic.deliver of a message a queue elsewhere sent (the one path for remote and quorum
        queues; a classic queue homed here delivers through `ChannelConsumer.deliver`)."""
        msgstats.count_delivery(self.mstats, queue.mstats, c.no_ack, redelivered)
        self.delivery_tag += 1
        tag = self.delivery_tag
        if not c.no_ack:
            self.unacked[tag] = (queue, HeldEntry(seq, delivery_count), c)
            c.unacked += 1
        self.session.send_frames(codec.deliver_frames(self.number, c.ctag_enc, tag, redelivered, route, props,
                                                      body, self.frame_max))

    # ---------------------------------------------------------------- acknowledgements

    def _take_unacked(self, tag: int, multiple: bool) -> list[tuple[ClassicQueue, Entry, ChannelConsumer | None]]:
        unacked = self.unacked
        if multiple:
            if tag == 0:
                taken = list(unacked.values())
                unacked.clear()
                return taken
            if tag not in unacked and (not unacked or tag < next(iter(unacked))):
                raise precondition_failed(f"unknown delivery tag {tag}")
            taken = []
            while unacked:
                first = next(iter(unacked))
                if first > tag:
                    break
                taken.append(unacked.popitem(last=False)[1])
            return taken
        item = unacked.pop(tag, None)
        if item is None:
            raise precondition_failed(f"unknown delivery tag {tag}")
        return [item]

    def queues_of(self, tag: int, multiple: bool) -> list[ClassicQueue]:
        """The queues of the deliveries an ack of `tag` would settle (nothing is taken)."""
        if multiple:
            return [q for t, (q, _e, _c) in self.unacked.items() if tag == 0 or t <= tag]
        item = self.unacked.get(tag)
        return [] if item is None else [item[0]]

    def check_tag(self, tag: int, multiple: bool) -> None:
        if multiple and tag == 0:
            return
        if tag in self.unacked:
            return
        if multiple and self.unacked and tag > next(iter(self.unacked)):
            return
        raise precondition_failed(f"unknown delivery tag {tag}")

    def ack(self, tag: int, multiple: bool) -> None:
        dirty = self.session.broker.dirty_queues
        taken = self._take_unacked(tag, multiple)
        self.mstats[msgstats.ACK] += len(taken)
        for queue, entry, consumer in taken:
            queue.mstats[msgstats.ACK] += 1
            if consumer is not None:
                consumer.unacked -= 1
            if not queue.deleted:
                queue.settle(entry.seq)
                self.session.broker.settled(queue, entry)
                dirty.add(queue)
        if self.global_prefetch:
            self.session.broker.kick_consumers_of(self)
        self.session.broker.schedule()

    def reject(self, tag: int, multiple: bool, requeue: bool) -> None:
        dirty = self.session.broker.dirty_queues
        dead = []
        for queue, entry, consumer in self._take_unacked(tag, multiple):
            if consumer is not None:
                consumer.unacked -= 1
            if queue.deleted:
                continue
            if requeue:
                queue.requeue(entry.seq)
            else:
                queue.discard(entry.seq)
                dead.append((queue, entry))
            dirty.add(queue)
        for queue, entry in dead:
            self.session.broker.dead_letter(queue, [entry], "rejected")
        self.session.broker.schedule()

    def requeue_all(self) -> None:
        """Return every unacknowledged delivery to its queue (channel closed, basic.recover)."""
        dirty = self.session.broker.dirty_queues
        items = list(self.unacked.values())
        self.unacked.clear()
        for queue, entry, consumer in reversed(items):
            if consumer is not None:
                consumer.unacked -= 1
            if not queue.deleted:
                queue.requeue(entry.seq)
                dirty.add(queue)
        self.session.broker.schedule()

    def oldest_unacked(self, now_ms: int) -> tuple[int, Any, ChannelConsumer | None, int] | None:
        """The consumer timer's visit: (delivery tag, queue, consumer, delivered by) of the oldest
        unacknowledged delivery, or None when there is none. "Delivered by" is the time of the
        first visit that saw its tag handed out: at most one visit late, never early."""
        unacked = self.unacked
        marks = self.delivery_marks
        if not unacked:
            marks.clear()
            return None
        if not marks or marks[-1][0] < self.delivery_tag:
            if len(marks) < DELIVERY_MARKS_MAX:
                marks.append((self.delivery_tag, now_ms))
            else:  # the last mark takes the new tags too: their time is later, not earlier
                marks[-1] = (self.delivery_tag, now_ms)
        tag = next(iter(unacked))
        while marks[0][0] < tag:  # marks before the oldest unacked delivery are done with
            marks.popleft()
        queue, _entry, consumer = unacked[tag]
        return tag, queue, consumer, marks[0][1]

    # ---------------------------------------------------------------- confirms

    def confirm_later(self, seq: int, waits: int) -> None:
        """The publish `seq` is confirmed after `waits` accepts (disk, replicas)."""
        self.confirm_waiting.append(seq)
        self.confirm_wait_count[seq] = waits

    def accepted(self, seq: int) -> None:
        n = self.confirm_wait_count.get(seq)
        if n is None:
            return
        if n > 1:
            self.confirm_wait_count[seq] = n - 1
            return
        del self.confirm_wait_count[seq]
        self.session.confirms_due(self)

    def publish_refused(self, seq: int) -> None:
        """A queue gives back a publish it had taken and not yet accepted (a mirrored queue whose
        leader moved away before its mirrors all had it): nack it, unless the channel is closed."""
        if seq in self.confirm_wait_count and not self.closed:
            self.nack_publish(seq)

    def nack_publish(self, seq: int) -> None:
        """Send basic.nack for one publish, after acks for everything before it that is
        decided; a later `multiple` ack never covers it again (a tag is confirmed once)."""
        self.confirm_wait_count.pop(seq, None)
        self.flush_confirms(upto=seq - 1)
        self.session.send_bytes(codec.confirm_frame(self.number, seq, False, nack=True))
        if self.confirm_acked == seq - 1:
            self.confirm_acked = seq
        else:
            self.confirm_nacked.add(seq)

    def flush_confirms(self, upto: int | None = None) -> None:
        """Ack (multiple) every publish up to the lowest one still waiting, stepping over the
        ones already nacked."""
        waiting = self.confirm_waiting
        counts = self.confirm_wait_count
        while waiting and waiting[0] not in counts:
            waiting.popleft()
        limit = (waiting[0] - 1) if waiting else self.publish_seq
        if upto is not None:
            limit = min(limit, upto)
        nacked = self.confirm_nacked
        while limit > self.confirm_acked:
            end = limit
            if nacked:
                gap = min((n for n in nacked if n > self.confirm_acked), default=None)
                if gap is not None and gap <= limit:
                    end = gap - 1
            if end > self.confirm_acked:
                multiple = end - self.confirm_acked > 1
                self.mstats[msgstats.CONFIRM] += end - self.confirm_acked
                self.session.send_bytes(codec.confirm_frame(self.number, end, multiple))
                self.confirm_acked = end
            if end < limit:  # the next one was nacked already: step over it
                nacked.discard(end + 1)
                self.confirm_acked = end + 1
        self.confirm_dirty = False

    # ---------------------------------------------------------------- closing

    def close(self) -> None:
        """Tear down: consumers leave their queues, unacked deliveries are requeued."""
        if self.closed:
            return
        self.closed = True
        broker = self.session.broker
        msgstats.node_counters(broker)[msgstats.CHANNELS_CLOSED] += 1
        vhost = self.session.vhost
        for c in self.consumers.values():
            c.count_deliveries()
        if vhost is not None:  # the vhost's and node's figures keep what this channel counted
            self.mstats[msgstats.PUBLISH_CONFIRM] = self.publish_seq
            msgstats.retire(broker, vhost.name, self.mstats)
            self.mstats = msgstats.new()
        if self.reply_token is not None:
            broker.unregister_direct_reply(self)
        for tag in list(self.consumers):
            c = self.remove_consumer(tag)
            if c is not None:
                broker.consumer_gone(c.queue)
        for tag in [t for t, item in self.unacked.items() if getattr(item[0], "stream", False)]:
            c = self.unacked.pop(tag)[2]  # a stream's deliveries only took credit: nothing goes back to it
            if c is not None:
                c.unacked -= 1
        self.requeue_all()
        self.tx = None
        if broker.cluster is not None:  # what the cluster kept for this channel as a publisher
            broker.cluster.channel_closed(self)

    def tx_hold(self, op: tuple, body_size: int = 0) -> None:
        """Hold a publish, ack or reject until tx.commit; a channel error (406) past the limits."""
        if len(self.tx) >= TX_HELD_MAX or self.tx_bytes + body_size > TX_HELD_BYTES_MAX:
            raise precondition_failed(f"transaction too large: it holds {len(self.tx)} publishes and "
                                      f"acknowledgements ({self.tx_bytes} bytes of messages); the limits are "
                                      f"{TX_HELD_MAX} and {TX_HELD_BYTES_MAX} bytes: commit more often")
        self.tx.append(op)
        self.tx_bytes += body_size

    def check_open(self) -> None:
        if self.closed:
            raise AMQPError(spec.CHANNEL_ERROR, "channel is closed")
