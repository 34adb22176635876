"""The catalogue leader's decisions, as pure functions.

The node that leads the catalogue's Raft group keeps the cluster's definitions in line with
the cluster as it finds it. `hutch.server.clustering` carries the decisions out (it proposes
the commands, logs, and remembers when it last acted); this module only decides:

- the first start of a cluster: the default vhost and user (unless definitions are imported
  at boot, as RabbitMQ's `load_definitions`), the cluster name and every member's peer address
  (`first_start_commands`);
- a node asking to join: record its address, then add it as a learner, then call it joined
  (`join_steps`);
- which down members' queues to look at, once a node has been gone for net_ticktime
  (`members_gone`), and among those queues the ones to delete: RabbitMQ's rule that a
  non-durable or exclusive queue dies with its home node, a mirrored one only when no
  running mirror is left to promote (`transient_deletions`);
- mirror placement from the ha-* policy keys (`mirror_placements`, with
  `hutch.mirror.placement` for the per-queue answer; seed 000, "Queue Arguments that Control
  Mirroring");
- refusing a stale promotion: a mirror that asks to take over from a leader the catalogue
  leader still reaches is cut off by a partition and must not (`refuse_promotion`);
- forget_cluster_node: refused for this node, a stranger or a running node; otherwise each
  queue homed on the forgotten node goes to its first mirror or is deleted
  (`forget_refusal`, `forget_commands`).

Every function takes what the leader knows (catalogue records, members, the running nodes,
this node's name, the time as a number) and returns commands or names. Nothing here does
I/O, reads a clock, logs, or mutates what it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from hutch.broker.cluster import INIT_PARAM, NODE_PARAM
from hutch.cluster import catalogue as cat
from hutch.mirror.placement import MirrorParams, leader_move, mirrors_for

INIT_RETRY_S = 2.0  # the first-start commands are proposed again if not applied by then
PLACEMENT_RETRY_S = 2.0  # a queue whose placement was just proposed is left alone this long
DELETE_RETRY_S = 5.0  # a transient queue whose deletion was just proposed is left alone this long

QueueKey = tuple[str, str]  # (vhost, queue name)


# ------------------------------------------------------------ first start


def initialisation_due(initialised: bool, now_s: float, sent_at_s: float) -> bool:
    """Whether the leader proposes the first-start commands (again) now."""
    return not initialised and now_s - sent_at_s > INIT_RETRY_S


def first_start_commands(*, default_vhost: str, default_user: str | None, password_hash: str | None,
                         load_definitions: bool, legacy: list[cat.Command] | None, cluster_name: str,
                         addresses: Mapping[str, tuple[str, int]]) -> list[cat.Command]:
    """What a new cluster's catalogue starts with. A node importing definitions at boot gets
    its vhosts and users from them (RabbitMQ's rule), and a node that kept definitions from
    before the catalogue (`legacy`) brings those instead of the defaults. The last command
    marks the catalogue initialised."""
    cmds: list[cat.Command] = [] if load_definitions else [cat.AddVhost(default_vhost)]
    if legacy is not None:
        cmds = list(legacy)
    elif default_user and not load_definitions:
        assert password_hash is not None, "a default user needs its password hash"
        cmds.append(cat.PutUser(default_user, password_hash, ("administrator",)))
        cmds.append(cat.SetPermissions(default_user, default_vhost, ".*", ".*", ".*"))
    cmds.append(cat.SetGlobalParameter("cluster_name", cluster_name))
    for n, (h, p) in sorted(addresses.items()):
        cmds.append(cat.SetGlobalParameter(NODE_PARAM + n, f"{h}:{p}"))
    cmds.append(cat.SetGlobalParameter(INIT_PARAM, True))
    return cmds


# ------------------------------------------------------------ joining

RECORD = "record"  # propose the joining node's address into the catalogue
JOINED = "joined"  # it is a member of the catalogue's group: the join is over
ADD_LEARNER = "add_learner"  # propose adding it to the group as a learner


@dataclass(frozen=True, slots=True)
class JoinStep:
    node: str
    action: str  # RECORD, JOINED or ADD_LEARNER
    command: cat.Command | None = None  # for RECORD


def join_steps(joins: Mapping[str, str], parameters: Collection[str], group_members: Collection[str]) -> list[JoinStep]:
    """The next step for each node that asked to join (`joins`: node -> its peer address),
    given the catalogue's global parameter names and the nodes in the catalogue's group."""
    steps = []
    for name, address in joins.items():
        if NODE_PARAM + name not in parameters:
            steps.append(JoinStep(name, RECORD, cat.SetGlobalParameter(NODE_PARAM + name, address)))
        elif name in group_members:
            steps.append(JoinStep(name, JOINED))
        else:
            steps.append(JoinStep(name, ADD_LEARNER))
    return steps


# ------------------------------------------------------------ nodes that are down


def members_gone(me: str, members: Iterable[str], up: Collection[str], down_since_s: Mapping[str, float],
                 started_s: float, grace_s: float, now_s: float) -> list[str]:
    """The members down for long enough that their transient queues are looked at: since they
    went down, or for `grace_s` (net_ticktime) after this node started when it never saw them."""
    gone = []
    for member in members:
        if member == me or member in up:
            continue
        if now_s >= down_since_s.get(member, started_s + grace_s):
            gone.append(member)
    return gone


def transient_deletions(node: str, records: Iterable[cat.QueueRecord], up: Collection[str],
                        deleting_s: Mapping[QueueKey, float], now_s: float) -> list[cat.QueueRecord]:
    """RabbitMQ's rule: a non-durable (or exclusive) queue whose home node `node` is gone is
    deleted; a mirrored one only when none of its mirrors is running to be promoted. A queue
    whose deletion was proposed less than DELETE_RETRY_S ago is left out."""
    out = []
    for rec in records:
        if rec.leader_node != node:
            continue
        if rec.durable and rec.exclusive_owner is None:
            continue
        if rec.exclusive_owner is None and any(n != node and n in up for n in rec.member_nodes):
            continue
        if now_s - deleting_s.get((rec.vhost, rec.name), -1e9) < DELETE_RETRY_S:
            continue
        out.append(rec)
    return out


# ------------------------------------------------------------ mirror placement


@dataclass(frozen=True, slots=True)
class Placement:
    record: cat.QueueRecord
    command: cat.SetQueueNodes
    moved_to: str | None  # the synchronised mirror that takes the leader's place (ha-mode nodes)


def mirror_placements(records: Iterable[cat.QueueRecord], members: list[str], running: list[str],
                      params_of: Callable[[str, str], MirrorParams | None],
                      synchronised_of: Callable[[str, str], Iterable[str]],
                      placing_s: Mapping[QueueKey, float], now_s: float) -> list[Placement]:
    """The classic queues whose leader or mirror nodes differ from what their policy asks for,
    each with the `SetQueueNodes` that puts it right. `params_of(vhost, name)` is the ha-*
    settings of the policy that applies (None: not mirrored); `synchronised_of(vhost, name)` the
    queue's synchronised mirrors. A queue whose leader's node is not running is left to its
    mirrors' promotion; exclusive queues are never mirrored; a queue placed less than
    PLACEMENT_RETRY_S ago is left out."""
    out = []
    for rec in records:
        if rec.type != cat.CLASSIC or rec.exclusive_owner is not None or rec.leader_node not in running:
            continue
        params = params_of(rec.vhost, rec.name)
        if params is None and not rec.member_nodes:
            continue
        if now_s - placing_s.get((rec.vhost, rec.name), -1e9) < PLACEMENT_RETRY_S:
            continue
        leader = rec.leader_node
        want = mirrors_for(params, leader, rec.member_nodes, members, running)
        move = leader_move(params, leader, synchronised_of(rec.vhost, rec.name))
        if move is not None:
            want = tuple(n for n in want if n != move)
            leader = move
        if leader == rec.leader_node and want == tuple(rec.member_nodes):
            continue
        out.append(Placement(rec, cat.SetQueueNodes(rec.vhost, rec.name, leader, want, expect_leader=rec.leader_node),
                             move))
    return out


# ------------------------------------------------------------ promotions


def refuse_promotion(cmd: cat.Command, me: str, is_up: Callable[[str], bool]) -> bool:
    """A mirror's promotion whose old leader this (catalogue leader) node still sees running:
    the mirror is cut off from it, not the other way round (a partition), so it must not take
    over, least of all once the partition heals and its retried proposal arrives."""
    if not isinstance(cmd, cat.SetQueueNodes) or not cmd.promotion:
        return False
    return cmd.expect_leader == me or is_up(cmd.expect_leader)


# ------------------------------------------------------------ forget_cluster_node


def forget_refusal(name: str, me: str, members: Collection[str], is_up: Callable[[str], bool]) -> str | None:
    """Why `name` cannot be forgotten now (None: it can)."""
    if name == me:
        return f"node {name} cannot forget itself; run forget_cluster_node on another node"
    if name not in members:
        return f"node {name} is not a member of the cluster"
    if is_up(name):
        return f"node {name} is running; stop it (hutchctl -n {name} stop_app) before forgetting it"
    return None


@dataclass(frozen=True, slots=True)
class ForgetStep:
    record: cat.QueueRecord
    command: cat.Command  # SetQueueNodes (a mirror takes over) or DeleteQueue
    promoted: str | None  # the mirror's node, for SetQueueNodes


def forget_commands(name: str, records: Iterable[cat.QueueRecord]) -> list[ForgetStep]:
    """RabbitMQ's forget_cluster_node for the classic queues homed on `name`: a mirrored one goes
    to its first mirror (which starts empty if its node is stopped: mirrors keep nothing across a
    restart); every other one is deleted. Quorum queues and streams are not deleted: the node
    leaves their groups afterwards, and their other members keep the messages
    (hutch.control.quorum.drop_forgotten_member). The node's address parameter goes last."""
    steps = []
    for rec in records:
        if rec.leader_node != name or rec.type != cat.CLASSIC:
            continue
        mirrors = [n for n in rec.member_nodes if n != name]
        if mirrors:
            steps.append(ForgetStep(rec, cat.SetQueueNodes(rec.vhost, rec.name, mirrors[0], tuple(mirrors[1:]),
                                                           expect_leader=name), mirrors[0]))
        else:
            steps.append(ForgetStep(rec, cat.DeleteQueue(rec.vhost, rec.name), None))
    return steps


def forget_parameter(name: str) -> cat.Command:
    return cat.ClearGlobalParameter(NODE_PARAM + name)


# ------------------------------------------------------------ bounded bookkeeping


def recent(stamps_s: Mapping[QueueKey, float], now_s: float, window_s: float) -> dict[QueueKey, float]:
    """The stamps younger than `window_s`: what a retry window still needs (older ones are
    dropped, so the map holds only queues acted on in the last window)."""
    return {k: t for k, t in stamps_s.items() if now_s - t < window_s}


__all__ = ["INIT_RETRY_S", "PLACEMENT_RETRY_S", "DELETE_RETRY_S", "initialisation_due", "first_start_commands",
           "JoinStep", "join_steps", "RECORD", "JOINED", "ADD_LEARNER", "members_gone", "transient_deletions",
           "Placement", "mirror_placements", "refuse_promotion", "forget_refusal", "ForgetStep", "forget_commands",
           "forget_parameter", "recent"]
