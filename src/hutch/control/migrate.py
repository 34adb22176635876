"""The way off classic (mirrored) queues: `hutchctl migrate_to_quorum QUEUE`.

    POST /api/hutch/migrate/{vhost}/{name}   {"timeout_ms": 60000}

RabbitMQ's guide moves applications to quorum queues by hand (new names, or a new vhost and a
shovel). hutch does it in place, keeping the queue's name, bindings and messages, on the
classic queue's home node (a request to another node is forwarded there):

1. a quorum queue `NAME.quorum-migration` is declared with the classic queue's arguments that
   quorum queues keep (x-max-length, x-max-length-bytes, x-overflow, x-message-ttl, x-expires,
   x-dead-letter-exchange, x-dead-letter-routing-key, x-single-active-consumer; priorities,
   queue mode and master locator are dropped and listed in the answer);
2. it gets the classic queue's bindings, which the classic queue then loses: new messages
   routed through exchanges go to the quorum queue from here on;
3. the classic queue's consumers are cancelled (basic.cancel, as on a queue deletion), and its
   messages are moved, each settled in the classic queue only once the quorum queue has
   confirmed it (a majority has it), so a failure at any point leaves every message in one
   queue or both, never in neither;
4. the classic queue is deleted and a quorum queue of the same name is declared, bound as the
   classic queue was, and filled from the holding queue the same way, which is then deleted;
5. policy keys that only apply to classic mirrored queues (ha-*, queue-master-locator) are
   removed from the policies that matched the queue (a policy left empty is cleared).

Message order across the migration is not kept: messages published during it come before the
ones moved. A publish straight to the queue's name through the default exchange while the old
queue is being deleted is moved by the old queue's node as it deletes it. Running the command
again after a failure carries on from where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from hutch.amqp import codec
from hutch.amqp.spec import AMQPError
from hutch.broker.quorumq import place_members
from hutch.cluster import catalogue as cat
from hutch.control import changes, ops
from hutch.control.errors import ApiError, bad_request, not_found
from hutch.control.http import api_of, read_json, requires
from hutch.control.policy import match
from hutch.queues.effective import HA_KEYS
from hutch.queues.message import Message
from hutch.quorum import fifo

routes = web.RouteTableDef()

HOLDING_SUFFIX = ".quorum-migration"
KEPT_ARGUMENTS = ("x-max-length", "x-max-length-bytes", "x-overflow", "x-message-ttl", "x-expires",
                  "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-single-active-consumer")
CLASSIC_ONLY_POLICY_KEYS = (*HA_KEYS, "queue-master-locator")
WINDOW = 500  # messages moved and not yet confirmed


class _Mover:
    """Stands in for a publishing channel: the quorum queue confirms each moved message here."""

    def __init__(self, on_accept, on_refuse):
        self.session = None
        self.closed = False
        self.confirm_wait_count: dict[int, int] = {}
        self._on_accept = on_accept
        self._on_refuse = on_refuse

    def accepted(self, seq: int) -> None:
        self._on_accept(seq)

    def nack_publish(self, seq: int) -> None:
        self._on_refuse(seq)


def quorum_arguments(args: dict) -> tuple[dict, list[str]]:
    kept = {k: v for k, v in args.items() if k in KEPT_ARGUMENTS}
    if kept.get("x-overflow") in ("reject-publish-dlx", b"reject-publish-dlx"):
        kept["x-overflow"] = "reject-publish"
    kept["x-queue-type"] = "quorum"
    dropped = sorted(k for k in args if k not in KEPT_ARGUMENTS and k != "x-queue-type")
    return kept, dropped


async def migrate(broker, vhost: str, name: str, timeout_s: float) -> dict[str, Any]:
    v = broker.vhosts.get(vhost)
    src = v.queues.get(name) if v is not None else None
    holding = f"{name}{HOLDING_SUFFIX}"
    hold = v.queues.get(holding) if v is not None else None
    if src is None and hold is None:
        raise not_found()
    if src is not None and src.quorum:
        if hold is None:
            raise bad_request(f"queue '{name}' in vhost '{vhost}' is a quorum queue already")
        return await _finish(broker, v, name, hold, {"moved": 0, "dropped_arguments": []}, timeout_s)
    if src is not None and not src.local:
        answer = await ops.ask_peer(broker, src.home_node, "migrate", [vhost, name, timeout_s],
                                    timeout_s=timeout_s * 3 + 10)
        if answer is None:
            raise ApiError(503, "unavailable", f"node {src.home_node}, the home of queue '{name}', did not answer")
        if answer[0] != 200:
            raise ApiError(answer[0], "migration_failed", answer[1])
        return answer[1]
    report: dict[str, Any] = {"moved": 0, "dropped_arguments": []}
    if src is not None:
        if src.exclusive_owner is not None or not src.durable:
            raise bad_request(f"queue '{name}' in vhost '{vhost}' is {'exclusive' if src.exclusive_owner else 'not durable'}"
                              ": only durable shared queues can become quorum queues")
        args, report["dropped_arguments"] = quorum_arguments(src.arguments)
        try:
            fifo.quorum_config(args, holding, vhost)
        except fifo.QuorumArgumentError as e:
            raise bad_request(e.text) from None
        if hold is None:
            await _declare_quorum(broker, v, holding, args)
            hold = v.queues[holding]
        bindings = _bindings_to(broker, vhost, name)
        await _rebind(broker, vhost, bindings, holding, unbind_from=name)
        broker.cancel_consumers(src)
        report["moved"] += await _move_classic(broker, src, hold, timeout_s)
        broker.cluster.migrations[(vhost, name)] = hold  # a late arrival is moved as the queue is deleted
        try:
            await changes.commit(broker, cat.DeleteQueue(vhost, name))
        finally:
            broker.cluster.migrations.pop((vhost, name), None)
    return await _finish(broker, v, name, hold, report, timeout_s)


async def _finish(broker, v, name: str, hold, report: dict, timeout_s: float) -> dict[str, Any]:
    vhost = v.name
    args = dict(hold.arguments)
    if v.queues.get(name) is None:
        await _declare_quorum(broker, v, name, args)
    final = v.queues[name]
    await _rebind(broker, vhost, _bindings_to(broker, vhost, hold.name), name, unbind_from=hold.name)
    report["moved"] += await _move_quorum(broker, hold, final, timeout_s)
    await changes.commit(broker, cat.DeleteQueue(vhost, hold.name))
    report["policies_changed"] = await _drop_classic_policy_keys(broker, vhost, name)
    report.update(queue=name, vhost=vhost, type="quorum", members=list(final.members))
    return report


async def _declare_quorum(broker, v, name: str, args: dict) -> None:
    leader, members = place_members(broker.cluster, args, name, v.name)
    res = await changes.commit(broker, cat.DeclareQueue(v.name, name, cat.QUORUM, True, False, None, args, leader,
                                                        members, changes.new_journal_id()))
    if res.code != cat.OK:
        raise changes.http_error(res)


def _bindings_to(broker, vhost: str, name: str) -> list[cat.BindingRecord]:
    return [b for b in broker.cluster.catalogue.bindings_to(vhost, cat.QUEUE, name)]


async def _rebind(broker, vhost: str, bindings: list, to: str, unbind_from: str) -> None:
    for b in bindings:
        await changes.commit(broker, cat.Bind(vhost, b.source, cat.QUEUE, to, b.routing_key, dict(b.arguments)))
    for b in bindings:
        await changes.commit(broker, cat.Unbind(vhost, b.source, cat.QUEUE, unbind_from, b.routing_key,
                                                dict(b.arguments)))


async def _move_classic(broker, src, dst, timeout_s: float) -> int:
    """Every message of a classic queue homed here into a quorum queue, each settled at the
    source once the destination confirmed it."""
    inflight: dict[int, Any] = {}
    moved = 0
    progress = asyncio.Event()

    def accepted(seq: int) -> None:
        nonlocal moved
        e = inflight.pop(seq, None)
        if e is not None and not src.deleted and e.seq in src.state.unacked:
            src.settle(e.seq)
            broker.settled(src, e)
            moved += 1
        progress.set()

    def refused(seq: int) -> None:
        e = inflight.pop(seq, None)
        if e is not None and not src.deleted and e.seq in src.state.unacked:
            src.requeue(e.seq)
        progress.set()
    mover = _Mover(accepted, refused)
    deadline = asyncio.get_running_loop().time() + timeout_s
    seq = 0
    while True:
        while len(inflight) < WINDOW:
            e = src.take_head(no_ack=False)
            if e is None:
                break
            seq += 1
            inflight[seq] = e
            broker.delivered(src, e)
            broker.cluster.quorum.publish(dst, e.message, mover, seq)
        broker.schedule()
        if not inflight and src.message_count == 0 and src.unacked_count == 0:
            return moved
        if asyncio.get_running_loop().time() > deadline:
            mover.closed = True
            raise ApiError(503, "timeout", f"{src.message_count + src.unacked_count} message(s) of queue "
                                           f"'{src.name}' in vhost '{src.vhost}' are still held by its consumers or "
                                           "not yet confirmed by the quorum queue; run the migration again")
        progress.clear()
        try:
            await asyncio.wait_for(progress.wait(), 0.2)
        except TimeoutError:
            pass


async def _move_quorum(broker, src, dst, timeout_s: float) -> int:
    """Every message of one quorum queue into another: get, publish, settle once confirmed."""
    qh = broker.cluster.quorum
    requester = qh.owner_id()
    moved = 0
    deadline = asyncio.get_running_loop().time() + timeout_s
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        fut = loop.create_future()
        qh.propose(src, fifo.Get(requester, False, broker.now_ms()), lambda r, f=fut: f.done() or f.set_result(r))
        answer = await fut
        if answer is None:
            raise ApiError(503, "timeout", f"no leader of queue '{src.name}' in vhost '{src.vhost}' answered")
        if answer[1] is None:
            return moved
        msg_id, _count, _redelivered, exchange, routing_key, props, body = answer[1]
        done = loop.create_future()
        mover = _Mover(lambda _s, d=done: d.done() or d.set_result(True),
                       lambda _s, d=done: d.done() or d.set_result(False))
        qh.publish(dst, Message(exchange, routing_key, codec.route_encoding(exchange, routing_key), props, body,
                                True, 0, None), mover, 1)
        broker.schedule()
        ok = await asyncio.wait_for(done, max(1.0, deadline - loop.time()))
        qh.propose(src, (fifo.Settle if ok else fifo.Return)(requester, [msg_id]))
        moved += ok
    raise ApiError(503, "timeout", f"moving messages out of queue '{src.name}' in vhost '{src.vhost}' took too long")


async def _drop_classic_policy_keys(broker, vhost: str, name: str) -> list[str]:
    changed = []
    for p in list(broker.cluster.catalogue.policies_of(vhost)):
        if not any(k in p.definition for k in CLASSIC_ONLY_POLICY_KEYS):
            continue
        if match([{"vhost": p.vhost, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
                   "priority": p.priority, "definition": dict(p.definition)}], vhost, name, "queue") is None:
            continue
        rest = {k: val for k, val in p.definition.items() if k not in CLASSIC_ONLY_POLICY_KEYS}
        if rest:
            await changes.commit(broker, cat.SetPolicy(p.vhost, p.name, p.pattern, p.apply_to, p.priority, rest))
        else:
            await changes.commit(broker, cat.ClearPolicy(p.vhost, p.name))
        changed.append(p.name)
    return changed


def run_for_peer(broker, args: list, reply) -> None:
    """A migration another node forwarded here (this node is the classic queue's home)."""
    async def run() -> None:
        try:
            reply([200, await migrate(broker, args[0], args[1], float(args[2]))])
        except ApiError as e:
            reply([e.status, str(e.reason)])
        except AMQPError as e:
            reply([400, e.text])
    task = asyncio.get_running_loop().create_task(run(), name=f"migrate:{args[0]}/{args[1]}")
    _forwarded.add(task)  # kept until it ends; an unexpected failure is logged, never lost
    task.add_done_callback(_forwarded_ended)


_forwarded: set[asyncio.Task] = set()  # at most one per migration a peer forwarded here


def _forwarded_ended(task: asyncio.Task) -> None:
    _forwarded.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger("hutch.http").error("forwarded migration %s failed", task.get_name(),
                                              exc_info=task.exception())


@routes.post("/api/hutch/migrate/{vhost}/{name}")
@requires("administrator")
async def migrate_queue(request: web.Request) -> web.Response:
    body = await read_json(request)
    timeout_ms = body.get("timeout_ms", 60000)
    if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
        raise bad_request("timeout_ms must be a positive integer")
    try:
        report = await migrate(api_of(request).broker, request.match_info["vhost"], request.match_info["name"],
                               timeout_ms / 1000)
    except AMQPError as e:
        raise bad_request(e.text) from None
    return web.json_response(report)
