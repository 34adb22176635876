"""Names shared by the mirroring modules: GM member ids name their node, and log lines name
the queue as RabbitMQ's do. Must never: import anything from `hutch.broker` or above."""

from __future__ import annotations

from typing import Any


def node_of(member: str) -> str:
    return member.split("|", 1)[0]


def qname(q: Any) -> str:
    return f"Mirrored queue '{q.name}' in vhost '{q.vhost}'"
