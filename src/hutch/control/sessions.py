"""Connections, channels and consumers.

    GET /api/connections                        GET|DELETE /api/connections/{name}   (X-Reason header)
    GET /api/connections/{name}/channels        GET /api/vhosts/{vhost}/connections
    GET /api/channels                           GET /api/channels/{name}
    GET /api/vhosts/{vhost}/channels
    GET /api/consumers                          GET /api/consumers/{vhost}

A user tagged monitoring or administrator sees every connection; any other management
user sees its own. Closing someone else's connection needs administrator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from aiohttp import web

from hutch.control import listing, ops, shapes, stats
from hutch.control.errors import not_authorised, not_found
from hutch.control.http import Api, api_of, has_tag, user_of
from hutch.control.topology import vhost_for_read

routes = web.RouteTableDef()

DEFAULT_CLOSE_REASON = "Closed via management plugin"


def _sessions(api: Api, request: web.Request) -> list:
    user = user_of(request)
    return _visible_sessions(api, user.name, api.sees_all_connections(user))


def _visible_sessions(api: Api, username: str, everyone: bool) -> list:
    out = [s for s in api.broker.sessions if s.user is not None and (everyone or s.username == username)]
    out.sort(key=lambda s: s.connected_at_ms)
    return out


# more listings other nodes may ask this node for, by name (hutch.control.streams adds its own)
LISTERS: dict[str, Callable[[Api, dict], list]] = {}


def local_listing(api: Api, what: str, params: dict) -> list[dict]:
    """This node's connections or channels, for another node's cluster-wide listing."""
    if what == "mstats":  # message counters and samples (hutch.control.stats)
        return stats.local_report(api.broker, params)
    if what in LISTERS:
        return LISTERS[what](api, params)
    sessions = _visible_sessions(api, params.get("user", ""), bool(params.get("everyone")))
    vhost = params.get("vhost")
    sessions = [s for s in sessions if vhost is None or (s.vhost is not None and s.vhost.name == vhost)]
    if what == "connections":
        return [shapes.connection(api.broker, s) for s in sessions]
    if what == "channels":
        return [shapes.channel(api.broker, s, ch) for s in sessions
                for ch in sorted(s.channels.values(), key=lambda c: c.number)]
    return []


async def cluster_listing(api: Api, request: web.Request, what: str, vhost: str | None = None) -> list[dict]:
    """RabbitMQ lists connections and channels of every node: this node's, then each running
    peer's (a peer that does not answer in time is left out)."""
    user = user_of(request)
    params = {"user": user.name, "everyone": api.sees_all_connections(user), "vhost": vhost}
    rows = local_listing(api, what, params)
    cl = api.broker.cluster
    if cl is None:
        return rows
    for peer in cl.running_nodes():
        if peer != cl.node:
            with contextlib.suppress(Exception):
                rows.extend(await ops.call_peer(api.broker, peer, "list", [what, params]))
    return rows


def _session(api: Api, request: web.Request):
    name = request.match_info["name"]
    for s in _sessions(api, request):
        if s.name == name:
            return s
    raise not_found()


@routes.get("/api/connections")
async def list_connections(request: web.Request) -> web.Response:
    return listing.respond(request, await cluster_listing(api_of(request), request, "connections"))


@routes.get("/api/vhosts/{vhost}/connections")
async def list_vhost_connections(request: web.Request) -> web.Response:
    v = vhost_for_read(request)
    return listing.respond(request, await cluster_listing(api_of(request), request, "connections", v.name))


@routes.get("/api/connections/{name}")
async def get_connection(request: web.Request) -> web.Response:
    api = api_of(request)
    return web.json_response(shapes.connection(api.broker, _session(api, request)))


@routes.delete("/api/connections/{name}")
async def close_connection(request: web.Request) -> web.Response:
    api = api_of(request)
    s = _session(api, request)
    user = user_of(request)
    if s.username != user.name and not has_tag(user, "administrator"):
        raise not_authorised("Not administrator user")
    reason = request.headers.get("X-Reason") or DEFAULT_CLOSE_REASON
    ops.close_connection(api.broker, s, reason)
    return web.Response(status=204)


@routes.get("/api/connections/{name}/channels")
async def connection_channels(request: web.Request) -> web.Response:
    api = api_of(request)
    s = _session(api, request)
    return listing.respond(request, [shapes.channel(api.broker, s, ch) for ch in s.channels.values()])


@routes.get("/api/channels")
async def list_channels(request: web.Request) -> web.Response:
    return listing.respond(request, await cluster_listing(api_of(request), request, "channels"))


@routes.get("/api/vhosts/{vhost}/channels")
async def list_vhost_channels(request: web.Request) -> web.Response:
    v = vhost_for_read(request)
    return listing.respond(request, await cluster_listing(api_of(request), request, "channels", v.name))


@routes.get("/api/channels/{name}")
async def get_channel(request: web.Request) -> web.Response:
    api = api_of(request)
    name = request.match_info["name"]
    for s in _sessions(api, request):
        for ch in s.channels.values():
            if shapes.channel_name(s, ch.number) == name:
                out = shapes.channel(api.broker, s, ch)
                out["consumer_details"] = [shapes.consumer(api.broker, c) for c in ch.consumers.values()]
                return web.json_response(out)
    raise not_found()


def _consumers(api: Api, request: web.Request, vhost=None) -> list[dict]:
    visible = set(api.visible_vhosts(user_of(request)))
    out = []
    for v in api.broker.vhosts.values():
        if v.name not in visible or (vhost is not None and v is not vhost):
            continue
        for q in v.queues.values():
            out.extend(shapes.consumer(api.broker, c) for c in q.consumers())
    return out


@routes.get("/api/consumers")
async def list_consumers(request: web.Request) -> web.Response:
    api = api_of(request)
    return listing.respond(request, _consumers(api, request))


@routes.get("/api/consumers/{vhost}")
async def list_vhost_consumers(request: web.Request) -> web.Response:
    api = api_of(request)
    return listing.respond(request, _consumers(api, request, vhost_for_read(request)))
