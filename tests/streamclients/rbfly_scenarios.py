"""rbfly (the current release, which needs Python 3.12) against a broker's stream protocol.

Run by its own interpreter, from a virtualenv that holds rbfly and nothing of hutch's
(tests/streamclients/toolchain.py makes it), so it runs the library unchanged, as a user
would:

    python rbfly_scenarios.py rabbitmq-stream://guest:guest@127.0.0.1:5552/ --out results.json

Each scenario uses only rbfly's public API and ends with what it checked; the JSON written
is {scenario: "passed" | "failed: <why>"}. The exit code is 0 when every scenario passed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import traceback
import uuid

from rbfly.streams import (
    MessageFilter,
    Offset,
    PublisherBatchFast,
    get_message_ctx,
    stream_message_ctx,
    streams_client,
)

READ_TIMEOUT_S = 10.0
# a scenario's bound: each takes under 2 s; rbfly retries what a broker without a feature refuses
SCENARIO_TIMEOUT_S = 8.0


def unique(prefix: str) -> str:
    return f"rbfly-{prefix}-{uuid.uuid4().hex[:8]}"


async def read(client, stream: str, offset, count: int, **kw) -> list[tuple[int, object]]:
    """The first `count` messages a subscription from `offset` gets: (stream offset, body)."""
    got = []

    async def go():
        async with contextlib.aclosing(client.subscribe(stream, offset=offset, **kw)) as sub:
            async for msg in sub:
                got.append((get_message_ctx().stream_offset, msg))
                if len(got) == count:
                    return

    await asyncio.wait_for(go(), READ_TIMEOUT_S)
    return got


async def new_stream(client, prefix: str, bodies: list) -> str:
    """A stream made for one scenario, holding `bodies` sent one by one (each confirmed)."""
    name = unique(prefix)
    await client.create_stream(name)
    async with client.publisher(name) as p:
        for body in bodies:
            await p.send(body)
    return name


def numbered(count: int) -> list[bytes]:
    return [f"m{i}".encode() for i in range(count)]


async def publish_and_read_in_order(client) -> None:
    """Single sends and a fast batch; read from first: every message once, at consecutive offsets."""
    name = await new_stream(client, "order", numbered(5))
    async with client.publisher(name, cls=PublisherBatchFast) as b:
        for i in range(5, 10):
            b.batch(f"m{i}".encode())
        await b.flush()
    got = await read(client, name, Offset.FIRST, 10)
    assert [m for _, m in got] == numbered(10), got
    assert [o for o, _ in got] == list(range(10)), got
    await client.delete_stream(name)


async def amqp_bodies_come_back_as_sent(client) -> None:
    """AMQP 1.0 bodies of several types (rbfly encodes them) are stored and decoded unchanged."""
    bodies = [b"bytes", "text", 42, 2.5, True, {"k": "v", "n": 1}, ["a", 1]]
    name = await new_stream(client, "types", bodies)
    got = await read(client, name, Offset.FIRST, len(bodies))
    assert [m for _, m in got] == bodies, got
    await client.delete_stream(name)


async def offset_specifications(client) -> None:
    """A numeric offset, last, next, and a timestamp each start where the protocol says."""
    name = unique("offsets")
    await client.create_stream(name)
    async with client.publisher(name) as p:
        for i in range(10):
            await p.send(f"m{i}".encode())
        got = await read(client, name, Offset.offset(7), 3)
        assert got == [(7, b"m7"), (8, b"m8"), (9, b"m9")], got
        last = await read(client, name, Offset.LAST, 1)
        assert last and last[0][0] <= 9, last  # the start of the last chunk
        after = time.time()
        await asyncio.sleep(1.1)  # stream timestamps are in milliseconds; the chunk comes after
        nxt = asyncio.ensure_future(read(client, name, Offset.NEXT, 1))
        stamp = asyncio.ensure_future(read(client, name, Offset.timestamp(after), 1))
        await asyncio.sleep(0.5)  # both subscribed before the next message
        await p.send(b"m10")
        assert await nxt == [(10, b"m10")]
        assert await stamp == [(10, b"m10")]
    await client.delete_stream(name)


async def stored_offset_reference(client) -> None:
    """write_offset stores an offset on the server; a subscription by reference starts after it."""
    name = await new_stream(client, "ref", numbered(8))
    await client.write_offset(name, "ref-a", 4)
    deadline = time.monotonic() + READ_TIMEOUT_S
    while True:  # the broker stores an offset asynchronously (the protocol's StoreOffset has no answer)
        try:
            got = await read(client, name, Offset.reference("ref-a"), 1)
        except Exception:  # noqa: BLE001 - not stored yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
            continue
        if got == [(5, b"m5")] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert got == [(5, b"m5")], got
    await client.delete_stream(name)


async def publisher_sequence_and_deduplication(client) -> None:
    """A named publisher starts after its last stored id when it comes back; an id sent again
    is confirmed and not stored twice."""
    name = unique("dedup")
    await client.create_stream(name)
    ref = "dedup-publisher"
    async with client.publisher(name, name=ref) as p:
        for i in range(3):
            await p.send(f"m{i}".encode())
        first_next = p.message_id
    async with client.publisher(name, name=ref) as p:
        assert p.message_id == first_next, (p.message_id, first_next)  # asked the broker for the sequence
        # the last two ids sent again, as after a lost confirm: confirmed (send returns), not stored
        await p.send(stream_message_ctx(b"again-1", publish_id=first_next - 2))
        await p.send(stream_message_ctx(b"again-2", publish_id=first_next - 1))
        await p.send(stream_message_ctx(b"m3", publish_id=first_next))
    got = await read(client, name, Offset.FIRST, 4)
    assert [m for _, m in got] == [b"m0", b"m1", b"m2", b"m3"], got
    await client.delete_stream(name)


async def filtered_subscription(client) -> None:
    """Filter values on publish; a subscription with a filter gets only the matching messages."""
    name = unique("filter")
    await client.create_stream(name)

    def region(ctx) -> str:
        return ctx.app_properties["region"]

    async with client.publisher(name, filter_extract=region) as p:
        for i in range(12):
            r = ("emea", "amer", "apac")[i % 3]
            await p.send(stream_message_ctx(f"m{i}-{r}".encode(), app_properties={"region": r}))
    got = await read(client, name, Offset.FIRST, 4, filter=MessageFilter(region, {"apac"}))
    assert [m for _, m in got] == [f"m{i}-apac".encode() for i in (2, 5, 8, 11)], got
    await client.delete_stream(name)


async def delete_stream(client) -> None:
    """A deleted stream made again under its name starts empty, at offset 0."""
    name = await new_stream(client, "delete", [b"old"])
    await client.delete_stream(name)
    await client.create_stream(name)
    async with client.publisher(name) as p:
        await p.send(b"new")
    assert await read(client, name, Offset.FIRST, 1) == [(0, b"new")]
    await client.delete_stream(name)


SCENARIOS = [publish_and_read_in_order, amqp_bodies_come_back_as_sent, offset_specifications,
             stored_offset_reference, publisher_sequence_and_deduplication, filtered_subscription,
             delete_stream]


async def main_async(uri: str, only: set[str]) -> dict[str, str]:
    results = {}
    for scenario in SCENARIOS:
        if only and scenario.__name__ not in only:
            continue
        client = streams_client(uri)
        started = time.monotonic()
        try:
            await asyncio.wait_for(scenario(client), SCENARIO_TIMEOUT_S)
            results[scenario.__name__] = "passed"
        except Exception as e:  # noqa: BLE001 - a scenario's failure is its result
            results[scenario.__name__] = f"failed: {type(e).__name__}: {e}"[:400]
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                await client.disconnect()
            print(f"{scenario.__name__}: {time.monotonic() - started:.1f} s", file=sys.stderr)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("uri")
    ap.add_argument("--out", help="write the results here as JSON")
    ap.add_argument("--only", action="append", default=[], help="run only this scenario (repeatable)")
    args = ap.parse_args()
    results = asyncio.run(main_async(args.uri, set(args.only)))
    text = json.dumps(results, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0 if all(v == "passed" for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
