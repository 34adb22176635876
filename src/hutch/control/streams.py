"""Operating streams over HTTP: what rabbitmq-streams does over Erlang distribution, and the
routes of RabbitMQ's stream management plugin.

    GET    /api/hutch/streams/{vhost}/{name}/status            one row per member (?tracking=true:
                                                               the stored offsets and writer sequences)
    POST   /api/hutch/streams/{vhost}/{name}/replicas          {"node": N}: add_replica
    DELETE /api/hutch/streams/{vhost}/{name}/replicas/{node}   delete_replica
    GET    /api/hutch/streams/{vhost}/{name}/groups/{reference}  a single-active-consumer group: its
                                                               members in order, active or inactive
    GET    /api/hutch/streams/{vhost}/consumer-groups          the vhost's single-active-consumer groups
    PUT    /api/stream/super-streams/{vhost}/{name}   {"partitions": N | "binding-keys": "a,b",
                                                       "arguments": {"max-age": "7D", ...}}
    DELETE /api/stream/super-streams/{vhost}/{name}
    GET    /api/stream/connections[/{vhost}]           stream-protocol connections of every node
    GET    /api/stream/consumers[/{vhost}]             their subscriptions
    GET    /api/stream/publishers[/{vhost}[/{stream}]] their publishers

A stream is a Raft group (`hutch.streams`): adding or removing a replica is the quorum queues'
membership change (`hutch.control.quorum.change_member`: the catalogue's member list, and the
group's leader adding the new member as a learner until it has caught up). A member's row of
`stream_status` comes from that member (its log's first and last offsets, segments, bytes, Raft
term and role, and its readers); a member that does not answer shows its role and node only,
as RabbitMQ shows it.

A super stream is RabbitMQ's: a direct exchange `NAME` with argument `x-super-stream: true`
and one stream per partition, `NAME-<key>`, bound with routing key `<key>` and binding argument
`x-stream-partition-order` (0, 1, ...). Creating one checks everything first (names free,
stream arguments valid), then commits the exchange, the streams and the bindings; a step that
fails undoes the ones before, as rabbit_stream_manager does.

The listings read every running node's `hutch.broker.streamreg.StreamRegistry` (each node knows
its own connections) through the peer "list" call. Must never: change a stream other than
through the catalogue and its group's leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import web

from hutch.amqp.spec import AMQPError
from hutch.broker import superstreams
from hutch.broker.streamreg import registry_of
from hutch.broker.streamsac import sac_of
from hutch.cluster import catalogue as cat
from hutch.control import changes, listing, ops, quorum, sessions, stats
from hutch.control.errors import ApiError, bad_request, not_found
from hutch.control.http import api_of, has_tag, node_name_arg, read_json, requires, user_of
from hutch.control.topology import vhost_for_read, vhost_for_write
from hutch.streams.config import NAMED_ARGUMENTS

log = logging.getLogger("hutch.streams")
routes = web.RouteTableDef()

PEER_WAIT_S = 2.0  # how long a status or listing waits for a member's answer
EXTENTS_MAX = 16384  # streams one "stream_extents" call answers for


# ---------------------------------------------------------------- what a node says of itself

def member_status(broker: Any, gid: int, tracking: bool = False) -> dict | None:
    """This node's replica of stream `gid`: its row of stream_status (with `tracking`, its
    stored offsets and writer sequences instead); None when it holds none."""
    host = broker.cluster.streams
    q = host.queues.get(gid)
    st = host.local_status(gid)
    if q is None or st is None or q.machine is None:
        return None
    if tracking:
        m = q.machine
        return {"tracking": [{"type": "offset", "reference": r, "value": o} for r, o in m.tracking.items()]
                + [{"type": "sequence", "reference": w, "value": s} for w, s in m.writers.items()]}
    end = st["committed_offset"]  # a member writes only committed entries: its log ends at the commit
    readers = len(q.local_consumers) + len(registry_of(broker).consumer_list(q.vhost, q.name))
    return {"role": "writer" if st.get("role") == "leader" else "replica", "node": broker.cluster.node,
            "epoch": st.get("term"), "offset": end - 1, "committed_offset": end - 1,
            "first_offset": st["first_offset"], "readers": readers, "segments": st["segments"],
            "bytes": st["bytes"], "leader": st.get("leader")}


def local_extents(broker: Any, gids: list) -> list[list[int]]:
    """[gid, first offset, committed end, bytes] of the streams among `gids` with a whole
    replica here."""
    out = []
    host = broker.cluster.streams
    for gid in gids[:EXTENTS_MAX]:
        q = host.queues.get(gid) if isinstance(gid, int) else None
        if q is not None and q.machine is not None and q.machine.missing_from is None:
            first, end, size = q.extent()
            out.append([gid, first, end, size])
    return out


def _connection_row(broker: Any, rec: dict) -> dict:
    """A stream connection as the management API shows it (a connection object)."""
    return {"name": rec.get("conn_name"), "node": rec.get("node", broker.config.node_name),
            "vhost": rec.get("vhost"), "user": rec.get("user"), "protocol": "stream",
            "host": rec.get("host"), "port": rec.get("port"), "peer_host": rec.get("peer_host"),
            "peer_port": rec.get("peer_port"), "state": rec.get("connection_state", "running"),
            "auth_mechanism": rec.get("auth_mechanism"), "ssl": bool(rec.get("ssl", False)),
            "frame_max": rec.get("frame_max"), "timeout": rec.get("heartbeat"),
            "client_properties": rec.get("client_properties") or {}, "connected_at": rec.get("connected_at"),
            "subscriptions": rec.get("subscriptions", 0)}


def _details(broker: Any, rec: dict, conns: dict) -> dict:
    c = conns.get(rec.get("connection"), {})
    return {"name": rec.get("connection"), "user": c.get("user"), "node": c.get("node", broker.config.node_name),
            "peer_host": c.get("peer_host"), "peer_port": c.get("peer_port")}


def _consumer_row(broker: Any, rec: dict, conns: dict) -> dict:
    """A subscription as rabbitmq_stream_management shows it."""
    return {"queue": {"name": rec.get("stream"), "vhost": rec.get("vhost")},
            "connection_details": _details(broker, rec, conns), "subscription_id": rec.get("subscription_id"),
            "credits": rec.get("credits"), "consumed": rec.get("messages_consumed"), "offset": rec.get("offset"),
            "offset_lag": rec.get("offset_lag"), "properties": rec.get("properties") or {},
            "active": rec.get("active", True), "activity_status": rec.get("activity_status", "up")}


def _publisher_row(broker: Any, rec: dict, conns: dict) -> dict:
    return {"queue": {"name": rec.get("stream"), "vhost": rec.get("vhost")},
            "connection_details": _details(broker, rec, conns), "publisher_id": rec.get("publisher_id"),
            "reference": rec.get("reference") or "", "published": rec.get("messages_published"),
            "confirmed": rec.get("messages_confirmed"), "errored": rec.get("messages_errored")}


def _list_connections(broker: Any, params: dict) -> list[dict]:
    everyone = bool(params.get("everyone"))
    user = params.get("user", "")
    return [_connection_row(broker, c) for c in registry_of(broker).connection_list(params.get("vhost"))
            if everyone or c.get("user") == user]


def _list_consumers(broker: Any, params: dict) -> list[dict]:
    reg = registry_of(broker)
    conns = {c["conn_name"]: c for c in reg.connection_list()}
    return [_consumer_row(broker, c, conns) for c in reg.consumer_list(params.get("vhost"), params.get("stream"))]


def _list_publishers(broker: Any, params: dict) -> list[dict]:
    reg = registry_of(broker)
    conns = {c["conn_name"]: c for c in reg.connection_list()}
    return [_publisher_row(broker, p, conns) for p in reg.publisher_list(params.get("vhost"), params.get("stream"))]


def _list_groups(broker: Any, params: dict) -> list[dict]:
    """A single-active-consumer group: in order with each member's state when the stream
    coordinator is here (rows marked `coordinator`), else this node's members of it."""
    key = (params.get("vhost", "/"), params.get("stream", ""), params.get("reference", ""))
    rows = sac_of(broker).group_rows(*key)
    if rows is not None:
        return [{**r, "coordinator": True} for r in rows]
    return registry_of(broker).group_consumers(*key) or []


