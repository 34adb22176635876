"""Definitions export and import over HTTP, in RabbitMQ's definitions format; runtime parameters.

    GET  /api/definitions                the whole catalogue as RabbitMQ's document (administrator)
    POST /api/definitions                import one; ?skip_unsupported=true imports what hutch
                                         can honour and answers 200 with what it left out
    GET|POST /api/definitions/{vhost}    one vhost's parameters, policies, queues, exchanges, bindings
    GET  /api/global-parameters[/{name}] global runtime parameters (cluster_name, ...)
    PUT|DELETE /api/global-parameters/{name}   {"value": ...}
    GET  /api/parameters[/{component}[/{vhost}[/{name}]]]   vhost-scoped runtime parameters

An import is planned whole first (`hutch.broker.definitions.plan`): every item becomes
catalogue commands or a refusal that names it. A document with a malformed item, or with an
item hutch cannot honour (an `x-delayed-message` exchange, a runtime parameter of a plugin's
component such as a federation upstream or a shovel, ...), is answered 400 with every such
item named in the reason, and nothing is changed. With `skip_unsupported=true` only malformed
items refuse it; the answer lists what was skipped. A binding whose exchange or queue is
neither in the document nor on the node is skipped as RabbitMQ skips it, with a warning in the
log naming it (and in the `skipped` list of a `skip_unsupported` answer). The planned commands
are then tried on a scratch copy of the catalogue, so whatever the catalogue would refuse
(permissions for a user that does not exist, a policy for a vhost that does not) is a 400
before anything is proposed, and then committed in dependency order. As in RabbitMQ, existing
exchanges and queues are left as they are, users, permissions, policies and parameters are set
to the document's, and a vhost that items refer to but the document does not define is
created. Classic queues are homed where the queue-master-locator puts them; quorum queues and
streams are declared as a client declares them (their own argument checks, their members
placed). A durable queue keeps the document's `hutch_id` as journal id (a quorum queue's or a
stream's Raft group) or gets a new random one. Imports are logged as RabbitMQ logs them
("Importing definitions from ...", then one line per kind with its count).

What it must never do: change anything when it refuses an import, or answer success for an
import that left something out without saying so.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from hutch import __version__
from hutch.amqp.spec import AMQPError
from hutch.broker import definitions as defs
from hutch.broker import kinds
from hutch.broker.broker import hash_password
from hutch.cluster import catalogue as cat
from hutch.control import changes
from hutch.control.errors import ApiError, bad_request, not_found
from hutch.control.http import api_of, read_json, requires
from hutch.control.policy import validate_policy

log = logging.getLogger("hutch.definitions")

routes = web.RouteTableDef()

REFUSALS_SHOWN_MAX = 50  # items named in one 400 answer; the count says how many more
HTTP_SOURCE = "a request to the HTTP API"


def context() -> defs.Context:
    return defs.Context(
        hash_password=hash_password,
        check_policy=lambda vhost, name, body: validate_policy(vhost, name, body),
        check_operator_policy=lambda vhost, name, body: validate_policy(vhost, name, body, operator=True))


def refusal_text(plan: defs.Plan, skip_unsupported: bool) -> str:
    """The reason given when a plan cannot be imported: every item that stops it, by name."""
    problems = plan.malformed if skip_unsupported else plan.problems
    shown = "; ".join(problems[:REFUSALS_SHOWN_MAX])
    more = f"; and {len(problems) - REFUSALS_SHOWN_MAX} more" if len(problems) > REFUSALS_SHOWN_MAX else ""
    if plan.malformed:
        head = f"invalid definitions, nothing was imported: {len(problems)} item(s) cannot be imported: "
    else:
        head = (f"definitions refused, nothing was imported: {len(problems)} item(s) hutch cannot honour "
                "(skip_unsupported=true imports the rest and lists them): ")
    return head + shown + more


def prepare(broker, doc: Any, *, skip_unsupported: bool = False) -> tuple[list[cat.Command], defs.Plan]:
    """The commands to commit for `doc`, checked whole (raises ApiError 400 naming every item
    that stops the import), and the plan they came from."""
    try:
        plan = defs.plan(doc, context())
    except defs.DefinitionsError as e:
        raise bad_request(f"invalid definitions: {e}") from None
    if plan.malformed:
        raise bad_request(refusal_text(plan, skip_unsupported))
    if plan.unsupported and not skip_unsupported:
        raise bad_request(refusal_text(plan, skip_unsupported))
    cmds, dangling = cluster_commands(broker, plan.commands)
    plan.dangling = dangling
    return cmds, plan


async def import_document(broker, doc: Any, *, skip_unsupported: bool = False,
                          source: str = HTTP_SOURCE) -> dict[str, Any]:
    """Import a document; what was imported (counts per kind) and what was skipped."""
    log.info("Importing definitions from %s", source)
    try:
        cmds, plan = prepare(broker, doc, skip_unsupported=skip_unsupported)
    except ApiError as e:
        log.error("Definitions from %s were not imported: %s", source, e.reason)
        raise
    for line in defs.counts_text(plan.counts):
        log.info("%s", line)
    for item in plan.unsupported + plan.dangling:
        log.warning("Skipped %s", item)
    await changes.commit_all(broker, cmds)
    skipped = plan.unsupported + plan.dangling
    log.info("Imported definitions from %s%s", source, f" ({len(skipped)} item(s) skipped)" if skipped else "")
    return {"imported": plan.counts, "skipped": skipped}


class BootImportError(Exception):
    """A definitions file configured with `load_definitions` that cannot be imported at boot:
    the text names the file and what is wrong with it; the node does not start."""


async def load_at_boot(broker, path: str) -> None:
    """Import the `load_definitions` file (or every `.json` file of a directory, in name
    order), as RabbitMQ does at every boot; raises BootImportError naming the file and item."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix == ".json" and f.is_file())
        if not files:
            raise BootImportError(f"definitions directory '{path}' holds no .json file")
    else:
        files = [p]
    await _earlier_runs_gone(broker)
    for f in files:
        try:
            raw = f.read_bytes()
        except OSError as e:
            raise BootImportError(f"could not read definitions file '{f}': {e.strerror or e}") from None
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise BootImportError(f"definitions file '{f}' is not valid JSON: {e}") from None
        try:
            await import_document(broker, doc, source=f"file at '{f}'")
        except ApiError as e:
            raise BootImportError(f"definitions file '{f}' was not imported: {e.reason}") from None


