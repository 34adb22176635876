"""The lab's fault proxy on real TCP, alone and between two peer transports."""

from __future__ import annotations

import asyncio
import logging

from hutch.lab.proxy import FaultProxy
from tests.cluster import Node, run, wait_until
from tests.support.brokers import free_port

TICK_S = 1.0  # net_ticktime for these tests


async def echo_server() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()
    return await asyncio.start_server(echo, "127.0.0.1", free_port())


def port_of(server: asyncio.Server) -> int:
    return server.sockets[0].getsockname()[1]


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 5.0) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_bytes_pass_through_unchanged():
    async def go():
        server = await echo_server()
        async with server, FaultProxy(free_port(), "127.0.0.1", port_of(server)) as proxy:
            reader, writer = await connect(proxy.listen_port)
            payload = bytes(range(256)) * 4096  # 1 MiB
            writer.write(payload)
            echoed = await reader.readexactly(len(payload))
            assert echoed == payload
            writer.close()
    run(go())


def test_reset_partition_cuts_open_connections_and_refuses_new_ones_until_healed():
    async def go():
        server = await echo_server()
        async with server, FaultProxy(free_port(), "127.0.0.1", port_of(server)) as proxy:
            reader, writer = await connect(proxy.listen_port)
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            proxy.partition(mode="reset")
            assert await closed_by_peer(reader)
            writer.close()
            reader2, writer2 = await connect(proxy.listen_port)
            assert await closed_by_peer(reader2)
            writer2.close()
            proxy.heal()
            reader3, writer3 = await connect(proxy.listen_port)
            writer3.write(b"pong")
            assert await reader3.readexactly(4) == b"pong"
            writer3.close()
    run(go())


def test_blackhole_holds_bytes_silently_and_delivers_them_intact_on_heal():
    async def go():
        server = await echo_server()
        async with server, FaultProxy(free_port(), "127.0.0.1", port_of(server)) as proxy:
            reader, writer = await connect(proxy.listen_port)
            writer.write(b"a")
            assert await reader.readexactly(1) == b"a"
            proxy.partition(mode="blackhole")
            writer.write(b"held")
            # Nothing comes back while the link is blackholed (and the connection stays open).
            read = asyncio.ensure_future(reader.readexactly(4))
            done, _ = await asyncio.wait({read}, timeout=0.3)
            assert not done
            proxy.heal()
            assert await asyncio.wait_for(read, 5.0) == b"held"
            writer.close()
    run(go())


def test_delay_adds_latency_in_each_direction():
    async def go():
        server = await echo_server()
        async with server, FaultProxy(free_port(), "127.0.0.1", port_of(server)) as proxy:
            reader, writer = await connect(proxy.listen_port)
            loop = asyncio.get_running_loop()
            proxy.delay(150)
            started = loop.time()
            writer.write(b"slow")
            assert await reader.readexactly(4) == b"slow"
            round_trip_s = loop.time() - started
            assert 0.3 <= round_trip_s < 5.0  # 150 ms out and 150 ms back
            proxy.delay(0)
            writer.close()
    run(go())


async def linked_pair(mode_kwargs: dict | None = None) -> tuple[Node, Node, FaultProxy, FaultProxy]:
    """Nodes a and b whose links in both directions pass through proxies."""
    kw = mode_kwargs or {}
    a, b = Node("a@h", net_ticktime_s=TICK_S, **kw), Node("b@h", net_ticktime_s=TICK_S, **kw)
    a_to_b = FaultProxy(free_port(), "127.0.0.1", b.port)
    b_to_a = FaultProxy(free_port(), "127.0.0.1", a.port)
    await a_to_b.start()
    await b_to_a.start()
    await a.start({"b@h": ("127.0.0.1", a_to_b.listen_port)})
    await b.start({"a@h": ("127.0.0.1", b_to_a.listen_port)})
    await wait_until(lambda: a.transport.is_up("b@h") and b.transport.is_up("a@h"), what="link up")
    return a, b, a_to_b, b_to_a


async def close_all(*things) -> None:
    for thing in things:
        await thing.close()