def _list_consumer_groups(broker: Any, params: dict) -> list[dict]:
    """The vhost's single-active-consumer groups, from the stream coordinator ([] elsewhere)."""
    return sac_of(broker).group_list(params.get("vhost", "/")) or []


def _list_member(broker: Any, params: dict) -> list[dict]:
    gid = params.get("gid")
    row = member_status(broker, gid, bool(params.get("tracking"))) if isinstance(gid, int) else None
    return [row] if row is not None else []


def _list_extents(broker: Any, params: dict) -> list:
    gids = params.get("gids")
    return local_extents(broker, gids) if isinstance(gids, list) else []


_LISTERS = {"stream_connections": _list_connections, "stream_consumers": _list_consumers,
            "stream_publishers": _list_publishers, "stream_groups": _list_groups,
            "stream_consumer_groups": _list_consumer_groups,
            "stream_member": _list_member, "stream_extents": _list_extents}


def _answering(fn: Any) -> Any:
    return lambda api, params: fn(api.broker, params)


# what this node answers other nodes' "list" calls with (hutch.control.sessions.local_listing)
sessions.LISTERS.update({what: _answering(fn) for what, fn in _LISTERS.items()})


# ---------------------------------------------------------------- the stream of a request

def _stream(request: web.Request):
    broker = api_of(request).broker
    v = vhost_for_read(request)
    q = v.queues.get(request.match_info["name"])
    if q is None:
        raise not_found()
    if q.queue_type != "stream":
        raise ApiError(400, f"{q.queue_type}_queue_not_supported",  # rabbit_stream_queue's error
                       f"queue '{q.name}' in vhost '{q.vhost}' is a {q.queue_type} queue, not a stream")
    return broker, q


