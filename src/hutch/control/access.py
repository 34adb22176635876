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
    GET /api/topic-permissions            administrator
    GET|PUT|DELETE /api/topic-permissions/{vhost}/{user}   PUT {"exchange", "write", "read"}
    GET /api/users/{name}/topic-permissions, /api/vhosts/{name}/topic-permissions
    GET /api/user-limits[/{user}]         [{"user", "value": {...}}]
    PUT|DELETE /api/user-limits/{user}/{name}     PUT {"value": N}; max-connections, max-channels
    GET /api/vhost-limits[/{vhost}]       [{"vhost", "value": {...}}]
    PUT|DELETE /api/vhost-limits/{vhost}/{name}   PUT {"value": N}; max-connections, max-queues

A user given an empty password (or none at all) has password login disabled: its stored hash
is empty and no password, blank or not, logs it in (RabbitMQ refuses blank passwords too).
Changes are logged as RabbitMQ's internal backend logs them (user, vhost and permission
changes), never with a password or a hash.

A PUT answers 201 when it created the object and 204 when it changed an existing one;
a DELETE answers 204, or 404 when there was nothing to delete. On a single node every change
is persisted with the node's durable definitions; on a clustered node it is a catalogue
command (`hutch.control.changes`), answered once committed, and passwords are hashed here,
before the command is proposed.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re

from aiohttp import web

from hutch.broker.broker import hash_password
from hutch.cluster import catalogue as cat
from hutch.control import changes, ops, rates, shapes, stats
from hutch.control.errors import bad_request, not_authorised, not_found
from hutch.control.http import api_of, read_json, requires, user_of

log = logging.getLogger("hutch.access")
routes = web.RouteTableDef()
USER_LIMITS = ("max-connections", "max-channels")
VHOST_LIMITS = ("max-connections", "max-queues")

NAME_BYTES_MAX = 255
VHOST_DEFAULT_QUEUE_TYPES = ("classic", "quorum", "stream")  # as rabbitmqctl 3.10.8 add_vhost takes them
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
    return web.json_response([_user_json(broker, u) for u in broker.users.values()])


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
    broker = api_of(request).broker
    u = broker.users.get(request.match_info["name"])
    if u is None:
        raise not_found()
    return web.json_response(_user_json(broker, u))


def _user_json(broker, u) -> dict:
    d = shapes.user(u)
    rec = broker.cluster.catalogue.users.get(u.name)
    d["limits"] = dict(rec.limits) if rec is not None else {}
    return d


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
        # an empty password disables password login (no hash matches anything)
        password_hash = hash_password(body["password"]) if body["password"] else ""
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
    old = broker.users.get(name)
    res = await changes.commit(broker, cat.PutUser(name, password_hash, tuple(tags)))
    if res.status == cat.CREATED:
        log.info("Created user '%s'", name)
    elif old is not None:
        if password_hash != old.password_hash:
            if password_hash:
                log.info("Successfully changed password for user '%s'", name)
            else:
                log.info("Clearing password for '%s'", name)
        if list(old.tags) != tags:
            log.info("Successfully set user tags for user '%s' to [%s]", name, ", ".join(tags))
    return changes.put_answer(res)


