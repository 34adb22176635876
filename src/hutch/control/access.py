"""Users, vhosts and permissions.

    GET /api/users                        administrator
    GET|PUT|DELETE /api/users/{name}      PUT {"password" | "password_hash", "tags"}
    GET /api/users/{name}/permissions
    GET /api/users/without-permissions
    POST /api/users/bulk-delete           {"users": [...]}
    GET /api/vhosts                       the vhosts the user may see
    GET|PUT|DELETE /api/vhosts/{name}     PUT {"description", "tags", "default_queue_type"} (optional)
    GET /api/vhosts/{name}/permissions
    GET /api/permissions                  administrator
    GET|PUT|DELETE /api/permissions/{vhost}/{user}   PUT {"configure", "write", "read"}

A PUT answers 201 when it created the object and 204 when it changed an existing one;
a DELETE answers 204, or 404 when there was nothing to delete. On a single node every change
is persisted with the node's durable definitions; on a clustered node it is a catalogue
command (`hutch.control.changes`), answered once committed, and passwords are hashed here,
before the command is proposed.
"""

from __future__ import annotations

import base64
import binascii
import re

from aiohttp import web

from hutch.broker.broker import hash_password
from hutch.cluster import catalogue as cat
from hutch.control import changes, ops, shapes
from hutch.control.app import api_of, read_json, requires, user_of
from hutch.control.errors import bad_request, not_authorised, not_found

routes = web.RouteTableDef()

NAME_BYTES_MAX = 255
VHOST_DEFAULT_QUEUE_TYPES = ("classic", "quorum")  # a stream default: no stream queues here
HASHING = "rabbit_password_hashing_sha256"


def _check_name(kind: str, name: str) -> None:
    if not name or len(name.encode()) > NAME_BYTES_MAX:
        raise bad_request(f"{kind} name must be 1 to {NAME_BYTES_MAX} bytes")


def parse_tags(raw: object) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [t.strip() for t in raw.replace(" ", ",").split(",") if t.strip()]
    if isinstance(raw, list) and all(isinstance(t, str) for t in raw):
        return [t.strip() for t in raw if t.strip()]
    raise bad_request("tags must be a comma-separated string or a list of strings")


# ---------------------------------------------------------------- users

