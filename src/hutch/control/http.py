"""What every management API route module shares: the `Api` handle, the user-tag checks,
and reading a request's JSON body.

The route modules (node, access, topology, sessions, policies, definitions, quorum, migrate)
import this module; `control/app.py` imports the route modules to build the application. So
this module must never import `control.app` or any route module: it sits below all of them,
which keeps control/ free of import cycles. It holds no state of its own and does no I/O
beyond reading the body of the request it is handed.

Access follows the user tags of RabbitMQ's management plugin guide ("Permissions"; the
seeds do not cover the plugin): administrator implies every tag; policymaker and monitoring
imply management.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from hutch.broker.broker import Broker, User
from hutch.control.errors import bad_request

BODY_BYTES_MAX = 128 * 1024 * 1024  # as RabbitMQ's default max request body (definitions imports)
MANAGEMENT_TAGS = ("management", "policymaker", "monitoring", "administrator")


def requires(tag: str):
    """Mark a handler as needing a user tag (management, policymaker, monitoring, administrator)."""
    assert tag in MANAGEMENT_TAGS, tag

    def mark(handler):
        handler.hutch_requires = tag
        return handler
    return mark


def has_tag(user: User, tag: str) -> bool:
    """RabbitMQ's tag hierarchy: administrator implies every tag; policymaker and monitoring
    imply management."""
    tags = set(user.tags)
    if "administrator" in tags:
        return True
    if tag == "management":
        return bool(tags & set(MANAGEMENT_TAGS))
    return tag in tags


class Api:
    """What handlers share: the broker and facts about this node's listeners."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.http_host: str | None = None
        self.http_port = 0
        self.https_host: str | None = None  # management.ssl.*: the HTTPS listener, if any
        self.https_port = 0
        self.started_at_s = time.time()

    @property
    def node_name(self) -> str:
        return self.broker.config.node_name

    def visible_vhosts(self, user: User) -> list[str]:
        if has_tag(user, "monitoring"):
            return list(self.broker.vhosts)
        return [v for v in self.broker.vhosts if v in user.permissions]

    def can_see_vhost(self, user: User, vhost: str) -> bool:
        return vhost in self.broker.vhosts and (has_tag(user, "monitoring") or vhost in user.permissions)

    def sees_all_connections(self, user: User) -> bool:
        return has_tag(user, "monitoring")


API = web.AppKey("api", Api)


def api_of(request: web.Request) -> Api:
    return request.app[API]


def user_of(request: web.Request) -> User:
    return request["user"]


def node_name_arg(body: dict) -> str:
    """The request body's "node": a node name (NAME@HOST), else 400."""
    name = body.get("node")
    if not isinstance(name, str) or "@" not in name:
        raise bad_request("'node' must be a node name, NAME@HOST")
    return name


async def read_json(request: web.Request, required: bool = True) -> dict[str, Any]:
    """The request body as a JSON object ({} when empty and not required)."""
    raw = await request.read()
    if not raw.strip():
        if required:
            raise bad_request("not_json")
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise bad_request("not_json") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body