def test_blackholed_peer_is_down_after_net_ticktime_and_back_after_heal(caplog):
    caplog.set_level(logging.WARNING, logger="hutch.cluster.transport")

    async def go():
        a, b, a_to_b, b_to_a = await linked_pair()
        try:
            loop = asyncio.get_running_loop()
            cut_at = loop.time()
            a_to_b.partition(mode="blackhole")
            b_to_a.partition(mode="blackhole")
            await wait_until(lambda: a.downs and b.downs, timeout_s=10, what="both sides down")
            for node, peer in ((a, "b@h"), (b, "a@h")):
                down_peer, reason, at = node.downs[0]
                assert (down_peer, reason) == (peer, "net_tick_timeout")
                # Silent links are only given up after net_ticktime, not before.
                assert at - cut_at >= TICK_S * 0.9
            assert any(r.getMessage() == "node b@h down: net_tick_timeout" for r in caplog.records)
            a_to_b.heal()
            b_to_a.heal()
            await wait_until(lambda: a.transport.is_up("b@h") and b.transport.is_up("a@h"), timeout_s=10,
                             what="link back")
            assert a.transport.send("b@h", "meta", "after heal")
            await wait_until(lambda: b.received("a@h", "meta") == ["after heal"], what="message after heal")
        finally:
            await close_all(a, b, a_to_b, b_to_a)
    run(go())


def test_reset_partition_is_noticed_at_once_and_heal_reconnects():
    async def go():
        a, b, a_to_b, b_to_a = await linked_pair()
        try:
            a_to_b.partition(mode="reset")
            b_to_a.partition(mode="reset")
            await wait_until(lambda: a.downs and b.downs, timeout_s=10, what="both sides down")
            # Cut by a reset, not found out by the tick timeout.
            assert a.downs[0][1].startswith("connection_closed")
            assert b.downs[0][1].startswith("connection_closed")
            a_to_b.heal()
            b_to_a.heal()
            await wait_until(lambda: a.transport.is_up("b@h") and b.transport.is_up("a@h"), timeout_s=10,
                             what="link back")
        finally:
            await close_all(a, b, a_to_b, b_to_a)
    run(go())


def test_a_hung_peer_is_suspected_by_the_detector_well_before_net_ticktime():
    async def go():
        kw = {"detector_acceptable_pause_ms": 200.0}
        a = Node("a@h", net_ticktime_s=4.0, **kw)
        b = Node("b@h", net_ticktime_s=4.0, **kw)
        a_to_b = FaultProxy(free_port(), "127.0.0.1", b.port)
        await a_to_b.start()
        await b.start()
        await a.start({"b@h": ("127.0.0.1", a_to_b.listen_port)})
        try:
            await wait_until(lambda: a.transport.is_up("b@h"), what="link up")
            loop = asyncio.get_running_loop()
            cut_at = loop.time()
            a_to_b.partition(mode="blackhole")  # to a, b now looks like a SIGSTOPped node
            await wait_until(lambda: ("b@h", True) in [(p, s) for p, s, _ in a.suspicions], timeout_s=10,
                             what="b suspected")
            suspected_at = next(t for p, s, t in a.suspicions if s)
            assert suspected_at - cut_at < 2.0
            assert a.transport.is_up("b@h")  # suspicion alone never takes a link down
            await wait_until(lambda: a.downs, timeout_s=10, what="b down at net_ticktime")
            assert a.downs[0][1] == "net_tick_timeout" and a.downs[0][2] - cut_at >= 4.0 * 0.9
        finally:
            await close_all(a, b, a_to_b)
    run(go())


def test_a_restarted_peer_replaces_the_stale_link_at_once():
    # a still holds a link to the old b (the path is blackholed, so a has seen no FIN) when a new
    # incarnation of b dials in directly: a must not wait net_ticktime to let it in.
    async def go():
        a = Node("a@h")  # net_ticktime 60 s: only the restart rule can bring the new b in soon
        b = Node("b@h")
        await a.start()
        b_to_a = FaultProxy(free_port(), "127.0.0.1", a.port)
        await b_to_a.start()
        await b.start({"a@h": ("127.0.0.1", b_to_a.listen_port)})
        b2 = Node("b@h")
        try:
            await wait_until(lambda: a.transport.is_up("b@h"), what="link up")
            old_incarnation = a.transport.link_info("b@h")["incarnation"]
            b_to_a.partition(mode="blackhole")
            await b.close()
            await b2.start({"a@h": a.address})
            await wait_until(lambda: b2.transport.is_up("a@h") and a.transport.is_up("b@h")
                             and a.transport.link_info("b@h")["incarnation"] == b2.transport.incarnation,
                             what="link to the new b")
            assert old_incarnation == b.transport.incarnation != b2.transport.incarnation
            assert [(p, r) for p, r, _ in a.downs] == [("b@h", "connection_closed (the node restarted)")]
        finally:
            await close_all(a, b2, b_to_a)
    run(go())
