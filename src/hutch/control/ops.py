"""What the API does to the broker beyond one broker method: publish and get over HTTP,
close a connection, delete a vhost, delete a user, the aliveness test, the cluster name.

Each operation checks everything it can before it changes anything. Definitions (vhosts,
users, queues, global parameters) are the cluster catalogue's, so the operations that change
them (the `async` ones) commit a catalogue command (`hutch.control.changes`) and act on this
node only once it is applied; messages change through the broker's own methods (enqueue,
settle, purge, dead-letter), so an HTTP change is the same change an AMQP client would make.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime
import logging
from typing import TYPE_CHECKING, Any

from pamqp import commands

from hutch.amqp import codec, spec
from hutch.amqp.spec import AMQPError
from hutch.broker import arguments as qargs
from hutch.broker import msgstats
from hutch.broker.cluster import home_down as cluster_home_down
from hutch.cluster import catalogue as cat
from hutch.control import changes, shapes
from hutch.control.errors import bad_request
from hutch.queues.message import Message

if TYPE_CHECKING:
    from hutch.broker.broker import Broker, User
    from hutch.broker.session import Session
    from hutch.broker.vhost import VHost
    from hutch.queues.classic import ClassicQueue

log = logging.getLogger("hutch.http")

CLOSE_OK_WAIT_S = 3.0
ALIVENESS_QUEUE = "aliveness-test"
VHOST_CONNECTIONS_CLOSE_S = 0.5  # after a vhost is deleted, its connections here are closed this much later
GET_COUNT_MAX = 10_000
ACK_MODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")
_PROP_TYPES: dict[str, type | tuple] = {
    "content_type": str, "content_encoding": str, "headers": dict, "delivery_mode": int, "priority": int,
    "correlation_id": str, "reply_to": str, "expiration": str, "message_id": str, "timestamp": int, "type": str,
    "user_id": str, "app_id": str, "cluster_id": str,
}


class _HttpPublisher:
    """Stands for the channel and session of `Broker.enqueue`: an HTTP publish has no socket to
    hold back, so flow control has nothing to pause (its bookkeeping still works on it)."""

    def __init__(self) -> None:
        self.session = self
        self.flow_queues: set = set()
        self.blocked = False
        self.closed = False
        self.transport_hooks = None


def message_properties(props: Any, username: str) -> bytes:
    """Encoded content properties from the API's `properties` object (400 on a bad one)."""
    if props is None or props == []:
        props = {}
    if not isinstance(props, dict):
        raise bad_request("properties must be a JSON object")
    values: dict[str, Any] = {}
    for key, value in props.items():
        want = _PROP_TYPES.get(key)
        if want is None:
            raise bad_request(f"unknown message property '{key}' (known: {', '.join(_PROP_TYPES)})")
        if key in ("delivery_mode", "priority", "timestamp") and isinstance(value, str) and value.isdigit():
            value = int(value)
        if key == "expiration" and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, want) or isinstance(value, bool):
            raise bad_request(f"message property '{key}' must be a {want.__name__}, got {value!r}")
        if key == "timestamp":
            value = datetime.datetime.fromtimestamp(value, tz=datetime.UTC)
        values[key] = value
    if "user_id" in values and values["user_id"] != username:
        raise bad_request(f"user_id property set to '{values['user_id']}' but authenticated user was '{username}'")
    if "delivery_mode" in values and values["delivery_mode"] not in (1, 2):
        raise bad_request("delivery_mode must be 1 or 2")
    if "priority" in values and not 0 <= values["priority"] <= 255:
        raise bad_request("priority must be between 0 and 255")
    try:
        return codec.encode_properties(commands.Basic.Properties(**values))
    except (TypeError, ValueError) as e:
        raise bad_request(f"invalid message properties: {e}") from None


