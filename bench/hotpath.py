"""In-process hot-path benchmark: N publishes through one broker to one autoack consumer.

The node is real (its cluster of one, catalogue, storage), started in this process on free
loopback ports; the two AMQP connections are not: bytes go straight into a `Session` and the
frames it writes are counted. This shows the broker's CPU per message (parse publish, route,
enqueue, dispatch, encode deliver, message statistics) without the load tool, the event loop's
socket work or the kernel in the picture, so two trees can be compared to a few percent:

    python bench/hotpath.py [N] [--rounds R] [--profile] [--count]
    PYTHONPATH=/other/tree/src python bench/hotpath.py      # the same on another checkout

Each round publishes N messages in batches of 1,000 (`--batch`) and runs the broker after each
batch, as the event loop would after one socket read; the best round is reported (the least
disturbed). `--count` instead counts, for 2,000 messages, the Python bytecodes executed, the
Python and the C function calls made per message, and the functions that executed the most:
figures that do not move with the machine's load, so that two trees can be compared to a
bytecode on a machine that others share (where CPU time per message varies by 10 %).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import pstats
import socket
import sys
import tempfile
import time
from collections import Counter

from pamqp import body, commands, frame, header

from hutch.broker.broker import Config
from hutch.broker.session import Session
from hutch.server.runtime import Node

BATCH = 1000
READY_TIMEOUT_S = 30.0


class Sink:
    """Stands where the socket would: counts what the session writes."""

    def __init__(self):
        self.bytes = 0

    def write(self, chunks):
        self.bytes += len(b"".join(chunks))

    def close_after_flush(self): ...
    def pause_reading(self): ...
    def resume_reading(self): ...
    def abort(self): ...


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def open_session(node: Node, peer: str) -> Session:
    s = Session(node.broker, peer, "127.0.0.1:5672")
    s.transport_hooks = Sink()
    node.broker.session_opened(s)
    s.receive(b"AMQP\x00\x00\x09\x01")
    s.receive(frame.marshal(commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                        response="\x00guest\x00guest"), 0))
    s.receive(frame.marshal(commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0), 0))
    s.receive(frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
    s.receive(frame.marshal(commands.Channel.Open(), 1))
    return s


async def wait_for(cond, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"hotpath: timed out waiting for {what}")
        await asyncio.sleep(0.01)


COUNT_MESSAGES = 2000  # messages --count follows bytecode by bytecode (about 1,000 times slower)


def count(run, n: int) -> None:
    """Run `run()` (n messages) under a tracer and print what it executed per message."""
    ops: Counter = Counter()  # code object -> bytecodes executed
    calls: Counter = Counter()  # code object -> Python calls (a generator's resumption counts)
    c_calls = 0

    def per_op(frame, event, _arg):
        if event == "opcode":
            ops[frame.f_code] += 1
        return per_op

    def per_call(frame, _event, _arg):
        frame.f_trace_opcodes = True
        calls[frame.f_code] += 1
        return per_op

    def per_c_call(_frame, event, _arg):
        nonlocal c_calls
        if event == "c_call":
            c_calls += 1

    sys.setprofile(per_c_call)
    sys.settrace(per_call)
    try:
        run()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    print(f"{n} messages: per message {sum(ops.values()) / n:.1f} bytecodes, {sum(calls.values()) / n:.2f} Python "
          f"calls, {c_calls / n:.2f} C calls")
    for code, k in ops.most_common(25):
        where = f"{code.co_filename.rsplit('/src/', 1)[-1]}:{code.co_firstlineno}"
        print(f"  {k / n:7.2f} bytecodes {calls[code] / n:5.2f} calls  {code.co_qualname}  ({where})")


@contextlib.asynccontextmanager
async def in_process_node(name: str, **fields):
    """A single node in this process, on this loop, in a temporary data directory, once its default
    user and vhost exist; `fields` set more of its Config."""
    with tempfile.TemporaryDirectory(prefix=f"hutch-{name}-") as data_dir:
        cfg = Config(node_name=f"{name}@localhost", data_dir=data_dir, amqp_host="127.0.0.1",
                     amqp_port=free_port(), peer_port=free_port(), mgmt_port=0)
        cfg.prometheus_port = 0  # (a field older trees lack: this script also measures them)
        for key, value in fields.items():
            setattr(cfg, key, value)
        node = Node(cfg)
        node.loop = asyncio.get_running_loop()
        await node.start_app()
        try:
            b = node.broker
            await wait_for(lambda: "guest" in b.users and "/" in b.vhosts, "the default user and vhost")
            yield node
        finally:
            await node.stop_app()


async def bench(n: int, rounds: int, size: int, profile: bool, batch_n: int = BATCH, counting: bool = False) -> None:
    async with in_process_node("hotpath") as node:
        b = node.broker
        pub = open_session(node, "127.0.0.1:1")
        con = open_session(node, "127.0.0.1:2")
        con.receive(frame.marshal(commands.Queue.Declare(queue="hotpath"), 1))
        await wait_for(lambda: "hotpath" in b.vhosts["/"].queues, "queue.declare")
        con.receive(frame.marshal(commands.Basic.Consume(queue="hotpath", no_ack=True), 1))
        b.run()
        one = (frame.marshal(commands.Basic.Publish(exchange="", routing_key="hotpath"), 1)
               + frame.marshal(header.ContentHeader(0, size, commands.Basic.Properties()), 1)
               + frame.marshal(body.ContentBody(b"x" * size), 1))
        batch = one * batch_n

        def run(n: int = n) -> None:
            for _ in range(n // batch_n):
                pub.receive(batch)
                b.run()

        run()  # warm up
        if counting:
            count(lambda: run(COUNT_MESSAGES), COUNT_MESSAGES // batch_n * batch_n)
            return
        if profile:
            cProfile.runctx("run()", globals(), locals(), "/tmp/hotpath.prof")
            pstats.Stats("/tmp/hotpath.prof").sort_stats("tottime").print_stats(20)
            return
        best = None
        for _ in range(rounds):
            before = con.transport_hooks.bytes
            c0 = time.process_time()
            run()
            cpu = time.process_time() - c0
            delivered = con.transport_hooks.bytes - before
            per_msg = cpu / (n // batch_n * batch_n) * 1e6
            print(f"  {per_msg:.2f} µs CPU per message, {delivered / n:.0f} bytes delivered per message")
            best = per_msg if best is None else min(best, per_msg)
        print(f"{n} messages x {rounds} rounds: best {best:.2f} µs CPU per message "
              f"({1e6 / best:,.0f} msg/s on one core)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", nargs="?", type=int, default=200_000, help="messages per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", type=int, default=16, help="body size in bytes")
    ap.add_argument("--batch", type=int, default=BATCH,
                    help="publishes per socket read, i.e. per broker run (a loaded event loop sees tens)")
    ap.add_argument("--profile", action="store_true", help="one round under cProfile instead")
    ap.add_argument("--count", action="store_true",
                    help="bytecodes and calls per message instead (deterministic: for comparing trees)")
    a = ap.parse_args()
    asyncio.run(bench(a.n, a.rounds, a.size, a.profile, a.batch, a.count))


if __name__ == "__main__":
    main()
