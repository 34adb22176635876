"""Definitions: users, vhosts, permissions, policies, exchanges, queues and bindings as JSON.

The format is RabbitMQ's definitions export (`rabbitmqctl export_definitions`,
`GET /api/definitions`), so files move between RabbitMQ and hutch. This module exports a
node's objects and checks a document's shape; importing goes through the cluster catalogue
(`hutch.cluster.catalogue.from_definitions`), which is also where a node keeps its
definitions. A `definitions.json` left in a data directory by an older hutch is brought into
the catalogue once, at the first start (`hutch.server.clustering`).

Queue records carry one hutch-only field, `hutch_id`: the identity under which a durable
queue's messages are journalled. A queue deleted and declared again gets a new id, so
records of the old one can never reappear in the new one. Exports for users leave it out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hutch import __version__
from hutch.broker.exchanges import EXCHANGE, QUEUE

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