def decode_payload(body: dict[str, Any]) -> bytes:
    for key in ("routing_key", "payload", "payload_encoding", "properties"):
        if key not in body:
            raise bad_request(f"[{{key_missing,{key}}}]")
    payload, encoding = body["payload"], body["payload_encoding"]
    if not isinstance(payload, str):
        raise bad_request("payload must be a string")
    if encoding == "string":
        return payload.encode()
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("payload is not valid base64") from None
    raise bad_request(f"payload_encoding must be 'string' or 'base64', got {encoding!r}")


def publish(broker: Broker, user: User, v: VHost, exchange_name: str, body: dict[str, Any]) -> bool:
    """POST /api/exchanges/{vhost}/{exchange}/publish: route and enqueue one message. True if routed."""
    routing_key = body.get("routing_key")
    if not isinstance(routing_key, str):
        raise bad_request("routing_key must be a string")
    data = decode_payload(body)
    props = message_properties(body.get("properties"), user.name)
    x = v.exchanges.get(exchange_name)
    if x is None:
        raise bad_request(f"404 NOT_FOUND - no exchange '{exchange_name}' in vhost '{v.name}'")
    if x.internal:
        raise AMQPError(spec.ACCESS_REFUSED, f"cannot publish to internal exchange '{x.name}' in vhost '{v.name}'")
    broker.check_permission(user, v.name, "write", "exchange", exchange_name)
    broker.check_topic_permission(user, v.name, x, "write", routing_key)
    if len(data) > broker.config.max_message_size:
        raise bad_request(f"message size {len(data)} is larger than configured max size "
                          f"{broker.config.max_message_size}")
    s = codec.summarize_properties(props)
    expiration_ms = qargs.parse_expiration(s.expiration) if s.expiration is not None else None
    headers = codec.decode_headers(props, s.headers_span) if x.type == "headers" else None
    msg = Message(exchange_name, routing_key, codec.route_encoding(exchange_name, routing_key), props, data,
                  s.delivery_mode == 2, s.priority, expiration_ms)
    queues = v.route(x, routing_key, headers)
    _count_publish(broker, v.name, x, queues)
    if queues:
        broker.enqueue(queues, msg, _HttpPublisher(), 0)
    return bool(queues)


def _count_publish(broker: Broker, vhost: str, x, queues) -> None:
    """Count an API publish as RabbitMQ does (its management plugin publishes on a channel of
    its own): on the exchange, and the vhost's and node's totals (each queue counts its own in
    Broker.enqueue)."""
    counts = msgstats.new()
    counts[msgstats.PUBLISH] = 1
    x.mstats[msgstats.X_PUBLISH_IN] += 1
    if queues:
        x.mstats[msgstats.X_PUBLISH_OUT] += len(queues)
    else:
        counts[msgstats.DROP_UNROUTABLE] = 1
        x.mstats[msgstats.X_DROP_UNROUTABLE] += 1
    msgstats.retire(broker, vhost, counts)


def get_request(body: dict[str, Any]) -> tuple[int, str, str, int | None]:
    """The checked fields of a POST /api/queues/{vhost}/{queue}/get body."""
    for key in ("count", "ackmode", "encoding"):
        if key not in body:
            raise bad_request(f"[{{key_missing,{key}}}]")
    count, ackmode, encoding = body["count"], body["ackmode"], body["encoding"]
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= GET_COUNT_MAX:
        raise bad_request(f"count must be an integer between 1 and {GET_COUNT_MAX}")
    if ackmode not in ACK_MODES:
        raise bad_request(f"ackmode must be one of {', '.join(ACK_MODES)}, got {ackmode!r}")
    if encoding not in ("auto", "base64"):
        raise bad_request(f"encoding must be 'auto' or 'base64', got {encoding!r}")
    truncate = body.get("truncate")
    if isinstance(truncate, str) and truncate.isdigit():
        truncate = int(truncate)
    if truncate is not None and (not isinstance(truncate, int) or isinstance(truncate, bool) or truncate < 0):
        raise bad_request("truncate must be a non-negative integer")
    return count, ackmode, encoding, truncate


