"""Exchanges, queues and bindings, and publishing and getting messages over HTTP.

    GET /api/exchanges[/{vhost}]                       GET|PUT|DELETE /api/exchanges/{vhost}/{name}
    GET /api/exchanges/{vhost}/{name}/bindings/source  .../bindings/destination
    POST /api/exchanges/{vhost}/{name}/publish         {"routing_key", "payload", "payload_encoding", "properties"}
    GET /api/queues[/{vhost}]                          GET|PUT|DELETE /api/queues/{vhost}/{name}
    DELETE /api/queues/{vhost}/{name}/contents         purge
    POST /api/queues/{vhost}/{name}/get                {"count", "ackmode", "encoding", "truncate"}
    GET /api/queues/{vhost}/{name}/bindings
    POST /api/queues/{vhost}/{name}/actions            {"action": "sync" | "cancel_sync"} (mirrored queues)
    GET /api/bindings[/{vhost}]
    GET|POST /api/bindings/{vhost}/e/{source}/q/{queue}     GET|DELETE .../{properties_key}
    GET|POST /api/bindings/{vhost}/e/{source}/e/{exchange}  GET|DELETE .../{properties_key}

The default exchange is named `amq.default` in paths. Changes check the user's
configure/write/read permissions exactly as the same AMQP method would, and go through the
broker's declare/delete/bind/unbind/purge methods — on a clustered node through the
catalogue instead (`hutch.control.changes`), after the same checks. A queue created there
is homed on the node the body's `node` names, or where the queue-master-locator puts it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from aiohttp import web

from hutch.amqp.spec import AMQPError, access_refused
from hutch.broker import operations
from hutch.broker.exchanges import EXCHANGE, EXCHANGE_TYPES, QUEUE
from hutch.cluster import catalogue as cat
from hutch.control import changes, listing, ops, rates, shapes, stats
from hutch.control.errors import bad_request, not_authorised, not_found
from hutch.control.http import Api, api_of, read_json, user_of

routes = web.RouteTableDef()

DEFAULT_EXCHANGE_ALIAS = "amq.default"


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    v = body.get(key, default)
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    if not isinstance(v, bool):
        raise bad_request(f"{key} must be true or false, got {v!r}")
    return v


def _arguments(body: dict[str, Any]) -> dict[str, Any]:
    args = body.get("arguments") or {}
    if not isinstance(args, dict):
        raise bad_request("arguments must be a JSON object")
    return args


def _exchange_name(raw: str) -> str:
    return "" if raw == DEFAULT_EXCHANGE_ALIAS else raw


def vhost_for_read(request: web.Request, key: str = "vhost"):
    api = api_of(request)
    name = request.match_info[key]
    v = api.broker.vhosts.get(name)
    if v is None:
        raise not_found()
    if not api.can_see_vhost(user_of(request), name):
        raise not_authorised("User not authorised to access virtual host")
    return v


def vhost_for_write(request: web.Request, key: str = "vhost"):
    api = api_of(request)
    name = request.match_info[key]
    v = api.broker.vhosts.get(name)
    if v is None:
        raise not_found()
    if name not in user_of(request).permissions:
        raise not_authorised("User not authorised to access virtual host")
    return v


def _visible(api: Api, request: web.Request) -> list:
    return [api.broker.vhosts[n] for n in api.visible_vhosts(user_of(request))]


def _query_flag(request: web.Request, key: str) -> bool:
    return request.query.get(key, "false").lower() == "true"


# ---------------------------------------------------------------- exchanges

@routes.get("/api/exchanges")
async def list_exchanges(request: web.Request) -> web.Response:
    api = api_of(request)
    rows = [shapes.exchange(api.broker, v.name, x) for v in _visible(api, request) for x in v.exchanges.values()]
    return listing.respond(request, await stats.decorate(api.broker, rates.EXCHANGE, rows, stats.window_of(request)))


@routes.get("/api/exchanges/{vhost}")
async def list_vhost_exchanges(request: web.Request) -> web.Response:
    v = vhost_for_read(request)
    broker = api_of(request).broker
    rows = [shapes.exchange(broker, v.name, x) for x in v.exchanges.values()]
    return listing.respond(request, await stats.decorate(broker, rates.EXCHANGE, rows, stats.window_of(request)))


@routes.get("/api/exchanges/{vhost}/{name}")
async def get_exchange(request: web.Request) -> web.Response:
    v = vhost_for_read(request)
    x = v.exchanges.get(_exchange_name(request.match_info["name"]))
    if x is None:
        raise not_found()
    out = shapes.exchange(api_of(request).broker, v.name, x)
    await stats.decorate(api_of(request).broker, rates.EXCHANGE, [out], stats.window_of(request))
    out["incoming"] = []
    out["outgoing"] = []
    return web.json_response(out)


@routes.put("/api/exchanges/{vhost}/{name}")
async def put_exchange(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    user = user_of(request)
    v = vhost_for_write(request)
    name = _exchange_name(request.match_info["name"])
    body = await read_json(request)
    xtype = body.get("type")
    if xtype is None:
        raise bad_request("[{key_missing,type}]")
    if xtype not in EXCHANGE_TYPES:
        raise bad_request(f"unknown exchange type '{xtype}'")  # RabbitMQ 3.10.8's reason, verbatim
    durable = _flag(body, "durable", True)
    auto_delete = _flag(body, "auto_delete", False)
    internal = _flag(body, "internal", False)
    args = _arguments(body)
    cmd = operations.declare_exchange(broker, v, user, name, xtype, durable, auto_delete, internal, args)
    if cmd is None:
        return web.Response(status=204)
    return changes.put_answer(await changes.commit(broker, cmd))


@routes.delete("/api/exchanges/{vhost}/{name}")
async def delete_exchange(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    user = user_of(request)
    v = vhost_for_write(request)
    name = _exchange_name(request.match_info["name"])
    x = v.exchanges.get(name)
    if x is None:
        raise not_found()
    cmd = operations.delete_exchange(broker, v, user, name, _query_flag(request, "if-unused"))
    assert cmd is not None, name  # it exists, and nothing ran between the lookup and the checks
    return changes.delete_answer(await changes.commit(broker, cmd))


@routes.get("/api/exchanges/{vhost}/{name}/bindings/source")
async def exchange_bindings_source(request: web.Request) -> web.Response:
    v = vhost_for_read(request)
    name = _exchange_name(request.match_info["name"])
    if name not in v.exchanges:
        raise not_found()
    return listing.respond(request, [b for b in shapes.bindings_of(v) if b["source"] == name])


@routes.get("/api/exchanges/{vhost}/{name}/bindings/destination")
async def exchange_bindings_destination(request: web.Request) -> web.Response:
    v = vhost_for_read(request)
    name = _exchange_name(request.match_info["name"])
    if name not in v.exchanges:
        raise not_found()
    return listing.respond(request, [b for b in shapes.bindings_of(v)
                                     if b["destination_type"] == EXCHANGE and b["destination"] == name])


@routes.post("/api/exchanges/{vhost}/{name}/publish")
async def publish(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    v = vhost_for_write(request)
    body = await read_json(request)
    routed = ops.publish(broker, user_of(request), v, _exchange_name(request.match_info["name"]), body)
    return web.json_response({"routed": routed})


# ---------------------------------------------------------------- queues

@routes.get("/api/queues")
async def list_queues(request: web.Request) -> web.Response:
    api = api_of(request)
    rows = [shapes.queue(api.broker, q) for v in _visible(api, request) for q in v.queues.values()]
    return listing.respond(request, await stats.decorate(api.broker, rates.QUEUE, rows, stats.window_of(request)))


@routes.get("/api/queues/{vhost}")
async def list_vhost_queues(request: web.Request) -> web.Response:
    v = vhost_for_read(request)
    broker = api_of(request).broker
    rows = [shapes.queue(broker, q) for q in v.queues.values()]
    return listing.respond(request, await stats.decorate(broker, rates.QUEUE, rows, stats.window_of(request)))


@routes.get("/api/queues/{vhost}/{name}")
async def get_queue(request: web.Request) -> web.Response:
    v = vhost_for_read(request)
    q = v.queues.get(request.match_info["name"])
    if q is None:
        raise not_found()
    broker = api_of(request).broker
    out = shapes.queue(broker, q, details=True)
    await stats.decorate(broker, rates.QUEUE, [out], stats.window_of(request))
    return web.json_response(out)


@routes.put("/api/queues/{vhost}/{name}")
async def put_queue(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    user = user_of(request)
    v = vhost_for_write(request)
    name = request.match_info["name"]
    body = await read_json(request)
    durable = _flag(body, "durable", True)
    auto_delete = _flag(body, "auto_delete", False)
    args = _arguments(body)
    node = body.get("node")
    members = broker.cluster.members
    if node is not None and node not in members:
        raise bad_request(f"node '{node}' is not a member of this cluster")
    q, cmd = operations.declare_queue(broker, v, user, name, durable=durable, exclusive=False,
                                      auto_delete=auto_delete, args=args, owner=None, node=node)
    if cmd is None:
        return web.Response(status=204)
    return changes.put_answer(await changes.commit(broker, cmd))


def _queue(request: web.Request, v):
    q = v.queues.get(request.match_info["name"])
    if q is None:
        raise not_found()
    return q


@routes.delete("/api/queues/{vhost}/{name}")
async def delete_queue(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    v = vhost_for_write(request)
    q = _queue(request, v)
    operations.check_delete_queue(broker, v, user_of(request), q.name, None, _query_flag(request, "if-unused"),
                                  _query_flag(request, "if-empty"))
    return changes.delete_answer(await changes.commit(broker, cat.DeleteQueue(v.name, q.name)))


@routes.delete("/api/queues/{vhost}/{name}/contents")
async def purge_queue(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    v = vhost_for_write(request)
    q = operations.queue_to_purge(broker, v, user_of(request), _queue(request, v).name, None)
    await ops.purge_anywhere(broker, q)
    return web.Response(status=204)


@routes.post("/api/queues/{vhost}/{name}/get")
async def get_messages(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    v = vhost_for_write(request)
    q = _queue(request, v)
    v.queue(q.name, owner=None)
    broker.check_permission(user_of(request), v.name, "read", "queue", q.name)
    body = await read_json(request)
    return web.json_response(await ops.get_messages_anywhere(broker, q, body))


@routes.post("/api/queues/{vhost}/{name}/actions")
async def queue_action(request: web.Request) -> web.Response:
    """Synchronise a mirrored queue's mirrors, or stop a sync in progress (seed 000)."""
    broker = api_of(request).broker
    v = vhost_for_write(request)
    q = _queue(request, v)
    broker.check_permission(user_of(request), v.name, "configure", "queue", q.name)
    body = await read_json(request)
    action = body.get("action") if isinstance(body, dict) else None
    if action not in ("sync", "cancel_sync"):
        raise bad_request(f'unknown action {action!r}: expected "sync" or "cancel_sync"')
    if q.quorum or broker.cluster is None:
        raise bad_request(f"queue '{q.name}' in vhost '{v.name}' is not a mirrored classic queue")
    if not q.local:
        try:
            await ops.call_home(broker, q, "sync", [action])
        except AMQPError as e:
            raise bad_request(e.text) from None
    else:
        code, text = broker.cluster.mirroring.sync_action(v.name, q.name, action)
        if code != 200:
            raise bad_request(text)
    return web.Response(status=204)


