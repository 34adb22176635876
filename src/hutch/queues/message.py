"""A message as queues hold it: content shared by every queue it was routed to.

The content properties stay the raw bytes the publisher sent; the broker fills in the few
facts queues act on (persistent, priority, expiration) when it routes the message. One
`Message` object is shared by all the queues a publish reached; nothing here copies a body.
"""

from __future__ import annotations


class Message:
    __slots__ = ("exchange", "routing_key", "route_enc", "props", "body", "persistent", "priority",
                 "expiration_ms", "id", "size")

    def __init__(self, exchange: str, routing_key: str, route_enc: bytes, props: bytes, body: bytes,
                 persistent: bool = False, priority: int = 0, expiration_ms: int | None = None, id: int = 0):
        self.exchange = exchange
        self.routing_key = routing_key
        self.route_enc = route_enc  # exchange + routing key as encoded in basic.deliver
        self.props = props  # raw content property flags + list
        self.body = body
        self.persistent = persistent
        self.priority = priority
        self.expiration_ms = expiration_ms  # per-message TTL (the `expiration` property)
        self.id = id  # broker-wide identity, used by the store to share one record among queues
        self.size = len(body)  # the body's length (a quorum queue's message may keep no body)

    def __repr__(self) -> str:
        return f"Message({self.exchange!r}, {self.routing_key!r}, {len(self.body)} bytes)"
