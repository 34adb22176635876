"""The virtual-time event loop and the in-memory network the whole-cluster simulation runs on
(hutch.simkernel.aioloop, hutch.simkernel.net): time that costs nothing, TCP's guarantees and
failures, and one seed naming one run."""

from __future__ import annotations

import asyncio
import time

import pytest

from hutch.simkernel import Kernel
from hutch.simkernel.aioloop import SimulationDeadlock, VirtualLoop
from hutch.simkernel.net import SimNet, current_host


def make(seed: int = 1, **net_args):
    kernel = Kernel(seed, trace=True)
    loop = VirtualLoop(kernel)
    return kernel, loop, SimNet(kernel, loop, **net_args)


def run(loop: VirtualLoop, coro):
    try:
        return loop.run_until_complete(coro)
    finally:
        pending = loop.living_tasks()
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()


async def upper_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(100):
        writer.write(data.upper())
    writer.close()


def test_an_hour_of_simulated_time_takes_no_wall_time():
    kernel, loop, _ = make()
    fired = []

    async def main():
        loop.call_later(2.0, fired.append, "b")
        loop.call_later(1.0, fired.append, "a")
        await asyncio.sleep(3600)
        return loop.time()

    started = time.perf_counter()
    assert run(loop, main()) == pytest.approx(3600.0)
    assert time.perf_counter() - started < 1.0
    assert fired == ["a", "b"]
    assert kernel.now == pytest.approx(3600 * 1_000_000, abs=10)