async def _earlier_runs_gone(broker) -> None:
    """Wait (at most the metadata timeout) until the non-durable queues this node's earlier run
    homed are deleted from the catalogue, as the node does when it starts: the file's own
    non-durable queues are then declared anew, not taken for ones about to go."""
    cl = broker.cluster
    loop = asyncio.get_running_loop()
    deadline = loop.time() + broker.config.metadata_timeout_ms / 1000

    def stale() -> bool:
        return any(rec.leader_node == cl.node and (not rec.durable or rec.exclusive_owner is not None)
                   and rec.home_incarnation not in (0, cl.incarnation) for rec in cl.catalogue.queues.values())

    while stale() and loop.time() < deadline:
        await asyncio.sleep(0.01)


def cluster_commands(broker, proposed: list[cat.Command]) -> tuple[list[cat.Command], list[str]]:
    """The planned commands as this node proposes them (queue homes and journal ids chosen,
    existing exchanges and queues kept), tried on a scratch copy of the catalogue first; and
    the bindings left out because an end is neither in the document nor on the node. RabbitMQ
    3.10 skips those too (and its rabbitmqctl export leaves internal exchanges out but keeps
    the bindings to them), so they do not refuse an import; they are logged and reported."""
    cl = broker.cluster
    scratch = cat.Catalogue.from_snapshot(cl.catalogue.snapshot())
    out: list[cat.Command] = []
    dangling: list[str] = []

    def take(cmd: cat.Command) -> None:
        res = scratch.apply(cmd)
        if isinstance(cmd, cat.Bind) and res.code == cat.NOT_FOUND:
            dangling.append(f"binding from exchange '{cmd.source}' to {cmd.destination_type} '{cmd.destination}' "
                            f"in vhost '{cmd.vhost}': {res.text} (neither in the definitions nor on the node)")
            return
        if res.code != cat.OK:
            raise bad_request(f"invalid definitions, nothing was imported: {_what(cmd)}: "
                              f"{changes.http_error(res).reason}")
        out.append(cmd)

    for cmd in proposed:
        vhost = getattr(cmd, "vhost", None)
        if isinstance(cmd, cat.AddVhost):
            old = scratch.vhosts.get(cmd.name)
            if old is not None and not (cmd.description or cmd.tags or cmd.default_queue_type):
                continue  # an existing vhost is kept as it is
        elif vhost is not None and vhost not in scratch.vhosts:
            take(cat.AddVhost(vhost))
        if isinstance(cmd, cat.DeclareExchange) and scratch.exchange(cmd.vhost, cmd.name) is not None:
            continue
        if isinstance(cmd, cat.DeclareQueue) and scratch.queue(cmd.vhost, cmd.name) is not None:
            continue  # an existing queue is left as it is
        if isinstance(cmd, cat.DeclareQueue) and cmd.type != cat.CLASSIC:
            cmd = _replicated_queue(cl, cmd)
        elif isinstance(cmd, cat.DeclareQueue):
            home = cl.choose_home(dict(cmd.arguments), False, cmd.vhost, cmd.name)
            # a non-durable queue lives as long as its home node's run (as one a client declares)
            cmd = msgspec.structs.replace(
                cmd, leader_node=home, journal_id=(cmd.journal_id or changes.new_journal_id()) if cmd.durable else 0,
                home_incarnation=cl.incarnation if home == cl.node and not cmd.durable else 0)
        take(cmd)
    return out, dangling


