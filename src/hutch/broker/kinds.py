"""The broker's part of each queue type: how a queue.declare becomes a catalogue record, how a
committed record becomes this node's handle for the queue, and how the handle goes when the
record does.

A queue type is two registrations. Its `QueueType` (`hutch.queues.handle`: the name
`x-queue-type` spells, its capabilities) says what it can do; its `Kind` here connects it to
this node: classic queues below, quorum queues in `hutch.broker.quorumq` next to the port the
quorum host uses. `hutch.broker.operations` (declare over AMQP and HTTP) and
`hutch.broker.topology` (the catalogue applied) ask `kind(name)` instead of testing types.

Must never: do I/O, or decide placement itself (the cluster side and the type's own placement
module do).
"""

from __future__ import annotations

from typing import Any, Protocol

from hutch.cluster import catalogue as cat
from hutch.cluster.remote import RemoteQueue
from hutch.queues.handle import CLASSIC

KINDS_MAX = 16  # as the type registry's QUEUE_TYPES_MAX


class Kind(Protocol):
    name: str

    def declare_command(self, cl: Any, vhost: str, name: str, *, durable: bool, exclusive: bool,
                        auto_delete: bool, args: dict, owner: Any, node: str | None,
                        journal_id: int) -> cat.DeclareQueue:
        """The catalogue record of a new queue: its type's own checks of the arguments (a 406
        when they fail), then where it lives. `node`: the home an HTTP PUT asked for;
        `journal_id`: a fresh random id for its records on disk, if it keeps any."""

    def apply_record(self, topo: Any, v: Any, rec: cat.QueueRecord, cur: Any, declared: bool) -> None:
        """Make this node's handle for a committed record (`cur`: the handle it has now, of
        this type, or None)."""

    def drop(self, topo: Any, q: Any, keep_bindings: bool) -> None:
        """The record is gone (or the queue moved: `keep_bindings`): remove this node's handle."""


_KINDS: dict[str, Kind] = {}


def register_kind(k: Kind) -> Kind:
    if k.name not in _KINDS and len(_KINDS) >= KINDS_MAX:
        raise ValueError(f"more than {KINDS_MAX} queue kinds")
    _KINDS[k.name] = k
    return k


def kind(name: str) -> Kind:
    k = _KINDS.get(name)
    if k is None:
        raise KeyError(f"no queue kind {name!r} registered on this node")
    return k


def _ignore(_result: cat.Result) -> None:
    return None


class GroupKind:
    """A type whose queues each have a Raft group (quorum queues, streams): a handle on every
    node, made and dropped by the type's host (`host(cl)`: `make_handle`, `members_changed`,
    `drop_handle`), the group's id in the record's `journal_id`."""

    name = ""

    def host(self, cl: Any) -> Any:
        raise NotImplementedError

    def apply_record(self, topo: Any, v: Any, rec: cat.QueueRecord, cur: Any, declared: bool) -> None:
        host = self.host(topo.cl)
        if cur is not None and cur.gid == rec.journal_id:
            if tuple(rec.member_nodes) != cur.members:
                host.members_changed(cur, tuple(rec.member_nodes))
            return
        if cur is not None:  # the same name declared again: another group
            topo.drop_queue(cur)
        handle = host.make_handle(rec, declared)
        if handle is not None:
            v.queues[rec.name] = handle
            v.topology_changed()

    def drop(self, topo: Any, q: Any, keep_bindings: bool) -> None:
        v = topo.cl.broker.vhosts.get(q.vhost)
        if v is not None and v.queues.get(q.name) is q:
            del v.queues[q.name]
            v.remove_bindings_of_queue(q.name)
        self.host(topo.cl).drop_handle(q)


