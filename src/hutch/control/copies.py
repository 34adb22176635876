"""Comparing the copies of a replicated queue: the digests every node gives of its own copy
(hutch.control.digest, GET /api/hutch/digest/{vhost}/{name}) judged side by side, by the fault
campaigns over HTTP and by the whole-cluster simulation in process. It imports nothing of the
node, so the clients of the HTTP API may use it.

Copies that reached the same point (applied index, last sequence number, committed offset, or a
stream's hashed range) must agree in every counter and hash; copies at different points are
not compared: a follower behind its leader is not a divergence.
"""

from __future__ import annotations

from typing import Any

HASH_KEYS = ("counters", "ready_hash", "unacked_hash", "state_hash", "held_hash", "chunks_hash")


def compare(digests: dict[str, dict], key: str = "applied") -> list[str]:
    """The disagreements among copies (node -> digest) that reached the same `key` (applied index,
    last sequence number, committed offset, or a stream's hashed range): one line each, empty
    when every group of copies at the same point agrees."""
    groups: dict[Any, list[str]] = {}
    for node, d in sorted(digests.items()):
        point = tuple(d[key]) if isinstance(d.get(key), list) else d.get(key)
        groups.setdefault(point, []).append(node)
    problems = []
    for point, nodes in groups.items():
        first = digests[nodes[0]]
        for node in nodes[1:]:
            d = digests[node]
            differ = [k for k in HASH_KEYS if k in first and first.get(k) != d.get(k)]
            if differ:
                problems.append(f"{nodes[0]} and {node} at {key} {point} differ in {', '.join(differ)}: "
                                + "; ".join(f"{k} {first.get(k)} vs {d.get(k)}" for k in differ))
    return problems


__all__ = ["compare", "HASH_KEYS"]
