"""The contract between the broker and a kind of queue: what a channel, a session and the
management API may ask of any queue, whatever keeps its messages.

RabbitMQ made this move when it added quorum queues (`rabbit_queue_type`, 3.8): the channel
talks to one behaviour and each queue type implements it. There the callbacks return
*actions* for the channel to carry out. Here the client operations answer through a `reply`
callback (or at once), and a queue hands a delivery to the consumer object it was given
(`can_take`/`deliver`, or the channel's `deliver_held`): the same separation without one
action object per message, which measured 0.2 us of the 5.7 us a message costs the broker.
hutch has three implementations of `QueueHandle`:

| handle | where | what it is |
|---|---|---|
| `hutch.queues.classic.ClassicQueue` | the queue's home node | a classic queue (and, with a `Leader` attached, a mirrored one's leader side, `hutch.mirror.host`) |
| `hutch.cluster.remote.RemoteQueue` | every other node | a classic queue homed on another node, reached over the peer protocol |
| `hutch.quorum.handle.QuorumQueue` | every node | a quorum queue: commands proposed to its Raft group's leader |

The read side is `figures()`: one `Figures` record (ready, unacknowledged, their bytes,
consumers) that listings, statistics and Prometheus read, the same for every type. The type
itself is a `QueueType` in the registry (`register`, `queue_type`): its name as
`x-queue-type` spells it and what it can do (`capabilities`), so code that must differ by type
asks for a capability instead of testing which class it holds.

Must never: import anything outside `hutch.queues`, do I/O, or check a handle's type with
isinstance on a per-message path (the registry is read at declare time and by listings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

QUEUE_TYPES_MAX = 16  # kinds of queue one node knows; a registry, not client input

# capabilities a queue type may have
PRIORITIES = "priorities"  # x-max-priority
SINGLE_ACTIVE_CONSUMER = "single-active-consumer"
GLOBAL_QOS = "global-qos"  # basic.qos global=true with its consumers
EXCLUSIVE = "exclusive"  # exclusive (connection-owned) queues
NON_DURABLE = "non-durable"
AUTO_DELETE = "auto-delete"
SERVER_NAMED = "server-named"  # queue.declare with an empty name: the broker names it
MIRRORING = "mirroring"  # ha-* policies apply
REPLICATED = "replicated"  # kept by a Raft group (membership, quorum status)


class Figures:
    """A queue's counts as listings show them. For a queue led on another node they are what
    its leader last reported (every second)."""

    __slots__ = ("ready", "unacked", "ready_bytes", "unacked_bytes", "consumers", "paged", "paged_bytes")

    def __init__(self, ready: int, unacked: int, ready_bytes: int, unacked_bytes: int, consumers: int,
                 paged: int | None = 0, paged_bytes: int = 0):
        assert ready >= 0 and unacked >= 0 and consumers >= 0, (ready, unacked, consumers)
        assert paged is None or 0 <= paged <= ready, (paged, ready)
        self.ready = ready
        self.unacked = unacked
        self.ready_bytes = ready_bytes
        self.unacked_bytes = unacked_bytes
        self.consumers = consumers
        # ready messages whose bodies are on disk, not in memory (hutch.queues.paging); None
        # when not known here (a queue led on another node)
        self.paged = paged
        self.paged_bytes = paged_bytes

    @property
    def messages(self) -> int:
        return self.ready + self.unacked

    @property
    def message_bytes(self) -> int:
        return self.ready_bytes + self.unacked_bytes

    def __repr__(self) -> str:
        return (f"Figures(ready={self.ready}, unacked={self.unacked}, bytes={self.ready_bytes}+"
                f"{self.unacked_bytes}, consumers={self.consumers})")


# ---------------------------------------------------------------- client operations

class _Pending:
    """What an operation returns when its answer comes later, through its `reply` callback."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PENDING"


PENDING = _Pending()


class HeldEntry:
    """A channel's unacknowledged delivery from a queue whose messages live elsewhere (a
    queue homed on another node, a quorum queue's Raft group): `seq` is the queue's own id for
    the message, `delivery_count` counts this delivery (1: the first). A classic queue homed
    here gives the channel its own `Entry` instead; both have `seq`, `log_seq` and
    `delivery_count`."""

    __slots__ = ("seq", "log_seq", "delivery_count")

    def __init__(self, seq: int, delivery_count: int):
        assert delivery_count >= 1, f"delivery {seq}: a delivery count counts this delivery"
        self.seq = seq
        self.log_seq = 0  # never in this node's journal
        self.delivery_count = delivery_count


class Got:
    """A basic.get's answer, whatever the queue's type: what the channel keeps until it is
    acknowledged (`entry`), and what goes to the client in get-ok."""

    __slots__ = ("entry", "redelivered", "route", "props", "body", "message_count")

    def __init__(self, entry: Any, redelivered: bool, route: bytes, props: bytes, body: bytes, message_count: int):
        self.entry = entry
        self.redelivered = redelivered
        self.route = route
        self.props = props
        self.body = body
        self.message_count = message_count


