"""Quorum queue membership and status (what rabbitmq-queues does over Erlang distribution).

    GET    /api/hutch/quorum/{vhost}/{name}/status          every member's Raft view of the queue
    POST   /api/hutch/quorum/{vhost}/{name}/members         {"node": N}: add_member
    DELETE /api/hutch/quorum/{vhost}/{name}/members/{node}  delete_member
    POST   /api/hutch/quorum/grow     {"node": N, "strategy": "all"|"even", "vhost_pattern", "queue_pattern"}
    POST   /api/hutch/quorum/shrink   {"node": N}
    POST   /api/hutch/quorum/rebalance  {"vhost_pattern", "queue_pattern"}: spread leaders evenly

Rebalancing (rabbitmq-queues rebalance quorum) plans the moves with
`hutch.quorum.placement.rebalance_plan` from the leaders this node knows, has each queue's
leader hand leadership to the chosen member (Raft leadership transfer), waits until the new
leaders are known, and answers the moves and the leaders per running node afterwards.

Adding a member records it in the catalogue first (the new member then hosts an empty copy of
the queue's Raft group) and then has the queue's leader add it as a learner, promoted to a
voter once it has caught up; removing one goes the other way round. Each step is retried
until it is done or `metadata_timeout_ms` passes.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from aiohttp import web

from hutch.cluster import catalogue as cat
from hutch.control import changes, ops
from hutch.control.errors import ApiError, bad_request, not_found
from hutch.control.http import api_of, node_name_arg, read_json, requires
from hutch.quorum import placement
from hutch.raft.group import NOT_LEADER

log = logging.getLogger("hutch.quorum")
routes = web.RouteTableDef()
RETRY_S = 0.25


def _quorum_queue(request: web.Request):
    broker = api_of(request).broker
    v = broker.vhosts.get(request.match_info["vhost"])
    q = v.queues.get(request.match_info["name"]) if v is not None else None
    if q is None:
        raise not_found()
    if not q.quorum:
        raise bad_request(f"queue '{q.name}' in vhost '{q.vhost}' is not a quorum queue")
    return broker, q


@routes.get("/api/hutch/quorum/{vhost}/{name}/status")
@requires("monitoring")
async def quorum_status(request: web.Request) -> web.Response:
    broker, q = _quorum_queue(request)
    rows = []
    for node in q.members:
        try:
            if node == broker.cluster.node:
                st = broker.cluster.quorum.local_status(q.gid)
            else:
                st = await ops.call_peer(broker, node, "qstatus", [q.gid])
        except Exception:  # down or not answering: reported as such
            st = None
        if st is None:
            rows.append({"node": node, "raft_state": "noproc", "membership": "unknown"})
            continue
        rows.append({"node": node, "raft_state": st["role"],
                     "membership": "voter" if node in st["voters"] else "promotable",
                     "last_log_index": st["last_index"], "last_written": st["last_index"],
                     "last_applied": st["applied"], "commit_index": st["commit"],
                     "snapshot_index": st["snapshot_index"], "term": st["term"], "machine_version": 1,
                     "leader": st["leader"], "publishers": st.get("publishers")})
    return web.json_response(rows)


async def change_member(broker, q, op: str, node: str) -> None:
    """add_member / delete_member of one queue; ApiError 400 with the reason when refused."""
    cl = broker.cluster
    if op == "add":
        if node not in cl.members:
            raise bad_request(f"node {node} is not a member of the cluster")
        if node in q.members:
            raise bad_request(f"{node} is already a member of queue '{q.name}' in vhost '{q.vhost}'")
        if not cl.is_up(node):
            raise bad_request(f"node {node} is not running")
        members = (*q.members, node)
    else:
        if node not in q.members:
            raise bad_request(f"{node} is not a member of queue '{q.name}' in vhost '{q.vhost}'")
        if len(q.members) == 1:
            raise bad_request(f"{node} is the last member of queue '{q.name}' in vhost '{q.vhost}'")
        members = tuple(n for n in q.members if n != node)
    deadline = asyncio.get_running_loop().time() + broker.config.metadata_timeout_ms / 1000
    if op == "add":  # the catalogue first: the new member makes its (empty) copy of the group
        await _set_members(broker, q, members)
    await _leader_changes_group(broker, q, op, node, deadline)
    if op == "remove":
        await _set_members(broker, q, members)


async def _set_members(broker, q, members: tuple[str, ...]) -> None:
    rec = broker.cluster.catalogue.queue(q.vhost, q.name)
    if rec is None:
        raise not_found()
    await changes.commit(broker, cat.SetQueueNodes(q.vhost, q.name, q.home_node, members))


async def _leader_changes_group(broker, q, op: str, node: str, deadline: float) -> None:
    loop = asyncio.get_running_loop()
    why = "no leader"
    while loop.time() < deadline:
        leader = q.home_node
        try:
            if leader == broker.cluster.node:
                answer = broker.cluster.quorum.membership_op(q.gid, op, node)
            else:
                answer = await asyncio.wait_for(_call(broker, leader, [q.gid, op, node]), 2)
            if answer is not None and answer[0] == 200:
                return
            why = answer[1] if answer else f"{leader} did not answer"
        except (TimeoutError, OSError):
            why = f"{leader} did not answer"
        await asyncio.sleep(RETRY_S)
    raise ApiError(503, "timeout", f"could not {op} member {node} of queue '{q.name}' in vhost '{q.vhost}': {why}")


async def _call(broker, peer: str, args: list, kind: str = "qmember") -> Any:
    fut = asyncio.get_running_loop().create_future()
    broker.cluster.call(peer, kind, args, lambda r: fut.done() or fut.set_result(r))
    return await fut


@routes.post("/api/hutch/quorum/{vhost}/{name}/members")
@requires("administrator")
async def add_member(request: web.Request) -> web.Response:
    broker, q = _quorum_queue(request)
    await change_member(broker, q, "add", node_name_arg(await read_json(request, required=True)))
    return web.Response(status=204)


@routes.delete("/api/hutch/quorum/{vhost}/{name}/members/{node}")
@requires("administrator")
async def delete_member(request: web.Request) -> web.Response:
    broker, q = _quorum_queue(request)
    await change_member(broker, q, "remove", request.match_info["node"])
    return web.Response(status=204)


def _matching(broker, body: dict) -> list:
    try:
        vp = re.compile(body.get("vhost_pattern") or ".*")
        qp = re.compile(body.get("queue_pattern") or ".*")
    except re.error as e:
        raise bad_request(f"invalid pattern: {e}") from None
    return [q for v in broker.vhosts.values() if vp.search(v.name)
            for q in list(v.queues.values()) if q.quorum and qp.search(q.name)]


@routes.post("/api/hutch/quorum/grow")
@requires("administrator")
async def grow(request: web.Request) -> web.Response:
    body = await read_json(request, required=True)
    node = node_name_arg(body)
    strategy = body.get("strategy", "all")
    if strategy not in ("all", "even"):
        raise bad_request("'strategy' must be all or even")
    broker = api_of(request).broker
    rows = []
    for q in _matching(broker, body):
        if node in q.members or (strategy == "even" and len(q.members) % 2):
            continue
        rows.append(await _outcome(broker, q, "add", node))
    return web.json_response(rows)


@routes.post("/api/hutch/quorum/shrink")
@requires("administrator")
async def shrink(request: web.Request) -> web.Response:
    body = await read_json(request, required=True)
    node = node_name_arg(body)
    broker = api_of(request).broker
    rows = [await _outcome(broker, q, "remove", node) for q in _matching(broker, body) if node in q.members]
    return web.json_response(rows)


TRANSFER_TIMEOUT_S = 5.0  # a leadership transfer not seen done by then is reported as not done
TRANSFER_RETRY_S = 1.5  # a transfer not seen done by then is asked for again


@routes.post("/api/hutch/quorum/rebalance")
@requires("administrator")
async def rebalance(request: web.Request) -> web.Response:
    body = await read_json(request) or {}
    broker = api_of(request).broker
    cl = broker.cluster
    running = sorted(cl.running_nodes())
    queues = {(q.vhost, q.name): q for q in _matching(broker, body)}
    online = set(running)
    moves, _counts = placement.rebalance_plan(
        ((q.vhost, q.name, q.home_node, tuple(m for m in q.members if m in online)) for q in queues.values()),
        running)
    rows = await asyncio.gather(*(_move_leader(broker, queues[(v, n)], frm, to) for v, n, frm, to in moves))
    counts = dict.fromkeys(running, 0)
    for q in queues.values():
        if q.home_node in counts:
            counts[q.home_node] += 1
    return web.json_response({"moves": list(rows),
                              "leaders": [{"node": n, "count": c} for n, c in counts.items()]})


async def _move_leader(broker, q, frm: str, to: str) -> dict:
    """Ask the queue's leader to hand leadership to `to`, then wait until `to` is seen leading.
    A Raft transfer is abandoned after an election timeout (a transferee still catching up, a
    vote lost to a timing accident): while time is left, the leader of the moment is asked
    again every TRANSFER_RETRY_S. A refusal because the node asked is not the leader (yet: a
    queue just declared shows the node it was declared on as its leader until its first
    election ends) is asked again soon; any other refusal of the first request is said at once."""
    row = {"vhost": q.vhost, "name": q.name, "from": frm, "to": to}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TRANSFER_TIMEOUT_S
    asked = False
    while True:
        leader = q.home_node if q.home_node in q.members else frm
        answer = await _ask_transfer(broker, q, leader, to, max(0.1, deadline - loop.time()))
        wait = TRANSFER_RETRY_S
        if answer is not None and answer[0] == 200:
            if not asked:
                asked = True
                log.info("Rebalancing quorum queue '%s' in vhost '%s': transferring leadership from %s to %s",
                         q.name, q.vhost, frm, to)
        elif not asked:
            why = answer[1] if answer else f"{leader} did not answer"
            if why != NOT_LEADER or loop.time() >= deadline:
                row.update(result="error", reason=why)
                return row
            wait = 0.1
        retry_at = min(deadline, loop.time() + wait)
        while q.home_node != to and loop.time() < retry_at:
            await asyncio.sleep(0.05)
        if q.home_node == to:
            row["result"] = "ok"
            return row
        if loop.time() >= deadline:
            row.update(result="error", reason=f"{to} did not take over within {TRANSFER_TIMEOUT_S:g} s")
            return row


async def _ask_transfer(broker, q, leader: str, to: str, timeout: float) -> list | None:
    try:
        if leader == broker.cluster.node:
            return broker.cluster.transfer_quorum_leader(q.gid, to)
        return await asyncio.wait_for(_call(broker, leader, [q.gid, to], "qleader"), timeout)
    except (TimeoutError, OSError):
        return None


async def drop_forgotten_member(broker, node: str) -> list[dict]:
    """What forget_cluster_node does to quorum queues and streams once `node` is out of the
    cluster, as RabbitMQ's (shrink_all, and delete_all_replicas for streams): the node leaves
    every group it was a member of, so each queue keeps its messages on its other members (one
    the node led elects another leader). A queue whose only member it was is left as it is,
    unavailable, until it is deleted. One row per queue, as `shrink` answers."""
    rows = []
    for q in [q for v in list(broker.vhosts.values()) for q in list(v.queues.values())
              if q.queue_type in ("quorum", "stream") and node in q.members]:
        if q.members == (node,):
            row = {"vhost": q.vhost, "name": q.name, "size": 1, "result": "error",
                   "reason": f"{node} is the last member of {q.queue_type} queue '{q.name}' in vhost '{q.vhost}'"}
        else:
            row = await _outcome(broker, q, "remove", node)
        if row["result"] == "ok":
            log.info("%s queue '%s' in vhost '%s': removed member %s (forgotten)", q.queue_type.capitalize(),
                     q.name, q.vhost, node)
        else:
            log.warning("%s queue '%s' in vhost '%s': could not remove member %s (forgotten): %s",
                        q.queue_type.capitalize(), q.name, q.vhost, node, row["reason"])
        rows.append(row)
    return rows


async def _outcome(broker, q, op: str, node: str) -> dict:
    row = {"vhost": q.vhost, "name": q.name, "size": len(q.members)}
    try:
        await change_member(broker, q, op, node)
        row.update(result="ok", size=len(q.members))
    except ApiError as e:
        row.update(result="error", reason=str(e.reason))
    return row
