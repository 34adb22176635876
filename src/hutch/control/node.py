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
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from typing import Any

import psutil
from aiohttp import web

from hutch import __version__
from hutch.control import ops
from hutch.control.app import Api, api_of, read_json, requires, user_of
from hutch.control.errors import ApiError, bad_request, not_authorised, not_found

routes = web.RouteTableDef()

RABBITMQ_COMPAT_VERSION = "3.10.8"  # the RabbitMQ release whose API and definitions hutch follows
EXCHANGE_TYPES = [
    {"name": t, "description": f"AMQP {t} exchange, as per the AMQP specification", "enabled": True}
    for t in ("direct", "fanout", "headers", "topic")
]
AUTH_MECHANISMS = {"PLAIN": "SASL PLAIN authentication mechanism", "AMQPLAIN": "QPid AMQPLAIN mechanism",
                   "EXTERNAL": "SASL EXTERNAL authentication mechanism (client certificates)"}


def listeners(api: Api) -> list[dict[str, Any]]:
    cfg = api.broker.config
    node = cfg.node_name
    ip = cfg.amqp_host or "::"
    out = [{"node": node, "protocol": "amqp", "ip_address": ip, "port": cfg.amqp_port, "socket_opts": {}}]
    amqps_port = getattr(cfg, "amqps_port", None)
    if amqps_port and getattr(cfg, "tls_certfile", None) and getattr(cfg, "tls_keyfile", None):
        out.append({"node": node, "protocol": "amqp/ssl", "ip_address": ip, "port": amqps_port, "socket_opts": {}})
    if api.http_port:
        out.append({"node": node, "protocol": "http", "ip_address": api.http_host or "::", "port": api.http_port,
                    "socket_opts": {}})
    return out


def cluster_name(api: Api) -> str:
    cfg = api.broker.config
    return cfg.cluster_name or cfg.node_name


def _totals(api: Api) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    b = api.broker
    queues = [q for v in b.vhosts.values() for q in v.queues.values()]
    ready = sum(q.state.ready_count for q in queues)
    unacked = sum(q.state.unacked_count for q in queues)
    channels = sum(len(s.channels) for s in b.sessions)
    consumers = sum(q.consumer_count for q in queues)
    objects = {"channels": channels, "connections": len(b.sessions), "consumers": consumers,
               "exchanges": sum(len(v.exchanges) for v in b.vhosts.values()), "queues": len(queues)}
    queue_totals = {"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked}
    stats = {"publish": sum(q.stats_published for q in queues), "deliver_get": sum(q.stats_delivered for q in queues),
             "ack": sum(q.stats_acked for q in queues)}
    return objects, queue_totals, stats


@routes.get("/api/overview")
async def overview(request: web.Request) -> web.Response:
    api = api_of(request)
    objects, queue_totals, stats = _totals(api)
    return web.json_response({
        "management_version": RABBITMQ_COMPAT_VERSION,
        "rabbitmq_version": RABBITMQ_COMPAT_VERSION,
        "product_name": "hutch",
        "product_version": __version__,
        "python_version": sys.version.split()[0],
        "cluster_name": cluster_name(api),
        "node": api.node_name,
        "rates_mode": "none",
        "disable_stats": False,
        "enable_queue_totals": True,
        "exchange_types": EXCHANGE_TYPES,
        "object_totals": objects,
        "queue_totals": queue_totals,
        "message_stats": stats,
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
        "type": "disc",
        "running": True,
        "being_drained": False,
        "os_pid": str(os.getpid()),
        "mem_used": proc.memory_info().rss,
        "mem_limit": mem_limit,
        "mem_alarm": "memory" in b.alarms,
        "disk_free": disk_free,
        "disk_free_limit": 50_000_000,
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
        "rates_mode": "none",
        "partitions": [],
        "cluster_links": [],
        "net_ticktime": 60,
        "exchange_types": EXCHANGE_TYPES,
        "auth_mechanisms": [{"name": m, "description": AUTH_MECHANISMS.get(m, m),
                             "enabled": m in getattr(cfg, "auth_mechanisms", ["PLAIN", "AMQPLAIN"])}
                            for m in AUTH_MECHANISMS],
        "applications": [{"name": "hutch", "description": "hutch message broker", "version": __version__}],
        "config_files": [],
        "log_files": [os.path.join(os.path.abspath(cfg.data_dir), "log", f"{cfg.node_name}.log")],
        "data_dir": os.path.abspath(cfg.data_dir),
    }


def _peer_info(name: str, running: bool) -> dict[str, Any]:
    """Another member of the cluster: what this node knows of it without asking it."""
    return {"name": name, "type": "disc", "running": running, "being_drained": False,
            "partitions": [], "cluster_links": []}


def cluster_nodes(api: Api) -> list[dict[str, Any]]:
    cl = api.broker.cluster
    me = node_info(api)
    if cl is None:
        return [me]
    st = cl.status()
    running = set(st.get("running_nodes", ()))
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
                                  "disk_nodes": [name], "running_nodes": [name], "leader": name, "partitions": {},
                                  "alarms": sorted(api.broker.alarms)})
    st = dict(cl.status())
    st["alarms"] = sorted(api.broker.alarms)
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
    if api.broker.alarms:
        return {"status": "failed", "reason": f"resource alarm(s) in effect: {', '.join(sorted(api.broker.alarms))}"}
    return {"status": "ok"}


def _alarms(api: Api) -> web.Response:
    alarms = [{"node": api.node_name, "resource": a} for a in sorted(api.broker.alarms)]
    if alarms:
        return web.json_response({"status": "failed", "reason": "There are alarms in effect in the cluster",
                                  "alarms": alarms}, status=503)
    return web.json_response({"status": "ok"})


@routes.get("/api/health/checks/alarms")
async def health_alarms(request: web.Request) -> web.Response:
    return _alarms(api_of(request))


@routes.get("/api/health/checks/local-alarms")
async def health_local_alarms(request: web.Request) -> web.Response:
    return _alarms(api_of(request))


@routes.get("/api/health/checks/virtual-hosts")
async def health_vhosts(request: web.Request) -> web.Response:
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
    return web.json_response({"status": "failed", "reason": f"No active listener on port {port}",
                              "missing": port, "ports": ports}, status=503)


@routes.get("/api/health/checks/protocol-listener/{protocol}")
async def health_protocol(request: web.Request) -> web.Response:
    api = api_of(request)
    protocol = request.match_info["protocol"].lower()
    protocols = [ln["protocol"] for ln in listeners(api)]
    aliases = {"amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp", "https": "http", "amqps": "amqp/ssl"}
    if aliases.get(protocol, protocol) in protocols:
        return web.json_response({"status": "ok", "protocol": protocol})
    return web.json_response({"status": "failed", "reason": f"No active listener for protocol {protocol}",
                              "missing": protocol, "protocols": protocols}, status=503)


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


def node_name_arg(body: dict) -> str:
    name = body.get("node")
    if not isinstance(name, str) or "@" not in name:
        raise bad_request("'node' must be a node name, NAME@HOST")
    return name


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


@routes.post("/api/hutch/cluster/forget")
@requires("administrator")
async def forget_cluster_node(request: web.Request) -> web.Response:
    body = await read_json(request, required=True)
    name = node_name_arg(body)
    fut = asyncio.get_running_loop().create_future()

    def done(error: str | None) -> None:
        if not fut.done():
            fut.set_result(error)
    await _app_call(request, lambda n: n.forget_cluster_node(name, done))
    error = await fut
    if error is not None:
        raise bad_request(error)
    return web.Response(status=204)