@routes.get("/api/users")
@requires("administrator")
async def list_users(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    return web.json_response([shapes.user(u) for u in broker.users.values()])


@routes.get("/api/users/without-permissions")
@requires("administrator")
async def users_without_permissions(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    return web.json_response([shapes.user(u) for u in broker.users.values() if not u.permissions])


@routes.post("/api/users/bulk-delete")
@requires("administrator")
async def bulk_delete_users(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    body = await read_json(request)
    names = body.get("users")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad_request("users must be a list of user names")
    for name in names:
        if name in broker.users:
            await ops.remove_user(broker, name)
    return web.Response(status=204)


@routes.get("/api/users/{name}")
@requires("administrator")
async def get_user(request: web.Request) -> web.Response:
    u = api_of(request).broker.users.get(request.match_info["name"])
    if u is None:
        raise not_found()
    return web.json_response(shapes.user(u))


@routes.put("/api/users/{name}")
@requires("administrator")
async def put_user(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    name = request.match_info["name"]
    _check_name("user", name)
    body = await read_json(request)
    tags = parse_tags(body.get("tags"))
    alg = body.get("hashing_algorithm", HASHING)
    if alg != HASHING:
        raise bad_request(f"unsupported hashing_algorithm {alg!r} (hutch uses {HASHING})")
    if "password" in body and "password_hash" in body:
        raise bad_request("give either password or password_hash, not both")
    if "password" in body:
        if not isinstance(body["password"], str):
            raise bad_request("password must be a string")
        password_hash = hash_password(body["password"])
    elif "password_hash" in body:
        ph = body["password_hash"]
        if not isinstance(ph, str):
            raise bad_request("password_hash must be a string")
        if ph:
            try:
                raw = base64.b64decode(ph, validate=True)
            except (binascii.Error, ValueError):
                raise bad_request("password_hash is not valid base64") from None
            if len(raw) != 4 + 32:
                raise bad_request("password_hash must be base64 of a 4-byte salt and a SHA-256 digest")
        password_hash = ph
    else:
        old = broker.users.get(name)
        password_hash = old.password_hash if old is not None else ""  # no password: cannot log in with one
    return changes.put_answer(await changes.commit(broker, cat.PutUser(name, password_hash, tuple(tags))))


@routes.delete("/api/users/{name}")
@requires("administrator")
async def delete_user(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    name = request.match_info["name"]
    if name not in broker.users:
        raise not_found()
    if not await ops.remove_user(broker, name):
        raise not_found()
    return web.Response(status=204)


@routes.get("/api/users/{name}/permissions")
@requires("administrator")
async def user_permissions(request: web.Request) -> web.Response:
    u = api_of(request).broker.users.get(request.match_info["name"])
    if u is None:
        raise not_found()
    return web.json_response([shapes.permission(u.name, v, p) for v, p in u.permissions.items()])


# ---------------------------------------------------------------- vhosts

@routes.get("/api/vhosts")
async def list_vhosts(request: web.Request) -> web.Response:
    api = api_of(request)
    names = api.visible_vhosts(user_of(request))
    return web.json_response([shapes.vhost(api.broker, api.broker.vhosts[n]) for n in names])


@routes.get("/api/vhosts/{name}")
async def get_vhost(request: web.Request) -> web.Response:
    api = api_of(request)
    name = request.match_info["name"]
    if not api.can_see_vhost(user_of(request), name):
        raise not_found()
    return web.json_response(shapes.vhost(api.broker, api.broker.vhosts[name]))


@routes.put("/api/vhosts/{name}")
@requires("administrator")
async def put_vhost(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    _check_name("vhost", name)
    body = await read_json(request, required=False)
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request("description must be a string")
    tags = parse_tags(body["tags"]) if "tags" in body else None
    if "tracing" in body and not isinstance(body["tracing"], bool):
        raise bad_request("tracing must be true or false")
    dqt = body.get("default_queue_type")
    if dqt is not None and dqt not in VHOST_DEFAULT_QUEUE_TYPES:
        raise bad_request(f"default_queue_type must be one of {', '.join(VHOST_DEFAULT_QUEUE_TYPES)}, got {dqt!r}")
    return await _put_vhost(request, name, description, tags, body.get("tracing"), dqt)


async def _put_vhost(request: web.Request, name: str, description: str | None, tags: list[str] | None,
                                tracing: bool | None, default_queue_type: str | None = None) -> web.Response:
    """PUT /api/vhosts/{name} on a clustered node: what the request leaves out stays as it is."""
    broker = api_of(request).broker
    old = broker.cluster.catalogue.vhosts.get(name)
    if description is None:
        description = old.description if old is not None else ""
    if tags is None:
        tags = list(old.tags) if old is not None else []
    if default_queue_type is None:
        default_queue_type = old.default_queue_type if old is not None else ""
    res = await changes.commit(broker, cat.AddVhost(name, description, tuple(tags), default_queue_type))
    if res.status == cat.CREATED:  # as on a single node: the creator may use the vhost it made
        await changes.commit(broker, cat.SetPermissions(user_of(request).name, name, ".*", ".*", ".*"))
    v = broker.vhosts.get(name)
    if tracing is not None and v is not None:
        v.tracing = tracing  # the firehose is this node's: it traces what passes through here
    return changes.put_answer(res)


@routes.delete("/api/vhosts/{name}")
@requires("administrator")
async def delete_vhost(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    name = request.match_info["name"]
    if name not in broker.vhosts:
        raise not_found()
    if not await ops.remove_vhost(broker, name):
        raise not_found()
    return web.Response(status=204)


@routes.get("/api/vhosts/{name}/permissions")
@requires("administrator")
async def vhost_permissions(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    name = request.match_info["name"]
    if name not in broker.vhosts:
        raise not_found()
    return web.json_response([shapes.permission(u.name, name, u.permissions[name])
                              for u in broker.users.values() if name in u.permissions])


# ---------------------------------------------------------------- permissions

@routes.get("/api/permissions")
@requires("administrator")
async def list_permissions(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    return web.json_response([shapes.permission(u.name, v, p) for u in broker.users.values()
                              for v, p in u.permissions.items()])


@routes.get("/api/permissions/{vhost}/{user}")
async def get_permission(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    me = user_of(request)
    vhost, name = request.match_info["vhost"], request.match_info["user"]
    if name != me.name and "administrator" not in me.tags:
        raise not_authorised("Not administrator user")
    u = broker.users.get(name)
    if u is None or vhost not in u.permissions:
        raise not_found()
    return web.json_response(shapes.permission(u.name, vhost, u.permissions[vhost]))


@routes.put("/api/permissions/{vhost}/{user}")
@requires("administrator")
async def put_permission(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost, name = request.match_info["vhost"], request.match_info["user"]
    body = await read_json(request)
    regexes = []
    for key in ("configure", "write", "read"):
        if key not in body:
            raise bad_request(f"[{{key_missing,{key}}}]")
        value = body[key]
        if not isinstance(value, str):
            raise bad_request(f"{key} must be a string (a regular expression)")
        try:
            re.compile(value)
        except re.error as e:
            raise bad_request(f"{key} is not a valid regular expression ({value!r}: {e})") from None
        regexes.append(value)
    u = broker.users.get(name)
    if u is None or vhost not in broker.vhosts:
        raise bad_request("vhost_or_user_not_found")
    return changes.put_answer(await changes.commit(broker, cat.SetPermissions(name, vhost, *regexes)))


@routes.delete("/api/permissions/{vhost}/{user}")
@requires("administrator")
async def delete_permission(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost, name = request.match_info["vhost"], request.match_info["user"]
    u = broker.users.get(name)
    if u is None or vhost not in u.permissions:
        raise not_found()
    return changes.delete_answer(await changes.commit(broker, cat.ClearPermissions(name, vhost)))