@routes.delete("/api/users/{name}")
@requires("administrator")
async def delete_user(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    name = request.match_info["name"]
    if name not in broker.users:
        raise not_found()
    if not await ops.remove_user(broker, name):
        raise not_found()
    log.info("Deleted user '%s'", name)
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
    rows = [shapes.vhost(api.broker, api.broker.vhosts[n]) for n in names]
    return web.json_response(await stats.decorate(api.broker, rates.VHOST, rows, stats.window_of(request)))


@routes.get("/api/vhosts/{name}")
async def get_vhost(request: web.Request) -> web.Response:
    api = api_of(request)
    name = request.match_info["name"]
    if not api.can_see_vhost(user_of(request), name):
        raise not_found()
    out = shapes.vhost(api.broker, api.broker.vhosts[name])
    await stats.decorate(api.broker, rates.VHOST, [out], stats.window_of(request))
    return web.json_response(out)


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
    if res.status == cat.CREATED and not description and not tags:
        log.info("Adding vhost '%s' without a description", name)
    elif res.status == cat.CREATED:
        log.info("Adding vhost '%s' (description: '%s', tags: [%s])", name, description, ", ".join(tags))
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
    log.info("Deleting vhost '%s'", name)
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
    res = await changes.commit(broker, cat.SetPermissions(name, vhost, *regexes))
    log.info("Successfully set permissions for '%s' in virtual host '%s' to '%s', '%s', '%s'", name, vhost, *regexes)
    return changes.put_answer(res)


@routes.delete("/api/permissions/{vhost}/{user}")
@requires("administrator")
async def delete_permission(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost, name = request.match_info["vhost"], request.match_info["user"]
    u = broker.users.get(name)
    if u is None or vhost not in u.permissions:
        raise not_found()
    res = await changes.commit(broker, cat.ClearPermissions(name, vhost))
    if res.status == cat.DELETED:
        log.info("Successfully cleared permissions for '%s' in virtual host '%s'", name, vhost)
    return changes.delete_answer(res)


# ---------------------------------------------------------------- topic permissions

def _topic_json(p: cat.TopicPermissionRecord) -> dict:
    return {"user": p.user, "vhost": p.vhost, "exchange": p.exchange, "write": p.write, "read": p.read}


def _topic_permissions(request: web.Request, user: str | None = None, vhost: str | None = None) -> list[dict]:
    cl = api_of(request).broker.cluster.catalogue
    return [_topic_json(p) for _k, p in sorted(cl.topic_permissions.items())
            if (user is None or p.user == user) and (vhost is None or p.vhost == vhost)]


@routes.get("/api/topic-permissions")
@requires("administrator")
async def list_topic_permissions(request: web.Request) -> web.Response:
    return web.json_response(_topic_permissions(request))


@routes.get("/api/users/{name}/topic-permissions")
@requires("administrator")
async def user_topic_permissions(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in api_of(request).broker.users:
        raise not_found()
    return web.json_response(_topic_permissions(request, user=name))


@routes.get("/api/vhosts/{name}/topic-permissions")
@requires("administrator")
async def vhost_topic_permissions(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in api_of(request).broker.vhosts:
        raise not_found()
    return web.json_response(_topic_permissions(request, vhost=name))


@routes.get("/api/topic-permissions/{vhost}/{user}")
@requires("administrator")
async def get_topic_permission(request: web.Request) -> web.Response:
    vhost, name = request.match_info["vhost"], request.match_info["user"]
    found = _topic_permissions(request, user=name, vhost=vhost)
    if not found:
        raise not_found()
    return web.json_response(found)


@routes.put("/api/topic-permissions/{vhost}/{user}")
@requires("administrator")
async def put_topic_permission(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost, name = request.match_info["vhost"], request.match_info["user"]
    body = await read_json(request)
    values = []
    for key in ("exchange", "write", "read"):
        if key not in body:
            raise bad_request(f"[{{key_missing,{key}}}]")
        if not isinstance(body[key], str):
            raise bad_request(f"{key} must be a string")
        values.append(body[key])
    for key, value in (("write", values[1]), ("read", values[2])):
        try:
            re.compile(value)
        except re.error as e:
            raise bad_request(f"{key} is not a valid regular expression ({value!r}: {e})") from None
    if name not in broker.users or vhost not in broker.vhosts:
        raise bad_request("vhost_or_user_not_found")
    res = await changes.commit(broker, cat.SetTopicPermissions(name, vhost, *values))
    log.info("Successfully set topic permissions on exchange '%s' for '%s' in virtual host '%s' to '%s', '%s'",
             values[0], name, vhost, values[1], values[2])
    return changes.put_answer(res)


@routes.delete("/api/topic-permissions/{vhost}/{user}")
@requires("administrator")
async def delete_topic_permission(request: web.Request) -> web.Response:
    """Clears the user's topic permissions in the vhost (all of them, or with ?exchange=X only
    those on X)."""
    broker = api_of(request).broker
    vhost, name = request.match_info["vhost"], request.match_info["user"]
    exchange = request.query.get("exchange")
    if not _topic_permissions(request, user=name, vhost=vhost):
        raise not_found()
    res = await changes.commit(broker, cat.ClearTopicPermissions(name, vhost, exchange))
    if res.status == cat.DELETED and exchange is None:
        log.info("Successfully cleared topic permissions for '%s' in virtual host '%s'", name, vhost)
    elif res.status == cat.DELETED:
        log.info("Successfully cleared topic permissions on exchange '%s' for '%s' in virtual host '%s'",
                 exchange, name, vhost)
    return changes.delete_answer(res)


# ---------------------------------------------------------------- user and vhost limits

def _limit_value(body: dict) -> int:
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    value = body["value"]
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            pass
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(f"limit value must be an integer, got {body['value']!r}")
    return value


def _check_limit_name(name: str, allowed: tuple[str, ...], kind: str) -> None:
    if name not in allowed:
        raise bad_request(f"'{name}' is not a {kind} limit (valid limits: {', '.join(allowed)})")


@routes.get("/api/user-limits")
@requires("administrator")
async def list_user_limits(request: web.Request) -> web.Response:
    cl = api_of(request).broker.cluster.catalogue
    return web.json_response([{"user": name, "value": dict(u.limits)}
                              for name, u in sorted(cl.users.items()) if u.limits])


@routes.get("/api/user-limits/{user}")
@requires("administrator")
async def get_user_limits(request: web.Request) -> web.Response:
    name = request.match_info["user"]
    u = api_of(request).broker.cluster.catalogue.users.get(name)
    if u is None:
        raise not_found()
    return web.json_response([{"user": name, "value": dict(u.limits)}] if u.limits else [])


@routes.put("/api/user-limits/{user}/{name}")
@requires("administrator")
async def put_user_limit(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    user, name = request.match_info["user"], request.match_info["name"]
    _check_limit_name(name, USER_LIMITS, "user")
    value = _limit_value(await read_json(request))
    if user not in broker.users:
        raise not_found()
    await changes.commit(broker, cat.SetUserLimits(user, {name: value}))
    log.info("Successfully set user limit '%s' for user '%s' to %d", name, user, value)
    return web.Response(status=204)


@routes.delete("/api/user-limits/{user}/{name}")
@requires("administrator")
async def delete_user_limit(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    user, name = request.match_info["user"], request.match_info["name"]
    if user not in broker.users:
        raise not_found()
    if name != "all":
        _check_limit_name(name, USER_LIMITS, "user")
    res = await changes.commit(broker, cat.ClearUserLimits(user, name))
    if res.status == cat.DELETED:
        log.info("Successfully cleared user limit '%s' for user '%s'", name, user)
    return web.Response(status=204)


def _vhost_limit_rows(request: web.Request, names: list[str]) -> list[dict]:
    cl = api_of(request).broker.cluster.catalogue
    return [{"vhost": v, "value": cl.vhost_limits(v)} for v in sorted(names) if cl.vhost_limits(v)]


@routes.get("/api/vhost-limits")
async def list_vhost_limits(request: web.Request) -> web.Response:
    api = api_of(request)
    return web.json_response(_vhost_limit_rows(request, api.visible_vhosts(user_of(request))))


@routes.get("/api/vhost-limits/{vhost}")
async def get_vhost_limits(request: web.Request) -> web.Response:
    api = api_of(request)
    vhost = request.match_info["vhost"]
    if vhost not in api.broker.vhosts or not api.can_see_vhost(user_of(request), vhost):
        raise not_found()
    return web.json_response(_vhost_limit_rows(request, [vhost]))


async def set_vhost_limits(broker, vhost: str, limits: dict[str, int]) -> cat.Result:
    """Store a vhost's whole limits object (the runtime parameter vhost-limits/limits)."""
    if limits:
        res = await changes.commit(broker, cat.SetParameter(cat.VHOST_LIMITS, vhost, "limits", dict(sorted(
            limits.items()))))
    else:
        res = await changes.commit(broker, cat.ClearParameter(cat.VHOST_LIMITS, vhost, "limits"))
    log.info("Setting vhost limits for vhost '%s' to %s", vhost, json.dumps(dict(sorted(limits.items()))))
    return res


@routes.put("/api/vhost-limits/{vhost}/{name}")
@requires("administrator")
async def put_vhost_limit(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    if vhost not in broker.vhosts:
        raise not_found()
    _check_limit_name(name, VHOST_LIMITS, "vhost")
    value = _limit_value(await read_json(request))
    limits = broker.cluster.catalogue.vhost_limits(vhost)
    limits[name] = value
    await set_vhost_limits(broker, vhost, limits)
    return web.Response(status=204)


@routes.delete("/api/vhost-limits/{vhost}/{name}")
@requires("administrator")
async def delete_vhost_limit(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    if vhost not in broker.vhosts:
        raise not_found()
    limits = broker.cluster.catalogue.vhost_limits(vhost)
    if name == "all":
        limits = {}
    else:
        _check_limit_name(name, VHOST_LIMITS, "vhost")
        limits.pop(name, None)
    await set_vhost_limits(broker, vhost, limits)
    return web.Response(status=204)
