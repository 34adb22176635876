"""Super streams: a direct exchange (argument `x-super-stream: true`) whose bindings route to
its partitions, streams named `NAME-<partition>`, each binding carrying its place in the
partition order (`x-stream-partition-order`), as RabbitMQ makes them. One piece of code for
the HTTP API (`PUT /api/stream/super-streams/...`, hutch-streams add_super_stream) and the
stream protocol (CreateSuperStream, Route, Partitions).

Creating one is several catalogue changes in order (the exchange, each stream, each binding);
`creation` checks everything first and then yields each change with the change that undoes it,
computed when it is reached (a binding's checks need the stream to exist), so that a caller
commits them one by one and undoes what was done when one fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hutch.amqp.spec import precondition_failed
from hutch.broker import operations
from hutch.broker.exchanges import QUEUE
from hutch.cluster import catalogue as cat
from hutch.streams.config import StreamArgumentError, stream_config

SUPER_STREAM = "x-super-stream"  # the exchange's argument
PARTITION_ORDER = "x-stream-partition-order"  # each binding's argument
PARTITIONS_MAX = 1000  # partitions (or binding keys) of one super stream


def partition_names(name: str, partitions: int | None,
                    binding_keys: str | list[str] | None) -> tuple[list[str], list[str]]:
    """(streams, routing keys): `NAME-0`.. with keys "0".. for a number of partitions,
    `NAME-<key>` for binding keys (a list, or comma-separated: trimmed, empty ones dropped)."""
    if partitions is not None:
        return [f"{name}-{i}" for i in range(partitions)], [str(i) for i in range(partitions)]
    if isinstance(binding_keys, str):
        binding_keys = binding_keys.split(",")
    keys = [k.strip() for k in binding_keys or () if k.strip()]
    return [f"{name}-{k}" for k in keys], keys


def ordered(v: Any, bindings: Any) -> list[str]:
    """The streams `bindings` lead to, in partition order (bindings without an order last),
    each once (rabbit_stream_manager's partitions and route)."""
    bound = []
    for b in bindings:
        q = v.queues.get(b.destination) if b.kind == QUEUE else None
        if q is None or q.deleted or q.queue_type != "stream":
            continue
        order = (b.arguments or {}).get(PARTITION_ORDER)
        bound.append(((0, order) if type(order) is int else (1, 0), b.destination))
    bound.sort()
    return list(dict.fromkeys(name for _k, name in bound))


def partitions(v: Any, name: str) -> list[str] | None:
    """The streams of super stream `name` in vhost `v`, in partition order (None: no such
    exchange)."""
    x = v.exchanges.get(name) if name else None
    return None if x is None else ordered(v, x.bindings.values())


def route(v: Any, name: str, routing_key: str) -> list[str] | None:
    """The partitions a message published to the super stream with `routing_key` goes to, as
    its exchange routes it (None: no such exchange)."""
    x = v.exchanges.get(name) if name else None
    return None if x is None else ordered(v, x.route(routing_key, None))


def creation(broker: Any, v: Any, user: Any, name: str, streams: list[str], routing_keys: list[str],
             args: dict[str, Any], node: str | None = None) -> Iterator[tuple[cat.Command, cat.Command]]:
    """Check a new super stream whole (AMQPError: 406 with what is wrong, 403 for a permission),
    then yield (change, undo) for the exchange, each stream and each binding, in that order."""
    if not streams:
        raise precondition_failed("a super stream needs at least one partition")
    if len(streams) > PARTITIONS_MAX:
        raise precondition_failed(f"a super stream has at most {PARTITIONS_MAX} partitions")
    if len(set(streams)) != len(streams):
        raise precondition_failed("binding keys must be distinct")
    if name in v.exchanges:
        raise precondition_failed(f"there is already an exchange named {name}")
    for s in streams:
        if s in v.queues:
            raise precondition_failed(f"there is already a queue named {s}")
    try:
        stream_config(args, streams[0], v.name, policy=broker.cluster.streams.port.policy_of(v.name, streams[0]))
    except StreamArgumentError as e:
        raise precondition_failed(e.text) from None
    for s in streams:
        broker.check_permission(user, v.name, "configure", "queue", s)
        broker.check_permission(user, v.name, "write", "queue", s)
    broker.check_permission(user, v.name, "read", "exchange", name)
    return _steps(broker, v, user, name, streams, routing_keys, args, node)


def _steps(broker: Any, v: Any, user: Any, name: str, streams: list[str], routing_keys: list[str],
           args: dict[str, Any], node: str | None) -> Iterator[tuple[cat.Command, cat.Command]]:
    cmd = operations.declare_exchange(broker, v, user, name, "direct", True, False, False, {SUPER_STREAM: True})
    yield cmd, cat.DeleteExchange(v.name, name, False)
    for s in streams:
        _q, cmd = operations.declare_queue(broker, v, user, s, durable=True, exclusive=False, auto_delete=False,
                                           args=dict(args), owner=None, node=node)
        if cmd is None:
            raise precondition_failed(f"there is already a queue named {s}")
        yield cmd, cat.DeleteQueue(v.name, s)
    for order, (s, key) in enumerate(zip(streams, routing_keys, strict=True)):
        operations.check_binding(broker, v, user, name, QUEUE, s, key, None)
        yield (cat.Bind(v.name, name, cat.QUEUE, s, key, {PARTITION_ORDER: order}),
               cat.Unbind(v.name, name, cat.QUEUE, s, key, {PARTITION_ORDER: order}))


def deletion(broker: Any, v: Any, user: Any, name: str) -> list[cat.Command]:
    """The changes that delete super stream `name` (the exchange, then its partitions), after the
    checks; [] when there is no such exchange."""
    streams = partitions(v, name)
    if streams is None:
        return []
    cmd = operations.delete_exchange(broker, v, user, name, False)
    for s in streams:
        operations.check_delete_queue(broker, v, user, s, None, False, False)
    return ([cmd] if cmd is not None else []) + [cat.DeleteQueue(v.name, s) for s in streams]


__all__ = ["SUPER_STREAM", "PARTITION_ORDER", "PARTITIONS_MAX", "partition_names", "partitions", "route",
           "creation", "deletion", "ordered"]
