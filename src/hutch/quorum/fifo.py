"""The replicated state machine of a quorum queue (hutch's counterpart of RabbitMQ's rabbit_fifo).

One Raft group per quorum queue (ARCHITECTURE.md "Quorum queues"). Every member applies the
same committed commands in the same order to a `QuorumQueueState` and so holds the same queue:
ready messages, messages checked out to consumers with their delivery counts, consumers and
whom they wait behind, publishers' last sequence numbers, dead letters still owed. `apply`
returns *effects* — deliveries, publisher confirms, dead letters, consumer notices — which only
the leader's runtime carries out; followers compute them and drop them, exactly as Ra's
effects work (research §2.1). After a leader change the new leader re-delivers whatever was
checked out to consumers on nodes that are gone (`NodeDown`), so a consumer may see a message
twice, with `redelivered` set and its delivery count raised (seed 003, "Scenario 1").

A consumer's deliveries form a chain: each names the one before it (`Deliver.prev_msg_id`), so
the consumer's node sees a delivery that was lost on the way (a leader stopped between the
commit and the send, a peer link that dropped) when the next one arrives, and asks for what is
checked out to the consumer again (`Resend`; RabbitMQ's rabbit_fifo_client does the same with
its consecutive message ids). A new leader sends each live consumer the same answer unasked
(`resends`), for deliveries its predecessor may have committed and never sent.

    Enqueue   a publish; Accepted / Rejected for its confirm (x-overflow reject-publish)
    Checkout  basic.consume: a consumer with a prefetch, a priority, ack or no-ack
    Cancel    basic.cancel, or (requeue=True) the consumer's channel is gone
    Settle    basic.ack                       Return  basic.nack/reject with requeue
    Discard   basic.nack/reject without requeue: dead-letter ('rejected') or drop
    Get       basic.get                       Purge   queue.purge
    NodeDown  return everything held by consumers on a node and suspend them; NodeUp revives
    Tick      time passes: expire heads (x-message-ttl / expiration), x-expires, dispatch more
    Configure a policy changed the queue's limits; DeadLetterSettled at-least-once dead
              letters were republished and confirmed; PublisherGone; Touch; Delete
    Resend    a consumer's node missed a delivery: what is checked out to it, again (`Resent`)

Messages live in a `hutch.queues.state.QueueState` — the one queue model — so ordering, the
place of returned messages, head-only expiry and drop-head overflow are the same as every
other hutch queue. What quorum queues do differently (measured against RabbitMQ 3.10.8):
no x-max-priority, but RabbitMQ 4.0's two message priorities instead (`TwoLevelQueue`: a
`priority` property above 4 is high, anything else normal; high is delivered two to one
against normal while both have messages ready); every return raises the delivery count, also
a consumer or node going away; `x-delivery-limit` N dead-letters a message on its N+1th return (reason
`delivery_limit`); reject-publish is a soft limit (a publish is refused once the queue is
*over* the limit, and refusals stop when it is back under 80% of it); prefetch 0 means 2000.

Must never: read a clock (time arrives as `now_ms` in commands; the state keeps the largest
seen), draw random numbers, iterate a set or depend on hash order, do I/O, or import anything
above `hutch.queues`. Equal states give equal `snapshot()` bytes.

A message's content stays in the Raft log: the state keeps what it decides with (the entry's
index, size, priority, expiry, delivery count) and the runtime reads the rest back from the
log for a delivery or a dead letter, as RabbitMQ's quorum queues do since 3.10. So neither the
state nor its snapshots hold bodies, and the log keeps its entries from the oldest message
still in the queue on (`first_logged_index`). The log is compacted only to a snapshot every
message of which has been settled since (hutch.quorum.host, `checkpoint`), so a follower sent
that snapshot finds the content of every message it may deliver in the entries after it. A
message restored with its content (`held`: from a snapshot with contents, `SNAP_PORTABLE`,
which leaders sent followers before that) keeps it in memory.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable

import msgspec

from hutch.queues.dispatch import PriorityRings
from hutch.queues.state import DROP_HEAD, REJECT_PUBLISH, REJECT_PUBLISH_DLX, Entry, QueueLimits, QueueState

AT_MOST_ONCE = "at-most-once"
AT_LEAST_ONCE = "at-least-once"
DEAD_LETTER_STRATEGIES = (AT_MOST_ONCE, AT_LEAST_ONCE)

# Dead-letter reasons, as RabbitMQ writes them into x-death.
EXPIRED = "expired"
MAXLEN = "maxlen"
REJECTED = "rejected"
DELIVERY_LIMIT = "delivery_limit"
# 2001-09-09 in ms since the epoch: a clock below it counted from a host's boot (older hutch)
EPOCH_MS_MIN = 1_000_000_000_000

# Limits (every collection the state holds is bounded, or bounded by the messages it holds).
CONSUMERS_MAX = 10_000  # consumer records, counting basic.get holders; more are cancelled/refused
PUBLISHERS_TRACKED_MAX = 10_000  # publishers whose last sequence number is kept (oldest forgotten)
PUBLISHER_WINDOW = 1024  # a resend further back than this is answered Rejected (its outcome is forgotten)
MSG_IDS_PER_COMMAND_MAX = 10_000  # ids in one Settle/Return/Discard/DeadLetterSettled
DELIVERIES_PER_APPLY_MAX = 2048  # deliveries one command may cause; then DispatchPending
UNLIMITED_PREFETCH = 2000  # what prefetch 0 means for a quorum queue consumer (as RabbitMQ)
SOFT_LIMIT_RATIO = 0.8  # reject-publish stops refusing at this fraction of the limits

# 2: the high priority level and the dequeue counter; 3: messages name their log entry and may
# leave their content there (1 and 2 still load, their messages with their content)
SNAPSHOT_VERSION = 3
SNAPSHOT_VERSIONS_LOADED = (1, 2, 3)
# snapshot() forms
SNAP_STORED = 0
SNAP_PORTABLE = 1
SNAP_DIGEST = 2
# A stored snapshot is its msgpack compressed (zlib, level 1: some 5 bytes a queued message
# instead of 25, so a queue of millions still fits one record of the Raft log), after this
# byte, which no msgpack document starts with. Restore takes either.
SNAP_COMPRESSED = b"\xc1"
SNAP_COMPRESS_LEVEL = 1

# RabbitMQ 4.0's quorum queue priorities (rabbit_fifo_q): two levels, high taken PRIORITY_WEIGHT
# times for each normal one while both have messages ready.
PRIORITY_HIGH_ABOVE = 4  # a `priority` property above this is high; absent, 0..4: normal
PRIORITY_WEIGHT = 2

# Consumer record states.
UP = 0  # receives messages
SUSPECTED_DOWN = 1  # its node is down: holds nothing, receives nothing until NodeUp
CANCELLED = 2  # cancelled, kept only while it still holds checked-out messages
GETTER = 3  # holds messages taken by basic.get without no-ack; never dispatched to


# ---------------------------------------------------------------------------------------------
# configuration (the queue's arguments, decided at declare, changed by policy)


class QuorumConfig(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The queue's effective settings. Build it with `quorum_config` from declare arguments."""

    name: str = ""
    vhost: str = "/"
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = DROP_HEAD  # drop-head | reject-publish (reject-publish-dlx acts as drop-head)
    delivery_limit: int | None = None
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    dead_letter_strategy: str = AT_MOST_ONCE  # effective: at-least-once only with reject-publish + DLX
    message_ttl_ms: int | None = None
    single_active: bool = False
    expires_ms: int | None = None


