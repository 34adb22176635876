"""Policies over HTTP.

    GET /api/policies                       every policy in the vhosts the user may see
    GET /api/policies/{vhost}
    GET|PUT|DELETE /api/policies/{vhost}/{name}
        PUT {"pattern": "^two\\.", "definition": {"ha-mode": "exactly", "ha-params": 2},
             "priority": 0, "apply-to": "queues"}
    GET /api/operator-policies              operator policies (administrators only)
    GET /api/operator-policies/{vhost}
    GET|PUT|DELETE /api/operator-policies/{vhost}/{name}
        PUT {"pattern": "^t\\.", "definition": {"max-length": 1000}, "apply-to": "queues"}

Operator policies are RabbitMQ's second kind of policy: set by administrators, they may only
carry the numeric limits (`expires`, `message-ttl`, `max-length`, `max-length-bytes`,
`delivery-limit`), and where a queue's policy sets the same key the smaller value wins
(`hutch.queues.effective`). Their records have the same JSON shape as policies'.

Changing policies needs the policymaker (or administrator) tag and permissions in the
vhost. A policy is validated whole (see `hutch.control.policy`) before it replaces the one of
the same name; an invalid one is a 400 whose reason names the problem, and nothing changes.
Policies are stored with the node's durable definitions, or on a clustered node in the
catalogue (`SetPolicy` / `ClearPolicy`, see `hutch.control.changes`).
"""

from __future__ import annotations

import logging

from aiohttp import web

from hutch.cluster import catalogue as cat
from hutch.control import changes, listing
from hutch.control.errors import bad_request, not_authorised, not_found
from hutch.control.http import api_of, has_tag, read_json, requires, user_of
from hutch.control.policy import PolicyError, validate_policy

log = logging.getLogger("hutch.policies")
routes = web.RouteTableDef()

POLICIES_MAX = 10_000


def _may_see(user, vhost: str) -> bool:
    return vhost in user.permissions or has_tag(user, "monitoring")


@routes.get("/api/policies")
async def list_policies(request: web.Request) -> web.Response:
    api = api_of(request)
    user = user_of(request)
    return listing.respond(request, [dict(p) for p in api.broker.policies if _may_see(user, p["vhost"])])


@routes.get("/api/policies/{vhost}")
async def list_vhost_policies(request: web.Request) -> web.Response:
    api = api_of(request)
    vhost = request.match_info["vhost"]
    if vhost not in api.broker.vhosts:
        raise not_found()
    if not _may_see(user_of(request), vhost):
        raise not_authorised("User not authorised to access virtual host")
    return listing.respond(request, [dict(p) for p in api.broker.policies if p["vhost"] == vhost])


def _find(policies: list[dict], vhost: str, name: str) -> dict | None:
    return next((p for p in policies if p["vhost"] == vhost and p["name"] == name), None)


@routes.get("/api/policies/{vhost}/{name}")
async def get_policy(request: web.Request) -> web.Response:
    api = api_of(request)
    vhost = request.match_info["vhost"]
    if not _may_see(user_of(request), vhost):
        raise not_authorised("User not authorised to access virtual host")
    p = _find(api.broker.policies, vhost, request.match_info["name"])
    if p is None:
        raise not_found()
    return web.json_response(dict(p))


def set_policy_command(record: dict) -> cat.SetPolicy:
    """The catalogue command for a validated policy record (`validate_policy`'s result)."""
    return cat.SetPolicy(record["vhost"], record["name"], record["pattern"], record["apply-to"],
                         record["priority"], record["definition"])


def _check_policymaker(request: web.Request, vhost: str) -> None:
    user = user_of(request)
    if vhost not in user.permissions and not has_tag(user, "administrator"):
        raise not_authorised("User not authorised to access virtual host")


@routes.put("/api/policies/{vhost}/{name}")
@requires("policymaker")
async def put_policy(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    if vhost not in broker.vhosts:
        return web.json_response({"error": "not_found", "reason": "vhost_not_found"}, status=404)
    _check_policymaker(request, vhost)
    body = await read_json(request)
    try:
        record = validate_policy(vhost, name, body)
    except PolicyError as e:
        raise bad_request(str(e)) from None
    old = _find(broker.policies, vhost, name)
    if old is None and len(broker.policies) >= POLICIES_MAX:
        raise bad_request(f"too many policies (at most {POLICIES_MAX})")
    res = await changes.commit(broker, set_policy_command(record))
    log.info("Successfully set policy '%s' matching %s names in virtual host '%s' using pattern '%s'",
             name, record["apply-to"], vhost, record["pattern"])
    return changes.put_answer(res)


@routes.delete("/api/policies/{vhost}/{name}")
@requires("policymaker")
async def delete_policy(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    _check_policymaker(request, vhost)
    old = _find(broker.policies, vhost, name)
    if old is None:
        raise not_found()
    return changes.delete_answer(await changes.commit(broker, cat.ClearPolicy(vhost, name)))


# ---------------------------------------------------------------- operator policies


@routes.get("/api/operator-policies")
@requires("administrator")
async def list_operator_policies(request: web.Request) -> web.Response:
    return listing.respond(request, [dict(p) for p in api_of(request).broker.operator_policies])


@routes.get("/api/operator-policies/{vhost}")
@requires("administrator")
async def list_vhost_operator_policies(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost = request.match_info["vhost"]
    if vhost not in broker.vhosts:
        raise not_found()
    return listing.respond(request, [dict(p) for p in broker.operator_policies if p["vhost"] == vhost])


@routes.get("/api/operator-policies/{vhost}/{name}")
@requires("administrator")
async def get_operator_policy(request: web.Request) -> web.Response:
    p = _find(api_of(request).broker.operator_policies, request.match_info["vhost"], request.match_info["name"])
    if p is None:
        raise not_found()
    return web.json_response(dict(p))


def set_operator_policy_command(record: dict) -> cat.SetOperatorPolicy:
    """The catalogue command for a validated operator policy record."""
    return cat.SetOperatorPolicy(record["vhost"], record["name"], record["pattern"], record["apply-to"],
                                 record["priority"], record["definition"])


@routes.put("/api/operator-policies/{vhost}/{name}")
@requires("administrator")
async def put_operator_policy(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    if vhost not in broker.vhosts:
        return web.json_response({"error": "not_found", "reason": "vhost_not_found"}, status=404)
    body = await read_json(request)
    try:
        record = validate_policy(vhost, name, body, operator=True)
    except PolicyError as e:
        raise bad_request(str(e)) from None
    if _find(broker.operator_policies, vhost, name) is None and len(broker.operator_policies) >= POLICIES_MAX:
        raise bad_request(f"too many operator policies (at most {POLICIES_MAX})")
    return changes.put_answer(await changes.commit(broker, set_operator_policy_command(record)))


@routes.delete("/api/operator-policies/{vhost}/{name}")
@requires("administrator")
async def delete_operator_policy(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    if _find(broker.operator_policies, vhost, name) is None:
        raise not_found()
    return changes.delete_answer(await changes.commit(broker, cat.ClearOperatorPolicy(vhost, name)))
