"""The topology operations AMQP and the management HTTP API both perform, checked once.

A queue.declare on a channel and a PUT /api/queues/{vhost}/{name} are the same operation (in
RabbitMQ the management plugin even performs it on an AMQP channel of its own), so they make
the same checks with the same texts: the user's configure/write/read permissions, the
reserved `amq.` prefix, the default exchange, the vhost's max-queues, the write permission on a
dead-letter exchange, argument validation, "inequivalent arg" on a redeclare, "in use" and
"not empty" on a conditional delete. The functions here take the broker, the vhost, the user
and the request's fields, raise `AMQPError` with RabbitMQ's code and text, and return the
catalogue command to commit (or the existing object, or None when there is nothing to do).
The caller commits it and answers in its own protocol: `broker.session` with AMQP methods,
`control.topology` with HTTP (`control.errors.from_amqp`).

A new queue with no `x-queue-type` gets the vhost's default queue type when that type can
hold it, as RabbitMQ 3.10's `rabbit_amqqueue:augment_declare_args` does: quorum only for a
durable, non-exclusive, non-auto-delete queue, classic for any.

What this module must never do: send anything, commit anything, or wait. It only reads the
broker's state and decides; a check that passes here is checked again by the catalogue when
the command commits (another node may have raced it).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from hutch.amqp import spec
from hutch.amqp.spec import AMQPError, access_refused, precondition_failed
from hutch.broker import arguments as qargs
from hutch.broker import kinds
from hutch.broker import quorumq as _quorum_kind  # noqa: F401 - registers the quorum kind
from hutch.broker import streamq as _stream_kind  # noqa: F401 - registers the stream kind
from hutch.broker.exchanges import EXCHANGE, EXCHANGE_TYPES, QUEUE
from hutch.cluster import catalogue as cat
from hutch.queues.handle import CLASSIC, SERVER_NAMED, queue_type

if TYPE_CHECKING:
    from hutch.broker.broker import Broker, User
    from hutch.broker.vhost import VHost

DEFAULT_EXCHANGE_REFUSED = "operation not permitted on the default exchange"
GENERATED_PREFIX = "amq.gen-"  # server-named queues; a new queue with this prefix is not refused


def _bool_text(v: bool) -> str:
    return "true" if v else "false"


def _inequivalent(kind: str, name: str, vhost: str, arg: str, got: str, cur: str) -> AMQPError:
    return precondition_failed(f"inequivalent arg '{arg}' for {kind} '{name}' in vhost '{vhost}': "
                               f"received '{got}' but current is '{cur}'")


def _text(v: Any) -> Any:
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def _random_id() -> int:
    """A positive 63-bit id (journal ids, quorum group ids)."""
    return int.from_bytes(os.urandom(8), "big") >> 1 or 1


# ---------------------------------------------------------------- exchanges

def check_exchange_type(xtype: str) -> None:
    if xtype not in EXCHANGE_TYPES:
        if xtype.startswith("x-"):
            raise AMQPError(spec.COMMAND_INVALID, f"invalid exchange type '{xtype}'")
        raise AMQPError(spec.COMMAND_INVALID, f"unknown exchange type '{xtype}'")


def declare_exchange(broker: Broker, vhost: VHost, user: User, name: str, xtype: str, durable: bool,
                     auto_delete: bool, internal: bool, args: dict[str, Any]) -> cat.DeclareExchange | None:
    """exchange.declare (not passive): the command that creates the exchange, or None when an
    equivalent one exists."""
    if name == "":
        raise access_refused(DEFAULT_EXCHANGE_REFUSED)
    broker.check_permission(user, vhost.name, "configure", "exchange", name)
    check_exchange_type(xtype)
    existing = vhost.exchanges.get(name)
    if existing is None:
        if name.startswith("amq."):
            raise access_refused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        qargs.validate_exchange_args(args, name, vhost.name)
        return cat.DeclareExchange(vhost.name, name, xtype, bool(durable), bool(auto_delete), bool(internal),
                                   dict(args))
    if existing.type != xtype:
        raise _inequivalent("exchange", name, vhost.name, "type", xtype, existing.type)
    for arg, got, cur in (("durable", durable, existing.durable), ("auto_delete", auto_delete, existing.auto_delete),
                          ("internal", internal, existing.internal)):
        if bool(got) != bool(cur):
            raise _inequivalent("exchange", name, vhost.name, arg, _bool_text(got), _bool_text(cur))
    text = cat.args_difference("exchange", name, vhost.name, existing.arguments, args, cat.EXCHANGE_ARGS_COMPARED)
    if text is not None:
        raise precondition_failed(text)
    return None


def delete_exchange(broker: Broker, vhost: VHost, user: User, name: str, if_unused: bool) -> cat.DeleteExchange | None:
    """exchange.delete: the command that deletes it, or None when there is no such exchange."""
    if name == "":
        raise access_refused(DEFAULT_EXCHANGE_REFUSED)
    if name.startswith("amq.") and name in vhost.exchanges:
        raise access_refused(f"deletion of system exchange '{name}' in vhost '{vhost.name}' not allowed")
    broker.check_permission(user, vhost.name, "configure", "exchange", name)
    x = vhost.exchanges.get(name)
    if x is None:
        return None
    if if_unused and vhost.exchange_in_use(x):
        raise precondition_failed(f"exchange '{name}' in vhost '{vhost.name}' in use")
    return cat.DeleteExchange(vhost.name, name, bool(if_unused))


# ---------------------------------------------------------------- bindings

def check_binding(broker: Broker, vhost: VHost, user: User, source: str, kind: str, destination: str,
                  routing_key: str, owner: Any) -> None:
    """queue.bind/unbind, exchange.bind/unbind: both ends exist (an exclusive queue only for its
    owner), write on the destination, read on the source, and the topic permission."""
    if source == "" or (kind == EXCHANGE and destination == ""):
        raise access_refused(DEFAULT_EXCHANGE_REFUSED)
    if kind == QUEUE:
        if destination == "":
            raise spec.not_found(f"no queue '' in vhost '{vhost.name}'")
        vhost.queue(destination, owner=owner)
    elif destination not in vhost.exchanges:
        raise spec.not_found(f"no exchange '{destination}' in vhost '{vhost.name}'")
    if source not in vhost.exchanges:
        raise spec.not_found(f"no exchange '{source}' in vhost '{vhost.name}'")
    broker.check_permission(user, vhost.name, "write", kind, destination)
    broker.check_permission(user, vhost.name, "read", "exchange", source)
    broker.check_topic_permission(user, vhost.name, vhost.exchanges[source], "read", routing_key)


def binding_command(vhost: VHost, source: str, kind: str, destination: str, routing_key: str,
                    arguments: dict | None, bind: bool) -> cat.Bind | cat.Unbind | None:
    """The command that adds (or removes) the binding, or None when it already is (is not) there."""
    if vhost.exchanges[source].has_binding(destination, kind, routing_key, arguments) == bind:
        return None
    kind_c = cat.QUEUE if kind == QUEUE else cat.EXCHANGE
    return (cat.Bind if bind else cat.Unbind)(vhost.name, source, kind_c, destination, routing_key,
                                              dict(arguments or {}))


# ---------------------------------------------------------------- queues

def default_queue_type(broker: Broker, vhost: str) -> str:
    """The vhost's default queue type ("" when none is set)."""
    cl = broker.cluster
    rec = cl.catalogue.vhosts.get(vhost) if cl is not None else None
    return getattr(rec, "default_queue_type", "") if rec is not None else ""


