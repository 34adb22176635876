"""The broker's side of quorum queues: the consumer object a channel holds for one, the entry
its unacknowledged deliveries keep, and `BrokerQuorumPort`, the few broker services the quorum
host (`hutch.quorum.host`) may use: time, policies, dead-lettering, the loop, publisher
windows and confirms, and delivering to a consumer's channel.

Everything about how a quorum queue works (Raft groups, proposals, the state machine's
effects) lives in `hutch.quorum`; this module only connects it to channels and sessions.
Must never: decide anything about a quorum queue (what to propose, to whom, when).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from hutch.amqp.spec import precondition_failed
from hutch.broker import msgstats
from hutch.broker.channel import ChannelConsumer
from hutch.broker.kinds import GroupKind, register_kind
from hutch.cluster import catalogue as cat
from hutch.quorum import fifo, placement
from hutch.quorum.handle import QUORUM, QuorumQueue


class ClusterSide(Protocol):
    """What the port uses of the node's cluster glue (`hutch.broker.cluster.ClusterBroker`)."""

    broker: Any
    catalogue: cat.Catalogue
    node: str

    def window_add(self, session: Any) -> None: ...
    def window_done(self, session: Any) -> None: ...
    def output(self, session: Any) -> None: ...
    def submit(self, cmd: cat.Command, callback: Any) -> None: ...
    def running_nodes(self) -> list[str]: ...
    def quorum_leader(self, rec: cat.QueueRecord) -> str | None: ...
    def _cancel_local(self, c: Any) -> None: ...

DEFAULT_GROUP_SIZE = placement.DEFAULT_GROUP_SIZE


class BrokerQuorumPort:
    """`hutch.quorum.host.QuorumPort` on a broker: the host's only way into it. The hot-path
    services are the broker's bound methods themselves (no extra call per message)."""

    def __init__(self, cl: ClusterSide):
        self.cl = cl
        b = cl.broker
        self.broker = b
        self.now_ms = b.now_ms
        self.schedule = b.schedule
        self.queue_settings = b.queue_settings
        self.dead_letter = b.dead_letter
        self.window_add = cl.window_add
        self.new_stats = msgstats.new

    def metadata_timeout_ms(self) -> int:
        return self.broker.config.metadata_timeout_ms

    def dirty(self, q: QuorumQueue) -> None:
        self.broker.dirty_queues.add(q)

    def call_later(self, delay_ms: int, fn: Callable[[], None]) -> bool:
        """Call `fn` in `delay_ms` (False: this broker has no timer)."""
        later = self.broker.call_later
        if later is None:
            return False
        later(delay_ms / 1000, fn)
        return True

    def delete_queue(self, vhost: str, name: str) -> None:
        self.cl.submit(cat.DeleteQueue(vhost, name), lambda _r: None)

    def cancel_local(self, consumer: ChannelConsumer) -> None:
        self.cl._cancel_local(consumer)

    def publish_answered(self, ch: Any, session: Any, seq: int, accepted: bool) -> None:
        """A publish the queue decided: the session's window moves on, the channel confirms."""
        cl = self.cl
        if session is not None:
            cl.window_done(session)
        if seq and ch is not None and not ch.closed:
            if accepted:
                ch.accepted(seq)
            else:
                ch.nack_publish(seq)
            cl.output(session)

    def deliver(self, c: ChannelConsumer, q: QuorumQueue, msg_id: int, delivery_count: int, redelivered: bool,
                route: bytes, props: bytes, body: bytes) -> None:
        ch = c.channel
        # the state machine's delivery_count counts earlier deliveries; the channel's this one too
        ch.deliver_held(c, q, msg_id, delivery_count + 1, redelivered, route, props, body)
        self.cl.output(ch.session)


def place_members(cl: ClusterSide, args: dict, name: str, vhost: str) -> tuple[str, tuple[str, ...]]:
    """The leader and members of a new quorum queue declared on this node (hutch.quorum.placement)."""
    return placement.place_members(cl.catalogue, cl.running_nodes(), cl.node, args, name, vhost,
                                   leader_of=cl.quorum_leader)


class QuorumKind(GroupKind):
    """Quorum queues: a `QuorumQueue` handle on every node, made and dropped by the quorum host."""

    name = QUORUM.name

    def declare_command(self, cl: ClusterSide, vhost: str, name: str, *, durable: bool, exclusive: bool,
                        auto_delete: bool, args: dict, owner: Any, node: str | None,
                        journal_id: int) -> cat.DeclareQueue:
        try:
            fifo.quorum_config(args, name, vhost, durable=durable, exclusive=exclusive, auto_delete=auto_delete)
        except fifo.QuorumArgumentError as e:
            raise precondition_failed(e.text) from None
        leader, members = place_members(cl, args, name, vhost)
        if node is not None and node in members:
            leader = node  # an HTTP PUT's "node": the member that starts as leader
        return cat.DeclareQueue(vhost, name, cat.QUORUM, True, False, None, dict(args), leader, members, journal_id)

    def host(self, cl: Any) -> Any:
        return cl.quorum


register_kind(QuorumKind())
