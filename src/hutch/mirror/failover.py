"""What a mirrored queue's consumers on other nodes do when its leader changes (seed 000,
"Mirrored queue consumers and failover"): each follows the new leader, or is cancelled if it
asked for `x-cancel-on-ha-failover`. Their unacknowledged deliveries from the old leader settle
nothing any more: the new leader requeued those messages and delivers them again, marked
redelivered, so a late ack must not settle the next delivery.

Three cases, all on a node that is not the old leader:

- the leader moved to another node (`leader_moved`): consumers here attach to it again
  (`reattach`). The new leader may not have applied its promotion yet when asked, so a
  "not found" answer is retried `REATTACH_TRIES` times, `REATTACH_DELAY_S` apart, before the
  consumer is cancelled;
- a mirror on this node was promoted (`leader_here`): consumers here become local consumers
  of the promoted queue;
- the old leader came back unpromoted (a partition healed): consumers attach to it again.

The decisions live here. The broker carries them out through `FailoverSide`: forgetting a
channel's deliveries, cancelling or adopting a consumer, and sending the consume request.
Must never: import anything from `hutch.broker` or above, or touch a channel's fields itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from hutch.amqp import spec
from hutch.cluster.remote import Consume

log = logging.getLogger("hutch.cluster")

REATTACH_TRIES = 100
REATTACH_DELAY_S = 0.05  # between tries to attach a consumer to a promoted mirror that is not ready yet


def cancel_on_failover(arguments: dict) -> bool:
    v = (arguments or {}).get("x-cancel-on-ha-failover")
    return v is True or v == 1


class FailoverSide(Protocol):
    """The broker side of a mirrored queue's remote consumers (`hutch.broker.cluster.ClusterBroker`)."""

    consumers: dict[int, Any]  # cid -> this node's consumer of a queue led elsewhere

    def is_up(self, node: str) -> bool: ...
    def send(self, peer: str, payload: Any) -> bool: ...
    def expect_reply(self, rid: int, peer: str, callback: Callable[[Any], None]) -> None: ...
    def forget_unacked(self, channel: Any, q: Any) -> None: ...
    def cancel_consumer(self, c: Any) -> None: ...
    def adopt_consumer(self, c: Any, q: Any) -> None: ...
    def redirect_publishes(self, vhost: str, name: str, old_home: str) -> None: ...
    def retry_orphans(self) -> None: ...


class Failover:
    """See the module docstring. `now_s` is the broker's clock in seconds."""

    def __init__(self, side: FailoverSide, now_s: Callable[[], float]):
        self.side = side
        self.now_s = now_s
        # (when, queue, consumer, tries): at most one per consumer of a mirrored queue led elsewhere
        self._due: list[tuple[float, Any, Any, int]] = []

    def leader_here(self, cur: Any, q: Any) -> None:
        """A mirror here was promoted: this node's consumers of the queue (`cur`, the handle of
        the queue as led elsewhere) attach to the promoted queue `q` directly."""
        side = self.side
        cur.deleted = True
        side.redirect_publishes(q.vhost, q.name, cur.home_node)
        for c in list(cur.local_consumers.values()):
            cur.local_consumers.pop(c.ref, None)
            side.consumers.pop(c.ref, None)
            side.forget_unacked(c.channel, cur)
            if cancel_on_failover(c.arguments) or c.channel.closed:
                side.cancel_consumer(c)
                continue
            side.adopt_consumer(c, q)

    def leader_moved(self, q: Any, new_home: str) -> None:
        """The queue, led elsewhere, has a new leader on another node."""
        side = self.side
        old = q.home_node
        q.home_node = new_home
        q.mirror_nodes, q.synced_nodes = [], []  # until the new leader reports them
        side.redirect_publishes(q.vhost, q.name, old)
        log.info("Mirrored queue '%s' in vhost '%s': leader moved from %s to %s", q.name, q.vhost, old, new_home)
        for c in list(q.local_consumers.values()):
            side.forget_unacked(c.channel, q)
            if cancel_on_failover(c.arguments) or c.channel.closed:
                q.local_consumers.pop(c.ref, None)
                side.consumers.pop(c.ref, None)
                side.cancel_consumer(c)
                continue
            self.reattach(q, c)
        side.retry_orphans()

    def reattach(self, q: Any, c: Any, tries: int = 0) -> None:
        """Attach a consumer to its queue's (new) leader."""
        assert 0 <= tries <= REATTACH_TRIES, tries
        side = self.side
        c.received = 0
        if not side.is_up(q.home_node) or q.deleted:
            return

        def answered(result: Any) -> None:
            if result is not None and result[0] == spec.NOT_FOUND and tries < REATTACH_TRIES and not q.deleted:
                self._due.append((self.now_s() + REATTACH_DELAY_S, q, c, tries + 1))
                return
            if result is None or result[0] != 200:
                if q.local_consumers.pop(c.ref, None) is not None:
                    side.consumers.pop(c.ref, None)
                    side.cancel_consumer(c)
        side.expect_reply(c.ref, q.home_node, answered)
        side.send(q.home_node, Consume(c.ref, q.vhost, q.name, c.tag, c.no_ack, c.exclusive, c.priority, c.prefetch,
                                       c.arguments))

    def peer_up(self, peer: str) -> None:
        """A queue's leader is back, unpromoted: its consumers here attach to it again."""
        for c in list(self.side.consumers.values()):
            if c.queue.home_node == peer and c.queue.mirrored:
                self.reattach(c.queue, c)

    def tick(self, now_s: float) -> None:
        if self._due:
            due, self._due = self._due, []
            for at, q, c, tries in due:
                if at > now_s:
                    self._due.append((at, q, c, tries))
                elif self.side.consumers.get(c.ref) is c:
                    self.reattach(q, c, tries)
