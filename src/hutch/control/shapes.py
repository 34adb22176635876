"""The JSON objects of the management API, in RabbitMQ 3.10's field names and types.

Each function turns one broker object into the dict RabbitMQ's API would show for it:
queues, exchanges, bindings, connections, channels, consumers, users, vhosts and
permissions. They are pure reads of broker state; every object carries `node` (this node's
name), so the same shapes serve a cluster where objects live on several nodes.

`message_stats` holds counters since the object was created, with their rates (`*_details`,
hutch.control.rates); a queue's, exchange's and vhost's figures here are this node's, and the
routes add the other nodes' (hutch.control.stats). Differences from RabbitMQ, by design:
a binding's `properties_key` hashes its arguments with hutch's own (stable) hash.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from hutch.amqp import codec
from hutch.broker.exchanges import QUEUE, Binding
from hutch.control import rates
from hutch.queues import effective

if TYPE_CHECKING:
    from hutch.broker.broker import Broker, User
    from hutch.broker.channel import Channel, ChannelConsumer
    from hutch.broker.exchanges import Exchange
    from hutch.broker.session import Session
    from hutch.broker.vhost import VHost
    from hutch.queues.classic import ClassicQueue

DEFAULT_VHOST_DESCRIPTION = "Default virtual host"
PROPERTY_FIELDS = ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                   "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id")


def jsonable(v: Any) -> Any:
    """AMQP field values as JSON: bytes as text, timestamps as seconds, decimals as numbers."""
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, datetime.datetime):
        return int(v.timestamp())
    if isinstance(v, decimal.Decimal):
        return float(v)
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return str(v)


def _host_port(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return addr, 0


# ---------------------------------------------------------------- bindings

def properties_key(routing_key: str, arguments: dict[str, Any] | None) -> str:
    """A binding's identity within (source, destination), usable in a URL path segment."""
    key = quote(routing_key, safe="") if routing_key else ""
    if arguments:
        canon = json.dumps(jsonable(arguments), sort_keys=True, separators=(",", ":")).encode()
        key += "~" + base64.urlsafe_b64encode(hashlib.sha1(canon).digest()[:6]).decode()
    return key or "~"


def binding(vhost: str, source: str, kind: str, destination: str, routing_key: str,
            arguments: dict[str, Any] | None) -> dict[str, Any]:
    return {"source": source, "vhost": vhost, "destination": destination, "destination_type": kind,
            "routing_key": routing_key, "arguments": jsonable(arguments or {}),
            "properties_key": properties_key(routing_key, arguments)}


def bindings_of(v: VHost) -> list[dict[str, Any]]:
    """Every binding of a vhost, the default exchange's implicit ones first (as RabbitMQ lists them)."""
    out = [binding(v.name, "", QUEUE, q.name, q.name, {}) for q in v.queues.values()]
    for x in v.exchanges.values():
        out.extend(binding_of(v.name, b) for b in x.bindings.values())
    return out


def binding_of(vhost: str, b: Binding) -> dict[str, Any]:
    return binding(vhost, b.source, b.kind, b.destination, b.routing_key, b.arguments)


# ---------------------------------------------------------------- queues and exchanges

def policy_fields(broker: Broker, vhost: str, name: str, kind: str, queue: Any = None) -> dict[str, Any]:
    """`policy`, and for queues `operator_policy` and `effective_policy_definition` (the two
    merged, hutch.queues.effective); `unsupported_policy_keys` lists the keys of that definition
    the queue's type does not act on (only when there are some)."""
    if kind != "queue":
        p = effective.match(broker.policies, vhost, name, kind)
        return {"policy": p["name"] if p else None}
    qtype = queue.queue_type if queue is not None else "classic"
    p = effective.match(broker.policies, vhost, name, kind, qtype)
    op = effective.match(broker.operator_policies, vhost, name, kind, qtype)
    out = {"policy": p["name"] if p else None, "operator_policy": op["name"] if op else None}
    if qtype == "stream":  # a stream takes its retention keys from the policies as they are (hutch.streams.config)
        out["effective_policy_definition"] = effective.merge_definitions(p["definition"] if p else None,
                                                                         op["definition"] if op else None)
        return out
    eff = broker.queue_settings(vhost, name, qtype, queue.arguments if queue is not None else {})
    out["effective_policy_definition"] = eff.definition
    if eff.unsupported:
        out["unsupported_policy_keys"] = list(eff.unsupported)
    return out


