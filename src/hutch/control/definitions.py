"""Definitions export and import: RabbitMQ's definitions JSON over HTTP.

    GET /api/definitions                 the whole node: users, vhosts, permissions, policies,
                                         exchanges, queues, bindings (administrator)
    POST /api/definitions                import such a document
    GET|POST /api/definitions/{vhost}    one vhost's policies, exchanges, queues and bindings

An import is checked whole before anything is applied — the document's shape, every policy,
every queue's and exchange's arguments, permissions naming users that exist — so a bad
document is a 400 with a reason and changes nothing. Imported objects are then created
through the broker (existing ones are kept) and the node's durable definitions saved.

On a clustered node the document becomes catalogue commands (`catalogue.from_definitions`),
which are first tried on a scratch copy of the catalogue — so whatever the catalogue would
refuse is a 400 before anything is proposed — and then committed one by one, in dependency
order. The single node's leniency is kept: existing exchanges and queues are left as they
are, bindings whose ends do not exist are skipped, and a vhost that records refer to but the
document does not define is created. Queues are homed where the queue-master-locator puts
them; durable ones keep the document's `hutch_id` as journal id or get a new random one.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from hutch.amqp.spec import AMQPError
from hutch.broker import arguments as qargs
from hutch.broker import definitions
from hutch.broker.broker import hash_password
from hutch.cluster import catalogue as cat
from hutch.control import changes
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


async def import_document(broker, doc: Any) -> None:
    doc = check(broker, doc)
    await changes.commit_all(broker, cluster_commands(broker, doc))


INTERNAL_GLOBAL_PREFIX = "hutch_"  # a cluster's own global parameters (member addresses): never imported


def cluster_commands(broker, doc: dict[str, Any]) -> list[cat.Command]:
    """The catalogue commands that import a checked document on a clustered node, tried on a
    scratch copy of the catalogue first (raises ApiError 400 with the catalogue's reason)."""
    cl = broker.cluster
    doc = dict(doc)
    doc["global_parameters"] = [p for p in doc.get("global_parameters", []) if not
                                (isinstance(p, dict) and str(p.get("name", "")).startswith(INTERNAL_GLOBAL_PREFIX))]
    try:
        proposed = cat.from_definitions(doc, home_node=cl.node, hash_password=hash_password)
    except cat.CatalogueError as e:
        raise bad_request(f"invalid definitions: {e}") from None
    given_ids = {(q["vhost"], q["name"]) for q in doc.get("queues", []) if "hutch_id" in q}
    described = {v["name"] for v in doc.get("vhosts", []) if v.get("metadata") or v.get("description")}
    scratch = cat.Catalogue.from_snapshot(cl.catalogue.snapshot())
    out: list[cat.Command] = []

    def take(cmd: cat.Command) -> None:
        res = scratch.apply(cmd)
        if isinstance(cmd, cat.Bind) and res.code == cat.NOT_FOUND:
            return  # as on a single node: a binding whose ends are missing is skipped
        if res.code != cat.OK:
            raise bad_request(f"invalid definitions: {changes.http_error(res).reason}")
        out.append(cmd)

    for cmd in proposed:
        vhost = getattr(cmd, "vhost", None)
        if isinstance(cmd, cat.AddVhost):
            if cmd.name in scratch.vhosts and cmd.name not in described:
                continue  # an existing vhost is kept as it is
        elif vhost is not None and vhost not in scratch.vhosts:
            take(cat.AddVhost(vhost))
        if isinstance(cmd, cat.DeclareExchange) and scratch.exchange(cmd.vhost, cmd.name) is not None:
            continue
        if isinstance(cmd, cat.DeclareQueue):
            if scratch.queue(cmd.vhost, cmd.name) is not None:
                continue
            journal_id = cmd.journal_id if (cmd.vhost, cmd.name) in given_ids else changes.new_journal_id()
            cmd = msgspec.structs.replace(
                cmd, leader_node=cl.choose_home(dict(cmd.arguments), False, cmd.vhost, cmd.name),
                journal_id=journal_id if cmd.durable else 0)
        take(cmd)
    return out


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
    await import_document(api_of(request).broker, body)
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
    await import_document(broker, doc)
    return web.Response(status=204)
