"""Tests of the cluster building blocks: the peer wire and transport, the failure detector,
and the lab's fault proxy. Helpers shared by these tests live here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from hutch.cluster import PeerTransport
from tests.support.brokers import free_port

TEST_TIMEOUT_S = 30.0
SECRET = "test-cluster-secret"


def run(coro: Coroutine[Any, Any, Any], timeout_s: float = TEST_TIMEOUT_S) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(timeout_s):
            return await coro
    return asyncio.run(bounded())


async def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "") -> float:
    """Wait for a condition (polled every 10 ms); returns the seconds it took, fails after timeout_s."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or condition}")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


class Node:
    """A PeerTransport plus a record of everything its callbacks saw."""

    def __init__(self, name: str, port: int | None = None, secret: str = SECRET, **kwargs: Any):
        self.name = name
        self.port = port or free_port()
        self.messages: list[tuple[str, Any, Any]] = []
        self.ups: list[str] = []
        self.downs: list[tuple[str, str, float]] = []
        self.suspicions: list[tuple[str, bool, float]] = []
        self.kwargs = kwargs
        self.secret = secret
        self.transport: PeerTransport | None = None

    async def start(self, peers: dict[str, tuple[str, int]] | None = None) -> Node:
        loop = asyncio.get_running_loop()
        self.transport = PeerTransport(
            self.name, "127.0.0.1", self.port, self.secret, peers=peers or {},
            on_message=lambda peer, group, payload: self.messages.append((peer, group, payload)),
            on_peer_up=self.ups.append,
            on_peer_down=lambda peer, reason: self.downs.append((peer, reason, loop.time())),
            on_peer_suspected=lambda peer, s: self.suspicions.append((peer, s, loop.time())),
            **self.kwargs)
        await self.transport.start()
        return self

    async def close(self) -> None:
        if self.transport is not None:
            await self.transport.close()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def received(self, peer: str, group: Any) -> list[Any]:
        return [p for (src, g, p) in self.messages if src == peer and g == group]


async def linked_pair() -> tuple[Node, Node]:
    """Nodes a@h and b@h, each dialling the other, once their link is up (close both after)."""
    a, b = Node("a@h"), Node("b@h")
    await a.start({"b@h": b.address})
    await b.start({"a@h": a.address})
    await wait_until(lambda: a.transport.is_up("b@h") and b.transport.is_up("a@h"), what="link up")
    return a, b