def _memory_fields(f) -> dict[str, int]:
    """RabbitMQ's split of a queue's messages between memory and disk (disk-first queues page
    ready messages out, hutch.queues.paging); nothing for a queue led on another node, whose
    leader does not report it."""
    if f.paged is None:
        return {}
    return {"messages_paged_out": f.paged, "message_bytes_paged_out": f.paged_bytes,
            "messages_ram": f.messages - f.paged, "messages_ready_ram": f.ready - f.paged,
            "messages_unacknowledged_ram": f.unacked, "message_bytes_ram": f.message_bytes - f.paged_bytes}


def queue(broker: Broker, q: ClassicQueue, details: bool = False) -> dict[str, Any]:
    f = q.figures()  # the one read model of every queue type (hutch.queues.handle.Figures)
    ready, unacked = f.ready, f.unacked
    consumers = q.consumers()
    active = q.active_consumer()
    out = {
        "name": q.name,
        "vhost": q.vhost,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": q.exclusive_owner is not None,
        "arguments": jsonable(q.arguments),
        "node": q.home_node or broker.config.node_name,
        "type": q.queue_type,
        "state": "running",
        **policy_fields(broker, q.vhost, q.name, "queue", q),
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "message_bytes": f.ready_bytes + f.unacked_bytes,
        "message_bytes_ready": f.ready_bytes,
        "message_bytes_unacknowledged": f.unacked_bytes,
        "consumers": f.consumers,
        **(_memory_fields(f) if q.queue_type != "stream" else {}),  # a stream's messages are in its log
        "consumer_capacity": 1.0 if consumers else 0.0,
        "consumer_utilisation": 1.0 if consumers else 0.0,
        "exclusive_consumer_tag": next((c.tag for c in consumers if c.exclusive), None),
        "single_active_consumer_tag": active.tag if active is not None else None,
        "head_message_timestamp": None,
        "recoverable_slaves": None,
        "message_stats": rates.local_object_stats(broker, rates.QUEUE, (q.vhost, q.name), q.mstats),
    }
    if q.quorum:
        out["leader"] = q.home_node
        out["members"] = list(q.members)
        out["online"] = q.online()
    elif q.queue_type == "stream":
        out.update(stream_fields(q))
    elif broker.cluster is not None:
        mirrors, synced = broker.cluster.mirror_status(q.vhost, q.name)
        if mirrors or "ha-mode" in out["effective_policy_definition"]:
            out["slave_nodes"] = out["mirror_nodes"] = mirrors
            out["synchronised_slave_nodes"] = out["synchronised_mirror_nodes"] = synced
            out["recoverable_slaves"] = synced
    owner = q.exclusive_owner
    if owner is not None and hasattr(owner, "peer"):
        host, port = _host_port(owner.peer)
        out["owner_pid_details"] = {"name": owner.name, "peer_host": host, "peer_port": port}
    if details:
        out["consumer_details"] = [consumer(broker, c) for c in consumers]
        out["incoming"] = []
        out["deliveries"] = []
    return out


def stream_fields(q: Any) -> dict[str, Any]:
    """What RabbitMQ's API adds to a stream's queue object: its leader, members, the members
    that are up, and from this node's replica the last committed offset, the segments and the
    readers here (committed_offset and segments None when this node holds no replica; the
    listings then ask a member, hutch.control.streams.complete)."""
    here = q.machine is not None and q.log is not None and q.machine.missing_from is None
    _first, end, _size = q.extent()
    return {"leader": q.home_node, "members": list(q.members), "online": q.online(),
            "committed_offset": end - 1 if here else None, "segments": q.log.segment_count if here else None,
            "readers": len(q.local_consumers)}


