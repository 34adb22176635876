"""Where a new quorum queue's Raft group lives: how many members, which node leads first.

RabbitMQ's quorum queue guide: `x-quorum-initial-group-size` members (three by default, at most
the running nodes), placed by `x-queue-leader-locator` (or the policy's `queue-leader-locator`):
`client-local` puts the declaring node first; `balanced` (3.13; the older names `random` and
`least-leaders` mean the same here) prefers the nodes that lead and host the fewest queues.

A pure function of the catalogue, the running nodes and the declaring node. Must never: read
a clock, draw random numbers, do I/O, or import anything from `hutch.broker` or above.
"""

from __future__ import annotations

from hutch.cluster import catalogue as cat

DEFAULT_GROUP_SIZE = 3


def place_members(catalogue: cat.Catalogue, running: list[str], node: str, args: dict, name: str,
                  vhost: str) -> tuple[str, tuple[str, ...]]:
    """(leader, members) of a new quorum queue declared on `node` with `args`."""
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
            if rec.leader_node in leaders:
                leaders[rec.leader_node] += 1
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
