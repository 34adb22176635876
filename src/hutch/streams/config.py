"""A stream's settings from its declare arguments and policy, checked as RabbitMQ checks them.

Texts are RabbitMQ 3.10.8's (measured with pika against Debian's package with the
rabbitmq_stream plugin enabled). Must never: do I/O, or import outside hutch.streams and the
cores.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from hutch.streamproto.chunk import BLOOM_SIZE_DEFAULT, BLOOM_SIZE_MAX, BLOOM_SIZE_MIN

# Arguments of other queue types that a stream refuses (RabbitMQ 3.10.8, measured)
UNSUPPORTED_ARGUMENTS = ("x-max-length", "x-message-ttl", "x-max-priority", "x-dead-letter-exchange",
                         "x-dead-letter-routing-key", "x-single-active-consumer", "x-expires", "x-overflow",
                         "x-delivery-limit", "x-queue-mode", "x-queue-master-locator", "x-queue-version",
                         "x-dead-letter-strategy")
SEGMENT_BYTES_DEFAULT = 500_000_000  # x-stream-max-segment-size-bytes
SEGMENT_BYTES_MAX = 3_000_000_000
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")
# A stream's arguments as RabbitMQ names them outside AMQP 0-9-1 (the stream protocol's Create,
# a super stream over HTTP) -> the queue.declare argument and the type of its value
NAMED_ARGUMENTS: dict[str, tuple[str, type]] = {
    "max-length-bytes": ("x-max-length-bytes", int), "max-age": ("x-max-age", str),
    "stream-max-segment-size-bytes": ("x-stream-max-segment-size-bytes", int),
    "initial-cluster-size": ("x-initial-cluster-size", int), "queue-leader-locator": ("x-queue-leader-locator", str),
    "stream-filter-size-bytes": ("x-stream-filter-size-bytes", int)}
_AGE = re.compile(r"^([0-9]+)([YMDhms])$")
_AGE_UNIT_S = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}


class StreamArgumentError(ValueError):
    """A declare argument or property a stream refuses; `text` is RabbitMQ's 406 reply text."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


class StreamConfig(msgspec.Struct, frozen=True):
    name: str
    vhost: str
    max_bytes: int | None = None  # retention by size (x-max-length-bytes)
    max_age_ms: int | None = None  # retention by age (x-max-age)
    segment_bytes: int = SEGMENT_BYTES_DEFAULT
    initial_cluster_size: int | None = None
    leader_locator: str | None = None
    filter_size: int = BLOOM_SIZE_DEFAULT


def _text(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def parse_age(value: Any) -> int | None:
    """x-max-age ("7D", "1h", "30m", "10s", "1M", "1Y") in ms; None when not valid."""
    value = _text(value)
    if not isinstance(value, str):
        return None
    m = _AGE.match(value)
    if m is None or int(m.group(1)) <= 0:
        return None
    return int(m.group(1)) * _AGE_UNIT_S[m.group(2)] * 1000


def _type_name(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "signedint"
    if isinstance(v, (str, bytes)):
        return "longstr"
    if isinstance(v, float):
        return "double"
    return type(v).__name__


def stream_config(args: dict, name: str, vhost: str, *, durable: bool = True, exclusive: bool = False,
                  auto_delete: bool = False, policy: dict | None = None) -> StreamConfig:
    """The stream-specific checks of queue.declare, in RabbitMQ's order, and the settings that
    result (an argument wins over the policy's key)."""
    rs = f"queue '{name}' in vhost '{vhost}'"
    for key in args:
        if key in UNSUPPORTED_ARGUMENTS:
            raise StreamArgumentError(f"invalid arg '{key}' for {rs} of queue type rabbit_stream_queue")
    if exclusive:
        raise StreamArgumentError(f"invalid property 'exclusive-owner' for {rs}")
    if auto_delete:
        raise StreamArgumentError(f"invalid property 'auto-delete' for {rs}")
    if not durable:
        raise StreamArgumentError(f"invalid property 'non-durable' for {rs}")
    policy = policy or {}
    age_ms = None
    age = args.get("x-max-age", policy.get("max-age"))
    if age is not None:
        if not isinstance(_text(age), str):
            raise StreamArgumentError(f"invalid arg 'x-max-age' for {rs}: {{unacceptable_type,{_type_name(age)}}}")
        age_ms = parse_age(age)
        if age_ms is None:
            raise StreamArgumentError(f"invalid arg 'x-max-age' for {rs}: invalid_max_age")
    max_bytes = _int_arg(args, policy, "x-max-length-bytes", "max-length-bytes", rs)
    segment = _int_arg(args, policy, "x-stream-max-segment-size-bytes", "stream-max-segment-size-bytes", rs)
    if segment is not None and segment > SEGMENT_BYTES_MAX:
        raise StreamArgumentError("Exceeded max value for x-stream-max-segment-size-bytes")
    size = _int_arg(args, policy, "x-initial-cluster-size", "initial-cluster-size", rs)
    if size == 0 and "x-initial-cluster-size" in args:
        raise StreamArgumentError(f"invalid arg 'x-initial-cluster-size' for {rs}: {{value_zero,0}}")
    filter_size = _int_arg(args, policy, "x-stream-filter-size-bytes", "stream-filter-size-bytes", rs)
    if filter_size is not None and not BLOOM_SIZE_MIN <= filter_size <= BLOOM_SIZE_MAX:
        raise StreamArgumentError(f"invalid arg 'x-stream-filter-size-bytes' for {rs}: "
                                  f"must be between {BLOOM_SIZE_MIN} and {BLOOM_SIZE_MAX}")
    locator = _text(args.get("x-queue-leader-locator", policy.get("queue-leader-locator")))
    if locator is not None and locator not in LEADER_LOCATORS:
        raise StreamArgumentError(f"invalid arg 'x-queue-leader-locator' for {rs}: invalid_queue_locator_arg")
    return StreamConfig(name, vhost, max_bytes, age_ms, segment or SEGMENT_BYTES_DEFAULT,
                        size if size and size > 0 else None, locator, filter_size or BLOOM_SIZE_DEFAULT)


def _int_arg(args: dict, policy: dict, key: str, pkey: str, rs: str) -> int | None:
    v = args.get(key)
    if v is None:
        v = policy.get(pkey)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None
    if isinstance(v, bool) or not isinstance(v, int):
        raise StreamArgumentError(f'invalid arg \'{key}\' for {rs}: "expected integer, got {_type_name(v)}"')
    if v < 0:
        raise StreamArgumentError(f"invalid arg '{key}' for {rs}: {{value_negative,{v}}}")
    return v
