"""The cluster's catalogue made into this node's objects: vhosts, users and permissions,
policies, exchanges and bindings exist on every node; a queue becomes the handle its type and
its home call for (a `ClassicQueue` on its home node, a `RemoteQueue` elsewhere, a
`QuorumQueue` everywhere, with a mirrored queue's leader or mirror attached by the mirroring
host).

Every node applies the same committed catalogue commands (the metadata Raft group) and calls
`Topology.apply_command` for each; `rebuild` makes every object agree with the catalogue at
start-up or after a snapshot was installed. A change this node cannot apply is logged and
answered by a rebuild, never by stopping the node from applying its log.

Must never: propose anything but the deletion of a queue that cannot exist here any more (a
transient queue of an earlier run of this node, an exclusive queue whose connection is gone),
or do I/O.
"""

from __future__ import annotations

import logging
from typing import Any

from hutch.broker import kinds
from hutch.broker.broker import User
from hutch.broker.exchanges import Exchange
from hutch.broker.vhost import VHost
from hutch.cluster import catalogue as cat

log = logging.getLogger("hutch.cluster")

NODE_PARAM = "hutch_node:"  # global parameter per member: its peer address


def _ignore(_result: cat.Result) -> None:
    return None


class Topology:
    """Catalogue commands applied to the broker's objects; `cl` is the node's cluster side
    (hutch.broker.cluster.ClusterBroker: the broker, the catalogue, the quorum and mirroring
    hosts, the consumers and owners it tracks)."""

    def __init__(self, cl: Any):
        self.cl = cl

    def apply_command(self, cmd: cat.Command) -> cat.Result:
        res = self.cl.catalogue.apply(cmd)
        if res.status in (cat.CREATED, cat.UPDATED, cat.DELETED) or res.exchanges_deleted:
            try:
                self._materialise(cmd, res)
            except Exception:  # a bug here must not stop the node applying the log
                log.exception("cannot apply catalogue change %s on this node; rebuilding from the catalogue", cmd)
                self.rebuild()
        return res

    def _materialise(self, cmd: cat.Command, res: cat.Result) -> None:
        b = self.cl.broker
        t = type(cmd)
        if t is cat.DeclareExchange:
            v = b.vhosts.get(cmd.vhost)
            if v is not None and cmd.name not in v.exchanges:
                b.add_exchange(v, Exchange(cmd.name, cmd.type, durable=cmd.durable, auto_delete=cmd.auto_delete,
                                           internal=cmd.internal, arguments=dict(cmd.arguments)))
        elif t is cat.DeleteExchange:
            v = b.vhosts.get(cmd.vhost)
            if v is not None:
                v.remove_exchange(cmd.name)
                self._drop_exchanges(v, res.exchanges_deleted)
        elif t is cat.Bind:
            v = b.vhosts.get(cmd.vhost)
            if v is not None and cmd.source in v.exchanges:
                v.bind(cmd.source, cmd.destination_type, cmd.destination, cmd.routing_key, dict(cmd.arguments))
        elif t is cat.Unbind:
            v = b.vhosts.get(cmd.vhost)
            if v is not None:
                v.unbind(cmd.source, cmd.destination_type, cmd.destination, cmd.routing_key, dict(cmd.arguments))
                self._drop_exchanges(v, res.exchanges_deleted)
        elif t is cat.DeclareQueue or t is cat.SetQueueNodes:
            rec = self.cl.catalogue.queue(cmd.vhost, cmd.name)
            if rec is not None:
                self._make_queue(rec, declared=t is cat.DeclareQueue and res.status == cat.CREATED)
        elif t is cat.DeleteQueue:
            v = b.vhosts.get(cmd.vhost)
            q = v.queues.get(cmd.name) if v is not None else None
            if q is not None:
                self.drop_queue(q)
                self._drop_exchanges(v, res.exchanges_deleted)
        elif t in (cat.AddVhost, cat.DeleteVhost, cat.PutUser, cat.DeleteUser, cat.SetPermissions,
                   cat.ClearPermissions):
            self._sync_vhosts_and_users()
            if t is cat.DeleteVhost:
                self._sync_policies()
        elif t in (cat.SetPolicy, cat.ClearPolicy, cat.SetOperatorPolicy, cat.ClearOperatorPolicy):
            self._sync_policies()
            b.reapply_policies()  # every matching queue takes its new settings at once
        elif t in (cat.SetGlobalParameter, cat.ClearGlobalParameter):
            self._sync_members()

    def _drop_exchanges(self, v: VHost, names: tuple[str, ...]) -> None:
        for name in names:
            v.remove_exchange(name)

    def _make_queue(self, rec: cat.QueueRecord, declared: bool = False) -> None:
        """Bring this node's object for a queue record in line, as the record's type does it."""
        v = self.cl.broker.vhosts.get(rec.vhost)
        if v is None:
            return
        cur = v.queues.get(rec.name)
        if cur is not None and cur.queue_type != rec.type:
            self.drop_queue(cur)
            cur = None
        kinds.kind(rec.type).apply_record(self, v, rec, cur, declared)

    def drop_queue(self, q, keep_bindings: bool = False) -> None:
        """The catalogue no longer has this queue (or it moved: `keep_bindings`): remove this
        node's object for it."""
        kinds.kind(q.queue_type).drop(self, q, keep_bindings)

    def _sync_vhosts_and_users(self) -> None:
        b = self.cl.broker
        c = self.cl.catalogue
        for name in list(b.vhosts):
            if name not in c.vhosts:
                v = b.vhosts.pop(name)
                for q in list(v.queues.values()):
                    self.drop_queue(q)
        for name in c.vhosts:
            if name not in b.vhosts:
                b.add_vhost(name)
        users = {}
        for name, rec in c.users.items():
            u = b.users.get(name)
            if u is None or u.password_hash != rec.password_hash or list(u.tags) != list(rec.tags):
                u = User(name, rec.password_hash, list(rec.tags))
            u.permissions.clear()
            users[name] = u
        for (user, vhost), p in c.permissions.items():
            if user in users:
                users[user].set_permissions(vhost, p.configure, p.write, p.read)
        b.users.clear()
        b.users.update(users)

    def _sync_policies(self) -> None:
        self.cl.broker.policies = [
            {"vhost": p.vhost, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
             "priority": p.priority, "definition": dict(p.definition)}
            for _key, p in sorted(self.cl.catalogue.policies.items())]
        self.cl.broker.operator_policies = [
            {"vhost": p.vhost, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
             "priority": p.priority, "definition": dict(p.definition)}
            for _key, p in sorted(self.cl.catalogue.operator_policies.items())]

    def _sync_members(self) -> None:
        self.cl.members = {k[len(NODE_PARAM):]: v for k, v in self.cl.catalogue.global_parameters.items()
                        if k.startswith(NODE_PARAM)}
        cn = self.cl.catalogue.global_parameters.get("cluster_name")
        if isinstance(cn, str) and cn:
            self.cl.broker.config.cluster_name = cn

    def rebuild(self) -> None:
        """Make every local object agree with the catalogue (start-up, an installed snapshot)."""
        b = self.cl.broker
        c = self.cl.catalogue
        self._sync_members()
        self._sync_vhosts_and_users()
        self._sync_policies()
        for v in b.vhosts.values():
            want = {name: rec for (vh, name), rec in c.exchanges.items() if vh == v.name}
            for name in list(v.exchanges):
                if name not in want:
                    v.remove_exchange(name)
            for name, rec in want.items():
                x = v.exchanges.get(name)
                if x is None or x.type != rec.type:
                    x = Exchange(name, rec.type, durable=rec.durable, auto_delete=rec.auto_delete,
                                 internal=rec.internal, arguments=dict(rec.arguments))
                    v.exchanges[name] = x
                x.bindings.clear()
                x._direct.clear()
            for (vh, _name), rec in c.queues.items():
                if vh == v.name:
                    self._make_queue(rec)
            for name, q in list(v.queues.items()):
                if c.queue(v.name, name) is None:
                    self.drop_queue(q)
            v.topology_changed()
        for rec in c.bindings.values():
            v = b.vhosts.get(rec.vhost)
            if v is not None and rec.source in v.exchanges:
                v.bind(rec.source, rec.destination_type, rec.destination, rec.routing_key, dict(rec.arguments))
        b.reapply_policies()
