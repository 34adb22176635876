"""Definitions: users, vhosts, permissions, policies, exchanges, queues and bindings as JSON.

The format is RabbitMQ's definitions export (`rabbitmqctl export_definitions`,
`GET /api/definitions`), so files move between RabbitMQ and hutch. A node also keeps its own
durable definitions in this format (`definitions.json` in its data directory), rewritten
atomically (write, fsync, rename, fsync the directory) whenever a durable thing changes, and
read back at start-up. Only durable exchanges and queues, and bindings whose both ends are
durable, are kept — the rest dies with the node, as in RabbitMQ.

Queue records carry one hutch-only field, `hutch_id`: the identity under which a durable
queue's messages are journalled. A queue deleted and declared again gets a new id, so
records of the old one can never reappear in the new one. Exports for users leave it out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hutch import __version__
from hutch.broker.exchanges import EXCHANGE, QUEUE, Exchange

if TYPE_CHECKING:
    from hutch.broker.broker import Broker

HASHING = "rabbit_password_hashing_sha256"


class DefinitionsError(ValueError):
    """A definitions document that cannot be imported; says what is wrong."""


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def export(broker: Broker, durable_only: bool = False, internal: bool = False) -> dict[str, Any]:
    """The broker's definitions as RabbitMQ's JSON document."""
    out: dict[str, Any] = {
        "rabbit_version": "3.10.8",
        "rabbitmq_version": "3.10.8",
        "product_name": "hutch",
        "product_version": __version__,
        "users": [{"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": HASHING,
                   "tags": list(u.tags), "limits": {}} for u in broker.users.values()],
        "vhosts": [{"name": v, "limits": [], "metadata": {"description": "", "tags": []}} for v in broker.vhosts],
        "permissions": [{"user": u.name, "vhost": vh, "configure": p[0].pattern, "write": p[1].pattern,
                         "read": p[2].pattern} for u in broker.users.values() for vh, p in u.permissions.items()],
        "topic_permissions": [],
        "parameters": [],
        "global_parameters": [{"name": "cluster_name", "value": broker.config.cluster_name or broker.config.node_name}],
        "policies": [dict(p) for p in broker.policies],
        "queues": [],
        "exchanges": [],
        "bindings": [],
    }
    for vhost in broker.vhosts.values():
        for q in vhost.queues.values():
            if q.exclusive_owner is not None or (durable_only and not q.durable):
                continue
            rec = {"name": q.name, "vhost": vhost.name, "durable": q.durable, "auto_delete": q.auto_delete,
                   "arguments": _jsonable(q.arguments)}
            if internal:
                rec["hutch_id"] = q.journal_id
            out["queues"].append(rec)
        for x in vhost.exchanges.values():
            if x.name == "" or x.name.startswith("amq.") or (durable_only and not x.durable):
                continue
            out["exchanges"].append({"name": x.name, "vhost": vhost.name, "type": x.type, "durable": x.durable,
                                     "auto_delete": x.auto_delete, "internal": x.internal,
                                     "arguments": _jsonable(x.arguments)})
        for x in vhost.exchanges.values():
            for b in x.bindings.values():
                if durable_only:
                    if not x.durable:
                        continue
                    if b.kind == QUEUE:
                        q = vhost.queues.get(b.destination)
                        if q is None or not q.durable or q.exclusive_owner is not None:
                            continue
                    else:
                        d = vhost.exchanges.get(b.destination)
                        if d is None or not d.durable:
                            continue
                out["bindings"].append({"source": x.name, "vhost": vhost.name, "destination": b.destination,
                                        "destination_type": b.kind, "routing_key": b.routing_key,
                                        "arguments": _jsonable(b.arguments)})
    return out


def _req(rec: dict, key: str, kind: str, types: type | tuple) -> Any:
    if key not in rec:
        raise DefinitionsError(f"{kind} definition {rec!r} lacks '{key}'")
    v = rec[key]
    if not isinstance(v, types):
        raise DefinitionsError(f"{kind} definition field '{key}' must be {types}, got {v!r}")
    return v


def validate(doc: Any) -> None:
    """Check a whole document before anything is applied: nothing is half-imported."""
    if not isinstance(doc, dict):
        raise DefinitionsError("definitions must be a JSON object")
    for key in ("users", "vhosts", "permissions", "queues", "exchanges", "bindings", "policies"):
        if key in doc and not isinstance(doc[key], list):
            raise DefinitionsError(f"'{key}' must be a list")
    for u in doc.get("users", []):
        _req(u, "name", "user", str)
        if "password_hash" not in u and "password" not in u:
            raise DefinitionsError(f"user '{u['name']}' has neither password_hash nor password")
        alg = u.get("hashing_algorithm", HASHING)
        if alg != HASHING:
            raise DefinitionsError(f"user '{u['name']}': unsupported hashing_algorithm '{alg}'")
    for v in doc.get("vhosts", []):
        _req(v, "name", "vhost", str)
    for p in doc.get("permissions", []):
        for k in ("user", "vhost", "configure", "write", "read"):
            _req(p, k, "permission", str)
    for x in doc.get("exchanges", []):
        for k in ("name", "vhost", "type"):
            _req(x, k, "exchange", str)
        if x["type"] not in ("direct", "fanout", "topic", "headers"):
            raise DefinitionsError(f"exchange '{x['name']}': unknown type '{x['type']}'")
    for q in doc.get("queues", []):
        for k in ("name", "vhost"):
            _req(q, k, "queue", str)
        if not isinstance(q.get("arguments", {}), dict):
            raise DefinitionsError(f"queue '{q['name']}': arguments must be an object")
    for b in doc.get("bindings", []):
        for k in ("source", "vhost", "destination", "destination_type"):
            _req(b, k, "binding", str)
        if b["destination_type"] not in (QUEUE, EXCHANGE):
            raise DefinitionsError(f"binding destination_type must be 'queue' or 'exchange', "
                                   f"got '{b['destination_type']}'")


def apply(broker: Broker, doc: dict[str, Any]) -> None:
    """Import a (validated) document into the broker. Existing things are kept or updated."""
    from hutch.broker.broker import User, hash_password

    validate(doc)
    for v in doc.get("vhosts", []):
        broker.add_vhost(v["name"])
    for u in doc.get("users", []):
        ph = u.get("password_hash") or hash_password(u.get("password", ""))
        tags = u.get("tags", [])
        if isinstance(tags, str):
            tags = [t for t in tags.split(",") if t]
        old = broker.users.get(u["name"])
        user = User(u["name"], ph, list(tags))
        if old is not None:
            user.permissions = old.permissions
        broker.users[u["name"]] = user
    for p in doc.get("permissions", []):
        user = broker.users.get(p["user"])
        if user is None:
            raise DefinitionsError(f"permission for unknown user '{p['user']}'")
        if p["vhost"] not in broker.vhosts:
            broker.add_vhost(p["vhost"])
        user.set_permissions(p["vhost"], p["configure"], p["write"], p["read"])
    for pol in doc.get("policies", []):
        broker.policies = [x for x in broker.policies if not (x["vhost"] == pol["vhost"] and x["name"] == pol["name"])]
        broker.policies.append(dict(pol))
    for x in doc.get("exchanges", []):
        vhost = broker.add_vhost(x["vhost"])
        if x["name"] not in vhost.exchanges:
            broker.add_exchange(vhost, Exchange(x["name"], x["type"], durable=bool(x.get("durable", True)),
                                                auto_delete=bool(x.get("auto_delete", False)),
                                                internal=bool(x.get("internal", False)),
                                                arguments=x.get("arguments") or {}), persist=False)
    for q in doc.get("queues", []):
        vhost = broker.add_vhost(q["vhost"])
        if q["name"] not in vhost.queues:
            queue = broker.declare_queue(vhost, q["name"], durable=bool(q.get("durable", True)), exclusive=False,
                                         auto_delete=bool(q.get("auto_delete", False)),
                                         arguments=q.get("arguments") or {}, owner=None, persist=False)
            if q.get("hutch_id"):
                queue.journal_id = int(q["hutch_id"])
    for b in doc.get("bindings", []):
        vhost = broker.add_vhost(b["vhost"])
        if b["source"] in vhost.exchanges and (
                b["destination"] in (vhost.queues if b["destination_type"] == QUEUE else vhost.exchanges)):
            vhost.bind(b["source"], b["destination_type"], b["destination"], b.get("routing_key", ""),
                       b.get("arguments") or {})


class DefinitionsFile:
    """The node's durable definitions on disk, replaced atomically."""

    def __init__(self, data_dir: str | os.PathLike):
        self.path = Path(data_dir) / "definitions.json"

    def load(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None

    def save(self, doc: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        data = json.dumps(doc, indent=1, sort_keys=True).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