async def _ask(broker: Any, node: str, what: str, params: dict) -> list | None:
    """A node's answer to a "list" call (this node answers itself); None when it does not."""
    if node == broker.cluster.node:
        return _LISTERS[what](broker, params)
    if not broker.cluster.is_up(node):
        return None
    try:
        return await ops.call_peer(broker, node, "list", [what, params], timeout_s=PEER_WAIT_S)
    except (AMQPError, TimeoutError, OSError):
        return None


@routes.get("/api/hutch/streams/{vhost}/{name}/status")
@requires("monitoring")
async def stream_status(request: web.Request) -> web.Response:
    broker, q = _stream(request)
    if request.query.get("tracking", "false").lower() == "true":
        for node in sorted(q.online(), key=lambda n: n != q.home_node):  # the leader's first
            rows = await _ask(broker, node, "stream_member", {"gid": q.gid, "tracking": True})
            if rows:
                return web.json_response(rows[0]["tracking"])
        raise ApiError(503, "unavailable", f"no member of stream '{q.name}' in vhost '{q.vhost}' answered")
    leader = q.home_node
    answers = await asyncio.gather(*(_ask(broker, n, "stream_member", {"gid": q.gid}) for n in q.members))
    rows = []
    for node, answer in zip(q.members, answers, strict=True):
        if answer:
            rows.append(answer[0])
        else:  # down, not answering, or not holding its replica (yet)
            rows.append({"role": "writer" if node == leader else "replica", "node": node, "epoch": None,
                         "offset": None, "committed_offset": None, "first_offset": None, "readers": None,
                         "segments": None, "bytes": None})
    rows.sort(key=lambda r: r["node"])
    return web.json_response(rows)


# ---------------------------------------------------------------- replicas

async def _change_replica(request: web.Request, op: str, node: str) -> web.Response:
    broker, q = _stream(request)
    if op == "remove" and q.members == (node,):
        raise bad_request("Cannot delete the last member of a stream")
    await quorum.change_member(broker, q, op, node)
    log.info("stream '%s' in vhost '%s': %s replica on node %s", q.name, q.vhost,
             "added a" if op == "add" else "removed the", node)
    return web.Response(status=204)


@routes.post("/api/hutch/streams/{vhost}/{name}/replicas")
@requires("administrator")
async def add_replica(request: web.Request) -> web.Response:
    return await _change_replica(request, "add", node_name_arg(await read_json(request, required=True)))


@routes.delete("/api/hutch/streams/{vhost}/{name}/replicas/{node}")
@requires("administrator")
async def delete_replica(request: web.Request) -> web.Response:
    return await _change_replica(request, "remove", request.match_info["node"])