async def get_messages_anywhere(broker: Broker, q, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The management get on a queue here, or on its home node when that is another."""
    if q.local:
        if q.mirror is not None and q.mirror.sync_holds_clients:  # answered once the sync is done, as basic.get
            done = asyncio.get_running_loop().create_future()
            q.mirror.after_sync(lambda _r: done.done() or done.set_result(None))
            await done
        return get_messages(broker, q, body)
    count, ackmode, encoding, truncate = get_request(body)
    rows = await call_home(broker, q, "take", [count, ackmode.endswith("requeue_true"),
                                               ackmode == "reject_requeue_false"])
    return [shapes.message(b, props, x, rk, redelivered, remaining, encoding, truncate)
            for x, rk, props, b, redelivered, remaining in rows]


async def purge_anywhere(broker: Broker, q) -> int:
    if q.local:
        return broker.purge_queue(q)
    return await call_home(broker, q, "purge", [])


async def call_home(broker: Broker, q, kind: str, args: list) -> Any:
    """Ask a queue's home node (another node); its answer, or the AMQP error it gives."""
    q.check_up()
    result = await _call(broker, q.home_node, kind, [q.vhost, q.name, *args])
    if result is None:
        raise cluster_home_down(q)
    if result[0] != 200:
        raise AMQPError(result[0], result[1])
    return result[1]


async def call_peer(broker: Broker, peer: str, kind: str, args: list, timeout_s: float | None = None) -> Any:
    """Ask another node; its answer (an error if it goes down or does not answer in time)."""
    result = await _call(broker, peer, kind, args, timeout_s)
    if result is None or result[0] != 200:
        raise AMQPError(spec.INTERNAL_ERROR, f"node {peer} did not answer")
    return result[1]


async def ask_peer(broker: Broker, peer: str, kind: str, args: list, timeout_s: float | None = None) -> Any:
    """Ask another node; its raw answer ([code, ...]), or None if it goes down first."""
    return await _call(broker, peer, kind, args, timeout_s)


async def _call(broker: Broker, peer: str, kind: str, args: list, timeout_s: float | None = None) -> Any:
    fut = asyncio.get_running_loop().create_future()

    def answered(result) -> None:
        if not fut.done():
            fut.set_result(result)
    broker.cluster.call(peer, kind, args, answered)
    return await asyncio.wait_for(fut, timeout_s or broker.config.metadata_timeout_ms / 1000)


def get_messages(broker: Broker, q: ClassicQueue, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST /api/queues/{vhost}/{queue}/get: fetch up to `count` messages, then ack, requeue or reject them."""
    count, ackmode, encoding, truncate = get_request(body)
    taken = broker.take_messages(q, count, ackmode.endswith("requeue_true"), ackmode == "reject_requeue_false")
    return [shapes.message(e.message.body, e.message.props, e.message.exchange, e.message.routing_key,
                           e.delivery_count > 1, left, encoding, truncate) for e, left in taken]


def close_connection(broker: Broker, s: Session, reason: str) -> None:
    """Close a client connection from the server side (connection.close 320 CONNECTION_FORCED)."""
    log.info("closing AMQP connection %s (%s, vhost: '%s', user: '%s') on request: %s", id(s), s.name,
             s.vhost.name if s.vhost else "", s.username, reason)
    s.proto.close(spec.CONNECTION_FORCED, reason)
    s.teardown()
    if not s.output_pending:
        s.output_pending = True
        broker.output_due(s)
    hooks = s.transport_hooks
    if hooks is not None:
        # the client should answer close-ok at once; a client that does not is cut off
        asyncio.get_running_loop().call_later(CLOSE_OK_WAIT_S, hooks.close_after_flush)


async def run_aliveness_test(broker: Broker, user: User, v: VHost) -> None:
    """Declare `aliveness-test`, publish one message to it and get it back, as RabbitMQ does.
    A missing queue is declared through the catalogue, homed on this node; one homed on
    another node is used there (the message and the get travel on the same peer link, in
    that order)."""
    cl = broker.cluster
    if v.queues.get(ALIVENESS_QUEUE) is None:
        broker.check_permission(user, v.name, "configure", "queue", ALIVENESS_QUEUE)
        await changes.commit(broker, cat.DeclareQueue(v.name, ALIVENESS_QUEUE, cat.CLASSIC, False, False, None,
                                                      {}, cl.node, (), 0, cl.incarnation))
    q = v.queues.get(ALIVENESS_QUEUE)
    if q is None:
        raise bad_request("aliveness-test queue was deleted during the test")
    if q.local:
        return _aliveness_round_trip(broker, user, v, q)
    _aliveness_check_and_publish(broker, user, v, q)
    cl.flush()  # the publish leaves before the get below
    fut: asyncio.Future = asyncio.get_running_loop().create_future()
    cl.call(q.home_node, "get", [v.name, q.name, True], lambda r: fut.done() or fut.set_result(r))
    answer = await fut
    if answer is None or answer[0] != 200:
        raise bad_request(f"aliveness-test queue on node '{q.home_node}' did not answer: "
                          f"{answer[1] if answer else 'the node is down'}")
    if answer[1] is None:
        raise bad_request("aliveness-test message could not be fetched")


def _aliveness_check_and_publish(broker: Broker, user: User, v: VHost, q) -> None:
    if q.exclusive_owner is not None:
        raise bad_request("aliveness-test queue is exclusive to another connection")
    routed = publish(broker, user, v, "", {"routing_key": ALIVENESS_QUEUE, "payload": "test_message",
                                            "payload_encoding": "string", "properties": {}})
    if not routed:
        raise bad_request("aliveness-test message was not routed")
    broker.check_permission(user, v.name, "read", "queue", ALIVENESS_QUEUE)


def _aliveness_round_trip(broker: Broker, user: User, v: VHost, q: ClassicQueue) -> None:
    _aliveness_check_and_publish(broker, user, v, q)
    got = get_messages(broker, q, {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
    if not got:
        raise bad_request("aliveness-test message could not be fetched")


async def remove_vhost(broker: Broker, name: str) -> bool:
    """DELETE /api/vhosts/{name}: its queues, exchanges, permissions and policies go with it,
    its connections on this node are closed. False when it was gone already (deleted by
    someone else before this delete committed)."""
    v = broker.vhosts[name]
    res = await changes.commit(broker, cat.DeleteVhost(name))
    # its queues, exchanges, permissions and policies went with the catalogue's record. The
    # connections to it on this node are closed a moment after this answer, as RabbitMQ closes
    # them after the deletion, not before its answer: a client that deletes the vhost it is
    # connected to and then closes its channel still gets its close-ok (amqpstorm's suite does)

    def close_its_connections() -> None:
        for s in list(broker.sessions):
            if s.vhost is v and not s.closed:
                close_connection(broker, s, f"vhost '{name}' is deleted")
    asyncio.get_running_loop().call_later(VHOST_CONNECTIONS_CLOSE_S, close_its_connections)
    if res.status == cat.DELETED:
        log.info("deleted vhost '%s'", name)
    return res.status == cat.DELETED


async def remove_user(broker: Broker, name: str) -> bool:
    """DELETE /api/users/{name}. False when it was gone already."""
    res = await changes.commit(broker, cat.DeleteUser(name))
    if res.status == cat.DELETED:
        log.info("deleted user '%s'", name)
    return res.status == cat.DELETED


async def set_cluster_name(broker: Broker, name: str) -> None:
    """PUT /api/cluster-name: a global parameter of the catalogue."""
    await changes.commit(broker, cat.SetGlobalParameter("cluster_name", name))
