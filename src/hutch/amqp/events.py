"""Events the protocol core hands to the broker: small classes named for what happened.

Hot events (`Publish`, `Ack`, `Nack`, `Reject`) carry only what the broker needs and are
built without pamqp; every other method arrives as `Method` wrapping the pamqp object.
"""

from __future__ import annotations

from typing import Any

from pamqp.base import Frame as PamqpMethod


class Event:
    __slots__ = ()


class Authenticate(Event):
    """connection.start-ok arrived: the broker checks the credentials and calls
    `Connection.login_ok()` or `Connection.login_refused()`."""

    __slots__ = ("mechanism", "username", "password", "client_properties")

    def __init__(self, mechanism: str, username: str, password: str, client_properties: dict[str, Any]):
        self.mechanism = mechanism
        self.username = username
        self.password = password
        self.client_properties = client_properties

    def __repr__(self) -> str:  # never show the password
        return f"Authenticate(mechanism={self.mechanism!r}, username={self.username!r})"


class OpenVhost(Event):
    """connection.open arrived: the broker calls `open_ok()` or `close(NOT_ALLOWED, ...)`."""

    __slots__ = ("vhost",)

    def __init__(self, vhost: str):
        self.vhost = vhost


class ChannelOpened(Event):
    __slots__ = ("channel",)

    def __init__(self, channel: int):
        self.channel = channel


class ChannelClosed(Event):
    """The client closed a channel (the core has answered close-ok)."""

    __slots__ = ("channel", "code", "text")

    def __init__(self, channel: int, code: int = 200, text: str = ""):
        self.channel = channel
        self.code = code
        self.text = text


class ChannelFlow(Event):
    __slots__ = ("channel", "active")

    def __init__(self, channel: int, active: bool):
        self.channel = channel
        self.active = active


class Method(Event):
    """Any method not given its own event; `method` is the pamqp object."""

    __slots__ = ("channel", "method")

    def __init__(self, channel: int, method: PamqpMethod):
        self.channel = channel
        self.method = method

    def __repr__(self) -> str:
        return f"Method({self.channel}, {self.method!r})"


class Publish(Event):
    """basic.publish with its content assembled.

    `props` is the raw property flags and list as sent; `route_enc` the exchange and
    routing key as encoded on the wire (reused in basic.deliver)."""

    __slots__ = ("channel", "exchange", "routing_key", "route_enc", "mandatory", "immediate", "props", "body")

    def __init__(self, channel: int, route: tuple[str, str, bytes, bool, bool], props: bytes, body: bytes):
        """`route`: (exchange, routing_key, route_enc, mandatory, immediate), as `codec.decode_publish`
        gives them (the connection keeps them per distinct basic.publish)."""
        self.channel = channel
        self.exchange, self.routing_key, self.route_enc, self.mandatory, self.immediate = route
        self.props = props
        self.body = body

    def __repr__(self) -> str:
        return f"Publish({self.channel}, {self.exchange!r}, {self.routing_key!r}, {len(self.body)} bytes)"


class Ack(Event):
    __slots__ = ("channel", "delivery_tag", "multiple")

    def __init__(self, channel: int, delivery_tag: int, multiple: bool):
        self.channel = channel
        self.delivery_tag = delivery_tag
        self.multiple = multiple


class Nack(Event):
    __slots__ = ("channel", "delivery_tag", "multiple", "requeue")

    def __init__(self, channel: int, delivery_tag: int, multiple: bool, requeue: bool):
        self.channel = channel
        self.delivery_tag = delivery_tag
        self.multiple = multiple
        self.requeue = requeue


class Reject(Event):
    __slots__ = ("channel", "delivery_tag", "requeue")

    def __init__(self, channel: int, delivery_tag: int, requeue: bool):
        self.channel = channel
        self.delivery_tag = delivery_tag
        self.requeue = requeue


class ConnectionClosed(Event):
    """The connection is over: the client closed it (close-ok has been queued), the
    broker's close was acknowledged, or the protocol was broken. The runtime flushes
    `data_to_send()` and closes the socket."""

    __slots__ = ("code", "text", "by_client")

    def __init__(self, code: int, text: str, by_client: bool):
        self.code = code
        self.text = text
        self.by_client = by_client

    def __repr__(self) -> str:
        return f"ConnectionClosed({self.code}, {self.text!r}, by_client={self.by_client})"


class HeartbeatTimeout(Event):
    __slots__ = ("timeout_s",)

    def __init__(self, timeout_s: int):
        self.timeout_s = timeout_s
