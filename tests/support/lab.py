"""Helpers for tests that run a `hutch lab` (a cluster whose peer links go through fault proxies)."""

from __future__ import annotations

import base64
import json
import urllib.request

from hutch.lab.cluster import (
    MGMT_PORT_OFFSET,
    PEER_PORT_OFFSET,
    PROMETHEUS_PORT_OFFSET,
    STREAM_PORT_OFFSET,
    Lab,
    port_in_use,
)
from tests.support.brokers import free_port


def free_base_port(count: int) -> int:
    """A base port P with P+i, P-120+i (streams), P+10000+i, P+10020+i and P+20000+i free for
    i < count, all below the kernel's ephemeral range (so no outgoing connection can take one of
    them meanwhile)."""
    for _ in range(200):
        base = free_port() - PEER_PORT_OFFSET  # free_port() hands out 20000..32000: P+20000 is free
        if base + STREAM_PORT_OFFSET < 1024 or base + PEER_PORT_OFFSET + count > 32768:
            continue
        ports = [base + off + i for off in (0, STREAM_PORT_OFFSET, MGMT_PORT_OFFSET, PROMETHEUS_PORT_OFFSET,
                                            PEER_PORT_OFFSET) for i in range(count)]
        if not any(port_in_use(p) for p in ports):
            return base
    raise RuntimeError("no free base port")


def api(lab: Lab, i: int, path: str, timeout_s: float = 10.0, method: str = "GET", body=None):
    """`path` of node i's management API as guest (GET, or `method` with a JSON `body`), decoded
    (None for an empty answer)."""
    req = urllib.request.Request(lab.nodes[i].http_url + path, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        raw = r.read()
        return json.loads(raw) if raw else None


def queue_leader(lab: Lab, queue: str, via: int) -> str | None:
    """The leader of a queue in / as node `via` reports it (None when that node does not answer)."""
    try:
        return api(lab, via, f"/api/queues/%2F/{queue}").get("leader")
    except OSError:
        return None