def exchange(broker: Broker, vhost: str, x: Exchange) -> dict[str, Any]:
    return {
        "name": x.name,
        "vhost": vhost,
        "type": x.type,
        "durable": x.durable,
        "auto_delete": x.auto_delete,
        "internal": x.internal,
        "arguments": jsonable(x.arguments),
        **policy_fields(broker, vhost, x.name, "exchange"),
        "user_who_performed_action": "rmq-internal" if x.name == "" or x.name.startswith("amq.") else "",
    }


# ---------------------------------------------------------------- connections, channels, consumers

def connection_state(s: Session) -> str:
    if s.closed or s.proto.state in ("closing", "closed"):
        return "closed" if s.closed else "closing"
    if s.blocked:
        return "blocked"
    if s.flow_queues:
        return "flow"
    return "running" if s.proto.state == "open" else "starting"


def connection(broker: Broker, s: Session) -> dict[str, Any]:
    peer_host, peer_port = _host_port(s.peer)
    host, port = _host_port(s.local)
    age_ms = max(0, broker.now_ms() - s.connected_at_ms)
    props = jsonable(s.proto.client_properties or {})
    return {
        "name": s.name,
        "node": broker.config.node_name,
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "state": connection_state(s),
        "user": s.username,
        "user_who_performed_action": s.username,
        "vhost": s.vhost.name if s.vhost is not None else None,
        "auth_mechanism": s.proto.mechanism or None,
        "host": host,
        "port": port,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "ssl": bool(getattr(s, "tls", False)),
        "channels": len(s.channels),
        "channel_max": s.proto.channel_max,
        "frame_max": s.proto.frame_max,
        "timeout": s.proto.heartbeat_s,
        "client_properties": props,
        "user_provided_name": props.get("connection_name") if isinstance(props, dict) else None,
        "connected_at": int(time.time() * 1000) - age_ms,
        "recv_cnt": s.stats_recv_msgs,
        **rates.local_object_stats(broker, rates.CONNECTION, s.name, (s.recv_oct, s.send_oct)),
        "send_cnt": s.stats_send_msgs,
    }


def channel_name(s: Session, number: int) -> str:
    return f"{s.name} ({number})"


def channel(broker: Broker, s: Session, ch: Channel) -> dict[str, Any]:
    peer_host, peer_port = _host_port(s.peer)
    tx = ch.tx or []
    return {
        "name": channel_name(s, ch.number),
        "node": broker.config.node_name,
        "number": ch.number,
        "user": s.username,
        "user_who_performed_action": s.username,
        "vhost": s.vhost.name if s.vhost is not None else None,
        "connection_details": {"name": s.name, "peer_host": peer_host, "peer_port": peer_port},
        "state": "running" if ch.flow_active else "flow",
        "confirm": ch.confirm,
        "transactional": ch.tx is not None,
        "consumer_count": len(ch.consumers),
        "prefetch_count": ch.prefetch,
        "global_prefetch_count": ch.global_prefetch,
        "messages_unacknowledged": len(ch.unacked),
        "messages_unconfirmed": len(ch.confirm_waiting),
        "messages_uncommitted": sum(1 for op in tx if op[0] == "publish"),
        "acks_uncommitted": sum(1 for op in tx if op[0] != "publish"),
        "message_stats": rates.local_object_stats(broker, rates.CHANNEL, channel_name(s, ch.number), ch.mstats),
    }


