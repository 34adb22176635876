"""Single active consumer for streams on one node (RabbitMQ 3.11+; RabbitMQ 3.10.8, the version
the other stream tests run side by side, has no single active consumer for streams, so these
tests hold hutch to the 3.11+ documentation alone).

A subscription with `single-active-consumer=true` and `name=<group>` joins its group: the first
is active and is told so with a ConsumerUpdate, whose response says where it starts; the others
get nothing until the active one goes, and the next then takes over from where its response
says (typically the group's stored offset). On a super stream, partition i's active consumer is
consumer (i mod n) of the group, and a newcomer makes the active one step down before it takes
over. The raw client (tests.support.stream_client) shows every frame; rstream 1.1.1 shows a
real client's use of it. The groups and consumers show in list_stream_group_consumers and
list_stream_consumers; list_stream_tracking lists stored offsets and writers.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from hutch.streamproto import frames as f
from tests.support.brokers import HutchNode, wait_until
from tests.support.http import Http
from tests.support.stream_client import Raw, chunk_bodies, create, publish_chunks, raw, run, unique

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def node() -> Iterator[HutchNode]:
    with HutchNode() as n:
        yield n


def sac(name: str, super_stream: str | None = None) -> dict[str, str]:
    props = {"single-active-consumer": "true", "name": name}
    if super_stream is not None:
        props["super-stream"] = super_stream
    return props


def subscribe(c: Raw, sub: int, stream: str, props: dict[str, str], credit: int = 10,
              offset_type: int = f.OFFSET_TYPE_FIRST) -> int:
    return c.call(f.Subscribe(c.cid(), sub, stream, offset_type, None, credit, props)).code


def update(c: Raw) -> f.ConsumerUpdate:
    return c.recv(f.ConsumerUpdate)


def answer(c: Raw, u: f.ConsumerUpdate, offset_type: int = f.OFFSET_TYPE_NEXT, offset: int | None = None) -> None:
    c.send(f.ConsumerUpdateResponse(u.correlation_id, f.OK, offset_type, offset))


def bodies(c: Raw, count: int, sub: int) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < count:
        d = c.recv(f.Deliver, f.DeliverV2)
        assert d.subscription_id == sub
        out.extend(chunk_bodies(d.chunk))
        c.send(f.Credit(sub, 1))
    return out


def no_delivery(c: Raw) -> None:
    """Nothing delivered to `c` so far (a round trip makes sure what was sent has come)."""
    assert not [cmd for cmd in c.sync() if type(cmd) in (f.Deliver, f.DeliverV2)]


def api(node: HutchNode, path: str) -> tuple[int, object]:
    return Http(node.http_port)("GET", path)


def group(node: HutchNode, stream: str, name: str) -> list[dict]:
    status, rows = api(node, f"/api/hutch/streams/%2F/{stream}/groups/{name}")
    assert status == 200, (status, rows)
    return rows


def streams_cli(node: HutchNode, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hutch.cli.streams", "--url", node.mgmt_url, *args],
                          capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------- a plain stream


def test_first_registered_is_active_the_others_wait_and_the_next_takes_over_from_its_stored_offset(node):
    stream, name = unique(), unique("app")
    with raw(node) as a, raw(node) as b, raw(node) as p:
        create(p, stream)
        publish_chunks(p, stream, [["m0", "m1"], ["m2"]])
        assert subscribe(a, 1, stream, sac(name)) == f.OK
        u = update(a)
        assert (u.subscription_id, u.active) == (1, True)
        answer(a, u, f.OFFSET_TYPE_FIRST)
        assert bodies(a, 3, 1) == [b"m0", b"m1", b"m2"]
        a.send(f.StoreOffset(name, stream, 1))  # it has processed m0 and m1

        assert subscribe(b, 7, stream, sac(name)) == f.OK
        publish_chunks(p, stream, [["m3"]])
        assert bodies(a, 1, 1) == [b"m3"]
        no_delivery(b)
        rows = group(node, stream, name)
        assert [(r["subscription_id"], r["state"]) for r in rows] == [(1, "active"), (7, "inactive")]
        consumers = {c["subscription_id"]: c for c in api(node, "/api/stream/consumers/%2F")[1]
                     if c["queue"]["name"] == stream}
        assert (consumers[1]["active"], consumers[1]["activity_status"]) == (True, "single_active")
        assert (consumers[7]["active"], consumers[7]["activity_status"]) == (False, "waiting")
        cli = streams_cli(node, "--formatter", "json", "list_stream_group_consumers", "--stream", stream,
                          "--reference", name)
        assert cli.returncode == 0, cli.stderr
        assert [(r["subscription_id"], r["state"]) for r in json.loads(cli.stdout)] == [(1, "active"), (7, "inactive")]

        assert a.call(f.Unsubscribe(a.cid(), 1)).code == f.OK
        u = update(b)
        assert (u.subscription_id, u.active) == (7, True)
        stored = b.call(f.QueryOffset(b.cid(), name, stream))
        assert stored.offset == 1
        answer(b, u, f.OFFSET_TYPE_OFFSET, stored.offset + 1)
        assert bodies(b, 2, 7) == [b"m2", b"m3"]
        assert [(r["subscription_id"], r["state"]) for r in group(node, stream, name)] == [(7, "active")]


def test_the_active_consumers_connection_closing_activates_the_next_one_and_a_third_still_waits(node):
    stream, name = unique(), unique("app")
    with raw(node) as b, raw(node) as c, raw(node) as p:
        create(p, stream)
        a = Raw(node.stream_port)
        a.handshake()
        assert subscribe(a, 1, stream, sac(name)) == f.OK
        answer(a, update(a))
        assert subscribe(b, 2, stream, sac(name)) == f.OK
        assert subscribe(c, 3, stream, sac(name)) == f.OK
        a.close()
        u = update(b)
        assert (u.subscription_id, u.active) == (2, True)
        answer(b, u, f.OFFSET_TYPE_FIRST)
        publish_chunks(p, stream, [["x"]])
        assert bodies(b, 1, 2) == [b"x"]
        no_delivery(c)
        assert [r["state"] for r in group(node, stream, name)] == ["active", "inactive"]


def test_an_unanswered_consumer_update_is_sent_again_and_delivery_waits_for_the_answer(node):
    stream, name = unique(), unique("app")
    with raw(node) as c:
        create(c, stream)
        publish_chunks(c, stream, [["z"]])
        assert subscribe(c, 1, stream, sac(name)) == f.OK
        first = update(c)
        no_delivery(c)  # active, but the client has not said where to start
        again = update(c)  # a client may miss one sent right behind its subscribe response
        assert (again.subscription_id, again.active) == (1, True)
        assert again.correlation_id != first.correlation_id
        answer(c, again, f.OFFSET_TYPE_FIRST)
        assert bodies(c, 1, 1) == [b"z"]


def test_groups_are_per_name_and_plain_subscriptions_are_not_in_any(node):
    stream = unique()
    with raw(node) as a, raw(node) as b, raw(node) as p:
        create(p, stream)
        assert subscribe(a, 1, stream, sac("one")) == f.OK
        assert subscribe(b, 1, stream, sac("two")) == f.OK
        assert subscribe(b, 2, stream, {}) == f.OK  # an ordinary subscription: delivered at once
        assert update(a).active and update(b).active
        publish_chunks(p, stream, [["y"]])
        assert bodies(b, 1, 2) == [b"y"]
        assert [r["subscription_id"] for r in group(node, stream, "two")] == [1]


def test_a_single_active_consumer_without_a_name_is_refused_with_precondition_failed(node):
    stream = unique()
    with raw(node) as c:
        create(c, stream)
        assert subscribe(c, 1, stream, {"single-active-consumer": "true"}) == f.PRECONDITION_FAILED


def test_an_unknown_group_is_not_found_in_the_api_and_the_cli(node):
    stream = unique()
    with raw(node) as c:
        create(c, stream)
    assert api(node, f"/api/hutch/streams/%2F/{stream}/groups/nobody")[0] == 404
    p = streams_cli(node, "list_stream_group_consumers", "--stream", stream, "--reference", "nobody")
    assert p.returncode != 0 and "The group does not exist" in p.stderr


# ---------------------------------------------------------------- super streams


def test_super_stream_partitions_spread_over_the_group_and_a_newcomer_takes_over_after_the_step_down(node):
    name, group_name = unique("ss"), unique("app")
    parts = [f"{name}-{i}" for i in range(3)]
    with raw(node) as a, raw(node) as b, raw(node) as p:
        assert p.call(f.CreateSuperStream(p.cid(), name, parts, ["0", "1", "2"], {})).code == f.OK
        for i, s in enumerate(parts):
            assert subscribe(a, i, s, sac(group_name, name)) == f.OK
        got = {}
        for _ in parts:
            u = update(a)
            got[u.subscription_id] = u.active
            answer(a, u)
        assert got == {0: True, 1: True, 2: True}  # alone, it has every partition

        for i, s in enumerate(parts):
            assert subscribe(b, i, s, sac(group_name, name)) == f.OK
        # two consumers: partition 1 goes to the second (1 mod 2), 0 and 2 stay with the first
        down = update(a)
        assert (down.subscription_id, down.active) == (1, False)
        no_delivery(b)  # nothing is handed over before the first one has stepped down
        answer(a, down)
        up = update(b)
        assert (up.subscription_id, up.active) == (1, True)
        answer(b, up, f.OFFSET_TYPE_FIRST)
        publish_chunks(p, parts[1], [["p1"]])
        publish_chunks(p, parts[0], [["p0"]])
        assert bodies(b, 1, 1) == [b"p1"]
        assert bodies(a, 1, 0) == [b"p0"]
        states = {s: [r["state"] for r in group(node, s, group_name)] for s in parts}
        assert states == {parts[0]: ["active", "inactive"], parts[1]: ["inactive", "active"],
                          parts[2]: ["active", "inactive"]}
        cli = streams_cli(node, "--formatter", "json", "list_stream_consumer_groups")
        assert cli.returncode == 0, cli.stderr
        assert [g for g in json.loads(cli.stdout) if g["reference"] == group_name] == [
            {"stream": s, "reference": group_name, "partition_index": i, "consumers": 2} for i, s in enumerate(parts)]


# ---------------------------------------------------------------- rstream 1.1.1


def test_rstream_consumers_of_a_group_take_over_from_the_stored_offset(node):
    """Two rstream consumers of one group: the first reads and stores its offset; once it
    closes, the second is activated, asks the server for the stored offset in its
    consumer_update_listener and reads on from there."""
    from rstream import (
        AMQPMessage,
        Consumer,
        ConsumerOffsetSpecification,
        OffsetSpecification,
        OffsetType,
        Producer,
        amqp_decoder,
    )
    stream, name = unique(), unique("app")

    async def scenario() -> None:
        kw = {"host": "127.0.0.1", "port": node.stream_port, "username": "guest", "password": "guest"}
        async with Producer(**kw) as producer:
            await producer.create_stream(stream)
            for i in range(4):
                await producer.send_wait(stream, AMQPMessage(body=f"m{i}".encode()))
        got: dict[str, list[tuple[int, bytes]]] = {"first": [], "second": []}
        done = {k: asyncio.Event() for k in got}

        def consumer(key: str, want: int) -> Consumer:
            c = Consumer(**kw)

            async def on_message(msg, ctx) -> None:
                got[key].append((ctx.offset, bytes(msg.body if isinstance(msg.body, bytes) else msg.body[0])))
                if key == "first" and ctx.offset == 1:
                    await c.store_offset(stream, name, 1)
                if len(got[key]) >= want:
                    done[key].set()

            async def on_update(active: bool, ctx) -> OffsetSpecification:
                if not active:
                    return OffsetSpecification(OffsetType.NEXT, 0)
                try:
                    stored = await c.query_offset(stream, name)
                except Exception:  # no offset stored yet
                    return OffsetSpecification(OffsetType.FIRST, 0)
                return OffsetSpecification(OffsetType.OFFSET, stored + 1)
            c._sac = (on_message, on_update)  # kept with the consumer for its subscribe below
            return c

        async def stored_offset(c: Consumer) -> int | None:
            try:
                return await c.query_offset(stream, name)
            except Exception:  # none stored yet
                return None

        first, second = consumer("first", 4), consumer("second", 2)
        for c in (first, second):
            await c.start()
            on_message, on_update = c._sac
            await c.subscribe(stream, on_message, decoder=amqp_decoder, properties=sac(name),
                              offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
                              consumer_update_listener=on_update)
        async with asyncio.timeout(30):
            await done["first"].wait()
        assert [b for _o, b in got["first"]] == [b"m0", b"m1", b"m2", b"m3"]
        assert got["second"] == []
        async with asyncio.timeout(30):  # the stored offset is committed (it is written like a publish)
            while await stored_offset(first) != 1:
                await asyncio.sleep(0.05)
        await first.close()
        async with asyncio.timeout(30):
            await done["second"].wait()
        assert got["second"] == [(2, b"m2"), (3, b"m3")]
        await second.close()
    run(scenario())


def test_rstream_super_stream_consumers_split_the_partitions(node):
    """Two rstream SuperStreamConsumers of one group on a super stream of three partitions:
    alone, the first has them all; once the second comes, partition 1 moves to it (1 mod 2),
    its old consumer stepping down first, and each reads only its own partitions."""
    from rstream import OffsetSpecification, OffsetType, SuperStreamConsumer, amqp_decoder
    name, group_name = unique("ss"), unique("app")
    parts = [f"{name}-{i}" for i in range(3)]
    with raw(node) as p:
        assert p.call(f.CreateSuperStream(p.cid(), name, parts, ["0", "1", "2"], {})).code == f.OK

        async def scenario() -> None:
            got: dict[str, list[tuple[str, bytes]]] = {"one": [], "two": []}
            active: dict[str, set[str]] = {"one": set(), "two": set()}
            changed = asyncio.Event()

            def consumer(key: str) -> tuple[SuperStreamConsumer, object, object]:
                c = SuperStreamConsumer(host="127.0.0.1", port=node.stream_port, username="guest", password="guest",
                                        super_stream=name)

                async def on_message(msg, ctx) -> None:
                    got[key].append((ctx.stream, bytes(msg.body if isinstance(msg.body, bytes) else msg.body[0])))
                    changed.set()

                async def on_update(is_active: bool, ctx) -> OffsetSpecification:
                    (active[key].add if is_active else active[key].discard)(ctx.stream)
                    changed.set()
                    return OffsetSpecification(OffsetType.NEXT, 0)
                return c, on_message, on_update

            async def until(cond) -> None:
                async with asyncio.timeout(30):
                    while not cond():
                        changed.clear()
                        await changed.wait()

            consumers = []
            for key in ("one", "two"):
                c, on_message, on_update = consumer(key)
                await c.start()
                await c.subscribe(on_message, decoder=amqp_decoder, properties=sac(group_name, name),
                                  consumer_update_listener=on_update)
                consumers.append(c)
                if key == "one":
                    await until(lambda: active["one"] == set(parts))
            await until(lambda: active == {"one": {parts[0], parts[2]}, "two": {parts[1]}})
            await asyncio.to_thread(lambda: [publish_chunks(p, s, [[f"to-{s}"]]) for s in parts])
            await until(lambda: len(got["one"]) + len(got["two"]) == 3)
            assert sorted(got["one"]) == [(parts[0], f"to-{parts[0]}".encode()), (parts[2], f"to-{parts[2]}".encode())]
            assert got["two"] == [(parts[1], f"to-{parts[1]}".encode())]
            for c in consumers:
                await c.close()
        run(scenario())


# ---------------------------------------------------------------- list_stream_tracking


def test_list_stream_tracking_lists_stored_offsets_and_writers_as_rabbitmq_streams_does(node):
    stream = unique()
    with raw(node) as c:
        create(c, stream)
        assert c.call(f.DeclarePublisher(c.cid(), 1, "writer-a", stream)).code == f.OK
        c.send(f.Publish(1, [(5, b"\x00Sw\xa1\x01x")]))
        c.recv(f.PublishConfirm)
        c.send(f.StoreOffset("reader-a", stream, 0))
        wait_until(lambda: c.call(f.QueryOffset(c.cid(), "reader-a", stream)).code == f.OK, 20, "the stored offset")

    def listing(*flags: str) -> list[dict]:
        p = streams_cli(node, "--formatter", "json", "list_stream_tracking", stream, *flags)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)
    assert listing() == [{"type": "writer", "name": "writer-a", "tracking_value": 5},
                         {"type": "offset", "name": "reader-a", "tracking_value": 0}]
    assert listing("--offset") == [{"type": "offset", "name": "reader-a", "tracking_value": 0}]
    assert listing("--writer") == [{"type": "writer", "name": "writer-a", "tracking_value": 5}]
    p = streams_cli(node, "list_stream_tracking", stream, "--offset", "--writer")
    assert p.returncode != 0 and "Specify only one of --all, --offset, --writer." in p.stderr
    p = streams_cli(node, "list_stream_tracking", unique())
    assert p.returncode != 0 and "The stream does not exist." in p.stderr
