"""Queue, exchange and consumer arguments: validation and equivalence, as RabbitMQ checks them.

A declare with an argument of the wrong type or range fails with 406 PRECONDITION_FAILED
("invalid arg 'x-max-length' for queue 'q' in vhost '/': ..."); a redeclare whose arguments
differ from the existing queue's fails with 406 "inequivalent arg ...". Unknown `x-` arguments
are accepted and kept, as RabbitMQ does.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hutch.amqp.spec import PRECONDITION_FAILED, AMQPError, precondition_failed
from hutch.queues.state import OVERFLOW_MODES, QueueLimits

QUEUE_ARGS_COMPARED = ("x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes", "x-overflow",
                       "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-priority",
                       "x-single-active-consumer", "x-queue-type", "x-queue-mode", "x-queue-master-locator")


def _type_name(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "long" if not -2**31 <= v < 2**31 else "signedint"
    if isinstance(v, (str, bytes)):
        return "longstr"
    if isinstance(v, float):
        return "double"
    if isinstance(v, Decimal):
        return "decimal"
    if isinstance(v, dict):
        return "table"
    if isinstance(v, list):
        return "array"
    return type(v).__name__


def _show(v: Any) -> str:
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _text(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def check_equivalent_args(kind: str, name: str, vhost: str, current: dict, received: dict,
                          compared: tuple[str, ...]) -> None:
    for key in compared:
        a, b = current.get(key), received.get(key)
        if _text(a) == _text(b) and not (isinstance(a, bool) != isinstance(b, bool) and a is not None
                                         and b is not None):
            continue
        if a is not None and b is not None and _type_name(a) == _type_name(b):
            got, cur = f"'{_show(b)}'", f"'{_show(a)}'"
        else:
            got = "none" if b is None else f"the value '{_show(b)}' of type '{_type_name(b)}'"
            cur = "none" if a is None else f"the value '{_show(a)}' of type '{_type_name(a)}'"
        raise precondition_failed(f"inequivalent arg '{key}' for {kind} '{name}' in vhost '{vhost}': "
                                  f"received {got} but current is {cur}")


def _invalid(key: str, name: str, vhost: str, why: str) -> AMQPError:
    return AMQPError(PRECONDITION_FAILED, f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}': {why}")


def _int_arg(args: dict, key: str, name: str, vhost: str, minimum: int) -> int | None:
    v = args.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, Decimal)) and not (isinstance(v, float) and v.is_integer()):
        raise _invalid(key, name, vhost, f"{{unacceptable_type,{_type_name(v)}}}")
    v = int(v)
    if v < minimum:
        raise _invalid(key, name, vhost, f"{{value_{'negative' if minimum == 0 else 'zero'},{v}}}")
    return v


class QueueSettings:
    """What a queue's arguments mean, validated."""

    __slots__ = ("limits", "message_ttl_ms", "expires_ms", "dead_letter_exchange", "dead_letter_routing_key",
                 "single_active", "queue_type")

    def __init__(self) -> None:
        self.limits = QueueLimits()
        self.message_ttl_ms: int | None = None
        self.expires_ms: int | None = None
        self.dead_letter_exchange: str | None = None
        self.dead_letter_routing_key: str | None = None
        self.single_active = False
        self.queue_type = "classic"


def queue_settings(args: dict[str, Any], name: str, vhost: str) -> QueueSettings:
    s = QueueSettings()
    s.message_ttl_ms = _int_arg(args, "x-message-ttl", name, vhost, 0)
    s.expires_ms = _int_arg(args, "x-expires", name, vhost, 1)
    max_length = _int_arg(args, "x-max-length", name, vhost, 0)
    max_bytes = _int_arg(args, "x-max-length-bytes", name, vhost, 0)
    overflow = _text(args.get("x-overflow", "drop-head"))
    if overflow not in OVERFLOW_MODES:
        raise _invalid("x-overflow", name, vhost, f"{{unacceptable_value,<<\"{overflow}\">>}}")
    max_priority = _int_arg(args, "x-max-priority", name, vhost, 0)
    if max_priority is not None and max_priority > 255:
        raise _invalid("x-max-priority", name, vhost, f"{{value_too_large,{max_priority},255}}")
    s.limits = QueueLimits(max_length, max_bytes, overflow, max_priority or 0)
    dlx = args.get("x-dead-letter-exchange")
    if dlx is not None:
        if not isinstance(dlx, (str, bytes)):
            raise _invalid("x-dead-letter-exchange", name, vhost, f"{{unacceptable_type,{_type_name(dlx)}}}")
        s.dead_letter_exchange = _text(dlx)
    dlrk = args.get("x-dead-letter-routing-key")
    if dlrk is not None:
        if not isinstance(dlrk, (str, bytes)):
            raise _invalid("x-dead-letter-routing-key", name, vhost, f"{{unacceptable_type,{_type_name(dlrk)}}}")
        if dlx is None:
            raise _invalid("x-dead-letter-routing-key", name, vhost,
                           "Key x-dead-letter-exchange must be specified if x-dead-letter-routing-key is set")
        s.dead_letter_routing_key = _text(dlrk)
    sac = args.get("x-single-active-consumer")
    if sac is not None:
        if not isinstance(sac, bool):
            raise _invalid("x-single-active-consumer", name, vhost, f"{{unacceptable_type,{_type_name(sac)}}}")
        s.single_active = sac
    qtype = _text(args.get("x-queue-type", "classic"))
    if qtype not in ("classic",):
        raise _invalid("x-queue-type", name, vhost, f"{{unacceptable_value,<<\"{qtype}\">>}} "
                       "(this node serves classic queues)")
    s.queue_type = qtype
    return s


def validate_exchange_args(args: dict[str, Any], name: str, vhost: str) -> None:
    alt = args.get("alternate-exchange")
    if alt is not None and not isinstance(alt, (str, bytes)):
        raise precondition_failed(f"invalid arg 'alternate-exchange' for exchange '{name}' in vhost '{vhost}': "
                                  f"{{unacceptable_type,{_type_name(alt)}}}")


def consumer_priority(args: dict[str, Any]) -> int:
    v = args.get("x-priority")
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int):
        raise precondition_failed(f"invalid arg 'x-priority' for consumer: {{unacceptable_type,{_type_name(v)}}}")
    return v


def parse_expiration(value: str) -> int:
    """The `expiration` property: a non-negative integer number of milliseconds, as a string."""
    try:
        ms = int(value)
    except ValueError:
        raise precondition_failed(f"invalid expiration '{value}': {{error,no_integer}}") from None
    if ms < 0:
        raise precondition_failed(f"invalid expiration '{value}': {{value_negative,{ms}}}")
    return ms
