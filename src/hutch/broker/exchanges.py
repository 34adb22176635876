"""Exchanges and bindings: where a published message goes.

Four types, as in AMQP 0-9-1 and RabbitMQ: direct (binding key equals routing key), fanout
(every binding), topic (dot-separated words; `*` matches exactly one word, `#` zero or more),
headers (`x-match` all or any over the binding's arguments, keys starting with `x-`
ignored; `all-with-x`/`any-with-x` include them). A binding's destination is a queue or
another exchange (exchange-to-exchange bindings). Routing results are cached by the vhost
per (exchange, routing key) and the cache is dropped on any topology change.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")

QUEUE = "queue"
EXCHANGE = "exchange"


def freeze(value: Any) -> Any:
    """A hashable form of a field table / array value, for binding identity."""
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


class Binding:
    __slots__ = ("source", "destination", "kind", "routing_key", "arguments", "key", "words")

    def __init__(self, source: str, destination: str, kind: str, routing_key: str, arguments: dict | None):
        self.source = source
        self.destination = destination
        self.kind = kind
        self.routing_key = routing_key
        self.arguments = arguments or {}
        self.key = (kind, destination, routing_key, freeze(self.arguments))
        self.words = routing_key.split(".") if routing_key else []

    @property
    def target(self) -> tuple[str, str]:
        return (self.kind, self.destination)


def topic_matches(pattern: list[str], key: list[str]) -> bool:
    """Does a topic binding pattern match a routing key (both split into words)?

    '#' is a wildcard over whole words (zero or more), '*' exactly one word; the classic
    wildcard algorithm with one backtracking point is exact for patterns with several '#'."""
    p = k = 0
    np_, nk = len(pattern), len(key)
    star_p = -1
    star_k = 0
    while k < nk:
        if p < np_:
            w = pattern[p]
            if w == "#":
                star_p, star_k = p, k
                p += 1
                continue
            if w == "*" or w == key[k]:
                p += 1
                k += 1
                continue
        if star_p >= 0:
            p = star_p + 1
            star_k += 1
            k = star_k
            continue
        return False
    while p < np_ and pattern[p] == "#":
        p += 1
    return p == np_


def _same_header_value(bound: Any, sent: Any) -> bool:
    """Equal values of the same type class, as RabbitMQ compares them: integers of any width
    are one class, floats another, booleans their own (so 1 matches neither 1.0 nor true)."""
    if isinstance(bound, bool) or isinstance(sent, bool):
        return type(bound) is type(sent) and bound == sent
    if isinstance(bound, float) != isinstance(sent, float):
        return False
    return bound == sent


def headers_match(binding_args: dict[str, Any], headers: dict[str, Any]) -> bool:
    mode = binding_args.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode()
    with_x = mode.endswith("-with-x")
    any_mode = mode.startswith("any")
    for k, v in binding_args.items():
        if k == "x-match" or (k.startswith("x-") and not with_x):
            continue
        present = k in headers
        ok = present and (v is None or _same_header_value(v, headers[k]))
        if any_mode and ok:
            return True
        if not any_mode and not ok:
            return False
    return not any_mode


class Exchange:
    __slots__ = ("name", "type", "durable", "auto_delete", "internal", "arguments", "bindings", "_direct",
                 "alternate", "mstats")

    def __init__(self, name: str, type: str, durable: bool = True, auto_delete: bool = False,
                 internal: bool = False, arguments: dict[str, Any] | None = None):
        self.name = name
        self.type = type
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        alt = self.arguments.get("alternate-exchange")
        self.alternate = alt.decode() if isinstance(alt, bytes) else alt
        self.bindings: dict[tuple, Binding] = {}
        self._direct: dict[str, list[Binding]] = {}
        # publish_in, publish_out, return_unroutable, drop_unroutable (hutch.broker.msgstats)
        self.mstats = [0, 0, 0, 0]

    def __repr__(self) -> str:
        return f"Exchange({self.name!r}, {self.type!r})"

    def has_binding(self, destination: str, kind: str, routing_key: str, arguments: dict | None) -> bool:
        return (kind, destination, routing_key, freeze(arguments or {})) in self.bindings

    def add_binding(self, b: Binding) -> bool:
        if b.key in self.bindings:
            return False
        self.bindings[b.key] = b
        if self.type == "direct":
            self._direct.setdefault(b.routing_key, []).append(b)
        return True

    def remove_binding(self, key: tuple) -> Binding | None:
        b = self.bindings.pop(key, None)
        if b is not None and self.type == "direct":
            lst = self._direct.get(b.routing_key)
            if lst is not None:
                lst.remove(b)
                if not lst:
                    del self._direct[b.routing_key]
        return b

    def route(self, routing_key: str, headers: dict[str, Any] | None) -> Iterable[Binding]:
        t = self.type
        if t == "direct":
            return self._direct.get(routing_key, ())
        if t == "fanout":
            return self.bindings.values()
        if t == "topic":
            words = routing_key.split(".") if routing_key else []
            return [b for b in self.bindings.values() if topic_matches(b.words, words)]
        if t == "headers":
            h = headers or {}
            return [b for b in self.bindings.values() if headers_match(b.arguments, h)]
        return ()