class ClassicKind:
    """Classic queues: a `ClassicQueue` on the home node (its mirrors and leader side attached by
    the mirroring host), a `RemoteQueue` on every other node."""

    name = CLASSIC.name

    def declare_command(self, cl: Any, vhost: str, name: str, *, durable: bool, exclusive: bool,
                        auto_delete: bool, args: dict, owner: Any, node: str | None,
                        journal_id: int) -> cat.DeclareQueue:
        home = node or cl.choose_home(args, exclusive, vhost, name)
        return cat.DeclareQueue(vhost, name, cat.CLASSIC, bool(durable), bool(auto_delete),
                                cl.owner_id(owner) if exclusive else None, dict(args), home,
                                () if exclusive else cl.initial_mirrors(vhost, name, home),
                                journal_id if durable and not exclusive else 0,
                                cl.incarnation if home == cl.node else 0)

    def apply_record(self, topo: Any, v: Any, rec: cat.QueueRecord, cur: Any, declared: bool) -> None:
        cl = topo.cl
        b = cl.broker
        here = rec.leader_node == cl.node
        if cur is not None:
            remote = not cur.local
            if here and remote and (rec.vhost, rec.name) in cl.mirroring.mirrors:
                if not cl.mirroring.become_leader(rec, cur):
                    cur.home_node = rec.leader_node  # until the old leader has left the ring
                    return
                new = v.queues.get(rec.name)
                if new is not cur and new is not None and new.local:
                    cl.mirroring.record_changed(rec, new)
                    return
            if (not remote) == here:
                if remote:
                    cur.mirrored = bool(rec.member_nodes)
                    if cur.home_node != rec.leader_node:
                        cl._leader_moved(cur, rec.leader_node)
                cl.mirroring.record_changed(rec, cur)
                return
            topo.drop_queue(cur, keep_bindings=True)
        if here:
            transient = not rec.durable or rec.exclusive_owner is not None
            if transient and rec.home_incarnation not in (0, cl.incarnation):
                # a non-durable or exclusive queue of an earlier run of this node: gone with it
                cl.submit(cat.DeleteQueue(rec.vhost, rec.name), _ignore)
                return
            owner = None
            if rec.exclusive_owner is not None:
                owner = cl.owners.get(rec.exclusive_owner)
                if owner is None or owner.closed:
                    # its connection is gone already: the queue goes too
                    cl.submit(cat.DeleteQueue(rec.vhost, rec.name), _ignore)
                    return
            q = b.declare_queue(v, rec.name, durable=rec.durable, exclusive=rec.exclusive_owner is not None,
                                auto_delete=rec.auto_delete, arguments=dict(rec.arguments), owner=owner)
            q.journal_id = rec.journal_id if rec.durable and rec.exclusive_owner is None else 0
            b.adopt_journalled(q)
        else:
            q = v.queues[rec.name] = RemoteQueue(cl, rec)
            v.topology_changed()
        cl.mirroring.record_changed(rec, q)

    def drop(self, topo: Any, q: Any, keep_bindings: bool) -> None:
        cl = topo.cl
        b = cl.broker
        if not q.local:
            if not keep_bindings:
                cl.mirroring.queue_gone(q.vhost, q.name)  # the mirror here goes with the queue
            q.deleted = True
            v = b.vhosts.get(q.vhost)
            if v is not None and v.queues.get(q.name) is q:
                del v.queues[q.name]
                if not keep_bindings:
                    v.remove_bindings_of_queue(q.name)
            for c in list(q.local_consumers.values()):
                q.local_consumers.pop(c.ref, None)
                cl.consumers.pop(c.ref, None)
                cl._cancel_local(c)
            return
        for key in [k for k, (pq, _p) in cl.proxies.items() if pq is q]:
            del cl.proxies[key]
        target = cl.migrations.get((q.vhost, q.name))
        if target is not None:  # messages that arrived since the move: they go on, unconfirmed
            q.page_in_all()  # (a migrating queue does not page; this keeps it so if that changes)
            for e in list(q.state.ready()):
                cl.quorum.publish(target, e.message, None, 0)
        if q.mirror is not None and keep_bindings:  # led elsewhere now (deleted: delete_queue drops it)
            cl.mirroring.drop_leader(q.mirror)
        b.delete_queue(q, propose=False, keep_bindings=keep_bindings)


register_kind(ClassicKind())