def with_default_type(broker: Broker, vhost: str, durable: bool, exclusive: bool, auto_delete: bool,
                      args: dict[str, Any]) -> dict[str, Any]:
    """The declare's arguments with the vhost's default queue type added when it names none and
    the default type can hold such a queue (RabbitMQ's augment_declare_args)."""
    if "x-queue-type" in args:
        return args
    dqt = default_queue_type(broker, vhost)
    if not dqt:
        return args
    qt = queue_type(dqt)
    if qt is None or not qt.holds(durable, exclusive, auto_delete):
        return args
    return {**args, "x-queue-type": dqt}


def declare_queue(broker: Broker, vhost: VHost, user: User, name: str, *, durable: bool, exclusive: bool,
                  auto_delete: bool, args: dict[str, Any], owner: Any, node: str | None = None,
                  server_named: bool = False):
    """queue.declare (not passive): `(queue, None)` when an equivalent queue exists,
    `(None, command)` for a new one. `owner` is the declaring connection (None over HTTP);
    `node` the home asked for by an HTTP PUT; `server_named` when the client left the name to
    the broker (RabbitMQ allows that for classic queues only)."""
    args = with_default_type(broker, vhost.name, durable, exclusive, auto_delete, args)
    qt = queue_type(_text(args.get("x-queue-type")) or CLASSIC.name)
    if server_named and qt is not None and not qt.can(SERVER_NAMED):
        raise precondition_failed(f"Cannot declare a server-named queue for type {qt.module}")
    broker.check_permission(user, vhost.name, "configure", "queue", name)
    q = vhost.queues.get(name)
    if q is not None:
        vhost.queue(name, owner=owner)  # 405 for another connection's exclusive queue
        if q.durable != bool(durable):
            raise _inequivalent("queue", name, vhost.name, "durable", _bool_text(durable), _bool_text(q.durable))
        if (q.exclusive_owner is not None) != bool(exclusive):
            raise AMQPError(spec.RESOURCE_LOCKED, f"cannot obtain exclusive access to locked queue '{name}' "
                            f"in vhost '{vhost.name}'. It could be originally declared on another connection "
                            "or the exclusive property value does not match that of the original declaration.")
        if q.auto_delete != bool(auto_delete):
            raise _inequivalent("queue", name, vhost.name, "auto_delete", _bool_text(auto_delete),
                                _bool_text(q.auto_delete))
        text = cat.args_difference("queue", name, vhost.name, q.arguments, args, cat.QUEUE_ARGS_COMPARED)
        if text is not None:
            raise precondition_failed(text)
        return q, None
    if name.startswith("amq.") and not name.startswith(GENERATED_PREFIX):
        raise access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
    refusal = broker.queue_refusal(vhost, name)
    if refusal is not None:  # the vhost's max-queues (only a new queue counts, as in RabbitMQ)
        raise precondition_failed(refusal)
    dlx = args.get("x-dead-letter-exchange")
    if isinstance(dlx, (str, bytes)):
        # as RabbitMQ: whoever declares a dead-lettering queue must be allowed to publish there
        broker.check_permission(user, vhost.name, "write", "exchange", dlx.decode() if isinstance(dlx, bytes) else dlx)
    return None, new_queue_command(broker, vhost.name, name, durable=durable, exclusive=exclusive,
                                   auto_delete=auto_delete, args=args, owner=owner, node=node)