@routes.get("/api/hutch/streams/{vhost}/{name}/groups/{reference}")
@requires("monitoring")
async def group_consumers(request: web.Request) -> web.Response:
    broker, q = _stream(request)
    params = {"vhost": q.vhost, "stream": q.name, "reference": request.match_info["reference"]}
    answers = await asyncio.gather(*(_ask(broker, n, "stream_groups", params) for n in broker.cluster.running_nodes()))
    rows = [row for answer in answers for row in answer or ()]
    # the coordinator's rows are the whole group in order; without them (a coordinator
    # changing), every node's own members
    ordered = [r for r in rows if r.pop("coordinator", False)]
    rows = ordered or rows
    if not rows:
        raise ApiError(404, "not_found", "The group does not exist")
    return web.json_response(rows)


@routes.get("/api/hutch/streams/{vhost}/consumer-groups")
@requires("monitoring")
async def consumer_groups(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    v = vhost_for_read(request)
    answers = await asyncio.gather(*(_ask(broker, n, "stream_consumer_groups", {"vhost": v.name})
                                     for n in broker.cluster.running_nodes()))
    return web.json_response([row for answer in answers for row in answer or ()])


# ---------------------------------------------------------------- super streams

def stream_arguments(arguments: Any) -> dict[str, Any]:
    """A super stream's `arguments` (RabbitMQ's names, values as text or numbers) as the
    partitions' declare arguments; 400 for an unknown name or a value of the wrong kind."""
    if not isinstance(arguments, dict):
        raise bad_request("arguments must be a JSON object")
    out: dict[str, Any] = {"x-queue-type": "stream"}
    for key, value in arguments.items():
        if key not in NAMED_ARGUMENTS:
            raise bad_request(f"unknown stream argument '{key}' (expected one of "
                              f"{', '.join(sorted(NAMED_ARGUMENTS))})")
        xkey, kind = NAMED_ARGUMENTS[key]
        if kind is int:
            try:
                value = int(value)
            except (TypeError, ValueError):
                raise bad_request(f"stream argument '{key}' must be an integer, got {value!r}") from None
        elif not isinstance(value, str):
            raise bad_request(f"stream argument '{key}' must be a string, got {value!r}")
        out[xkey] = value
    out.setdefault("x-queue-leader-locator", "balanced")  # RabbitMQ's default for partitions
    return out


def _super_stream_request(body: dict) -> tuple[int | None, str | None]:
    partitions, keys = body.get("partitions"), body.get("binding-keys")
    if partitions is None and keys is None:
        raise bad_request("Must specify partitions or binding keys")
    if partitions is not None and keys is not None:
        raise bad_request("Specify partitions or binding keys, not both")
    if keys is not None:
        if isinstance(keys, list):
            keys = ",".join(str(k) for k in keys)
        if not isinstance(keys, str):
            raise bad_request("binding-keys must be a comma-separated string")
        if keys.count(",") + 1 > superstreams.PARTITIONS_MAX:
            raise bad_request(f"The number of binding keys must not exceed {superstreams.PARTITIONS_MAX}")
        if not [k for k in keys.split(",") if k.strip()]:
            raise bad_request("The number of binding keys must be greater than 0")
        return None, keys
    try:
        n = int(partitions)
    except (TypeError, ValueError):
        raise bad_request("The partitions must be a number") from None
    if n < 1:
        raise bad_request("The partition number must be greater than 0")
    if n > superstreams.PARTITIONS_MAX:
        raise bad_request(f"The partition number must not exceed {superstreams.PARTITIONS_MAX}")
    return n, None


@routes.put("/api/stream/super-streams/{vhost}/{name}")
async def put_super_stream(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    user = user_of(request)
    v = vhost_for_write(request)
    name = request.match_info["name"]
    body = await read_json(request, required=True)
    partitions, keys = _super_stream_request(body)
    args = stream_arguments(body.get("arguments") or {})
    streams, routing_keys = superstreams.partition_names(name, partitions, keys)
    try:
        steps = superstreams.creation(broker, v, user, name, streams, routing_keys, args, body.get("node"))
    except AMQPError as e:
        if e.code == 403:
            raise
        raise bad_request(e.text) from None
    done: list[cat.Command] = []  # what to undo if a later step fails
    try:
        for cmd, undo in steps:
            await changes.commit(broker, cmd)
            done.append(undo)
    except (ApiError, AMQPError):
        for undo in reversed(done):
            with contextlib.suppress(ApiError):
                await changes.commit(broker, undo)
        raise
    log.info("super stream '%s' in vhost '%s' created with %d partition(s)", name, v.name, len(streams))
    return web.Response(status=201)


@routes.delete("/api/stream/super-streams/{vhost}/{name}")
async def delete_super_stream(request: web.Request) -> web.Response:
    broker = api_of(request).broker
    user = user_of(request)
    v = vhost_for_write(request)
    name = request.match_info["name"]
    streams = superstreams.partitions(v, name) or []
    cmds = superstreams.deletion(broker, v, user, name)
    if not cmds:
        raise not_found()
    for cmd in cmds:
        if isinstance(cmd, cat.DeleteQueue):
            res = await changes.change(broker, cmd)
            if res.code != cat.OK:
                log.warning("Error while deleting partition %s of super stream %s: %s", cmd.name, name, res.text)
        else:
            await changes.commit(broker, cmd)
    log.info("super stream '%s' in vhost '%s' deleted with %d partition(s)", name, v.name, len(streams))
    return web.Response(status=204)


# ---------------------------------------------------------------- stream connections, consumers, publishers

def _vhost_param(request: web.Request) -> str | None:
    if "vhost" not in request.match_info:
        return None
    return vhost_for_read(request).name


async def _cluster_rows(request: web.Request, what: str, extra: dict | None = None) -> list[dict]:
    api = api_of(request)
    vhost = _vhost_param(request)
    if what == "stream_connections":
        return await sessions.cluster_listing(api, request, what, vhost)
    params = {"vhost": vhost, **(extra or {})}
    answers = await asyncio.gather(*(_ask(api.broker, n, what, params) for n in api.broker.cluster.running_nodes()))
    rows = [row for answer in answers for row in answer or ()]
    user = user_of(request)
    visible = set(api.visible_vhosts(user))
    return [r for r in rows if (r.get("queue") or {}).get("vhost") in visible
            and (has_tag(user, "monitoring") or (r.get("connection_details") or {}).get("user") == user.name)]


@routes.get("/api/stream/connections")
@routes.get("/api/stream/connections/{vhost}")
async def stream_connections(request: web.Request) -> web.Response:
    return listing.respond(request, await _cluster_rows(request, "stream_connections"))


@routes.get("/api/stream/consumers")
@routes.get("/api/stream/consumers/{vhost}")
async def stream_consumers(request: web.Request) -> web.Response:
    return listing.respond(request, await _cluster_rows(request, "stream_consumers"))


@routes.get("/api/stream/publishers")
@routes.get("/api/stream/publishers/{vhost}")
async def stream_publishers(request: web.Request) -> web.Response:
    return listing.respond(request, await _cluster_rows(request, "stream_publishers"))


@routes.get("/api/stream/publishers/{vhost}/{stream}")
async def stream_publishers_of(request: web.Request) -> web.Response:
    return listing.respond(request, await _cluster_rows(request, "stream_publishers",
                                                        {"stream": request.match_info["stream"]}))


# ---------------------------------------------------------------- queue objects of streams

async def complete(broker: Any, rows: list[dict]) -> None:
    """Stream rows of a queue listing whose figures this node cannot tell (it holds no whole
    replica): messages and bytes from a member, one call per member node for all of them."""
    cl = broker.cluster
    if cl is None:
        return
    wanted: dict[str, list[int]] = {}
    by_gid: dict[int, dict] = {}
    for row in rows:
        if row.get("type") != "stream" or row.get("committed_offset") is not None:
            continue
        v = broker.vhosts.get(row.get("vhost"))
        q = v.queues.get(row.get("name")) if v is not None else None
        if q is None or q.queue_type != "stream":
            continue
        up = [n for n in q.online() if n != cl.node]
        if not up:
            continue
        node = q.home_node if q.home_node in up else up[0]
        wanted.setdefault(node, []).append(q.gid)
        by_gid[q.gid] = row
    if not wanted:
        return
    answers = await asyncio.gather(*(_ask(broker, n, "stream_extents", {"gids": g}) for n, g in wanted.items()))
    for answer in answers:
        for gid, first, end, size in answer or ():
            row = by_gid.get(gid)
            if row is not None:
                n = max(0, end - first)
                row.update(messages=n, messages_ready=n, message_bytes=size, message_bytes_ready=size,
                           committed_offset=end - 1)


stats.QUEUE_ROWS_COMPLETERS.append(complete)


__all__ = ["routes", "member_status", "complete", "stream_arguments"]
