"""This node's stream-protocol connections, publishers and consumers, for the listings.

The stream-protocol server adds a record when a connection opens, a publisher is declared or a
subscription made, updates the record's counters in place, and removes it when it ends; the
management API (`/api/stream/...`) and `hutch-streams list_stream_*` read it, each node its own
(a listing asks every running node, as RabbitMQ's does).

Records are plain dicts with the field names of RabbitMQ's stream plugin (its CLI's info items:
`conn_name`, `subscriptions`, `connection_state`, ...; `publisher_id`, `reference`,
`messages_published`, ...; `subscription_id`, `offset`, `offset_lag`, `credits`, `properties`,
`active`, `activity_status` (`up`, or `single_active` / `waiting` for a single active
consumer), ...). A publisher's and a consumer's record also carry `connection` (the connection's name),
`stream` and `vhost`. Must never: decide anything about a connection, or hold more than
`RECORDS_MAX` records of a kind.
"""

from __future__ import annotations

from typing import Any

RECORDS_MAX = 1 << 20  # records of one kind; the server's own limits keep far below it


class StreamRegistry:
    """Connections by name; publishers and consumers by (connection name, id)."""

    def __init__(self) -> None:
        self.connections: dict[str, dict[str, Any]] = {}
        self.publishers: dict[tuple[str, int], dict[str, Any]] = {}
        self.consumers: dict[tuple[str, int], dict[str, Any]] = {}

    # -- the server's side
    def add_connection(self, name: str, record: dict[str, Any]) -> dict[str, Any]:
        """Record a connection (RabbitMQ's info items); the stored dict, to update in place."""
        assert name in self.connections or len(self.connections) < RECORDS_MAX, "stream connections"
        record = {**record, "conn_name": name}
        self.connections[name] = record
        return record

    def remove_connection(self, name: str) -> None:
        """The connection closed: it goes, with its publishers and consumers."""
        self.connections.pop(name, None)
        for key in [k for k in self.publishers if k[0] == name]:
            del self.publishers[key]
        for key in [k for k in self.consumers if k[0] == name]:
            del self.consumers[key]

    def add_publisher(self, connection: str, publisher_id: int, record: dict[str, Any]) -> dict[str, Any]:
        assert (connection, publisher_id) in self.publishers or len(self.publishers) < RECORDS_MAX, "publishers"
        record = {"messages_published": 0, "messages_confirmed": 0, "messages_errored": 0, **record,
                  "connection": connection, "publisher_id": publisher_id}
        self.publishers[(connection, publisher_id)] = record
        return record

    def remove_publisher(self, connection: str, publisher_id: int) -> None:
        self.publishers.pop((connection, publisher_id), None)

    def add_consumer(self, connection: str, subscription_id: int, record: dict[str, Any]) -> dict[str, Any]:
        assert (connection, subscription_id) in self.consumers or len(self.consumers) < RECORDS_MAX, "consumers"
        record = {"messages_consumed": 0, "offset": 0, "offset_lag": 0, "credits": 0, "properties": {},
                  "active": True, "activity_status": "up", **record, "connection": connection,
                  "subscription_id": subscription_id}
        self.consumers[(connection, subscription_id)] = record
        return record

    def remove_consumer(self, connection: str, subscription_id: int) -> None:
        self.consumers.pop((connection, subscription_id), None)

    # -- the listings' side
    def connection_list(self, vhost: str | None = None) -> list[dict[str, Any]]:
        return [dict(c) for c in self.connections.values() if vhost is None or c.get("vhost") == vhost]

    def publisher_list(self, vhost: str | None = None, stream: str | None = None,
                       connection: str | None = None) -> list[dict[str, Any]]:
        return [dict(p) for p in self.publishers.values() if _matches(p, vhost, stream, connection)]

    def consumer_list(self, vhost: str | None = None, stream: str | None = None,
                      connection: str | None = None) -> list[dict[str, Any]]:
        return [dict(c) for c in self.consumers.values() if _matches(c, vhost, stream, connection)]

    def group_consumers(self, vhost: str, stream: str, reference: str) -> list[dict[str, Any]] | None:
        """This node's consumers of a single-active-consumer group (its name is the
        subscriptions' `name` property) on a stream: subscription_id, connection_name, state
        (`active` as the group's coordinator last told this node, else `inactive`); None when
        this node has none of the group. The whole group, in order, is the coordinator's
        (`hutch.broker.streamsac`); this is what a listing shows while the coordinator changes."""
        rows = []
        for c in self.consumers.values():
            props = c.get("properties") or {}
            if (c.get("vhost") == vhost and c.get("stream") == stream and props.get("name") == reference
                    and str(props.get("single-active-consumer", "")).lower() == "true"):
                rows.append({"subscription_id": c["subscription_id"], "connection_name": c["connection"],
                             "state": "active" if c.get("active") else "inactive"})
        return rows or None


def _matches(rec: dict[str, Any], vhost: str | None, stream: str | None, connection: str | None) -> bool:
    return ((vhost is None or rec.get("vhost") == vhost) and (stream is None or rec.get("stream") == stream)
            and (connection is None or rec.get("connection") == connection))


def registry_of(broker: Any) -> StreamRegistry:
    """The broker's registry (`broker.stream_registry`), made on first use."""
    reg = getattr(broker, "stream_registry", None)
    if reg is None:
        reg = broker.stream_registry = StreamRegistry()
    return reg


__all__ = ["StreamRegistry", "registry_of", "RECORDS_MAX"]
