"""Where a new quorum queue's Raft group lives: how many members, which node leads first.

RabbitMQ's quorum queue guide: `x-quorum-initial-group-size` members (three by default, at most
the running nodes), placed by `x-queue-leader-locator` (or the policy's `queue-leader-locator`):
`client-local` puts the declaring node first; `balanced` (3.13; the older names `random` and
`least-leaders` mean the same here) prefers the nodes that lead and host the fewest queues.
RabbitMQ 3.13 picks at random once a cluster has more than 1000 queues, to save counting; hutch
always counts (a pass over the local catalogue), so placement stays a deterministic function.

`rebalance_plan` is `rabbitmq-queues rebalance quorum`: which queues' leadership to move, and
to which member, so that the running nodes lead about as many queues each.

A pure function of the catalogue, the running nodes and the declaring node. Must never: read
a clock, draw random numbers, do I/O, or import anything from `hutch.broker` or above.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from hutch.cluster import catalogue as cat

DEFAULT_GROUP_SIZE = 3


def place_members(catalogue: cat.Catalogue, running: list[str], node: str, args: dict, name: str,
                  vhost: str, leader_of: Callable[[cat.QueueRecord], str | None] | None = None
                  ) -> tuple[str, tuple[str, ...]]:
    """(leader, members) of a new quorum queue declared on `node` with `args`. `leader_of(rec)`:
    a queue's leader now, where known (leadership moves after a failover or a rebalance); the
    catalogue's leader otherwise."""
    nodes = running or [node]
    size = args.get("x-quorum-initial-group-size")
    size = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else DEFAULT_GROUP_SIZE
    size = min(size, len(nodes))
    locator = args.get("x-queue-leader-locator")
    if isinstance(locator, bytes):
        locator = locator.decode()
    if locator is None:
        pol = catalogue.policy_for(vhost, name, cat.QUEUE, cat.QUORUM)
        locator = pol.definition.get("queue-leader-locator") if pol is not None else None
    leaders = dict.fromkeys(nodes, 0)
    hosted = dict.fromkeys(nodes, 0)
    for rec in catalogue.queues.values():
        if rec.type == cat.QUORUM:
            leader = (leader_of(rec) if leader_of is not None else None) or rec.leader_node
            if leader in leaders:
                leaders[leader] += 1
            for m in rec.member_nodes:
                if m in hosted:
                    hosted[m] += 1
    if locator in ("balanced", "random", "least-leaders"):
        leader = min(nodes, key=lambda n: (leaders[n], hosted[n], n))
    else:
        leader = node if node in nodes else nodes[0]
    others = sorted((n for n in nodes if n != leader), key=lambda n: (hosted[n], n))
    members = (leader, *others[:size - 1])
    assert 1 <= len(members) <= len(nodes) and len(set(members)) == len(members), members
    return leader, members


def rebalance_plan(queues: Iterable[tuple[str, str, str, tuple[str, ...]]], running: list[str]
                   ) -> tuple[list[tuple[str, str, str, str]], dict[str, int]]:
    """Leadership moves that spread `queues` ((vhost, name, leader, online members)) evenly over
    the `running` nodes, as rabbit_amqqueue's rebalance does: no node should lead more than
    ceil(queues / nodes). The node leading the most gives up a queue (its queues in name
    order) to that queue's online member leading the fewest (ties: node name), while that
    member is under the ceiling. Returns (moves as (vhost, name, from, to), leaders per node
    afterwards). Queues led by a node that is not running are left alone."""
    nodes = sorted(set(running))
    led: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {n: [] for n in nodes}
    for vhost, name, leader, members in queues:
        if leader in led:
            led[leader].append((vhost, name, tuple(m for m in members if m in led and m != leader)))
    if not nodes:
        return [], {}
    total = sum(len(v) for v in led.values())
    ceiling = math.ceil(total / len(nodes))
    counts = {n: len(v) for n, v in led.items()}
    for v in led.values():
        v.sort()
    moves: list[tuple[str, str, str, str]] = []
    stuck: set[str] = set()  # nodes over the ceiling none of whose queues can move
    while True:
        over = [n for n in nodes if counts[n] > ceiling and n not in stuck]
        if not over:
            break
        src = min(over, key=lambda n: (-counts[n], n))
        for i, (vhost, name, members) in enumerate(led[src]):
            targets = [m for m in members if counts[m] < ceiling]
            if targets:
                to = min(targets, key=lambda m: (counts[m], m))
                del led[src][i]
                counts[src] -= 1
                counts[to] += 1
                moves.append((vhost, name, src, to))
                break
        else:
            stuck.add(src)
    return moves, counts
