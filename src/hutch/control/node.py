"""Node-level routes: overview, nodes, whoami, cluster name, aliveness and health checks.

    GET /api/overview                   versions, node, cluster name, totals, listeners
    GET /api/nodes, /api/nodes/{name}   this node (a cluster lists every member)
    GET /api/whoami                     the authenticated user and its tags
    GET|PUT /api/cluster-name
    GET /api/aliveness-test/{vhost}     declare, publish, get: {"status": "ok"}
    GET /api/healthchecks/node[/{name}] {"status": "ok"} or {"status": "failed", "reason": ...}
    GET /api/health/checks/alarms       200 when no resource alarm is in effect, else 503
    GET /api/health/checks/local-alarms
    GET /api/health/checks/virtual-hosts
    GET /api/health/checks/port-listener/{port}
    GET /api/health/checks/protocol-listener/{protocol}
    GET /api/health/checks/node-is-quorum-critical
    GET /api/health/checks/node-is-mirror-sync-critical
    GET /api/hutch/node/state           {"node", "app_running", "paused", ...}: what ping and check_running ask
    GET /api/hutch/node/log?lines=N     the last lines of the node's log file
    GET /api/hutch/node/memory          the node's memory use by category
    GET /api/hutch/node/environment     the node's settings (secrets left out)
    POST /api/hutch/node/stop           stop the node process (rabbitmqctl stop)

Every answer tells the truth about the application: after `stop_app` the node reports itself
not running, its AMQP listeners gone and its health checks failed (503 with
`{"status": "failed", "reason": ...}`, as RabbitMQ's health check endpoints answer), and any
write under /api/ other than the app and node controls answers 503 with a reason
(`app_state_middleware`). These routes never guess: a peer's state is what it last reported
and whether its link is up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import sys
import time
from typing import Any

import psutil
from aiohttp import web

from hutch import __version__
from hutch.broker.streamq import advertised_address
from hutch.control import ops, quorum
from hutch.control import stats as msg_stats
from hutch.control.errors import ApiError, bad_request, not_authorised, not_found, service_unavailable
from hutch.control.http import Api, api_of, node_name_arg, read_json, requires, user_of

routes = web.RouteTableDef()

RABBITMQ_COMPAT_VERSION = "3.10.8"  # the RabbitMQ release whose API and definitions hutch follows
EXCHANGE_TYPES = [
    {"name": t, "description": f"AMQP {t} exchange, as per the AMQP specification", "enabled": True}
    for t in ("direct", "fanout", "headers", "topic")
]
AUTH_MECHANISMS = {"PLAIN": "SASL PLAIN authentication mechanism", "AMQPLAIN": "QPid AMQPLAIN mechanism",
                   "EXTERNAL": "SASL EXTERNAL authentication mechanism (client certificates)"}


def app_running(api: Api) -> bool:
    """Whether the broker proper runs on this node (False between stop_app and start_app)."""
    ops_ = getattr(api, "node_ops", None)
    return True if ops_ is None else bool(ops_.app_running)


def stopped_reason(api: Api) -> str:
    return f"hutch is not running on node {api.node_name}; start it with 'hutchctl start_app'"


def _amqp_ports(api: Api) -> list[tuple[str, int]]:
    """(protocol, port) of each client listener (AMQP, AMQPS, the stream protocol) that accepts
    connections right now."""
    cfg = api.broker.config
    tls = bool(getattr(cfg, "tls_certfile", None) and getattr(cfg, "tls_keyfile", None))
    ops_ = getattr(api, "node_ops", None)
    if ops_ is None:  # an application without a runtime: what the configuration says
        return ([("amqp", cfg.amqp_port)] + ([("amqp/ssl", cfg.amqps_port)] if tls else [])
                + ([("stream", cfg.stream_port)] if cfg.stream_port else []))
    if not ops_.app_running or getattr(ops_, "paused", False):
        return []
    out: list[tuple[str, int]] = []
    for i, server in enumerate(getattr(ops_, "servers", [])):
        if not server.is_serving():
            continue
        for sock in server.sockets:
            entry = ("amqp/ssl" if i > 0 else "amqp", sock.getsockname()[1])
            if entry not in out:
                out.append(entry)
    streams = getattr(ops_, "streams", None)
    if streams is not None and streams.port:
        out.append(("stream", streams.port))
    return out


def listeners(api: Api) -> list[dict[str, Any]]:
    cfg = api.broker.config
    node = cfg.node_name
    ip = cfg.amqp_host or "::"
    out = [{"node": node, "protocol": proto, "ip_address": ip, "port": port, "socket_opts": {}}
           for proto, port in _amqp_ports(api)]
    if api.http_port:
        out.append({"node": node, "protocol": "http", "ip_address": api.http_host or "::", "port": api.http_port,
                    "socket_opts": {}})
    if api.https_port:
        out.append({"node": node, "protocol": "https", "ip_address": api.https_host or "::",
                    "port": api.https_port, "socket_opts": {}})
    return out


def cluster_name(api: Api) -> str:
    cfg = api.broker.config
    return cfg.cluster_name or cfg.node_name


def _totals(api: Api) -> tuple[dict[str, int], dict[str, Any]]:
    b = api.broker
    queues = [q for v in b.vhosts.values() for q in v.queues.values()]
    figures = [q.figures() for q in queues]
    ready = sum(f.ready for f in figures)
    unacked = sum(f.unacked for f in figures)
    channels = sum(len(s.channels) for s in b.sessions)
    consumers = sum(q.consumer_count for q in queues)
    objects = {"channels": channels, "connections": len(b.sessions), "consumers": consumers,
               "exchanges": sum(len(v.exchanges) for v in b.vhosts.values()), "queues": len(queues)}
    queue_totals = {"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked}
    return objects, queue_totals


@routes.get("/api/overview")
async def overview(request: web.Request) -> web.Response:
    api = api_of(request)
    objects, queue_totals = _totals(api)
    message_stats, length_details, churn_rates = await msg_stats.overview(api.broker, msg_stats.window_of(request))
    queue_totals.update(length_details)
    return web.json_response({
        "management_version": RABBITMQ_COMPAT_VERSION,
        "rabbitmq_version": RABBITMQ_COMPAT_VERSION,
        "product_name": "hutch",
        "product_version": __version__,
        "python_version": sys.version.split()[0],
        "cluster_name": cluster_name(api),
        "node": api.node_name,
        "rates_mode": "basic",
        "disable_stats": False,
        "enable_queue_totals": True,
        "exchange_types": EXCHANGE_TYPES,
        "object_totals": objects,
        "queue_totals": queue_totals,
        "message_stats": message_stats,
        "churn_rates": churn_rates,
        "statistics_db_event_queue": 0,
        "listeners": listeners(api),
        "contexts": [{"node": api.node_name, "description": "hutch management", "path": "/",
                      "ip": api.http_host or "::", "port": str(api.http_port)}],
    })


def node_info(api: Api) -> dict[str, Any]:
    b = api.broker
    cfg = b.config
    proc = psutil.Process()
    mem_total = psutil.virtual_memory().total
    mem_limit = cfg.vm_memory_high_watermark_bytes or int(mem_total * cfg.vm_memory_high_watermark)
    try:
        disk_free = shutil.disk_usage(cfg.data_dir).free
    except OSError:
        disk_free = 0
    try:
        fd_used = proc.num_fds()
    except (psutil.Error, AttributeError):
        fd_used = 0
    try:
        import resource
        fd_total = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        fd_total = 0
    return {
        "name": cfg.node_name,
        # where stream-protocol clients reach this node (peers put it in their metadata answers)
        "stream_advertised": dict(zip(("host", "port"), advertised_address(cfg), strict=True)),
        "type": "disc",
        "running": app_running(api),
        "being_drained": False,
        "os_pid": str(os.getpid()),
        "mem_used": proc.memory_info().rss,
        "mem_limit": mem_limit,
        "mem_alarm": "memory" in b.alarms,
        "disk_free": disk_free,
        "disk_free_limit": cfg.disk_free_limit_bytes,
        "disk_free_alarm": "disk" in b.alarms,
        "fd_used": fd_used,
        "fd_total": fd_total,
        "sockets_used": len(b.sessions),
        "sockets_total": fd_total,
        "proc_used": 1,
        "proc_total": 1,
        "processors": os.cpu_count() or 1,
        "run_queue": 0,
        "uptime": int((time.time() - api.started_at_s) * 1000),
        **msg_stats.node_resource_details(b),
        "rates_mode": "basic",
        "partitions": (b.cluster.status().get("partitions", {}).get(cfg.node_name, [])
                       if b.cluster is not None else []),
        "cluster_links": [],
        "net_ticktime": int(cfg.net_ticktime_s) if float(cfg.net_ticktime_s).is_integer() else cfg.net_ticktime_s,
        "exchange_types": EXCHANGE_TYPES,
        "auth_mechanisms": [{"name": m, "description": AUTH_MECHANISMS.get(m, m),
                             "enabled": m in getattr(cfg, "auth_mechanisms", ["PLAIN", "AMQPLAIN"])}
                            for m in AUTH_MECHANISMS],
        "applications": [{"name": "hutch", "description": "hutch message broker", "version": __version__}],
        "config_files": [],
        "log_files": [log_file() or os.path.join(os.path.abspath(cfg.data_dir), "log", f"{cfg.node_name}.log")],
        "data_dir": os.path.abspath(cfg.data_dir),
    }


def _peer_info(name: str, running: bool) -> dict[str, Any]:
    """Another member of the cluster: what this node knows of it without asking it."""
    return {"name": name, "type": "disc", "running": running, "being_drained": False,
            "partitions": [], "cluster_links": []}


def _running_nodes(api: Api) -> list[str]:
    """The members this node sees running: none of them while its own app is stopped (it has
    left the cluster's links then, so it knows nothing current of the others)."""
    cl = api.broker.cluster
    if not app_running(api):
        return []
    if cl is None:
        return [api.node_name]
    return list(cl.status().get("running_nodes", ()))


def cluster_nodes(api: Api) -> list[dict[str, Any]]:
    cl = api.broker.cluster
    me = node_info(api)
    if cl is None:
        return [me]
    running = set(_running_nodes(api))
    st = cl.status()
    out = []
    for n in st.get("members", [api.node_name]):
        if n == api.node_name:
            out.append(me)
        else:  # what the peer last reported of itself, with whether it is running now
            out.append({**cl.peer_info.get(n, _peer_info(n, False)), "name": n, "running": n in running})
    return out


@routes.get("/api/nodes")
@requires("monitoring")
async def nodes(request: web.Request) -> web.Response:
    return web.json_response(cluster_nodes(api_of(request)))


@routes.get("/api/hutch/cluster")
@requires("monitoring")
async def cluster_status(request: web.Request) -> web.Response:
    """What `rabbitmqctl cluster_status` prints: members, running nodes, the catalogue's leader."""
    api = api_of(request)
    cl = api.broker.cluster
    if cl is None:
        name = api.node_name
        return web.json_response({"cluster_name": cluster_name(api), "node": name, "members": [name],
                                  "disk_nodes": [name], "running_nodes": _running_nodes(api),
                                  "leader": name if app_running(api) else None, "partitions": {},
                                  "alarms": sorted(api.broker.alarms), "app_running": app_running(api)})
    st = dict(cl.status())
    st["running_nodes"] = _running_nodes(api)
    if not app_running(api):
        st["leader"] = None
    st["alarms"] = sorted(api.broker.alarms)
    st["app_running"] = app_running(api)
    return web.json_response(st)


@routes.get("/api/nodes/{name}")
@requires("monitoring")
async def node(request: web.Request) -> web.Response:
    api = api_of(request)
    for n in cluster_nodes(api):
        if n["name"] == request.match_info["name"]:
            return web.json_response(n)
    raise not_found()


@routes.get("/api/whoami")
async def whoami(request: web.Request) -> web.Response:
    u = user_of(request)
    return web.json_response({"name": u.name, "tags": list(u.tags)})


@routes.get("/api/cluster-name")
async def get_cluster_name(request: web.Request) -> web.Response:
    return web.json_response({"name": cluster_name(api_of(request))})


@routes.put("/api/cluster-name")
@requires("administrator")
async def put_cluster_name(request: web.Request) -> web.Response:
    body = await read_json(request)
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("name must be a non-empty string")
    await ops.set_cluster_name(api_of(request).broker, name)
    return web.Response(status=204)


@routes.get("/api/aliveness-test/{vhost}")
async def aliveness(request: web.Request) -> web.Response:
    api = api_of(request)
    user = user_of(request)
    name = request.match_info["vhost"]
    v = api.broker.vhosts.get(name)
    if v is None:
        raise not_found()
    if name not in user.permissions:
        raise not_authorised("User not authorised to access virtual host")
    if not app_running(api):
        return web.json_response({"status": "failed", "reason": stopped_reason(api)}, status=503)
    await ops.run_aliveness_test(api.broker, user, v)
    return web.json_response({"status": "ok"})


@routes.get("/api/healthchecks/node")
async def healthcheck(request: web.Request) -> web.Response:
    return web.json_response(_node_health(api_of(request)))


@routes.get("/api/healthchecks/node/{name}")
async def healthcheck_node(request: web.Request) -> web.Response:
    api = api_of(request)
    if request.match_info["name"] != api.node_name:
        raise not_found()
    return web.json_response(_node_health(api))


def _node_health(api: Api) -> dict[str, Any]:
    if not app_running(api):
        return {"status": "failed", "reason": stopped_reason(api)}
    if api.broker.alarms:
        return {"status": "failed", "reason": f"resource alarm(s) in effect: {', '.join(sorted(api.broker.alarms))}"}
    return {"status": "ok"}


def _failed(reason: str, **extra: Any) -> web.Response:
    return web.json_response({"status": "failed", "reason": reason, **extra}, status=503)


def local_alarms(api: Api) -> list[dict[str, str]]:
    return [{"node": api.node_name, "resource": a} for a in sorted(api.broker.alarms)]


def cluster_alarms(api: Api) -> list[dict[str, str]]:
    """This node's alarms and those its running peers last reported."""
    out = local_alarms(api)
    for n in cluster_nodes(api):
        if n["name"] == api.node_name or not n.get("running"):
            continue
        out += [{"node": n["name"], "resource": r}
                for r, key in (("memory", "mem_alarm"), ("disk", "disk_free_alarm")) if n.get(key)]
    return out


@routes.get("/api/health/checks/alarms")
async def health_alarms(request: web.Request) -> web.Response:
    api = api_of(request)
    if not app_running(api):
        return _failed(stopped_reason(api))
    alarms = cluster_alarms(api)
    if alarms:
        return _failed("There are alarms in effect in the cluster", alarms=alarms)
    return web.json_response({"status": "ok"})


@routes.get("/api/health/checks/local-alarms")
async def health_local_alarms(request: web.Request) -> web.Response:
    api = api_of(request)
    if not app_running(api):
        return _failed(stopped_reason(api))
    alarms = local_alarms(api)
    if alarms:
        return _failed("There are alarms in effect on the node", alarms=alarms)
    return web.json_response({"status": "ok"})


@routes.get("/api/health/checks/virtual-hosts")
async def health_vhosts(request: web.Request) -> web.Response:
    api = api_of(request)
    if not app_running(api):
        return _failed("Some virtual hosts are down", **{"virtual-hosts": sorted(api.broker.vhosts)})
    return web.json_response({"status": "ok"})


@routes.get("/api/health/checks/port-listener/{port}")
async def health_port(request: web.Request) -> web.Response:
    api = api_of(request)
    raw = request.match_info["port"]
    if not raw.isdigit():
        raise bad_request(f"port must be an integer, got {raw!r}")
    port = int(raw)
    ports = [ln["port"] for ln in listeners(api)]
    if port in ports:
        return web.json_response({"status": "ok", "port": port})
    return _failed("No active listener", missing=port, ports=ports)


PROTOCOL_ALIASES = {"amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp", "amqps": "amqp/ssl",
                    "amqp/tls": "amqp/ssl", "http/ssl": "https"}


@routes.get("/api/health/checks/protocol-listener/{protocol}")
async def health_protocol(request: web.Request) -> web.Response:
    api = api_of(request)
    protocol = request.match_info["protocol"].lower()
    protocols = [ln["protocol"] for ln in listeners(api)]
    if PROTOCOL_ALIASES.get(protocol, protocol) in protocols:
        return web.json_response({"status": "ok", "protocol": protocol})
    return _failed("No active listener", missing=protocol, protocols=protocols)


def quorum_critical(api: Api) -> list[dict[str, str]]:
    """Quorum queues and streams (a Raft group each) with a member here that would lose their
    majority if this node stopped."""
    me = api.node_name
    out = []
    for v in api.broker.vhosts.values():
        for qu in v.queues.values():
            if qu.queue_type not in ("quorum", "stream"):
                continue
            members = list(qu.members)
            online = [n for n in qu.online() if n != me]
            if me in members and len(online) < len(members) // 2 + 1:
                out.append({"name": qu.name, "readable_name": f"queue '{qu.name}' in vhost '{qu.vhost}'",
                            "virtual_host": qu.vhost, "type": qu.queue_type})
    return out


def mirror_sync_critical(api: Api) -> list[dict[str, str]]:
    """Mirrored classic queues led here with no other synchronised replica."""
    me = api.node_name
    cl = api.broker.cluster
    out = []
    if cl is None:
        return out
    for v in api.broker.vhosts.values():
        for qu in v.queues.values():
            if qu.queue_type != "classic" or (qu.home_node or me) != me:
                continue
            mirrors, synced = cl.mirror_status(qu.vhost, qu.name)
            if mirrors and not [n for n in synced if n != me]:
                out.append({"name": qu.name, "readable_name": f"queue '{qu.name}' in vhost '{qu.vhost}'",
                            "virtual_host": qu.vhost, "type": "classic"})
    return out


@routes.get("/api/health/checks/node-is-quorum-critical")
async def health_quorum_critical(request: web.Request) -> web.Response:
    api = api_of(request)
    if not app_running(api):
        return _failed(stopped_reason(api))
    critical = quorum_critical(api)
    if critical:
        return _failed("There are quorum queues that would lose their quorum if the target node is shut down",
                       queues=critical)
    return web.json_response({"status": "ok"})


@routes.get("/api/health/checks/node-is-mirror-sync-critical")
async def health_mirror_sync_critical(request: web.Request) -> web.Response:
    api = api_of(request)
    if not app_running(api):
        return _failed(stopped_reason(api))
    critical = mirror_sync_critical(api)
    if critical:
        return _failed("There are classic mirrored queues without online synchronised mirrors present",
                       queues=critical)
    return web.json_response({"status": "ok"})


# ---------------------------------------------------------------- the node process
#
# What rabbitmq-diagnostics reads from a node over Erlang distribution (ping, its log, its
# memory, its environment) and what `rabbitmqctl stop` asks, hutch's CLIs ask through these.

LOG_LINES_MAX = 10_000
LOG_READ_BYTES_MAX = 16 * 1024 * 1024
SECRET_WORDS = ("pass", "secret", "cookie")


@routes.get("/api/hutch/node/state")
@requires("monitoring")
async def node_state(request: web.Request) -> web.Response:
    api = api_of(request)
    ops_ = getattr(api, "node_ops", None)
    return web.json_response({"node": api.node_name, "app_running": app_running(api),
                              "paused": bool(getattr(ops_, "paused", False)), "os_pid": str(os.getpid()),
                              "uptime": int((time.time() - api.started_at_s) * 1000)})


def log_file() -> str | None:
    """The file the node's log goes to (the root logger's file handler)."""
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            return h.baseFilename
    return None


def tail(path: str, lines: int) -> list[str]:
    """The last `lines` lines of a file, read from its end (at most LOG_READ_BYTES_MAX bytes)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        end = f.tell()
        pos, chunk, data = end, 64 * 1024, b""
        while pos > 0 and data.count(b"\n") <= lines and end - pos < LOG_READ_BYTES_MAX:
            step = min(chunk, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    text = data.decode(errors="replace").splitlines()
    return text[-lines:] if lines else []


@routes.get("/api/hutch/node/log")
@requires("administrator")
async def node_log(request: web.Request) -> web.Response:
    api = api_of(request)
    raw = request.query.get("lines", "50")
    if not raw.isdigit() or not 0 < int(raw) <= LOG_LINES_MAX:
        raise bad_request(f"lines must be an integer from 1 to {LOG_LINES_MAX}, got {raw!r}")
    path = log_file()
    if path is None:
        raise ApiError(404, "not_found", f"node {api.node_name} does not log to a file")
    try:
        lines = tail(path, int(raw))
    except OSError as e:
        raise ApiError(404, "not_found", f"cannot read the log file {path}: {e.strerror}") from None
    return web.json_response({"node": api.node_name, "file": path, "lines": lines})


@routes.get("/api/hutch/node/memory")
@requires("monitoring")
async def node_memory(request: web.Request) -> web.Response:
    api = api_of(request)
    rss = psutil.Process().memory_info().rss
    ops_ = getattr(api, "node_ops", None)
    baseline = min(int(getattr(ops_, "_baseline_rss", 0) or 0), rss)
    messages = min(api.broker.accounted_bytes() if app_running(api) else 0, rss - baseline)
    breakdown = {"runtime_at_startup": baseline, "queue_messages": messages,
                 "other": max(rss - baseline - messages, 0)}
    return web.json_response({"node": api.node_name, "total": {"rss": rss}, "breakdown": breakdown})


def _settings(cfg: Any) -> dict[str, Any]:
    out = {}
    for k, v in (dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else {}).items():
        if any(w in k for w in SECRET_WORDS) and v:
            v = "********"
        elif isinstance(v, tuple):
            v = list(v)
        out[k] = v
    return out


@routes.get("/api/hutch/node/environment")
@requires("administrator")
async def node_environment(request: web.Request) -> web.Response:
    api = api_of(request)
    return web.json_response({"node": api.node_name, "hutch": _settings(api.broker.config)})


@routes.post("/api/hutch/node/stop")
@requires("administrator")
async def stop_node(request: web.Request) -> web.Response:
    """Stop the node process once this answer has gone out (what SIGTERM does)."""
    ops_ = _node_ops(api_of(request))
    asyncio.get_running_loop().call_later(0.05, ops_.request_stop)
    return web.json_response({"node": api_of(request).node_name, "os_pid": str(os.getpid())}, status=202)


# ---------------------------------------------------------------- writes while the app is stopped

_ALLOWED_WHILE_STOPPED = ("/api/hutch/app/", "/api/hutch/cluster/join", "/api/hutch/node/")


@web.middleware
async def app_state_middleware(request: web.Request, handler):
    """A write under /api/ while the app is stopped answers 503 with a reason, before any handler
    touches the stopped broker (only the app and node controls are served then)."""
    if (request.method not in ("GET", "HEAD", "OPTIONS") and request.path.startswith("/api/")
            and not request.path.startswith(_ALLOWED_WHILE_STOPPED) and not app_running(api_of(request))):
        raise service_unavailable(stopped_reason(api_of(request)))
    return await handler(request)


# ---------------------------------------------------------------- the application and membership
#
#   POST /api/hutch/app/stop | /api/hutch/app/start | /api/hutch/app/reset
#   POST /api/hutch/cluster/join    {"node": "NAME@HOST", "address": "HOST:PEER_PORT" (optional)}
#   POST /api/hutch/cluster/forget  {"node": "NAME@HOST"}
#
# What rabbitmqctl does over Erlang distribution, hutchctl does through these: the node's
# runtime (`api.node_ops`) carries them out; the HTTP listener stays up while the app is stopped.

def _node_ops(api: Api):
    ops_ = getattr(api, "node_ops", None)
    if ops_ is None:
        raise ApiError(501, "not_implemented", "this node cannot be controlled over HTTP")
    return ops_


async def _app_call(request: web.Request, fn) -> web.Response:
    try:
        result = fn(_node_ops(api_of(request)))
        if hasattr(result, "__await__"):
            await result
    except ApiError:
        raise
    except Exception as e:  # the runtime's refusal (AppStateError) or a failure to start
        if type(e).__name__ != "AppStateError":
            raise bad_request(f"{type(e).__name__}: {e}") from None
        raise bad_request(str(e)) from None
    return web.Response(status=204)


@routes.post("/api/hutch/app/stop")
@requires("administrator")
async def stop_app(request: web.Request) -> web.Response:
    return await _app_call(request, lambda n: n.stop_app())


@routes.post("/api/hutch/app/start")
@requires("administrator")
async def start_app(request: web.Request) -> web.Response:
    return await _app_call(request, lambda n: n.start_app())


@routes.post("/api/hutch/app/reset")
@requires("administrator")
async def reset_node(request: web.Request) -> web.Response:
    return await _app_call(request, lambda n: n.reset())


@routes.post("/api/hutch/cluster/join")
@requires("administrator")
async def join_cluster(request: web.Request) -> web.Response:
    body = await read_json(request, required=True)
    seed = node_name_arg(body)
    address = body.get("address")
    addr = None
    if address is not None:
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit():
            raise bad_request("'address' must be HOST:PEER_PORT")
        addr = (host, int(port))
    return await _app_call(request, lambda n: n.join_cluster(seed, addr))


async def forget_cluster_member(node: Any, broker: Any, name: str) -> str | None:
    """forget_cluster_node on the running `node`: `name` leaves the cluster (its classic queues
    are deleted or go to a mirror), then every quorum queue and stream it was a member of
    (quorum.drop_forgotten_member). The refusal's text, or None once done."""
    fut = asyncio.get_running_loop().create_future()
    node.forget_cluster_node(name, lambda error: fut.done() or fut.set_result(error))
    error = await fut
    if error is None:
        await quorum.drop_forgotten_member(broker, name)
    return error


@routes.post("/api/hutch/cluster/forget")
@requires("administrator")
async def forget_cluster_node(request: web.Request) -> web.Response:
    body = await read_json(request, required=True)
    name = node_name_arg(body)
    refused: list[str] = []

    async def forget(n: Any) -> None:
        error = await forget_cluster_member(n, api_of(request).broker, name)
        if error is not None:
            refused.append(error)
    await _app_call(request, forget)
    if refused:
        raise bad_request(refused[0])
    return web.Response(status=204)
