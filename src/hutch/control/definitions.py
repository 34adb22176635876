"""Definitions export and import: RabbitMQ's definitions JSON over HTTP.

    GET /api/definitions                 the whole node: users, vhosts, permissions, policies,
                                         exchanges, queues, bindings (administrator)
    POST /api/definitions                import such a document
    GET|POST /api/definitions/{vhost}    one vhost's policies, exchanges, queues and bindings

An import is checked whole before anything is applied — the document's shape, every policy,
every queue's and exchange's arguments, permissions naming users that exist — so a bad
document is a 400 with a reason and changes nothing. Imported objects are then created
through the broker (existing ones are kept) and the node's durable definitions saved.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from hutch.amqp.spec import AMQPError
from hutch.broker import arguments as qargs
from hutch.broker import definitions
from hutch.control.app import api_of, read_json, requires
from hutch.control.errors import bad_request, not_found
from hutch.control.policy import PolicyError, validate_policy

routes = web.RouteTableDef()

SCOPED_KEYS = ("policies", "exchanges", "queues", "bindings")


def check(broker, doc: Any) -> dict[str, Any]:
    """The document to apply, fully validated (policies normalised). Raises ApiError 400."""
    try:
        definitions.validate(doc)
    except definitions.DefinitionsError as e:
        raise bad_request(f"invalid definitions: {e}") from None
    doc = dict(doc)
    vhosts = set(broker.vhosts) | {v["name"] for v in doc.get("vhosts", [])}
    users = set(broker.users) | {u["name"] for u in doc.get("users", [])}
    for u in doc.get("users", []):
        if "tags" in u and not isinstance(u["tags"], (str, list)):
            raise bad_request(f"invalid definitions: user '{u['name']}': tags must be a string or a list")
    for p in doc.get("permissions", []):
        if p["user"] not in users:
            raise bad_request(f"invalid definitions: permissions for user '{p['user']}', who is not defined")
    policies = []
    for p in doc.get("policies", []):
        if not isinstance(p, dict) or not isinstance(p.get("vhost"), str) or not isinstance(p.get("name"), str):
            raise bad_request(f"invalid definitions: policy {p!r} needs 'vhost' and 'name'")
        if p["vhost"] not in vhosts:
            raise bad_request(f"invalid definitions: policy '{p['name']}' is for vhost '{p['vhost']}', "
                              "which is not defined")
        try:
            policies.append(validate_policy(p["vhost"], p["name"], p))
        except PolicyError as e:
            raise bad_request(f"invalid definitions: policy '{p['name']}' in vhost '{p['vhost']}': {e}") from None
    if "policies" in doc:
        doc["policies"] = policies
    try:
        for x in doc.get("exchanges", []):
            if not isinstance(x.get("arguments", {}), dict):
                raise bad_request(f"invalid definitions: exchange '{x['name']}': arguments must be an object")
            qargs.validate_exchange_args(x.get("arguments") or {}, x["name"], x["vhost"])
        for q in doc.get("queues", []):
            qargs.queue_settings(q.get("arguments") or {}, q["name"], q["vhost"])
    except AMQPError as e:
        raise bad_request(f"invalid definitions: {e.text}") from None
    return doc


def import_document(broker, doc: Any) -> None:
    doc = check(broker, doc)
    try:
        definitions.apply(broker, doc)
    except definitions.DefinitionsError as e:  # pragma: no cover - check() catches these first
        raise bad_request(f"invalid definitions: {e}") from None
    broker.persist_definitions()


@routes.get("/api/definitions")
@requires("administrator")
async def export_all(request: web.Request) -> web.Response:
    doc = definitions.export(api_of(request).broker)
    headers = {}
    if request.query.get("download"):
        headers["Content-Disposition"] = f'attachment; filename="{request.query["download"]}"'
    return web.json_response(doc, headers=headers)


@routes.post("/api/definitions")
@requires("administrator")
async def import_all(request: web.Request) -> web.Response:
    body = await read_json(request)
    import_document(api_of(request).broker, body)
    return web.Response(status=204)


@routes.get("/api/definitions/{vhost}")
@requires("administrator")
async def export_vhost(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost = request.match_info["vhost"]
    if vhost not in broker.vhosts:
        raise not_found()
    full = definitions.export(broker)
    doc = {k: full[k] for k in ("rabbit_version", "rabbitmq_version", "product_name", "product_version")}
    for key in SCOPED_KEYS:
        doc[key] = [{k: v for k, v in rec.items() if k != "vhost"} for rec in full[key] if rec.get("vhost") == vhost]
    return web.json_response(doc)


@routes.post("/api/definitions/{vhost}")
@requires("administrator")
async def import_vhost(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost = request.match_info["vhost"]
    if vhost not in broker.vhosts:
        raise not_found()
    body = await read_json(request)
    doc: dict[str, Any] = {}
    for key in SCOPED_KEYS:
        recs = body.get(key, [])
        if not isinstance(recs, list) or not all(isinstance(r, dict) for r in recs):
            raise bad_request(f"invalid definitions: '{key}' must be a list of objects")
        doc[key] = [{**r, "vhost": vhost} for r in recs]
    import_document(broker, doc)
    return web.Response(status=204)