@routes.get("/api/queues/{vhost}/{name}/bindings")
async def queue_bindings(request: web.Request) -> web.Response:
    v = vhost_for_read(request)
    q = _queue(request, v)
    return listing.respond(request, [b for b in shapes.bindings_of(v)
                                     if b["destination_type"] == QUEUE and b["destination"] == q.name])


# ---------------------------------------------------------------- bindings

@routes.get("/api/bindings")
async def list_bindings(request: web.Request) -> web.Response:
    api = api_of(request)
    return listing.respond(request, [b for v in _visible(api, request) for b in shapes.bindings_of(v)])


@routes.get("/api/bindings/{vhost}")
async def list_vhost_bindings(request: web.Request) -> web.Response:
    return listing.respond(request, shapes.bindings_of(vhost_for_read(request)))


_KINDS = {"q": QUEUE, "e": EXCHANGE}
_CATALOGUE_KINDS = {QUEUE: cat.QUEUE, EXCHANGE: cat.EXCHANGE}


def _ends(request: web.Request, v, kind: str) -> tuple[str, str]:
    source = _exchange_name(request.match_info["source"])
    destination = request.match_info["destination"]
    if source not in v.exchanges:
        raise not_found()
    if kind == QUEUE:
        if destination not in v.queues:
            raise not_found()
    elif _exchange_name(destination) not in v.exchanges:
        raise not_found()
    else:
        destination = _exchange_name(destination)
    return source, destination