class QuorumArgumentError(ValueError):
    """A declare argument or property a quorum queue refuses; `text` is RabbitMQ's 406 reply text."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


# Arguments of other queue types that a quorum queue refuses (RabbitMQ 3.10.8, measured).
UNSUPPORTED_ARGUMENTS = ("x-max-priority", "x-queue-mode", "x-queue-master-locator", "x-queue-version",
                         "x-max-age", "x-stream-max-segment-size-bytes", "x-initial-cluster-size")


def _text(v: object) -> object:
    return v.decode() if isinstance(v, bytes) else v


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def quorum_config(args: dict, name: str, vhost: str, *, durable: bool = True, exclusive: bool = False,
                  auto_delete: bool = False) -> tuple[QuorumConfig, list[str]]:
    """The quorum-specific part of queue.declare validation, in RabbitMQ 3.10's order, and the
    settings that result. Returns (config, warnings): warnings are lines for the node's log
    (RabbitMQ's wording) about settings it accepted but does not act on as written.

    The generic argument checks (types and ranges of x-max-length, x-message-ttl, x-expires,
    x-overflow's value, the DLX arguments) are `hutch.broker.arguments.queue_settings`, which
    runs first; here an argument of the wrong type is simply not used."""
    rs = f"queue '{name}' in vhost '{vhost}'"
    for key in args:
        if key in UNSUPPORTED_ARGUMENTS:
            raise QuorumArgumentError(f"invalid arg '{key}' for {rs} of queue type rabbit_quorum_queue")
    strategy = _text(args.get("x-dead-letter-strategy"))
    if strategy is not None and strategy not in DEAD_LETTER_STRATEGIES:
        raise QuorumArgumentError(f"invalid arg 'x-dead-letter-strategy' for {rs}: invalid_dlx_strategy")
    if auto_delete:
        raise QuorumArgumentError(f"invalid property 'auto-delete' for {rs}")
    if exclusive:
        raise QuorumArgumentError(f"invalid property 'exclusive-owner' for {rs}")
    if not durable:
        raise QuorumArgumentError(f"invalid property 'non-durable' for {rs}")
    warnings: list[str] = []
    overflow = _text(args.get("x-overflow")) or DROP_HEAD
    if overflow == REJECT_PUBLISH_DLX:
        warnings.append(f'Invalid overflow strategy <<"{overflow}">> for quorum queue: {rs}')
        overflow = DROP_HEAD
    if overflow not in (DROP_HEAD, REJECT_PUBLISH):
        overflow = DROP_HEAD
    dlx = _text(args.get("x-dead-letter-exchange"))
    dlrk = _text(args.get("x-dead-letter-routing-key"))
    strategy = strategy or AT_MOST_ONCE
    if strategy == AT_LEAST_ONCE and overflow != REJECT_PUBLISH:
        warnings.append(f"Falling back to dead-letter-strategy at-most-once for {rs} because configured "
                        f"dead-letter-strategy at-least-once is incompatible with effective overflow strategy "
                        f"{overflow}. To enable dead-letter-strategy at-least-once, set overflow strategy to "
                        f"reject-publish.")
        strategy = AT_MOST_ONCE
    sac = args.get("x-single-active-consumer")
    config = QuorumConfig(
        name=name, vhost=vhost,
        max_length=_int(args.get("x-max-length")), max_length_bytes=_int(args.get("x-max-length-bytes")),
        overflow=overflow, delivery_limit=_int(args.get("x-delivery-limit")),
        dead_letter_exchange=dlx if isinstance(dlx, str) else None,
        dead_letter_routing_key=dlrk if isinstance(dlrk, str) else None,
        dead_letter_strategy=strategy, message_ttl_ms=_int(args.get("x-message-ttl")),
        single_active=sac is True, expires_ms=_int(args.get("x-expires")))
    return config, warnings


# ---------------------------------------------------------------------------------------------
# commands (what the Raft log holds; msgpack arrays, field order is the wire format: append only)


class Enqueue(msgspec.Struct, tag=1, array_like=True, frozen=True, gc=False):
    exchange: str
    routing_key: str
    props: bytes  # the raw AMQP content header properties
    body: bytes
    persistent: bool = True
    priority: int = 0  # the `priority` property: above 4 the message is high priority
    expiration_ms: int | None = None  # the per-message `expiration` property
    now_ms: int = 0
    publisher: str | None = None  # who wants a confirm (e.g. "node/conn/channel"); None: nobody
    # The runtime's own counter for this publisher *and this queue*: 1, 2, 3... without gaps (not
    # the channel's delivery tag, which skips publishes routed elsewhere). A number already applied
    # is a resend after a leader change: answered again with its outcome, never enqueued twice.
    # 0: no deduplication (a publisher not in confirm mode).
    publisher_seq: int = 0
    # The publisher's lowest number for this queue still unanswered when this one was sent (the
    # ones below it are answered, or given up). Given (>= 1), publishes are decided in number
    # order only: one past a gap is not decided (no effect; the publisher sends it again after
    # the missing one), so a channel's messages are enqueued in the order it published them
    # however they travelled (RabbitMQ's rabbit_fifo drops an out-of-sequence enqueue alike).
    # 0 (commands written before it existed): one past a gap is decided at once, out of order.
    publisher_base: int = 0


class Checkout(msgspec.Struct, tag=2, array_like=True, frozen=True, gc=False):
    consumer_id: str  # unique in the queue, starting with the consumer's node: "node/..."
    tag: str = ""
    prefetch: int = 0  # 0: UNLIMITED_PREFETCH
    priority: int = 0  # x-priority
    no_ack: bool = False
    now_ms: int = 0
    # messages it may have on their way beyond its prefetch while it is the queue's only
    # consumer (its node holds them until the channel can take them: hutch.quorum.handle); with
    # another consumer it gets its prefetch only, so a busy one never keeps messages from an idle one
    ahead: int = 0


class Cancel(msgspec.Struct, tag=3, array_like=True, frozen=True, gc=False):
    consumer_id: str
    requeue: bool = False  # True when the channel is gone: its checked-out messages come back
    now_ms: int = 0


class Settle(msgspec.Struct, tag=4, array_like=True, frozen=True, gc=False):
    consumer_id: str
    msg_ids: list[int]


class Return(msgspec.Struct, tag=5, array_like=True, frozen=True, gc=False):
    consumer_id: str
    msg_ids: list[int]


class Discard(msgspec.Struct, tag=6, array_like=True, frozen=True, gc=False):
    consumer_id: str
    msg_ids: list[int]


class NodeDown(msgspec.Struct, tag=7, array_like=True, frozen=True, gc=False):
    node: str
    now_ms: int = 0


class NodeUp(msgspec.Struct, tag=8, array_like=True, frozen=True, gc=False):
    node: str
    now_ms: int = 0


class Purge(msgspec.Struct, tag=9, array_like=True, frozen=True, gc=False):
    now_ms: int = 0


class Tick(msgspec.Struct, tag=10, array_like=True, frozen=True, gc=False):
    now_ms: int


class Get(msgspec.Struct, tag=11, array_like=True, frozen=True, gc=False):
    requester: str  # like a consumer id: "node/..."; later Settle/Return/Discard name it
    no_ack: bool = False
    now_ms: int = 0


class Configure(msgspec.Struct, tag=12, array_like=True, frozen=True, gc=False):
    config: QuorumConfig  # single_active and the name are kept from the queue's declaration


class DeadLetterSettled(msgspec.Struct, tag=13, array_like=True, frozen=True, gc=False):
    seqs: list[int]  # at-least-once dead letters that reached their target queues


class PublisherGone(msgspec.Struct, tag=14, array_like=True, frozen=True, gc=False):
    publisher: str


class Touch(msgspec.Struct, tag=15, array_like=True, frozen=True, gc=False):
    now_ms: int  # the queue was redeclared (it counts as used, for x-expires)


class Delete(msgspec.Struct, tag=16, array_like=True, frozen=True, gc=False):
    now_ms: int = 0


class Resend(msgspec.Struct, tag=17, array_like=True, frozen=True, gc=False):
    """The consumer's node found a delivery missing (one arrived naming a predecessor it never
    got): answer with what is checked out to the consumer past `after_msg_id`. Changes nothing."""

    consumer_id: str
    after_msg_id: int


Command = (Enqueue | Checkout | Cancel | Settle | Return | Discard | NodeDown | NodeUp | Purge | Tick | Get
           | Configure | DeadLetterSettled | PublisherGone | Touch | Delete | Resend)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Command)


def encode_command(cmd: Command) -> bytes:
    """The bytes to propose to the queue's Raft group. Refuses commands beyond the limits."""
    ids = getattr(cmd, "msg_ids", None) or getattr(cmd, "seqs", None)
    if ids is not None and len(ids) > MSG_IDS_PER_COMMAND_MAX:
        raise ValueError(f"{len(ids)} ids in one command (at most {MSG_IDS_PER_COMMAND_MAX}): split it")
    return _encoder.encode(cmd)


def decode_command(data: bytes) -> Command:
    return _decoder.decode(data)


# ---------------------------------------------------------------------------------------------
# effects (what the leader's runtime does after applying; followers drop them)


class Deliver(msgspec.Struct, frozen=True, gc=False):
    """Send this message to the consumer (basic.deliver) — or, inside GetResult, basic.get-ok.

    `msg_id` is the queue's number for this one delivery (never reused): Settle/Return/Discard
    name it, so the runtime maps its delivery tags to it. `delivery_count` is how many times the
    message came back before; RabbitMQ 3.10 sends it on every quorum delivery as the
    `x-delivery-count` header (0 included): the runtime splices it into `props` (this layer may
    not import the AMQP codec). `seq` is the message's place in the queue. `prev_msg_id` is the
    msg_id of the delivery made to the same consumer before this one (0: none): a consumer's node
    that has not seen it has missed a delivery."""

    consumer_id: str
    msg_id: int
    delivery_count: int
    redelivered: bool
    exchange: str
    routing_key: str
    props: bytes
    body: bytes | None  # None: the message's content is the Enqueue at log index `index`
    seq: int = 0
    prev_msg_id: int = 0
    index: int = 0


class Resent(msgspec.Struct, frozen=True, gc=False):
    """For the consumer's node: `deliveries` are the messages checked out to the consumer (past
    the id it asked from), as they were delivered; every other delivery to it up to
    `upto_msg_id` is settled or no longer its own. Its node gives the client the ones it never
    had, in order."""

    consumer_id: str
    upto_msg_id: int
    deliveries: tuple[Deliver, ...]


class Accepted(msgspec.Struct, frozen=True, gc=False):
    """The publish is committed (in the queue, or consumed or dropped by the queue's own rules):
    basic.ack to a publisher in confirm mode. A resent publish is answered again."""

    publisher: str
    publisher_seq: int


class Rejected(msgspec.Struct, frozen=True, gc=False):
    """The publish was refused (x-overflow reject-publish, or the queue is deleted): basic.nack."""

    publisher: str
    publisher_seq: int


class DeadMessage(msgspec.Struct, frozen=True, gc=False):
    """A dead-lettered message; `body` None as in Deliver (its content is at log index `index`)."""

    seq: int
    exchange: str
    routing_key: str
    props: bytes
    body: bytes | None
    persistent: bool
    delivery_count: int
    index: int = 0


class DeadLetter(msgspec.Struct, frozen=True, gc=False):
    """Messages that left the queue for `reason` (x-death: reason, queue = config.name, time =
    time_ms, exchange / routing-keys = the message's own, original-expiration from its props).

    `exchange` None: the queue has no dead-letter exchange, the messages are dropped (the effect
    is only for counting). `routing_key` None: republish with each message's own routing key.
    With strategy at-least-once the messages stay owed in the queue until the runtime has
    republished them with confirms and proposed `DeadLetterSettled(seqs)`; a new leader finds
    them in `dead_letters_pending()`. With at-most-once they are gone already."""

    reason: str
    exchange: str | None
    routing_key: str | None
    strategy: str
    time_ms: int
    messages: tuple[DeadMessage, ...]


class ConsumerCancelled(msgspec.Struct, frozen=True, gc=False):
    """The queue cancelled this consumer (basic.cancel to clients that accept it)."""

    consumer_id: str
    reason: str  # "deleted" | "consumers_max"


class ConsumerActivated(msgspec.Struct, frozen=True, gc=False):
    """With x-single-active-consumer: this consumer now receives the queue's messages."""

    consumer_id: str


class GetResult(msgspec.Struct, frozen=True, gc=False):
    """Answer to Get: basic.get-ok with `message` (consumer_id = the requester) and the number
    of messages still ready, or basic.get-empty when `message` is None."""

    requester: str
    message: Deliver | None
    message_count: int


class Purged(msgspec.Struct, frozen=True, gc=False):
    message_count: int


class Deleted(msgspec.Struct, frozen=True, gc=False):
    message_count: int


class DispatchPending(msgspec.Struct, frozen=True, gc=False):
    """Ready messages and willing consumers remain after DELIVERIES_PER_APPLY_MAX deliveries:
    propose a Tick (when the consumers' connections can take more) to continue."""


class QueueExpired(msgspec.Struct, frozen=True, gc=False):
    """x-expires: the queue has been unused that long; the runtime deletes it."""


Effect = (Deliver | Accepted | Rejected | DeadLetter | ConsumerCancelled | ConsumerActivated | GetResult
          | Purged | Deleted | DispatchPending | QueueExpired | Resent)


# ---------------------------------------------------------------------------------------------
# the state machine


class _Publisher:
    __slots__ = ("last", "rejected", "ahead")

    def __init__(self, last: int = 0, rejected: list[int] | None = None, ahead: dict[int, bool] | None = None):
        self.last = last  # every publisher_seq up to this one is decided
        self.rejected: list[int] = rejected or []  # refused ones within PUBLISHER_WINDOW of `last`
        # decided ones past a gap (a resend, or another route, brought them first): seq -> accepted
        self.ahead: dict[int, bool] = ahead or {}


class _Consumer:
    __slots__ = ("consumer_id", "tag", "prefetch", "priority", "no_ack", "status", "checked_out", "ahead",
                 "last_msg_id")

    def __init__(self, consumer_id: str, tag: str, prefetch: int, priority: int, no_ack: bool, status: int,
                 ahead: int = 0):
        self.consumer_id = consumer_id
        self.tag = tag
        self.prefetch = prefetch
        self.priority = priority
        self.no_ack = no_ack
        self.status = status
        self.checked_out: dict[int, int] = {}  # msg_id -> seq, in msg_id order (ids only grow)
        self.ahead = ahead  # Checkout.ahead: beyond the prefetch while it is the only consumer
        self.last_msg_id = 0  # of the last delivery made to it (the next one names it)

    def can_take(self, alone: bool = False) -> bool:
        if self.status != UP:
            return False
        return self.no_ack or len(self.checked_out) < (self.prefetch or UNLIMITED_PREFETCH) + (self.ahead if alone
                                                                                               else 0)


class LoggedMessage:
    """A quorum queue's message: what the queue decides with (size, priority, expiry, persistence)
    and the index of the log entry whose Enqueue carries its content. The content (exchange,
    routing key, properties, body) is in memory only where it is not in this member's log: a
    message that came in a snapshot from the leader, or a state used without a log (index 0).
    Otherwise `held` is None and the runtime reads the content from the log when it delivers or
    dead-letters the message; the log keeps every entry from the lowest such index on
    (`QuorumQueueState.first_logged_index`). Six slots and shared size objects: a queue of a
    million messages spends some 64 MB on these."""

    __slots__ = ("index", "size", "persistent", "priority", "expiration_ms", "held")

    def __init__(self, index: int, size: int, persistent: bool, priority: int, expiration_ms: int | None,
                 held: tuple[str, str, bytes, bytes] | None = None):
        self.index = index
        self.size = _SIZES.setdefault(size, size) if size < SIZES_SHARED_BELOW else size
        self.persistent = persistent
        self.priority = priority
        self.expiration_ms = expiration_ms
        self.held = held  # (exchange, routing key, properties, body), or None: in the log

    @property
    def exchange(self) -> str:
        return self.held[0] if self.held is not None else ""

    @property
    def routing_key(self) -> str:
        return self.held[1] if self.held is not None else ""

    @property
    def props(self) -> bytes:
        return self.held[2] if self.held is not None else b""

    @property
    def body(self) -> bytes | None:
        return self.held[3] if self.held is not None else None


_IN_LOG = ("", "", b"", None)  # what a delivery of a message whose content is in the log carries
# one int object per message size below this, shared by every message of that size
SIZES_SHARED_BELOW = 1 << 16
_SIZES: dict[int, int] = {}


def _limits(config: QuorumConfig) -> QueueLimits:
    # drop-head is the QueueState's own rule; reject-publish is decided here (a soft limit).
    # Two priority levels, whatever the queue's arguments (TwoLevelQueue).
    if config.overflow == DROP_HEAD:
        return QueueLimits(config.max_length, config.max_length_bytes, DROP_HEAD, max_priority=1)
    return QueueLimits(max_priority=1)


class TwoLevelQueue(QueueState):
    """A quorum queue's messages: RabbitMQ 4.0's two priorities (rabbit_fifo_q).

    A message whose `priority` property is above 4 is high, any other normal (no x-max-priority
    is needed or accepted). Each level keeps the one queue model's order (returned messages back
    at their place ahead of its FIFO). Which level gives the next message: a dequeue counter goes
    0, 1, 2, 0, ... with every message taken; at 2 it is normal's turn, unless high's head is the
    older message (a high message published before the normal one is always delivered first).
    So while both levels have messages ready, high gets two deliveries to normal's one and
    normal is never starved. The counter is part of the state (snapshots carry it): every member
    takes the same message next."""

    __slots__ = ("dequeue_counter",)

    def __init__(self, limits: QueueLimits):
        assert limits.max_priority == 1, "a quorum queue has exactly two priority levels"
        super().__init__(limits)
        self.dequeue_counter = 0

    def head(self) -> Entry | None:
        level = self._next_level()
        return level.head() if level is not None else None

    def _next_level(self):
        normal, high = self._levels
        if not len(high):
            return normal if len(normal) else None
        if not len(normal):
            return high
        if self.dequeue_counter == PRIORITY_WEIGHT and normal.head().seq < high.head().seq:
            return normal
        return high

    def _level_of(self, message: LoggedMessage):
        return self._levels[1 if message.priority > PRIORITY_HIGH_ABOVE else 0]

    def _pop_head(self) -> Entry:
        level = self._next_level()
        if level is None:  # pragma: no cover - guarded by ready_count
            raise IndexError("empty queue")
        entry = level.pop()
        self.dequeue_counter = 0 if self.dequeue_counter == PRIORITY_WEIGHT else self.dequeue_counter + 1
        self._ready_removed(entry)
        return entry


class QuorumQueueState:
    """See the module docstring. `apply(cmd)` is the only way the state changes."""

    def __init__(self, config: QuorumConfig | None = None):
        self.config = config or QuorumConfig()
        self.queue = TwoLevelQueue(_limits(self.config))
        self.consumers: dict[str, _Consumer] = {}  # registration order (the single-active queue)
        self._rings = PriorityRings()  # competing consumers that are UP, by id (hutch.queues.dispatch)
        self.active_id: str | None = None  # single active consumer
        self.next_msg_id = 1
        self.dlx_pending: dict[int, Entry] = {}  # at-least-once dead letters owed, by seq
        self.dlx_bytes = 0
        self.publishers: dict[str, _Publisher] = {}  # oldest first
        self.rejecting = False  # reject-publish: over the limit, not yet back under the soft limit
        self.clock_ms = 0  # the largest now_ms seen
        self._alone_now = False  # _next_consumer's: one consumer up (it may be sent its ahead)
        self.last_used_ms: int | None = None
        self.expired_notified = False
        self.deleted = False
        self._index = 0  # the log index of the command being applied

    # ---------------------------------------------------------------- applying

    def apply(self, cmd: Command, index: int = 0) -> list[Effect]:
        """Apply one committed command, the entry at log `index`; returns the effects for the
        leader to carry out. A message enqueued with an index keeps its content in the log only;
        without one (index 0: a state used outside a Raft group) it keeps it in memory."""
        effects: list[Effect] = []
        self._index = index
        now_ms = getattr(cmd, "now_ms", 0)
        if now_ms > self.clock_ms:
            if 0 < self.clock_ms < EPOCH_MS_MIN <= now_ms:
                self._rebase_times(now_ms - self.clock_ms)
            self.clock_ms = now_ms
        if self.last_used_ms is None:
            self.last_used_ms = self.clock_ms
        _HANDLERS[type(cmd)](self, cmd, effects)
        if not self.deleted:
            self._evaluate_limit()
        return effects

    def _rebase_times(self, delta_ms: int) -> None:
        """State kept by nodes that counted time from their host's boot meets a node that counts
        from the epoch (hutch.server.clock): move every time it holds by the same amount, so TTLs
        and x-expires keep what was left of them instead of all running out at once."""
        for e in (*self.queue.ready(), *self.queue.unacked.values(), *self.dlx_pending.values()):
            if e.expires_at_ms is not None:
                e.expires_at_ms += delta_ms
        if self.last_used_ms is not None:
            self.last_used_ms += delta_ms
        self.clock_ms += delta_ms

    def apply_bytes(self, data: bytes, index: int = 0) -> list[Effect]:
        """Apply a committed log entry's data (the leader's empty no-op entry applies nothing)."""
        return self.apply(decode_command(data), index) if data else []

    def _enqueue(self, cmd: Enqueue, effects: list[Effect]) -> None:
        pub, seq, base = cmd.publisher, cmd.publisher_seq, cmd.publisher_base
        rec = None
        if pub is not None and seq > 0:
            rec = self.publishers.get(pub)
            if rec is None:
                if len(self.publishers) >= PUBLISHERS_TRACKED_MAX:
                    del self.publishers[next(iter(self.publishers))]
                rec = self.publishers[pub] = _Publisher(max(base - 1, 0))
            elif base - 1 > rec.last and not rec.ahead:
                self._given_up(rec, base - 1)
            if seq <= rec.last:  # a resend of a publish already decided
                answered = seq > rec.last - PUBLISHER_WINDOW and seq not in rec.rejected
                effects.append(Accepted(pub, seq) if answered else Rejected(pub, seq))
                return
            if seq in rec.ahead:  # a resend of one decided past a gap
                effects.append(Accepted(pub, seq) if rec.ahead[seq] else Rejected(pub, seq))
                return
            if base and seq > rec.last + 1:
                return  # past a gap: decided once the publisher has sent the missing one again
            if seq > rec.last + PUBLISHER_WINDOW:
                # too far past a gap to remember: refused and not recorded, so that the publisher's
                # resend is decided then (a nack, never a message taken for a duplicate)
                effects.append(Rejected(pub, seq))
                return
        if self.deleted or self.rejecting:
            if rec is not None:
                self._decided(rec, seq, False)
            if pub is not None:
                effects.append(Rejected(pub, seq))
            return
        if rec is not None:
            self._decided(rec, seq, True)
        ttl = cmd.expiration_ms
        if self.config.message_ttl_ms is not None:
            ttl = self.config.message_ttl_ms if ttl is None else min(ttl, self.config.message_ttl_ms)
        msg = LoggedMessage(self._index, len(cmd.body), cmd.persistent, cmd.priority, cmd.expiration_ms,
                            None if self._index else (cmd.exchange, cmd.routing_key, cmd.props, cmd.body))
        _entry, dropped = self.queue.enqueue(msg, None if ttl is None else self.clock_ms + ttl)
        if pub is not None:
            effects.append(Accepted(pub, seq))
        if dropped:
            self._dead_letter(MAXLEN, dropped, effects)
        self._dispatch(effects)

    @staticmethod
    def _given_up(rec: _Publisher, last: int) -> None:
        """The publisher answered or gave up every number up to `last` (a publish it stopped
        waiting for): the next one expected is `last` + 1."""
        rec.last = last
        while rec.rejected and rec.rejected[0] <= last - PUBLISHER_WINDOW:
            rec.rejected.pop(0)

    @staticmethod
    def _decided(rec: _Publisher, seq: int, accepted: bool) -> None:
        """Record a publish's outcome. Publishes may arrive out of order (resends after a leader
        change, different routes to the leader): each is decided once, whatever the order."""
        rec.ahead[seq] = accepted
        while rec.last + 1 in rec.ahead:
            rec.last += 1
            if not rec.ahead.pop(rec.last):
                rec.rejected.append(rec.last)
        while rec.rejected and rec.rejected[0] <= rec.last - PUBLISHER_WINDOW:
            rec.rejected.pop(0)

    def _checkout(self, cmd: Checkout, effects: list[Effect]) -> None:
        self.last_used_ms = self.clock_ms
        if self.deleted:
            effects.append(ConsumerCancelled(cmd.consumer_id, "deleted"))
            return
        c = self.consumers.get(cmd.consumer_id)
        if c is not None and c.status in (UP, SUSPECTED_DOWN):
            return  # already registered (a resent command)
        if c is None:
            if len(self.consumers) >= CONSUMERS_MAX:
                effects.append(ConsumerCancelled(cmd.consumer_id, "consumers_max"))
                return
            c = _Consumer(cmd.consumer_id, cmd.tag, cmd.prefetch, cmd.priority, cmd.no_ack, UP, cmd.ahead)
            self.consumers[c.consumer_id] = c
        else:  # a cancelled or basic.get record under the same id comes alive as this consumer
            c.tag, c.prefetch, c.priority, c.no_ack, c.status = cmd.tag, cmd.prefetch, cmd.priority, cmd.no_ack, UP
            c.ahead = cmd.ahead
            self.consumers[c.consumer_id] = self.consumers.pop(c.consumer_id)  # joins at the back
        self._serve(c, effects)
        self._dispatch(effects)

    def _cancel(self, cmd: Cancel, effects: list[Effect]) -> None:
        c = self.consumers.get(cmd.consumer_id)
        if c is None:
            return
        self.last_used_ms = self.clock_ms
        if cmd.requeue:
            self._return_all(c, effects)
        if c.status != GETTER:
            self._unserve(c)
            c.status = CANCELLED
        self._forget_if_idle(c)
        self._elect(effects)
        self._dispatch(effects)

    def _settle(self, cmd: Settle, effects: list[Effect]) -> None:
        c = self.consumers.get(cmd.consumer_id)
        if c is None:
            return
        for seq in _checked_out_seqs(c, cmd.msg_ids):
            self.queue.settle(seq)
        self._forget_if_idle(c)
        self._dispatch(effects)

    def _return(self, cmd: Return, effects: list[Effect]) -> None:
        c = self.consumers.get(cmd.consumer_id)
        if c is None:
            return
        self._return_ids(c, cmd.msg_ids, effects)
        self._forget_if_idle(c)
        self._dispatch(effects)

    def _discard(self, cmd: Discard, effects: list[Effect]) -> None:
        c = self.consumers.get(cmd.consumer_id)
        if c is None:
            return
        gone = [self.queue.discard(seq) for seq in _checked_out_seqs(c, cmd.msg_ids)]
        if gone:
            self._dead_letter(REJECTED, gone, effects)
        self._forget_if_idle(c)
        self._dispatch(effects)

    def _node_down(self, cmd: NodeDown, effects: list[Effect]) -> None:
        prefix = cmd.node + "/"
        for c in list(self.consumers.values()):
            if not c.consumer_id.startswith(prefix):
                continue
            self._return_all(c, effects)
            if c.status == UP:
                self._unserve(c)
                c.status = SUSPECTED_DOWN
            self._forget_if_idle(c)
        self._elect(effects)
        self._dispatch(effects)

    def _node_up(self, cmd: NodeUp, effects: list[Effect]) -> None:
        prefix = cmd.node + "/"
        revived = [c for c in self.consumers.values()
                   if c.status == SUSPECTED_DOWN and c.consumer_id.startswith(prefix)]
        for c in revived:
            c.status = UP
            self.consumers[c.consumer_id] = self.consumers.pop(c.consumer_id)  # waits at the back
            self._serve(c, effects)
        self._dispatch(effects)

    def _purge(self, cmd: Purge, effects: list[Effect]) -> None:
        effects.append(Purged(len(self.queue.purge())))

    def _tick(self, cmd: Tick, effects: list[Effect]) -> None:
        self._dispatch(effects)
        exp = self.config.expires_ms
        if (exp is not None and not self.deleted and not self.expired_notified
                and not any(c.status in (UP, SUSPECTED_DOWN) for c in self.consumers.values())
                and self.clock_ms - (self.last_used_ms or 0) >= exp):
            self.expired_notified = True
            effects.append(QueueExpired())

    def _get(self, cmd: Get, effects: list[Effect]) -> None:
        self.last_used_ms = self.clock_ms
        self._expire_heads(effects)
        q = self.queue
        holder = self.consumers.get(cmd.requester)
        if self.deleted or (not cmd.no_ack and holder is None and len(self.consumers) >= CONSUMERS_MAX):
            effects.append(GetResult(cmd.requester, None, q.ready_count))
            return
        entry = q.take() if cmd.no_ack else q.checkout()
        if entry is None:
            effects.append(GetResult(cmd.requester, None, 0))
            return
        msg_id = self.next_msg_id
        self.next_msg_id += 1
        if not cmd.no_ack:
            if holder is None:
                holder = _Consumer(cmd.requester, "", 0, 0, False, GETTER)
                self.consumers[cmd.requester] = holder
            holder.checked_out[msg_id] = entry.seq
        effects.append(GetResult(cmd.requester, self._delivery(cmd.requester, msg_id, entry), q.ready_count))

    def _configure(self, cmd: Configure, effects: list[Effect]) -> None:
        old = self.config
        self.config = msgspec.structs.replace(cmd.config, name=old.name, vhost=old.vhost,
                                              single_active=old.single_active)
        self.queue.limits = _limits(self.config)
        lim = self.queue.limits
        q = self.queue
        dropped = []
        while q.ready_count and ((lim.max_length is not None and q.ready_count > lim.max_length) or (
                lim.max_length_bytes is not None and q.ready_bytes > lim.max_length_bytes)):
            h = q.head()
            dropped.append(q.discard(h.seq))
        if dropped:
            self._dead_letter(MAXLEN, dropped, effects)
        self._dispatch(effects)

    def _dead_letter_settled(self, cmd: DeadLetterSettled, effects: list[Effect]) -> None:
        for seq in cmd.seqs:
            entry = self.dlx_pending.pop(seq, None)
            if entry is not None:
                self.dlx_bytes -= entry.message.size

    def _publisher_gone(self, cmd: PublisherGone, effects: list[Effect]) -> None:
        self.publishers.pop(cmd.publisher, None)

    def _touch(self, cmd: Touch, effects: list[Effect]) -> None:
        self.last_used_ms = self.clock_ms

    def _resend(self, cmd: Resend, effects: list[Effect]) -> None:
        effects.append(self.resend(cmd.consumer_id, cmd.after_msg_id))

    def _delete(self, cmd: Delete, effects: list[Effect]) -> None:
        if self.deleted:
            return
        for c in self.consumers.values():
            if c.status in (UP, SUSPECTED_DOWN):
                effects.append(ConsumerCancelled(c.consumer_id, "deleted"))
        effects.append(Deleted(self.queue.ready_count))
        self.queue = TwoLevelQueue(_limits(self.config))
        self.consumers.clear()
        self._rings.clear()
        self.active_id = None
        self.dlx_pending.clear()
        self.dlx_bytes = 0
        self.rejecting = False
        self.deleted = True

    # ---------------------------------------------------------------- dispatch

    def _serve(self, c: _Consumer, effects: list[Effect]) -> None:
        """Make an UP consumer eligible: join its priority's ring, or wait to be the active one."""
        if self.config.single_active:
            self._elect(effects)
            return
        self._rings.add(c.priority, c.consumer_id)

    def _unserve(self, c: _Consumer) -> None:
        if self.config.single_active:
            if self.active_id == c.consumer_id:
                self.active_id = None
            return
        self._rings.remove(c.consumer_id)

    def _elect(self, effects: list[Effect]) -> None:
        """Single active consumer: when there is none, the longest-waiting UP consumer takes over."""
        if not self.config.single_active or self.active_id is not None:
            return
        for c in self.consumers.values():
            if c.status == UP:
                self.active_id = c.consumer_id
                effects.append(ConsumerActivated(c.consumer_id))
                return

    def _next_consumer(self) -> _Consumer | None:
        if self.config.single_active:  # the active one is the only one served: its ahead holds
            c = self.consumers.get(self.active_id) if self.active_id is not None else None
            return c if c is not None and c.can_take(True) else None
        self._alone_now = self._alone()
        cid = self._rings.next(self._id_can_take)
        return self.consumers[cid] if cid is not None else None

    def _id_can_take(self, consumer_id: str) -> bool:
        return self.consumers[consumer_id].can_take(self._alone_now)

    def _alone(self) -> bool:
        """Whether the queue has one consumer up (then it may be sent its ahead)."""
        up = 0
        for c in self.consumers.values():
            if c.status == UP:
                up += 1
                if up > 1:
                    return False
        return up == 1

    def _dispatch(self, effects: list[Effect]) -> None:
        """Expire heads, then hand ready messages to consumers that can take them: highest
        priority first, round-robin among equals, within each consumer's prefetch."""
        q = self.queue
        delivered = 0
        while True:
            self._expire_heads(effects)
            if not q.ready_count:
                return
            if delivered == DELIVERIES_PER_APPLY_MAX:
                if self._next_consumer() is not None:
                    effects.append(DispatchPending())
                return
            c = self._next_consumer()
            if c is None:
                return
            entry = q.take() if c.no_ack else q.checkout()
            msg_id = self.next_msg_id
            self.next_msg_id += 1
            if not c.no_ack:
                c.checked_out[msg_id] = entry.seq
            effects.append(self._delivery(c.consumer_id, msg_id, entry, c.last_msg_id))
            c.last_msg_id = msg_id
            delivered += 1

    def _delivery(self, consumer_id: str, msg_id: int, entry: Entry, prev_msg_id: int = 0) -> Deliver:
        m = entry.message
        count = entry.delivery_count - 1  # QueueState counts deliveries; this is the returns before
        exchange, routing_key, props, body = m.held or _IN_LOG
        return Deliver(consumer_id, msg_id, count, count > 0, exchange, routing_key, props, body, entry.seq,
                       prev_msg_id, m.index)

    # ---------------------------------------------------------------- returns and dead letters

    def _return_ids(self, c: _Consumer, msg_ids, effects: list[Effect]) -> None:
        """Put checked-out messages back (delivery count +1), dead-lettering those past the
        delivery limit."""
        limit = self.config.delivery_limit
        over = []
        for seq in _checked_out_seqs(c, msg_ids):
            if limit is not None and self.queue.unacked[seq].delivery_count > limit:
                over.append(self.queue.discard(seq))
            else:
                self.queue.return_(seq)
        if over:
            self._dead_letter(DELIVERY_LIMIT, over, effects)

    def _return_all(self, c: _Consumer, effects: list[Effect]) -> None:
        if c.checked_out:
            self._return_ids(c, list(c.checked_out), effects)

    def _forget_if_idle(self, c: _Consumer) -> None:
        if c.status in (CANCELLED, GETTER) and not c.checked_out:
            del self.consumers[c.consumer_id]

    def _expire_heads(self, effects: list[Effect]) -> None:
        q = self.queue
        expired = []
        h = q.expired_head(self.clock_ms)
        while h is not None:
            expired.append(q.discard(h.seq))
            h = q.expired_head(self.clock_ms)
        if expired:
            self._dead_letter(EXPIRED, expired, effects)

    def _dead_letter(self, reason: str, entries: list[Entry], effects: list[Effect]) -> None:
        cfg = self.config
        strategy = cfg.dead_letter_strategy
        if cfg.dead_letter_exchange is None:
            strategy = AT_MOST_ONCE
        elif strategy == AT_LEAST_ONCE:
            for e in entries:
                self.dlx_pending[e.seq] = e
                self.dlx_bytes += e.message.size
        effects.append(DeadLetter(reason, cfg.dead_letter_exchange, cfg.dead_letter_routing_key, strategy,
                                  self.clock_ms, tuple(_dead_message(e) for e in entries)))

    def _evaluate_limit(self) -> None:
        """reject-publish as a soft limit (RabbitMQ's quorum queues): refuse publishes once the
        queue (with its owed dead letters) is over a limit, until it is back to 80% of it."""
        cfg = self.config
        if cfg.overflow != REJECT_PUBLISH or (cfg.max_length is None and cfg.max_length_bytes is None):
            self.rejecting = False
            return
        n = self.queue.ready_count + len(self.dlx_pending)
        b = self.queue.ready_bytes + self.dlx_bytes
        if not self.rejecting:
            self.rejecting = ((cfg.max_length is not None and n > cfg.max_length)
                              or (cfg.max_length_bytes is not None and b > cfg.max_length_bytes))
        else:
            self.rejecting = not ((cfg.max_length is None or n <= int(cfg.max_length * SOFT_LIMIT_RATIO))
                                  and (cfg.max_length_bytes is None
                                       or b <= int(cfg.max_length_bytes * SOFT_LIMIT_RATIO)))

    # ---------------------------------------------------------------- queries (figures, listings)

    @property
    def messages_ready(self) -> int:
        return self.queue.ready_count

    @property
    def messages_unacknowledged(self) -> int:
        return self.queue.unacked_count

    @property
    def messages(self) -> int:
        return self.queue.ready_count + self.queue.unacked_count

    @property
    def consumer_count(self) -> int:
        """Consumers registered and not cancelled (those on a node that is down included)."""
        return sum(1 for c in self.consumers.values() if c.status in (UP, SUSPECTED_DOWN))

    @property
    def message_bytes(self) -> int:
        return self.queue.ready_bytes + self.queue.unacked_bytes

    def figures(self) -> dict[str, int]:
        """The numbers a queue listing shows, in RabbitMQ's column names."""
        q = self.queue
        return {"messages": self.messages, "messages_ready": q.ready_count,
                "messages_unacknowledged": q.unacked_count, "consumers": self.consumer_count,
                "message_bytes": self.message_bytes, "message_bytes_ready": q.ready_bytes,
                "message_bytes_unacknowledged": q.unacked_bytes,
                "messages_dlx": len(self.dlx_pending), "message_bytes_dlx": self.dlx_bytes}

    def single_active_consumer(self) -> str | None:
        return self.active_id

    def ready_entries(self) -> list[Entry]:
        return list(self.queue.ready())

    def checked_out(self) -> list[tuple[str, int, Entry]]:
        """(consumer_id, msg_id, entry) for every checked-out message, consumers in registration order."""
        return [(c.consumer_id, msg_id, self.queue.unacked[seq])
                for c in self.consumers.values() for msg_id, seq in c.checked_out.items()]

    def resend(self, consumer_id: str, after_msg_id: int = 0) -> Resent:
        """What is checked out to the consumer past `after_msg_id`, as it was delivered (nothing
        for a consumer that is not up: what it held came back to the queue, or it is cancelled)."""
        c = self.consumers.get(consumer_id)
        deliveries: tuple[Deliver, ...] = ()
        if c is not None and c.status == UP:
            unacked = self.queue.unacked
            deliveries = tuple(self._delivery(consumer_id, msg_id, unacked[seq])
                               for msg_id, seq in c.checked_out.items() if msg_id > after_msg_id)
        return Resent(consumer_id, self.next_msg_id - 1, deliveries)

    def resends(self) -> list[Resent]:
        """For a new leader to send unasked: each live consumer's checked-out deliveries, since the
        old leader may have stopped after a checkout was committed and before its delivery left
        (the consumer's node drops the ones it has). Cancelled consumers and getters are left out."""
        return [self.resend(c.consumer_id) for c in self.consumers.values() if c.status == UP and c.checked_out]

    def dead_letters_pending(self) -> DeadLetter | None:
        """At-least-once dead letters not yet settled, for a new leader to republish."""
        if not self.dlx_pending:
            return None
        cfg = self.config
        return DeadLetter("", cfg.dead_letter_exchange, cfg.dead_letter_routing_key, AT_LEAST_ONCE,
                          self.clock_ms, tuple(_dead_message(e) for e in self.dlx_pending.values()))

    def check_invariants(self) -> None:
        """Assert the bookkeeping agrees with itself (tests and the simulator call this)."""
        q = self.queue
        held = [seq for c in self.consumers.values() for seq in c.checked_out.values()]
        assert len(held) == len(set(held)) == len(q.unacked), "checked-out messages and holders disagree"
        assert set(held) == set(q.unacked), "a checked-out message without a holder"
        assert q.unacked_bytes == sum(e.message.size for e in q.unacked.values())
        ready = list(q.ready())
        assert len(ready) == q.ready_count and sum(e.message.size for e in ready) == q.ready_bytes
        assert self.dlx_bytes == sum(e.message.size for e in self.dlx_pending.values())
        ringed = list(self._rings)
        assert len(ringed) == len(set(ringed))
        for c in self.consumers.values():
            assert (c.consumer_id in ringed) == (c.status == UP and not self.config.single_active)
        if self.active_id is not None:
            assert self.consumers[self.active_id].status == UP

    # ---------------------------------------------------------------- snapshots

    def snapshot(self, form: int = SNAP_STORED, read: Callable[[int], tuple] | None = None) -> bytes:
        """The whole state as canonical bytes: equal states give equal bytes in the same form.

        SNAP_STORED (what this member's log keeps): a message whose content is in the log is
        named by its index, one held in memory carries it. SNAP_PORTABLE (what leaders once sent
        a follower that lacked the log; such a snapshot is still restored): every message carries
        its content, `read(index)` giving (exchange, routing key, properties, body) for those in
        the log. SNAP_DIGEST (to compare
        members): no content at all, so members that hold the same messages in different places
        give equal bytes."""
        q = self.queue
        normal, high = q._levels
        held = sorted(q.unacked.values(), key=lambda e: e.seq)

        def entries(es) -> list[_SnapEntry]:
            return [_snap_entry(e, form, read) for e in es]
        snap = _Snapshot(
            SNAPSHOT_VERSION, self.config, q.next_seq,
            entries(sorted(normal.returned, key=lambda e: e.seq)),
            entries(normal.fifo),
            entries(held),
            [_SnapConsumer(c.consumer_id, c.tag, c.prefetch, c.priority, c.no_ack, c.status,
                           [(i, s) for i, s in c.checked_out.items()], c.ahead, c.last_msg_id)
             for c in self.consumers.values()],
            self._rings.snapshot(),
            self.active_id, self.next_msg_id,
            entries(self.dlx_pending.values()),
            [(p, r.last, list(r.rejected), sorted(r.ahead.items())) for p, r in self.publishers.items()],
            self.rejecting, self.clock_ms, self.last_used_ms, self.expired_notified, self.deleted,
            entries(sorted(high.returned, key=lambda e: e.seq)),
            entries(high.fifo), q.dequeue_counter)
        data = _encoder.encode(snap)
        return SNAP_COMPRESSED + zlib.compress(data, SNAP_COMPRESS_LEVEL) if form == SNAP_STORED else data

    def _live_entries(self):
        q = self.queue
        return (*q.ready(), *q.unacked.values(), *self.dlx_pending.values())

    def first_logged_index(self) -> int | None:
        """The lowest log index whose content a message of the queue still needs (None: no
        message's content is in the log). A member's log must keep every entry from it on."""
        low = None
        for e in self._live_entries():
            m = e.message
            if m.held is None and (low is None or m.index < low):
                low = m.index
        return low

    @classmethod
    def restore(cls, data: bytes) -> QuorumQueueState:
        """A state from `snapshot()` bytes (Raft installs snapshots with it)."""
        if data[:1] == SNAP_COMPRESSED:
            data = zlib.decompress(memoryview(data)[1:])
        snap = _snapshot_decoder.decode(data)
        if snap.version not in SNAPSHOT_VERSIONS_LOADED:
            raise ValueError(f"quorum queue snapshot version {snap.version}, expected one of "
                             f"{', '.join(map(str, SNAPSHOT_VERSIONS_LOADED))}")
        self = cls(snap.config)
        q = self.queue
        q.next_seq = snap.next_seq
        q.dequeue_counter = snap.dequeue_counter
        # version 1 had one level: its messages stay normal, in their order
        for level, returned, fifo in zip(q._levels, (snap.returned, snap.high_returned),
                                         (snap.fifo, snap.high_fifo), strict=True):
            level.returned = [_entry(s) for s in returned]  # sorted by seq: already a heap
            level.fifo = deque(_entry(s) for s in fifo)
            for e in (*level.returned, *level.fifo):
                q.ready_count += 1
                q.ready_bytes += e.message.size
        for s in snap.held:
            e = _entry(s)
            q.unacked[e.seq] = e
            q.unacked_bytes += e.message.size
        for sc in snap.consumers:
            c = _Consumer(sc.consumer_id, sc.tag, sc.prefetch, sc.priority, sc.no_ack, sc.status, sc.ahead)
            c.checked_out = dict(sc.checked_out)
            c.last_msg_id = sc.last_msg_id
            self.consumers[c.consumer_id] = c
        self._rings = PriorityRings.restore(snap.groups)
        self.active_id = snap.active_id
        self.next_msg_id = snap.next_msg_id
        for s in snap.dlx_pending:
            e = _entry(s)
            self.dlx_pending[e.seq] = e
            self.dlx_bytes += e.message.size
        self.publishers = {p: _Publisher(last, list(rej), dict(ahead)) for p, last, rej, ahead in snap.publishers}
        self.rejecting = snap.rejecting
        self.clock_ms = snap.clock_ms
        self.last_used_ms = snap.last_used_ms
        self.expired_notified = snap.expired_notified
        self.deleted = snap.deleted
        return self


_HANDLERS = {
    Enqueue: QuorumQueueState._enqueue, Checkout: QuorumQueueState._checkout, Cancel: QuorumQueueState._cancel,
    Settle: QuorumQueueState._settle, Return: QuorumQueueState._return, Discard: QuorumQueueState._discard,
    NodeDown: QuorumQueueState._node_down, NodeUp: QuorumQueueState._node_up, Purge: QuorumQueueState._purge,
    Tick: QuorumQueueState._tick, Get: QuorumQueueState._get, Configure: QuorumQueueState._configure,
    DeadLetterSettled: QuorumQueueState._dead_letter_settled, PublisherGone: QuorumQueueState._publisher_gone,
    Touch: QuorumQueueState._touch, Delete: QuorumQueueState._delete, Resend: QuorumQueueState._resend,
}


def _checked_out_seqs(c: _Consumer, msg_ids: list[int]) -> list[int]:
    """The queue seqs of the deliveries named, taken from what the consumer holds (an id it
    does not hold — already settled, or from another delivery — is skipped)."""
    return [seq for seq in (c.checked_out.pop(i, None) for i in msg_ids) if seq is not None]


def _dead_message(e: Entry) -> DeadMessage:
    m = e.message
    exchange, routing_key, props, body = m.held or _IN_LOG
    return DeadMessage(e.seq, exchange, routing_key, props, body, m.persistent, e.delivery_count, m.index)


# ---- snapshot format (msgpack arrays; append fields only, bump SNAPSHOT_VERSION otherwise)


class _SnapEntry(msgspec.Struct, array_like=True, frozen=True, gc=False):
    seq: int
    exchange: str
    routing_key: str
    props: bytes
    body: bytes
    persistent: bool
    priority: int
    expiration_ms: int | None
    delivery_count: int
    expires_at_ms: int | None
    # version 3: the log index of the message's Enqueue, and its size when the content is left
    # out (in the log, or a digest); -1: the content is here
    index: int = 0
    size: int = -1


class _SnapConsumer(msgspec.Struct, array_like=True, frozen=True, gc=False):
    consumer_id: str
    tag: str
    prefetch: int
    priority: int
    no_ack: bool
    status: int
    checked_out: list[tuple[int, int]]
    ahead: int = 0  # absent from snapshots written before it
    last_msg_id: int = 0  # absent from snapshots written before it (the next delivery names 0 then)


class _Snapshot(msgspec.Struct, array_like=True, frozen=True, gc=False):
    version: int
    config: QuorumConfig
    next_seq: int
    returned: list[_SnapEntry]
    fifo: list[_SnapEntry]
    held: list[_SnapEntry]
    consumers: list[_SnapConsumer]
    groups: list[tuple[int, list[str]]]
    active_id: str | None
    next_msg_id: int
    dlx_pending: list[_SnapEntry]
    publishers: list[tuple[str, int, list[int], list[tuple[int, bool]]]]
    rejecting: bool
    clock_ms: int
    last_used_ms: int | None
    expired_notified: bool
    deleted: bool
    # version 2
    high_returned: list[_SnapEntry] = []
    high_fifo: list[_SnapEntry] = []
    dequeue_counter: int = 0


_snapshot_decoder = msgspec.msgpack.Decoder(_Snapshot)


def _snap_entry(e: Entry, form: int, read: Callable[[int], tuple] | None) -> _SnapEntry:
    m = e.message
    if form == SNAP_DIGEST or (m.held is None and form == SNAP_STORED):
        return _SnapEntry(e.seq, "", "", b"", b"", m.persistent, m.priority, m.expiration_ms, e.delivery_count,
                          e.expires_at_ms, m.index, m.size)
    exchange, routing_key, props, body = m.held if m.held is not None else read(m.index)
    return _SnapEntry(e.seq, exchange, routing_key, props, body, m.persistent, m.priority, m.expiration_ms,
                      e.delivery_count, e.expires_at_ms, m.index)


def _entry(s: _SnapEntry) -> Entry:
    if s.size >= 0:  # the content is in the log
        m = LoggedMessage(s.index, s.size, s.persistent, s.priority, s.expiration_ms)
    else:
        m = LoggedMessage(s.index, len(s.body), s.persistent, s.priority, s.expiration_ms,
                          (s.exchange, s.routing_key, s.props, s.body))
    e = Entry(s.seq, m, s.expires_at_ms)
    e.delivery_count = s.delivery_count
    return e