# ---------------------------------------------------------------- the handle

class QueueHandle(Protocol):
    """A queue as the broker holds it in a vhost. Settling takes the sequence number the
    queue gave the delivery (`entry.seq` of the channel's unacknowledged entry)."""

    name: str
    vhost: str
    queue_type: str  # the registry's name: "classic", "quorum"
    local: bool  # this node's object holds the messages (a classic queue homed here); else they are elsewhere
    durable: bool
    auto_delete: bool
    arguments: dict
    deleted: bool
    mstats: list[int]

    @property
    def home_node(self) -> str | None: ...

    def figures(self) -> Figures: ...

    @property
    def message_count(self) -> int: ...

    @property
    def consumer_count(self) -> int: ...

    def check_up(self) -> None: ...

    def settle(self, seq: int) -> Any: ...

    def requeue(self, seq: int) -> Any: ...

    def discard(self, seq: int) -> Any: ...

    def add_consumer(self, c: Any) -> None: ...

    def remove_consumer(self, c: Any) -> bool: ...

    def consumers(self) -> list[Any]: ...

    def active_consumer(self) -> Any: ...

    def has_exclusive_consumer(self) -> bool: ...

    def dispatch(self) -> int: ...

    # Client operations. Each answers at once (returns the answer) or later: it returns
    # PENDING and calls reply(answer) exactly once (it may do so before returning). An answer
    # that is an exception is the error the client gets (an AMQP error from the type's layer).

    def stat(self, reply: Callable[[Any], None]) -> Any:
        """(message_count, consumer_count) for queue.declare-ok."""

    def purge(self, reply: Callable[[Any], None]) -> Any:
        """How many ready messages the purge removed."""

    def get(self, no_ack: bool, reply: Callable[[Any], None]) -> Any:
        """basic.get: a `Got`, or None when the queue is empty."""

    def consume(self, c: Any, reply: Callable[[Any], None]) -> Any:
        """Attach the consumer `c` (the channel's consumer object; the type may set `c.ref`):
        None once it is attached. The channel then sends consume-ok, or, when the channel
        closed or the queue went meanwhile, calls `remove_consumer(c)`."""


class GroupHandle:
    """What the handles of queues kept by a Raft group (quorum queues, streams) share: the
    group's leader is the queue's home, and operations wait for a leader rather than failing
    at once. The handle has `host` (with `leader_of` and `peers`), `members` and
    `declared_leader`."""

    host: Any
    members: tuple[str, ...]
    declared_leader: str

    @property
    def home_node(self) -> str:
        return self.host.leader_of(self) or self.declared_leader

    def online(self) -> list[str]:
        return [n for n in self.members if self.host.peers.is_up(n)]

    def check_up(self) -> None:
        return None  # operations wait for a leader (and time out) rather than failing at once


# ---------------------------------------------------------------- the registry

class QueueType:
    """One kind of queue: its `x-queue-type` name, what it can do, and the name RabbitMQ's
    error texts give its module (`rabbit_classic_queue`, `rabbit_quorum_queue`)."""

    __slots__ = ("name", "capabilities", "module")

    def __init__(self, name: str, capabilities: Iterable[str], module: str = ""):
        self.name = name
        self.capabilities = frozenset(capabilities)
        self.module = module or f"rabbit_{name}_queue"

    def can(self, capability: str) -> bool:
        return capability in self.capabilities

    def holds(self, durable: bool, exclusive: bool, auto_delete: bool) -> bool:
        """Whether a queue of this type can have these properties (a vhost's default queue type
        applies only to a declare it can hold, as RabbitMQ's augment_declare_args)."""
        return ((durable or self.can(NON_DURABLE)) and (not exclusive or self.can(EXCLUSIVE))
                and (not auto_delete or self.can(AUTO_DELETE)))

    def __repr__(self) -> str:
        return f"QueueType({self.name!r})"


_REGISTRY: dict[str, QueueType] = {}


def register(qt: QueueType) -> QueueType:
    """Make a queue type known (once per name; registering the same name again replaces it)."""
    if qt.name not in _REGISTRY and len(_REGISTRY) >= QUEUE_TYPES_MAX:
        raise ValueError(f"more than {QUEUE_TYPES_MAX} queue types")
    _REGISTRY[qt.name] = qt
    return qt


def queue_type(name: str) -> QueueType | None:
    return _REGISTRY.get(name)


def queue_types() -> list[str]:
    return sorted(_REGISTRY)


CLASSIC = register(QueueType("classic", (PRIORITIES, SINGLE_ACTIVE_CONSUMER, GLOBAL_QOS, EXCLUSIVE, NON_DURABLE,
                                         AUTO_DELETE, SERVER_NAMED, MIRRORING)))
