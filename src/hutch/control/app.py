"""The management HTTP API application: authentication, user tags, JSON in and out, the listener.

Every request under /api/ carries HTTP basic credentials, checked against the broker's users
(and its loopback-only users, as RabbitMQ does for guest). Access follows RabbitMQ's user
tags:

    management     may use the API: the vhosts it has permissions in, its own connections
    policymaker    management, plus policies in those vhosts
    monitoring     management, plus every vhost, connection and channel read-only, node data
    administrator  everything: users, vhosts, permissions, definitions, other users' connections

A route states the tag it needs with `@requires(...)` (default: management); `Api.visible_vhosts`
answers which vhosts a user may see. Request bodies are JSON objects; anything else is a
400 with a reason, and a handler checks a whole request before it changes anything.

The application runs on the node's own event loop (`HttpListener`), so handlers read and
change the broker between two of its iterations, never concurrently with it. Handler work
is bounded: listings are filtered and paginated (page_size at most 500, as RabbitMQ), and
request bodies are limited to `BODY_BYTES_MAX`.
"""

from __future__ import annotations

import logging

from aiohttp import BasicAuth, web

from hutch.amqp.spec import AMQPError
from hutch.broker.broker import Broker, User
from hutch.control import (
    access,
    changes,
    definitions,
    digest,
    migrate,
    node,
    policies,
    quorum,
    sessions,
    streams,
    topology,
    ui,
)
from hutch.control.errors import ApiError, error_middleware, from_amqp, login_failed, not_authorised
from hutch.control.http import API, BODY_BYTES_MAX, Api, has_tag

log = logging.getLogger("hutch.http")


def _authenticate(request: web.Request, api: Api) -> User:
    header = request.headers.get("Authorization")
    if not header:
        raise login_failed()
    try:
        creds = BasicAuth.decode(header)
    except ValueError:
        raise login_failed() from None
    peer = request.remote or ""
    user = api.broker.authenticate(creds.login, creds.password, f"{peer}:0")
    if user is None:
        log.warning("HTTP access denied: user '%s' - invalid credentials", creds.login)
        raise login_failed()
    if not has_tag(user, "management"):
        raise not_authorised("Not management user")
    return user


@web.middleware
async def _api_middleware(request: web.Request, handler):
    api = request.app[API]
    try:
        route = request.match_info.route
        target = getattr(route, "handler", None)
        if request.path.startswith("/api/") and target is not None and route.resource is not None:
            user = _authenticate(request, api)
            request["user"] = user
            need = getattr(target, "hutch_requires", "management")
            if not has_tag(user, need):
                raise not_authorised(f"Not {need} user" if need != "administrator" else "Not administrator user")
        try:
            return await handler(request)
        except (ApiError, AMQPError) as e:
            # made through another node a moment ago? A read that finds no such object runs once
            # more after this node has applied everything the catalogue committed before now
            missing = (e.status if isinstance(e, ApiError) else from_amqp(e).status) == 404
            if request.method != "GET" or not missing or not await changes.caught_up(api.broker):
                raise
            return await handler(request)
    except ApiError as e:
        return e.response()
    except AMQPError as e:
        return from_amqp(e).response()
    except web.HTTPNotFound:
        return web.json_response({"error": "Object Not Found", "reason": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed as e:
        return web.json_response({"error": "method_not_allowed", "reason": f"{request.method} is not allowed here"},
                                 status=405, headers={"Allow": ",".join(sorted(e.allowed_methods))})


def make_app(broker: Broker) -> web.Application:
    app = web.Application(middlewares=[error_middleware, _api_middleware, node.app_state_middleware],
                          client_max_size=BODY_BYTES_MAX)
    app[API] = Api(broker)
    for module in (node, access, topology, sessions, policies, definitions, quorum, streams, migrate):
        app.add_routes(module.routes)
    for module in (node, access, topology, sessions, policies, definitions, quorum, streams, migrate):
        for r in module.routes:  # RabbitMQ also answers "/api/queues/" and the like
            app.router.add_route(r.method, r.path + "/", r.handler)
    app.add_routes(digest.routes)
    ui.register(app)  # the web UI at / and its assets under /ui/
    return app


class HttpListener:
    """The management API on one address of this node, on the running event loop."""

    def __init__(self, broker: Broker):
        self.app = make_app(broker)
        self._runner: web.AppRunner | None = None

    async def start(self, host: str | None, port: int, ssl_context=None) -> list[tuple[str, int]]:
        """Serve the API on host:port (HTTPS with `ssl_context`); may be called once per listener."""
        if self._runner is None:
            self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
            await self._runner.setup()
        before = {(a[0], a[1]) for a in self._runner.addresses}
        site = web.TCPSite(self._runner, host=host, port=port, reuse_address=True, backlog=128,
                           ssl_context=ssl_context)
        await site.start()
        addresses = [(a[0], a[1]) for a in self._runner.addresses if (a[0], a[1]) not in before]
        api = self.app[API]
        if ssl_context is None:
            api.http_host = host
            api.http_port = addresses[0][1] if addresses else port
        else:
            api.https_host = host
            api.https_port = addresses[0][1] if addresses else port
        return addresses

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