def _replicated_queue(cl, cmd: cat.DeclareQueue) -> cat.DeclareQueue:
    """A quorum queue or a stream as a client's declare makes it (its type's `Kind`): the type's
    own checks against the node's policies, its members placed now, and a Raft group id (the
    document's hutch_id when a node's own export gives one)."""
    try:
        return kinds.kind(cmd.type).declare_command(
            cl, cmd.vhost, cmd.name, durable=cmd.durable, exclusive=False, auto_delete=cmd.auto_delete,
            args=dict(cmd.arguments), owner=None, node=None, journal_id=cmd.journal_id or changes.new_journal_id())
    except AMQPError as e:
        raise bad_request(f"invalid definitions, nothing was imported: {_what(cmd)}: {e.text}") from None


def _what(cmd: cat.Command) -> str:
    name = getattr(cmd, "name", None) or getattr(cmd, "user", None) or getattr(cmd, "source", "")
    kind = type(cmd).__name__
    vhost = getattr(cmd, "vhost", None)
    return f"{kind} '{name}'" + (f" in vhost '{vhost}'" if vhost is not None else "")


def _flag(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0", "yes", "no"):
        raise bad_request(f"{name} must be true or false, got {raw!r}")
    return raw in ("true", "1", "yes")


def _catalogue(request: web.Request) -> cat.Catalogue:
    broker = api_of(request).broker
    if broker is None or broker.cluster is None:
        raise ApiError(503, "service_unavailable", "the hutch application is not running on this node")
    return broker.cluster.catalogue


def _import_answer(report: dict[str, Any], skip_unsupported: bool) -> web.Response:
    if skip_unsupported:
        return web.json_response(report)
    return web.Response(status=204)


# ---------------------------------------------------------------- definitions

@routes.get("/api/definitions")
@requires("administrator")
async def export_all(request: web.Request) -> web.Response:
    doc = defs.export(_catalogue(request), __version__)
    headers = {}
    if request.query.get("download"):
        headers["Content-Disposition"] = f'attachment; filename="{request.query["download"]}"'
    return web.json_response(doc, headers=headers)


@routes.post("/api/definitions")
@requires("administrator")
async def import_all(request: web.Request) -> web.Response:
    skip = _flag(request, "skip_unsupported")
    body = await read_json(request)
    report = await import_document(api_of(request).broker, body, skip_unsupported=skip)
    return _import_answer(report, skip)


@routes.get("/api/definitions/{vhost}")
@requires("administrator")
async def export_vhost(request: web.Request) -> web.Response:
    c = _catalogue(request)
    vhost = request.match_info["vhost"]
    if vhost not in c.vhosts:
        raise not_found()
    return web.json_response(defs.export_vhost(c, vhost, __version__))


@routes.post("/api/definitions/{vhost}")
@requires("administrator")
async def import_vhost(request: web.Request) -> web.Response:
    skip = _flag(request, "skip_unsupported")
    broker = api_of(request).broker
    vhost = request.match_info["vhost"]
    if vhost not in _catalogue(request).vhosts:
        raise not_found()
    body = await read_json(request)
    try:
        doc = defs.scoped(body, vhost)
    except defs.DefinitionsError as e:
        raise bad_request(f"invalid definitions: {e}") from None
    report = await import_document(broker, doc, skip_unsupported=skip,
                                   source=f"a request to the HTTP API for vhost '{vhost}'")
    return _import_answer(report, skip)


# ---------------------------------------------------------------- runtime parameters

def _global_parameter(name: str, value: Any) -> dict[str, Any]:
    return {"name": name, "value": defs.jsonable(value)}


def _global_parameters(c: cat.Catalogue) -> list[dict[str, Any]]:
    return [_global_parameter(k, v) for k, v in sorted(c.global_parameters.items())
            if not k.startswith(defs.INTERNAL_GLOBAL_PREFIX)]


@routes.get("/api/global-parameters")
@requires("administrator")
async def list_global_parameters(request: web.Request) -> web.Response:
    return web.json_response(_global_parameters(_catalogue(request)))


@routes.get("/api/global-parameters/{name}")
@requires("administrator")
async def get_global_parameter(request: web.Request) -> web.Response:
    c = _catalogue(request)
    name = request.match_info["name"]
    if name.startswith(defs.INTERNAL_GLOBAL_PREFIX) or name not in c.global_parameters:
        raise not_found()
    return web.json_response(_global_parameter(name, c.global_parameters[name]))


@routes.put("/api/global-parameters/{name}")
@requires("administrator")
async def put_global_parameter(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    _catalogue(request)
    if name.startswith(defs.INTERNAL_GLOBAL_PREFIX):
        raise bad_request(f"global parameters named '{defs.INTERNAL_GLOBAL_PREFIX}...' are the cluster's own")
    body = await read_json(request)
    if "value" not in body:
        raise bad_request("a global parameter needs a 'value'")
    res = await changes.commit(api_of(request).broker, cat.SetGlobalParameter(name, body["value"]))
    return changes.put_answer(res)


@routes.delete("/api/global-parameters/{name}")
@requires("administrator")
async def delete_global_parameter(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    _catalogue(request)
    if name.startswith(defs.INTERNAL_GLOBAL_PREFIX):
        raise not_found()
    res = await changes.commit(api_of(request).broker, cat.ClearGlobalParameter(name))
    return changes.delete_answer(res)


def _parameter(p: cat.ParameterRecord) -> dict[str, Any]:
    return {"value": defs.jsonable(p.value), "vhost": p.vhost, "component": p.component, "name": p.name}


def _parameters(c: cat.Catalogue, component: str | None = None, vhost: str | None = None) -> list[dict]:
    return [_parameter(p) for _, p in sorted(c.parameters.items())
            if (component is None or p.component == component) and (vhost is None or p.vhost == vhost)]


@routes.get("/api/parameters")
@requires("administrator")
async def list_parameters(request: web.Request) -> web.Response:
    return web.json_response(_parameters(_catalogue(request)))


@routes.get("/api/parameters/{component}")
@requires("administrator")
async def list_component_parameters(request: web.Request) -> web.Response:
    return web.json_response(_parameters(_catalogue(request), request.match_info["component"]))


@routes.get("/api/parameters/{component}/{vhost}")
@requires("administrator")
async def list_vhost_parameters(request: web.Request) -> web.Response:
    c = _catalogue(request)
    if request.match_info["vhost"] not in c.vhosts:
        raise not_found()
    return web.json_response(_parameters(c, request.match_info["component"], request.match_info["vhost"]))


@routes.get("/api/parameters/{component}/{vhost}/{name}")
@requires("administrator")
async def get_parameter(request: web.Request) -> web.Response:
    c = _catalogue(request)
    m = request.match_info
    p = c.parameters.get((m["component"], m["vhost"], m["name"]))
    if p is None:
        raise not_found()
    return web.json_response(_parameter(p))