def test_run_in_executor_runs_inline_and_its_future_is_done():
    _, loop, _ = make()

    async def main():
        fut = loop.run_in_executor(None, lambda x: x * 2, 21)
        assert fut.done()
        failing = loop.run_in_executor(None, lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            await failing
        return await fut

    assert run(loop, main()) == 42


def test_work_that_takes_simulated_time_in_a_worker_thread_is_done_that_much_later():
    _, loop, _ = make()
    work = [0.0]
    loop.work_clock = lambda: work[0]

    def slow(result):
        work[0] += 0.25
        return result

    def failing():
        work[0] += 0.5
        raise OSError("EIO")

    async def main():
        fut = loop.run_in_executor(None, slow, "synced")
        assert not fut.done()
        assert await fut == "synced" and loop.time() == pytest.approx(0.25)
        with pytest.raises(OSError, match="EIO"):
            await loop.run_in_executor(None, failing)
        assert loop.time() == pytest.approx(0.75)
        assert loop.run_in_executor(None, lambda: "at once").done()  # no work done: no wait

    run(loop, main())


def test_what_a_worker_thread_hands_back_to_the_loop_runs_once_its_work_is_done():
    _, loop, _ = make()
    work = [0.0]
    loop.work_clock = lambda: work[0]
    seen = []

    def slow(result):
        work[0] += 0.25
        loop.call_soon_threadsafe(lambda: seen.append((result, loop.time())))

    async def main():
        loop.run_in_executor(None, slow, "synced")
        await asyncio.sleep(0.2)
        assert seen == []  # the thread is still at work
        await asyncio.sleep(0.1)
        assert seen == [("synced", pytest.approx(0.25))]
        loop.call_soon_threadsafe(seen.append, "from the loop")  # not from a worker: as call_soon
        await asyncio.sleep(0)
        assert seen[-1] == "from the loop"

    run(loop, main())


def test_work_in_a_worker_thread_of_a_process_that_dies_is_never_reported():
    from hutch.simkernel.aioloop import Life, life_var

    _, loop, _ = make()
    work = [0.0]
    loop.work_clock = lambda: work[0]
    life = Life("n1")

    def slow():
        work[0] += 1.0
        return "synced"

    async def main():
        token = life_var.set(life)
        try:
            fut = loop.run_in_executor(None, slow)
        finally:
            life_var.reset(token)
        loop.kill(life)
        await asyncio.sleep(2.0)
        return fut.done()

    assert run(loop, main()) is False


def test_waiting_on_what_can_never_happen_is_a_deadlock():
    _, loop, _ = make()
    with pytest.raises(SimulationDeadlock):
        run(loop, loop.create_future())


def test_streams_carry_bytes_in_order_with_seeded_delays():
    kernel, loop, net = make(delay_min_us=1000, delay_max_us=5000)

    async def main():
        await net.host("b").start_server(upper_echo, "b", 5000)
        reader, writer = await net.host("a").open_connection("b", 5000)
        sent_at = loop.time()
        for i in range(50):
            writer.write(b"x%d," % i)
        got = b""
        while len(got) < len(b"".join(b"x%d," % i for i in range(50))):
            got += await reader.read(1000)
        assert got == b"".join(b"X%d," % i for i in range(50))  # FIFO on the link
        assert 0.002 <= loop.time() - sent_at  # at least two one-way delays
        writer.close()
        await writer.wait_closed()

    run(loop, main())


def test_connecting_where_nothing_listens_is_refused():
    _, loop, net = make()

    async def main():
        with pytest.raises(ConnectionRefusedError):
            await net.host("a").open_connection("b", 5000)

    run(loop, main())


def test_a_cut_resets_both_ends_and_connects_across_it_go_unanswered_until_restored():
    _, loop, net = make()
    lost = {}

    class Recorder(asyncio.Protocol):
        def __init__(self, side):
            self.side = side

        def connection_lost(self, exc):
            lost[self.side] = exc

    async def main():
        await net.host("b").create_server(lambda: Recorder("server"), "b", 5000)
        await net.host("a").create_connection(lambda: Recorder("client"), "b", 5000)
        net.cut("a", "b")  # one direction is enough to break the connection
        await asyncio.sleep(0.01)
        assert isinstance(lost["client"], ConnectionResetError)
        assert isinstance(lost["server"], ConnectionResetError)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(5):
                await net.host("a").open_connection("b", 5000)
        net.restore("a", "b")
        await net.host("a").create_connection(lambda: Recorder("again"), "b", 5000)

    run(loop, main())


def test_close_delivers_what_was_written_then_the_end_of_the_stream():
    _, loop, net = make()

    async def main():
        received = asyncio.Queue()

        async def collect(reader, writer):
            await received.put(await reader.read())  # up to EOF

        await net.host("b").start_server(collect, "b", 5000)
        _, writer = await net.host("a").open_connection("b", 5000)
        writer.write(b"last words")
        writer.close()
        assert await received.get() == b"last words"

    run(loop, main())


def test_callbacks_run_in_the_context_of_the_host_they_are_delivered_to():
    _, loop, net = make()
    seen = []

    async def on_b(reader, writer):
        seen.append(current_host.get())
        writer.close()

    async def main():
        await net.host("b").start_server(on_b, "b", 5000)
        reader, _ = await net.host("a").open_connection("b", 5000)
        await reader.read()

    run(loop, main())
    assert seen == ["b"]


def _traced_run(seed: int) -> list[str]:
    kernel, loop, net = make(seed, trace_bytes=True)

    async def main():
        await net.host("b").start_server(upper_echo, "b", 5000)
        for n in range(3):
            reader, writer = await net.host(f"c{n}").open_connection("b", 5000)
            writer.write(b"ping" * (n + 1))
            await reader.read(100)
            if n == 1:
                net.set_cut({("c1", "b")})
            writer.close()
        net.set_cut(set())

    run(loop, main())
    return kernel.trace


def test_one_seed_names_one_run():
    assert _traced_run(7) == _traced_run(7)
    assert _traced_run(7) != _traced_run(8)


def test_a_killed_host_runs_nothing_more_and_its_peers_see_a_reset():
    _, loop, net = make()
    ticks = []
    lost = []

    class Peer(asyncio.Protocol):
        def connection_lost(self, exc):
            lost.append(exc)

    async def ticker():
        while True:
            ticks.append(loop.time())
            await asyncio.sleep(0.1)

    async def main():
        net.host("b")
        victim = loop.create_task(ticker(), context=net.context("b"))
        await net.host("b").create_server(asyncio.Protocol, "b", 5000)
        await net.host("a").create_connection(Peer, "b", 5000)
        await asyncio.sleep(0.55)
        net.kill_host("b")
        before = len(ticks)
        await asyncio.sleep(1.0)
        assert len(ticks) == before and not victim.done()  # stopped mid-await, as a killed process
        assert victim not in loop.living_tasks()
        assert len(lost) == 1 and isinstance(lost[0], ConnectionResetError)
        with pytest.raises(ConnectionRefusedError):  # its listener died with it
            await net.host("a").open_connection("b", 5000)

    run(loop, main())


def test_callbacks_that_never_let_the_clock_move_are_a_livelock(monkeypatch):
    from hutch.simkernel import aioloop
    monkeypatch.setattr(aioloop, "ITERATIONS_AT_ONE_INSTANT_MAX", 1000)
    _, loop, _ = make()

    def spin():
        loop.call_soon(spin)

    async def main():
        spin()
        await asyncio.sleep(1)

    with pytest.raises(aioloop.SimulationLivelock):
        run(loop, main())
