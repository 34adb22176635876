"""The crash test's client processes: a confirming publisher and an acknowledging consumer.

Both are careful applications built on the load client (`hutch.lab.client`): they survive
the broker being killed under them by reconnecting (with a short backoff) and carrying on.

publisher  Publishes messages 0..N-1, persistent, `--size` bytes, each body starting with
           its sequence number, spread over the queues (seq % queue count), in confirm mode
           with at most `--window` unconfirmed. A message whose connection dies before its
           confirm, or that is nacked, is published again. Prints `confirmed <count>` lines
           (the driver kills the broker at chosen counts) and writes, at the end, one byte
           per message: bit 0 = confirmed, bits 1.. = how many times it was sent (capped).
consumer   Consumes one queue with manual acks (prefetch `--qos`) and records each delivery
           (seq, redelivered) before acknowledging it, until SIGTERM; then writes the record.
drain      Consumes the queues until they are empty and quiet (the broker is no longer being
           killed), recording deliveries as the consumer does.

Run as `python -m tests.crash.clients publisher|consumer ...`. Nothing here imports the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import struct
import sys
import time
from collections import deque
from pathlib import Path

from pamqp.commands import Basic

from hutch.lab.client import AMQPError, Connection, Publisher, run

RECONNECT_DELAY_MIN_S = 0.05
RECONNECT_DELAY_MAX_S = 1.0
RECONNECT_DEADLINE_S = 60.0  # give up when the broker stays away this long
PROGRESS_INTERVAL_S = 0.05
SEND_COUNT_MAX = 127
RECEIPT = struct.Struct(">QB")  # seq, redelivered
STAMP = struct.Struct(">QQ")  # what Publisher.batch_stamped_ids writes: (timestamp_ns, id)


async def connect(uri: str) -> Connection:
    """Connect, retrying while the broker is down (it is being restarted)."""
    delay = RECONNECT_DELAY_MIN_S
    deadline = time.monotonic() + RECONNECT_DEADLINE_S
    while True:
        try:
            return await Connection.connect(uri, heartbeat_s=0, client_name="crash-test", timeout_s=5)
        except (TimeoutError, OSError, AMQPError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAY_MAX_S)


async def publisher(uri: str, queues: list[str], n: int, window: int, size: int, out: Path) -> None:
    state = bytearray(n)  # bit 0: confirmed; bits 1..7: times sent
    confirmed = 0
    next_seq = 0
    retry: deque[int] = deque()
    last_progress = 0.0
    props = Basic.Properties(delivery_mode=2)
    while confirmed < n:
        conn = await connect(uri)
        inflight: dict[int, int] = {}  # confirm tag -> seq, in tag order
        space = asyncio.Event()
        try:
            ch = await conn.channel()
            await ch.confirm_select()
            pubs = [Publisher(ch, "", q, size, props) for q in queues]

            def on_confirm(tag: int, multiple: bool, ack: bool, inflight=inflight, space=space) -> None:
                nonlocal confirmed
                if multiple:
                    tags = []
                    for t in inflight:
                        if t > tag:
                            break
                        tags.append(t)
                else:
                    tags = [tag] if tag in inflight else []
                for t in tags:
                    seq = inflight.pop(t)
                    if not ack:
                        retry.append(seq)
                    elif not state[seq] & 1:
                        state[seq] |= 1
                        confirmed += 1
                space.set()

            ch.on_confirm = on_confirm
            while confirmed < n:
                while len(inflight) < window and (retry or next_seq < n):
                    if retry:
                        seq = retry.popleft()
                        if state[seq] & 1:
                            continue
                    else:
                        seq = next_seq
                        next_seq += 1
                    tag = ch.publish_frames(pubs[seq % len(pubs)].batch_stamped_ids(0, [seq]), 1)
                    inflight[tag] = seq
                    sent = min((state[seq] >> 1) + 1, SEND_COUNT_MAX)
                    state[seq] = (state[seq] & 1) | (sent << 1)
                await conn.drain()
                now = time.monotonic()
                if now - last_progress >= PROGRESS_INTERVAL_S:
                    print(f"confirmed {confirmed}", flush=True)
                    last_progress = now
                if confirmed >= n:
                    break
                space.clear()
                waiter = asyncio.ensure_future(space.wait())
                done, _ = await asyncio.wait([waiter, conn.closed], timeout=1.0,
                                             return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if conn.closed.done():
                    raise conn._close_error()
        except (AMQPError, OSError, ConnectionError):
            pass  # the broker went away: whatever was in flight is unconfirmed
        finally:
            retry.extendleft(reversed(list(inflight.values())))
            inflight.clear()
            if not conn.closed.done():
                with contextlib.suppress(Exception):
                    await conn.close(timeout_s=2)
            conn.abort()
    print(f"confirmed {confirmed}", flush=True)
    out.write_bytes(bytes(state))
    print("done", flush=True)


async def consumer(uri: str, queue: str, qos: int, out: Path) -> None:
    receipts = bytearray()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        try:
            conn = await connect(uri)
        except (TimeoutError, OSError, AMQPError):
            break
        try:
            ch = await conn.channel()
            await ch.qos(qos)

            def on_message(tag: int, redelivered: bool, body: bytes, ch=ch) -> None:
                receipts.extend(RECEIPT.pack(STAMP.unpack_from(body)[1], redelivered))
                ch.ack_upto(tag)

            await ch.consume(queue, on_message)
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait([stopping, conn.closed], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if stop.is_set():
                conn.flush()
                with contextlib.suppress(Exception):
                    await conn.close(timeout_s=2)
        except (AMQPError, OSError, ConnectionError):
            pass
        finally:
            conn.abort()
    out.write_bytes(bytes(receipts))
    print("done", flush=True)


async def drain(uri: str, queues: list[str], qos: int, idle_s: float, out: Path) -> None:
    """Consume every queue until all are empty and nothing has arrived for idle_s; the broker
    stays up meanwhile. Acknowledges everything before closing."""
    receipts = bytearray()
    last_rx = time.monotonic()
    conn = await connect(uri)
    probe = await conn.channel()
    for q in queues:
        ch = await conn.channel()
        await ch.qos(qos)

        def on_message(tag: int, redelivered: bool, body: bytes, ch=ch) -> None:
            nonlocal last_rx
            receipts.extend(RECEIPT.pack(STAMP.unpack_from(body)[1], redelivered))
            ch.ack_upto(tag)
            last_rx = time.monotonic()

        await ch.consume(q, on_message)
    while True:
        await asyncio.sleep(idle_s / 4)
        counts = [(await probe.declare_queue(q, durable=True, passive=True))[1] for q in queues]
        if not any(counts) and time.monotonic() - last_rx >= idle_s:
            break
    conn.flush()
    await conn.close(timeout_s=5)
    out.write_bytes(bytes(receipts))
    print("done", flush=True)


def read_receipts(data: bytes) -> list[tuple[int, bool]]:
    return [(seq, bool(r)) for seq, r in RECEIPT.iter_unpack(data)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.crash.clients")
    sub = p.add_subparsers(dest="role", required=True)
    pp = sub.add_parser("publisher")
    pp.add_argument("--uri", required=True)
    pp.add_argument("--queue", action="append", required=True)
    pp.add_argument("--messages", type=int, required=True)
    pp.add_argument("--window", type=int, default=1000)
    pp.add_argument("--size", type=int, default=1024)
    pp.add_argument("--out", type=Path, required=True)
    pc = sub.add_parser("consumer")
    pc.add_argument("--uri", required=True)
    pc.add_argument("--queue", required=True)
    pc.add_argument("--qos", type=int, default=100)
    pc.add_argument("--out", type=Path, required=True)
    pd = sub.add_parser("drain")
    pd.add_argument("--uri", required=True)
    pd.add_argument("--queue", action="append", required=True)
    pd.add_argument("--qos", type=int, default=1000)
    pd.add_argument("--idle", type=float, default=0.5)
    pd.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.role == "publisher":
        run(publisher(a.uri, a.queue, a.messages, a.window, a.size, a.out))
    elif a.role == "consumer":
        run(consumer(a.uri, a.queue, a.qos, a.out))
    else:
        run(drain(a.uri, a.queue, a.qos, a.idle, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