def _between(v, source: str, kind: str, destination: str) -> list[dict[str, Any]]:
    return [b for b in shapes.bindings_of(v) if b["source"] == source and b["destination_type"] == kind
            and b["destination"] == destination]


def _binding_routes(letter: str) -> None:
    kind = _KINDS[letter]
    base = f"/api/bindings/{{vhost}}/e/{{source}}/{letter}/{{destination}}"

    async def list_between(request: web.Request) -> web.Response:
        v = vhost_for_read(request)
        source, destination = _ends(request, v, kind)
        return listing.respond(request, _between(v, source, kind, destination))

    async def create(request: web.Request) -> web.Response:
        broker = api_of(request).broker
        user = user_of(request)
        v = vhost_for_write(request)
        source, destination = _ends(request, v, kind)
        body = await read_json(request, required=False)
        routing_key = body.get("routing_key", "")
        if not isinstance(routing_key, str):
            raise bad_request("routing_key must be a string")
        args = _arguments(body)
        operations.check_binding(broker, v, user, source, kind, destination, routing_key, None)
        await changes.commit(broker, cat.Bind(v.name, source, _CATALOGUE_KINDS[kind], destination, routing_key,
                                              args))
        key = shapes.properties_key(routing_key, args)
        return web.Response(status=201, headers={"Location": key})

    async def get_one(request: web.Request) -> web.Response:
        v = vhost_for_read(request)
        source, destination = _ends(request, v, kind)
        key = request.match_info["props"]
        for b in _between(v, source, kind, destination):
            if key in (b["properties_key"], unquote(b["properties_key"])):
                return web.json_response(b)
        raise not_found()

    async def delete_one(request: web.Request) -> web.Response:
        broker = api_of(request).broker
        user = user_of(request)
        v = vhost_for_write(request)
        source, destination = _ends(request, v, kind)
        key = request.match_info["props"]
        if source == "":
            raise access_refused(operations.DEFAULT_EXCHANGE_REFUSED)
        x = v.exchanges[source]
        for b in list(x.bindings.values()):
            pk = shapes.properties_key(b.routing_key, b.arguments)
            if b.kind == kind and b.destination == destination and key in (pk, unquote(pk)):
                operations.check_binding(broker, v, user, source, kind, destination, b.routing_key, None)
                return changes.delete_answer(await changes.commit(broker, cat.Unbind(
                    v.name, source, _CATALOGUE_KINDS[kind], destination, b.routing_key, dict(b.arguments))))
        raise not_found()

    routes.get(base)(list_between)
    routes.post(base)(create)
    routes.get(base + "/{props}")(get_one)
    routes.delete(base + "/{props}")(delete_one)


_binding_routes("q")
_binding_routes("e")
