"""Where a mirrored classic queue's replicas belong, from the policy that applies to it.

A pure function of the policy definition and the cluster as the catalogue leader sees it:
which nodes are members, which of them are running, where the queue's leader and mirrors
are now. The catalogue leader compares its answer with the queue's record and commits the
difference (`SetQueueNodes`); every node then starts or stops its replica to match.

The modes follow RabbitMQ's (seed 000, "Queue Arguments that Control Mirroring"):

- ``all``: a mirror on every running node; a node that joins or starts gets one.
- ``exactly`` with a count: that many replicas in all (count 1 = the leader alone). Existing
  mirrors on running nodes are kept; a node that goes down has its mirror replaced on another
  running node; with fewer nodes than the count, every node.
- ``nodes`` with a list of names: a mirror on each listed node that is running. Names that are
  not cluster members are ignored. A leader that is not listed stays until a listed mirror is
  synchronised (the caller decides that: `leader_move` names the mirror to hand over to).

Exclusive queues are never mirrored: the caller does not ask.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MANUAL = "manual"
AUTOMATIC = "automatic"
WHEN_SYNCED = "when-synced"
ALWAYS = "always"
SYNC_BATCH_SIZE = 4096  # mirroring_sync_batch_size's default


@dataclass(frozen=True, slots=True)
class MirrorParams:
    """The ha-* keys of the policy that applies to a queue (None: the queue is not mirrored)."""

    mode: str
    params: Any
    sync_mode: str = MANUAL
    sync_batch_size: int | None = None  # None: the node's mirroring_sync_batch_size
    promote_on_shutdown: str = WHEN_SYNCED
    promote_on_failure: str = ALWAYS
    sync_background: bool | None = None  # hutch's ha-sync-background; None: the node's mirroring_sync_background


def params_of(definition: Mapping[str, Any] | None) -> MirrorParams | None:
    """The mirroring settings of a policy definition (already validated), or None."""
    if not definition or "ha-mode" not in definition:
        return None
    return MirrorParams(
        mode=definition["ha-mode"], params=definition.get("ha-params"),
        sync_mode=definition.get("ha-sync-mode", MANUAL),
        sync_batch_size=definition.get("ha-sync-batch-size"),
        promote_on_shutdown=definition.get("ha-promote-on-shutdown", WHEN_SYNCED),
        promote_on_failure=definition.get("ha-promote-on-failure", ALWAYS),
        sync_background=definition.get("ha-sync-background"))


def mirrors_for(params: MirrorParams | None, leader: str, mirrors: Iterable[str], members: Iterable[str],
                running: Iterable[str]) -> tuple[str, ...]:
    """The mirror nodes the queue should have (the leader excluded), in a stable order:
    existing mirrors first, in their order, then new ones by name."""
    current = [m for m in mirrors if m != leader]
    up = set(running) & set(members)
    if params is None:
        return ()
    if params.mode == "all":
        want = up - {leader}
        return tuple([m for m in current if m in want] + sorted(want - set(current)))
    if params.mode == "exactly":
        count = max(int(params.params) - 1, 0)
        keep = [m for m in current if m in up][:count]
        extra = sorted(up - set(keep) - {leader})
        return tuple(keep + extra[:count - len(keep)])
    listed = [n for n in params.params if n in up]
    return tuple([m for m in current if m in listed] + [n for n in listed if n not in current and n != leader])


def leader_move(params: MirrorParams | None, leader: str, synchronised: Iterable[str]) -> str | None:
    """For `nodes` mode: the synchronised mirror to hand the queue to when its leader is not
    listed (None: keep the leader, for now or for good)."""
    if params is None or params.mode != "nodes" or leader in params.params:
        return None
    for n in params.params:
        if n in set(synchronised):
            return n
    return None


def declare_node(params: MirrorParams | None, declaring: str, running: Iterable[str]) -> str:
    """Where a new queue's leader goes under a `nodes` policy: the declaring client's node if
    it is listed or if no listed node is running (seed 000), else the first listed running one."""
    if params is None or params.mode != "nodes" or declaring in params.params:
        return declaring
    up = set(running)
    for n in params.params:
        if n in up:
            return n
    return declaring
