"""Queue, exchange and consumer arguments: validation and equivalence, as RabbitMQ checks them.

A declare with an argument of the wrong type or range fails with 406 PRECONDITION_FAILED
("invalid arg 'x-max-length' for queue 'q' in vhost '/': ..."); a redeclare whose arguments
differ from the existing queue's fails with 406 "inequivalent arg ..." (that comparison is
`hutch.cluster.catalogue.args_difference`, the one place it is made). Unknown `x-` arguments
are accepted and kept, as RabbitMQ does.
"""

from __future__ import annotations

from typing import Any

from hutch.amqp.codec import field_type_name as _type_name
from hutch.amqp.spec import PRECONDITION_FAILED, AMQPError, precondition_failed
from hutch.queues.state import DROP_HEAD, OVERFLOW_MODES, QueueLimits


def _text(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _invalid(key: str, name: str, vhost: str, why: str) -> AMQPError:
    return AMQPError(PRECONDITION_FAILED, f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}': {why}")


EXPIRY_MS_MAX = 315_360_000_000  # ten years: RabbitMQ's largest x-message-ttl / x-expires
PRIORITY_MAX = 255
QUEUE_MODES = ("default", "lazy")
QUEUE_TYPES_KNOWN = ("classic", "quorum", "stream")


def _int_arg(args: dict, key: str, name: str, vhost: str, minimum: int, maximum: int | None = None,
             too_large: str = "value_too_large") -> int | None:
    """An integer argument checked as RabbitMQ does: AMQP integer types only (no bool, float or
    decimal), then the range: {value_negative,N} / {value_zero,N} / {value_too_large,N}."""
    v = args.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _invalid(key, name, vhost, f'"expected integer, got {_type_name(v)}"')
    if v < 0:
        raise _invalid(key, name, vhost, f"{{value_negative,{v}}}")
    if v < minimum:
        raise _invalid(key, name, vhost, f"{{value_zero,{v}}}")
    if maximum is not None and v > maximum:
        raise _invalid(key, name, vhost, f"{{{too_large},{v}}}")
    return v


def _str_arg(args: dict, key: str, name: str, vhost: str) -> str | None:
    v = args.get(key)
    if v is None:
        return None
    if not isinstance(v, (str, bytes)):
        raise _invalid(key, name, vhost, f"{{unacceptable_type,{_type_name(v)}}}")
    return _text(v)


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
    """Validate a queue's arguments in the order RabbitMQ 3.10 checks them; the first bad one
    fails the declare with its text."""
    s = QueueSettings()
    dlx = args.get("x-dead-letter-exchange")
    if dlx is not None and not isinstance(dlx, (str, bytes)):  # checked first, with its own wording
        raise precondition_failed(f"invalid type '{_type_name(dlx)}' for arg 'x-dead-letter-exchange' in "
                                  f"queue '{name}' in vhost '{vhost}'")
    s.expires_ms = _int_arg(args, "x-expires", name, vhost, 1, EXPIRY_MS_MAX)
    s.message_ttl_ms = _int_arg(args, "x-message-ttl", name, vhost, 0, EXPIRY_MS_MAX)
    s.dead_letter_exchange = _text(dlx) if dlx is not None else None
    dlrk = _str_arg(args, "x-dead-letter-routing-key", name, vhost)
    if dlrk is not None:
        if dlx is None:
            raise _invalid("x-dead-letter-routing-key", name, vhost, "routing_key_but_no_dlx_defined")
        s.dead_letter_routing_key = dlrk
    max_length = _int_arg(args, "x-max-length", name, vhost, 0)
    max_bytes = _int_arg(args, "x-max-length-bytes", name, vhost, 0)
    max_priority = _int_arg(args, "x-max-priority", name, vhost, 0, PRIORITY_MAX, "max_value_exceeded")
    overflow = _str_arg(args, "x-overflow", name, vhost) or DROP_HEAD
    if overflow not in OVERFLOW_MODES:
        raise _invalid("x-overflow", name, vhost, "invalid_overflow")
    s.limits = QueueLimits(max_length, max_bytes, overflow, max_priority or 0)
    _int_arg(args, "x-consumer-timeout", name, vhost, 0)  # read by the channel (effective settings)
    mode = _str_arg(args, "x-queue-mode", name, vhost)
    if mode is not None and mode not in QUEUE_MODES:
        raise _invalid("x-queue-mode", name, vhost, f'"unsupported queue mode \'{mode}\'"')
    sac = args.get("x-single-active-consumer")
    if sac is not None:
        if not isinstance(sac, bool):
            raise _invalid("x-single-active-consumer", name, vhost, f"{{unacceptable_type,{_type_name(sac)}}}")
        s.single_active = sac
    qtype = _str_arg(args, "x-queue-type", name, vhost) or "classic"
    if qtype not in QUEUE_TYPES_KNOWN:
        raise _invalid("x-queue-type", name, vhost, f'"unsupported queue type \'{qtype}\'"')
    if qtype not in ("classic", "quorum", "stream"):
        raise _invalid("x-queue-type", name, vhost, f"{{unacceptable_value,<<\"{qtype}\">>}} "
                       "(this node serves classic, quorum and stream queues)")
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
        raise precondition_failed(f"invalid expiration '{value}': no_integer") from None
    if ms < 0:
        raise precondition_failed(f"invalid expiration '{value}': {{value_negative,{ms}}}")
    return ms
