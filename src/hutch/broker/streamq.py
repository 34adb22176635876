"""The broker's side of streams: `BrokerStreamPort`, the few broker services the stream host
(`hutch.streams.host`) may use, and the `Kind` that turns a declare into a stream's catalogue
record and a committed record into this node's handle.

Everything about how a stream works (its Raft group, its log, reads and writes) lives in
`hutch.streams`. Must never: decide anything about a stream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hutch.amqp.spec import precondition_failed
from hutch.broker.kinds import GroupKind, register_kind
from hutch.broker.quorumq import BrokerQuorumPort
from hutch.cluster import catalogue as cat
from hutch.queues import effective
from hutch.quorum import placement
from hutch.streams.config import StreamArgumentError, stream_config
from hutch.streams.handle import STREAM


def advertised_address(config: Any) -> tuple[str, int]:
    """Where stream-protocol clients are told to reach this node (metadata): the configured
    stream.advertised_host/port, else the listener's address when it is a specific one."""
    host = config.stream_advertised_host
    if not host:
        bound = config.amqp_host or ""
        host = bound if bound not in ("", "0.0.0.0", "::") else "localhost"
    return host, config.stream_advertised_port or config.stream_port


class BrokerStreamPort(BrokerQuorumPort):
    """`hutch.streams.host.StreamPort` on a broker: the quorum host's port (time, the loop,
    publisher windows and confirms, consumers) with what streams need besides."""

    def data_dir(self) -> Path | None:
        d = getattr(self.broker, "data_dir", None) or self.broker.config.data_dir
        return Path(d) if d else None

    def fsync(self) -> bool:
        return True

    def policy_of(self, vhost: str, name: str) -> dict:
        pol = effective.match(self.broker.policies, vhost, name, "queue", STREAM.name)
        return dict(pol["definition"]) if pol else {}


class StreamKind(GroupKind):
    """Streams: a `StreamQueue` handle on every node, made and dropped by the stream host."""

    name = STREAM.name

    def declare_command(self, cl: Any, vhost: str, name: str, *, durable: bool, exclusive: bool,
                        auto_delete: bool, args: dict, owner: Any, node: str | None,
                        journal_id: int) -> cat.DeclareQueue:
        try:
            config = stream_config(args, name, vhost, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                                   policy=cl.streams.port.policy_of(vhost, name))
        except StreamArgumentError as e:
            raise precondition_failed(e.text) from None
        if config.initial_cluster_size is not None:
            args = {**args, "x-quorum-initial-group-size": config.initial_cluster_size}
        leader, members = placement.place_members(cl.catalogue, cl.running_nodes(), cl.node, args, name, vhost,
                                                  leader_of=cl.quorum_leader)
        args.pop("x-quorum-initial-group-size", None) if config.initial_cluster_size is not None else None
        if node is not None and node in members:
            leader = node
        return cat.DeclareQueue(vhost, name, cat.STREAM, True, False, None, dict(args), leader, members, journal_id)

    def host(self, cl: Any) -> Any:
        return cl.streams


register_kind(StreamKind())