def consumer(broker: Broker, c: ChannelConsumer) -> dict[str, Any]:
    ch = c.channel
    if ch is None:  # a consumer attached through another node: that node knows its channel
        q = c.queue
        return {"consumer_tag": c.tag, "queue": {"name": q.name, "vhost": q.vhost},
                "channel_details": {"node": c.origin}, "ack_required": not c.no_ack, "exclusive": c.exclusive,
                "prefetch_count": c.prefetch, "arguments": jsonable(c.arguments), "active": True,
                "activity_status": "up"}
    s = ch.session
    peer_host, peer_port = _host_port(s.peer)
    q = c.queue
    active = q.active_consumer()
    is_active = active is None or active is c
    return {
        "consumer_tag": c.tag,
        "queue": {"name": q.name, "vhost": q.vhost},
        "channel_details": {"name": channel_name(s, ch.number), "connection_name": s.name,
                            "node": broker.config.node_name, "number": ch.number, "peer_host": peer_host,
                            "peer_port": peer_port, "user": s.username},
        "ack_required": not c.no_ack,
        "exclusive": c.exclusive,
        "prefetch_count": c.prefetch,
        "arguments": jsonable(c.arguments),
        "active": is_active,
        "activity_status": ("single_active" if active is c else "waiting") if active is not None else "up",
    }


# ---------------------------------------------------------------- users, vhosts, permissions

def user(u: User) -> dict[str, Any]:
    return {"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": list(u.tags), "limits": {}}


def vhost(broker: Broker, v: VHost) -> dict[str, Any]:
    # the vhost's metadata is the catalogue record's (description, tags, default queue type)
    rec = broker.cluster.catalogue.vhosts.get(v.name) if broker.cluster is not None else None
    description = rec.description if rec is not None else getattr(v, "description", "")
    if not description and v.name == broker.config.default_vhost:
        description = DEFAULT_VHOST_DESCRIPTION
    tags = list(rec.tags) if rec is not None else list(getattr(v, "tags", []))
    default_queue_type = getattr(rec, "default_queue_type", "") or "undefined"
    metadata: dict[str, Any] = {"description": description, "tags": tags}
    if default_queue_type != "undefined":
        metadata["default_queue_type"] = default_queue_type
    figures = [q.figures() for q in v.queues.values()]
    ready = sum(f.ready for f in figures)
    unacked = sum(f.unacked for f in figures)
    return {
        "name": v.name,
        "description": description,
        "tags": tags,
        "default_queue_type": default_queue_type,
        "metadata": metadata,
        "tracing": bool(v.tracing),
        "cluster_state": {broker.config.node_name: "running"},
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
    }


def permission(user_name: str, vhost_name: str, perms: tuple) -> dict[str, Any]:
    return {"user": user_name, "vhost": vhost_name, "configure": perms[0].pattern, "write": perms[1].pattern,
            "read": perms[2].pattern}


# ---------------------------------------------------------------- messages

def properties(raw: bytes) -> dict[str, Any]:
    """A message's content properties as RabbitMQ's API shows them (only those that are set)."""
    if not raw or raw == b"\x00\x00":
        return {}
    p = codec.decode_properties(raw)
    out = {}
    for name in PROPERTY_FIELDS:
        v = getattr(p, name, None)
        if v is not None and v != {} and not (name == "cluster_id" and v == ""):
            out[name] = jsonable(v)
    return out


def message(body: bytes, props: bytes, exchange_name: str, routing_key: str, redelivered: bool,
            message_count: int, encoding: str, truncate: int | None) -> dict[str, Any]:
    shown = body if truncate is None else body[:truncate]
    payload_encoding = "base64"
    payload = None
    if encoding == "auto":
        try:
            payload = shown.decode("utf-8")
            payload_encoding = "string"
        except UnicodeDecodeError:
            payload = None
    if payload is None:
        payload = base64.b64encode(shown).decode()
    return {"payload_bytes": len(body), "redelivered": redelivered, "exchange": exchange_name,
            "routing_key": routing_key, "message_count": message_count, "properties": properties(props),
            "payload": payload, "payload_encoding": payload_encoding}