def new_queue_command(broker: Broker, vhost: str, name: str, *, durable: bool, exclusive: bool, auto_delete: bool,
                      args: dict[str, Any], owner: Any, node: str | None) -> cat.DeclareQueue:
    """The catalogue record of a new queue of the type its arguments name (hutch.broker.kinds)."""
    s = qargs.queue_settings(args, name, vhost)  # 406 for bad x- arguments, before anything changes
    return kinds.kind(s.queue_type).declare_command(broker.cluster, vhost, name, durable=durable, exclusive=exclusive,
                                                    auto_delete=auto_delete, args=args, owner=owner, node=node,
                                                    journal_id=_random_id())


def check_delete_queue(broker: Broker, vhost: VHost, user: User, name: str, owner: Any, if_unused: bool,
                       if_empty: bool):
    """queue.delete: the queue to delete after the checks, or None when there is no such queue."""
    q = vhost.queues.get(name)
    if q is None:
        return None
    vhost.queue(name, owner=owner)
    broker.check_permission(user, vhost.name, "configure", "queue", name)
    if if_unused and q.consumer_count:
        raise precondition_failed(f"queue '{name}' in vhost '{vhost.name}' in use")
    if if_empty and q.message_count:
        raise precondition_failed(f"queue '{name}' in vhost '{vhost.name}' not empty")
    return q


def queue_to_purge(broker: Broker, vhost: VHost, user: User, name: str, owner: Any):
    """queue.purge: the queue, after its owner and the read permission are checked."""
    q = vhost.queue(name, owner=owner)
    broker.check_permission(user, vhost.name, "read", "queue", q.name)
    return q
