"""Partition handling decisions: when a node pauses, and which peers it reports as partitioned.

Pure functions of what a node knows (the cluster's members, the peers it reaches now, the
peers that said they were stopping), so the runtime only carries them out. They follow
RabbitMQ 3.13 (its partitions guide and rabbit_node_monitor; seed 003 is the 4.3 guide that
retired these modes):

- pause_minority: pause while this node reaches no more than half of the members, itself
  included, and, after a partial partition (a member this node lost is still reached by a
  member it reaches: each side may see a majority, and a mirrored queue could have a leader on
  each), until every member is reachable again, as RabbitMQ's rabbit_node_monitor does;
- pause_if_all_down: pause while this node reaches none of the listed nodes (a listed node
  that is not a member does not count; when no listed node is a member, never pause; a listed
  node that is this node is always reached, so it never pauses);
- ignore and autoheal never pause.

A partition, as reported in cluster_status and /api/nodes: a member this node cannot reach
and that did not announce it was stopping (a stopped node is not running, not partitioned).

Nothing here does I/O, reads a clock or touches the broker.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

PAUSING_MODES = ("pause_minority", "pause_if_all_down")


def should_pause(mode: str, me: str, members: Collection[str], up: Collection[str],
                 watched: Iterable[str] = (), partial: bool = False) -> bool:
    """Whether a node in `mode` pauses, given the members and which of them it reaches (`up`);
    `partial`: a partial partition was detected and not every member is reachable yet."""
    reachable = {m for m in members if m == me or m in up}
    if mode == "pause_minority":
        return len(members) > 1 and (partial or len(reachable) * 2 <= len(members))
    if mode == "pause_if_all_down":
        listed = [n for n in watched if n in members]
        return bool(listed) and not any(n in reachable for n in listed)
    return False


def pause_reason(mode: str, me: str, members: Collection[str], up: Collection[str],
                 watched: Iterable[str] = (), partial: bool = False) -> str:
    """The log line's explanation of a pause (or of its end)."""
    reachable = sorted(m for m in members if m == me or m in up)
    if mode == "pause_if_all_down":
        listed = [n for n in watched if n in members]
        return f"none of the listed nodes {', '.join(listed)} is reachable"
    if partial:
        return f"a partial partition, {len(reachable)} of {len(members)} nodes reachable"
    return f"{len(reachable)} of {len(members)} nodes reachable"


def partitioned_from(me: str, members: Iterable[str], up: Collection[str], stopped: Collection[str]) -> list[str]:
    """The members `me` cannot reach, leaving out those that announced a clean stop."""
    return sorted(m for m in members if m != me and m not in up and m not in stopped)
