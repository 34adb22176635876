"""A virtual host: its exchanges, queues and bindings, and routing between them.

Routing follows bindings from the exchange a message was published to, through
exchange-to-exchange bindings, to queues; when nothing matched, the exchange's
`alternate-exchange` is tried. A queue is reached at most once per publish. The result for
(exchange, routing key) is cached for every exchange type but headers until the topology
changes (a declare, delete, bind or unbind drops the whole cache).
"""

from __future__ import annotations

from typing import Any

from hutch.amqp.spec import RESOURCE_LOCKED, AMQPError, not_found
from hutch.broker.exchanges import EXCHANGE, QUEUE, Binding, Exchange
from hutch.queues.classic import ClassicQueue

ROUTE_CACHE_MAX = 10_000
DEFAULT_EXCHANGES = (
    ("", "direct"), ("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
    ("amq.headers", "headers"), ("amq.match", "headers"),
)


def rs(kind: str, name: str, vhost: str) -> str:
    """A resource as RabbitMQ names it in messages: "queue 'q' in vhost '/'"."""
    return f"{kind} '{name}' in vhost '{vhost}'"


class VHost:
    def __init__(self, name: str):
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, ClassicQueue] = {}
        self._route_cache: dict[tuple[str, str], tuple[ClassicQueue, ...]] = {}
        for xname, xtype in DEFAULT_EXCHANGES:
            self.exchanges[xname] = Exchange(xname, xtype, durable=True)
        self.tracing = False
        # the alternate exchange a policy gives an exchange without an `alternate-exchange`
        # argument (set by the broker; the argument wins, as in RabbitMQ)
        self.policy_alternate: Any = None

    def __repr__(self) -> str:
        return f"VHost({self.name!r})"

    # ---------------------------------------------------------------- lookup

    def exchange(self, name: str) -> Exchange:
        x = self.exchanges.get(name)
        if x is None:
            raise not_found(f"no exchange '{name}' in vhost '{self.name}'")
        return x

    def queue(self, name: str, owner: Any = None) -> ClassicQueue:
        q = self.queues.get(name)
        if q is None:
            raise not_found(f"no queue '{name}' in vhost '{self.name}'")
        if q.exclusive_owner is not None and owner is not q.exclusive_owner:
            raise AMQPError(RESOURCE_LOCKED, f"cannot obtain exclusive access to locked queue '{name}' in vhost "
                            f"'{self.name}'. It could be originally declared on another connection or the "
                            "exclusive property value does not match that of the original declaration.")
        return q

    def topology_changed(self) -> None:
        self._route_cache.clear()

    # ---------------------------------------------------------------- routing

    def route(self, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None
              ) -> tuple[ClassicQueue, ...]:
        if exchange.type != "headers":
            key = (exchange.name, routing_key)
            cached = self._route_cache.get(key)
            if cached is not None:
                return cached
        if exchange.name == "":
            q = self.queues.get(routing_key)
            result: tuple[ClassicQueue, ...] = (q,) if q is not None else ()
        else:
            found: dict[str, ClassicQueue] = {}
            self._collect(exchange, routing_key, headers, found, set())
            result = tuple(found.values())
        if exchange.type != "headers":
            if len(self._route_cache) >= ROUTE_CACHE_MAX:
                self._route_cache.clear()
            self._route_cache[key] = result
        return result

    def _collect(self, x: Exchange, routing_key: str, headers: dict[str, Any] | None,
                 found: dict[str, ClassicQueue], seen: set[str]) -> None:
        if x.name in seen:
            return
        seen.add(x.name)
        before = len(found)
        for b in x.route(routing_key, headers):
            if b.kind == QUEUE:
                q = self.queues.get(b.destination)
                if q is not None:
                    found[q.name] = q
            else:
                dest = self.exchanges.get(b.destination)
                if dest is not None:
                    self._collect(dest, routing_key, headers, found, seen)
        alternate = x.alternate
        if alternate is None and self.policy_alternate is not None:
            alternate = self.policy_alternate(x, self.name)
        if len(found) == before and alternate:
            alt = self.exchanges.get(alternate)
            if alt is not None:
                self._collect(alt, routing_key, headers, found, seen)

    # ---------------------------------------------------------------- bindings

    def bind(self, source: str, kind: str, destination: str, routing_key: str, arguments: dict | None) -> bool:
        x = self.exchange(source)
        added = x.add_binding(Binding(source, destination, kind, routing_key, arguments))
        if added:
            self.topology_changed()
        return added

    def unbind(self, source: str, kind: str, destination: str, routing_key: str, arguments: dict | None
               ) -> Exchange | None:
        x = self.exchanges.get(source)
        if x is None:
            return None
        b = Binding(source, destination, kind, routing_key, arguments)
        if x.remove_binding(b.key) is not None:
            self.topology_changed()
            return x
        return None

    def bindings_to(self, kind: str, destination: str) -> list[Binding]:
        return [b for x in self.exchanges.values() for b in x.bindings.values()
                if b.kind == kind and b.destination == destination]

    def exchange_in_use(self, x: Exchange) -> bool:
        if x.bindings:
            return True
        return any(b.kind == EXCHANGE and b.destination == x.name
                   for other in self.exchanges.values() for b in other.bindings.values())

    def remove_bindings_of_queue(self, name: str) -> list[Exchange]:
        """Drop every binding to a deleted queue; returns the exchanges that lost one."""
        touched = []
        for x in list(self.exchanges.values()):
            keys = [k for k, b in x.bindings.items() if b.kind == QUEUE and b.destination == name]
            for k in keys:
                x.remove_binding(k)
            if keys:
                touched.append(x)
        self.topology_changed()
        return touched

    def remove_exchange(self, name: str) -> list[Exchange]:
        """Delete an exchange and every binding from or to it; returns exchanges that lost a binding."""
        self.exchanges.pop(name, None)
        touched = []
        for x in list(self.exchanges.values()):
            keys = [k for k, b in x.bindings.items() if b.kind == EXCHANGE and b.destination == name]
            for k in keys:
                x.remove_binding(k)
            if keys:
                touched.append(x)
        self.topology_changed()
        return touched

