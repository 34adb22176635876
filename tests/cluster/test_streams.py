"""Streams on a real 3-node cluster: one Raft group per stream, every member writing the committed
batches to its own log.

Replication (every member's replica has every message, and a node that is not a member reads
from one), publishing with confirms through the leader's kill -9 (every confirmed message is in
the stream once, and a consumer reading through the leader change sees offsets without a gap),
a member that was stopped catching up, and no confirm without a majority (nor any loss once the
members are back). With `stream.fsync = background` (a confirm once a majority wrote a batch, the
fsync after it) the same through the leader's kill, and nothing lost when every node is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid

import aio_pika
import pika
import pika.exceptions
import pytest

from hutch.streams.host import RAFT_SNAPSHOT_AFTER, RAFT_TRAILING
from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(420)
STREAM = {"x-queue-type": "stream"}


def connect(cluster: HutchCluster, i: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port, heartbeat=0,
                                                             blocked_connection_timeout=120))


def info(cluster: HutchCluster, name: str, via: int) -> dict:
    return cluster.api(via, f"/api/queues/%2F/{name}")


def member_end(cluster: HutchCluster, name: str, i: int) -> int | None:
    """The end of node i's own replica as that member reports it in the stream's status (None
    when node i holds none or does not answer)."""
    via = i if cluster.running(i) else next(j for j in range(cluster.n) if cluster.running(j))
    try:
        rows = cluster.api(via, f"/api/hutch/streams/%2F/{name}/status")
    except OSError:
        return None
    for row in rows:
        if row["node"] == cluster.names[i] and row["committed_offset"] is not None:
            return row["committed_offset"] + 1
    return None


def read_all(cluster: HutchCluster, i: int, name: str, count: int, timeout_s: float = 30.0,
             start: object = "first") -> list[tuple[int, bytes]]:
    """(offset, body) of `count` messages read on node i from `start`."""
    conn = connect(cluster, i)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=200)
        got: list[tuple[int, bytes]] = []

        def on_message(c, method, props, body):
            got.append((props.headers["x-stream-offset"], body))
            c.basic_ack(method.delivery_tag)
        ch.basic_consume(name, on_message, arguments={"x-stream-offset": start})
        deadline = time.monotonic() + timeout_s
        while len(got) < count and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        return got
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def publish(cluster: HutchCluster, i: int, name: str, bodies: list[bytes]) -> None:
    conn = connect(cluster, i)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for b in bodies:
            ch.basic_publish("", name, b)
    finally:
        conn.close()


def declare(cluster: HutchCluster, i: int, name: str, **args) -> None:
    conn = connect(cluster, i)
    try:
        conn.channel().queue_declare(name, durable=True, arguments={**STREAM, **args})
    finally:
        conn.close()


def unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def node_index(cluster: HutchCluster, name: str) -> int:
    return cluster.names.index(name)


@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


def test_a_stream_of_three_replicates_to_every_member(cluster):
    name = unique("s3")
    declare(cluster, 0, name, **{"x-initial-cluster-size": 3})
    assert sorted(info(cluster, name, 1)["members"]) == sorted(cluster.names)
    bodies = [f"m{i}".encode() for i in range(200)]
    publish(cluster, 1, name, bodies)
    for i in range(3):
        wait_until(lambda i=i: member_end(cluster, name, i) == 200, 20, f"node {i + 1}'s replica")
        assert read_all(cluster, i, name, 200) == list(enumerate(bodies))


def test_a_node_that_is_not_a_member_reads_and_writes_through_the_members(cluster):
    name = unique("s2")
    declare(cluster, 0, name, **{"x-initial-cluster-size": 2})
    members = info(cluster, name, 0)["members"]
    assert len(members) == 2
    outsider = next(i for i, n in enumerate(cluster.names) if n not in members)
    assert member_end(cluster, name, outsider) is None  # no replica there
    publish(cluster, 0, name, [f"a{i}".encode() for i in range(50)])
    assert read_all(cluster, outsider, name, 50) == [(i, f"a{i}".encode()) for i in range(50)]
    # a consumer there that has read everything gets what is written next
    conn = connect(cluster, outsider)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        got: list[int] = []
        ch.basic_consume(name, lambda c, m, p, b: (got.append(p.headers["x-stream-offset"]), c.basic_ack(m.delivery_tag)),
                         arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + 20
        while len(got) < 50 and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        assert got == list(range(50))
        publish(cluster, outsider, name, [f"b{i}".encode() for i in range(30)])  # published there too
        deadline = time.monotonic() + 20
        while len(got) < 80 and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        assert got == list(range(80))
        assert conn.channel().queue_declare(name, passive=True).method.message_count == 80  # asked of a member
    finally:
        conn.close()


def test_a_reader_on_a_node_without_a_replica_moves_to_another_member_when_its_member_dies(cluster):
    name = unique("sr")
    declare(cluster, 0, name, **{"x-initial-cluster-size": 2})
    members = info(cluster, name, 0)["members"]
    outsider = next(i for i, n in enumerate(cluster.names) if n not in members)
    total = 3000  # about 3 MB: more than one read (1 MiB) from a member
    body = b"x" * 1000
    conn = connect(cluster, next(i for i in range(3) if cluster.names[i] in members))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for _ in range(total):
            ch.basic_publish("", name, body)
    finally:
        conn.close()
    leader = node_index(cluster, info(cluster, name, outsider)["leader"])  # a reader asks the leader first
    conn = connect(cluster, outsider)
    killed = False
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        got: list[int] = []
        ch.basic_consume(name, lambda c, m, p, b: (got.append(p.headers["x-stream-offset"]), c.basic_ack(m.delivery_tag)),
                         arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + 60
        while len(got) < total and time.monotonic() < deadline:
            conn.process_data_events(0.05)
            if not killed and len(got) >= 500:
                cluster.kill(leader)
                killed = True
        assert killed and got == list(range(total))
    finally:
        conn.close()
        if killed:
            cluster.start_node(leader)


async def _publish_through_kill(url: str, name: str, count: int, in_flight_max: int, kill_after: int,
                                kill) -> dict[bytes, bool]:
    """Publish `count` messages with at most `in_flight_max` unconfirmed, calling `kill()` once
    `kill_after` are confirmed; body -> confirmed (True) or nacked/failed (False)."""
    conn = await aio_pika.connect(url, timeout=30)
    outcome: dict[bytes, bool] = {}
    try:
        ch = await conn.channel(publisher_confirms=True)
        sem = asyncio.Semaphore(in_flight_max)
        confirmed = 0
        killed = False

        async def one(i: int) -> None:
            nonlocal confirmed, killed
            body = f"k{i}".encode()
            async with sem:
                try:
                    await asyncio.wait_for(ch.default_exchange.publish(aio_pika.Message(body), routing_key=name), 90)
                    outcome[body] = True
                    confirmed += 1
                except Exception:
                    outcome[body] = False
            if confirmed >= kill_after and not killed:
                killed = True
                await asyncio.get_running_loop().run_in_executor(None, kill)

        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await conn.close()
    return outcome


def fsync_args(tmp_path, mode: str) -> list[str]:
    """`hutch server` arguments for a node with `stream.fsync = mode` (none for the default)."""
    if mode == "before_confirm":
        return []
    conf = tmp_path / "hutch.conf"
    conf.write_text(f"stream.fsync = {mode}\n")
    return ["--config", str(conf)]


@pytest.mark.parametrize("fsync", ["before_confirm", "background"])
def test_publishing_through_the_leaders_kill_loses_and_duplicates_nothing(tmp_path, fsync):
    with HutchCluster(n=3, extra_args=fsync_args(tmp_path, fsync)) as cluster:
        name = unique("sk")
        declare(cluster, 0, name, **{"x-initial-cluster-size": 3})
        wait_until(lambda: info(cluster, name, 1)["leader"] in cluster.names, 10, "a leader")
        leader = node_index(cluster, info(cluster, name, 1)["leader"])
        publisher, reader = [i for i in range(3) if i != leader]
        # a consumer on the third node reads through the leader change
        seen: list[int] = []
        bodies_seen: list[bytes] = []
        stop = threading.Event()

        def consume() -> None:
            conn = connect(cluster, reader)
            try:
                ch = conn.channel()
                ch.basic_qos(prefetch_count=100)

                def on(c, m, p, b):
                    seen.append(p.headers["x-stream-offset"])
                    bodies_seen.append(b)
                    c.basic_ack(m.delivery_tag)
                ch.basic_consume(name, on, arguments={"x-stream-offset": "first"})
                while not stop.is_set():
                    conn.process_data_events(0.1)
            finally:
                with contextlib.suppress(Exception):
                    conn.close()
        t = threading.Thread(target=consume, daemon=True)
        t.start()
        try:
            url = f"amqp://guest:guest@127.0.0.1:{cluster.nodes[publisher].amqp_port}/%2F"
            outcome = asyncio.run(_publish_through_kill(url, name, 1500, 50, 400, lambda: cluster.kill(leader)))
            confirmed = {b for b, ok in outcome.items() if ok}
            assert len(confirmed) >= 400
            wait_until(lambda: info(cluster, name, publisher)["leader"] in
                       [cluster.names[publisher], cluster.names[reader]], 30, "a new leader")
            end = member_end(cluster, name, publisher)
            stored = read_all(cluster, publisher, name, end or 0)
            bodies = [b for _o, b in stored]
            assert [o for o, _b in stored] == list(range(len(stored)))
            assert len(bodies) == len(set(bodies)), "a message is in the stream twice"
            assert confirmed <= set(bodies), f"confirmed but not in the stream: {sorted(confirmed - set(bodies))[:10]}"
            wait_until(lambda: len(seen) >= len(stored), 30, "the reader reached the end")
            assert seen[:len(stored)] == list(range(len(stored)))
            assert bodies_seen[:len(stored)] == bodies
        finally:
            stop.set()
            t.join(10)


def test_a_stopped_member_catches_up_when_it_restarts(cluster):
    name = unique("sc")
    declare(cluster, 0, name, **{"x-initial-cluster-size": 3})
    publish(cluster, 0, name, [f"a{i}".encode() for i in range(100)])
    wait_until(lambda: member_end(cluster, name, 2) == 100, 20, "node 3's replica")
    cluster.stop(2)
    try:
        publish(cluster, 0, name, [f"b{i}".encode() for i in range(300)])
    finally:
        cluster.start_node(2)
    wait_until(lambda: member_end(cluster, name, 2) == 400, 30, "node 3 caught up")
    expected = [f"a{i}".encode() for i in range(100)] + [f"b{i}".encode() for i in range(300)]
    assert read_all(cluster, 2, name, 400) == list(enumerate(expected))


SNAPSHOT_AFTER_ENTRIES = RAFT_SNAPSHOT_AFTER + RAFT_TRAILING  # a stream's Raft log is compacted behind a snapshot then


def test_a_member_that_missed_a_snapshots_worth_fills_its_gap_from_another_member(cluster):
    """The leader sends the returning member a snapshot, numbers only: the member fetches the
    chunks it lacks from another member, and writes what is applied meanwhile after them."""
    name = unique("sg")
    declare(cluster, 0, name, **{"x-initial-cluster-size": 3})
    publish(cluster, 0, name, [b"a0"])
    wait_until(lambda: member_end(cluster, name, 2) == 1, 20, "node 3's replica")
    cluster.stop(2)
    total = SNAPSHOT_AFTER_ENTRIES + 200
    try:
        publish(cluster, 0, name, [f"b{i}".encode() for i in range(total - 1)])  # one entry each
    finally:
        cluster.start_node(2)
    wait_until(lambda: member_end(cluster, name, 2) == total, 60, "node 3 caught up")
    got = read_all(cluster, 2, name, total, timeout_s=60)
    assert [o for o, _b in got] == list(range(total))
    assert [b for _o, b in got] == [b"a0"] + [f"b{i}".encode() for i in range(total - 1)]


class Publisher:
    """An aio-pika publisher with confirms on its own event loop, run by the test a step at a time,
    so that the test's own thread stops and starts nodes in between (a node started from another
    thread would die with that thread: the test's processes go with their parent)."""

    def __init__(self, url: str):
        self.loop = asyncio.new_event_loop()
        self.tasks: list[asyncio.Future] = []

        async def open_() -> tuple:
            conn = await aio_pika.connect(url, timeout=30)
            return conn, await conn.channel(publisher_confirms=True)
        self.conn, self.ch = self.loop.run_until_complete(open_())

    def publish(self, name: str, bodies: list[bytes]) -> None:
        async def start() -> None:
            for b in bodies:
                self.tasks.append(asyncio.ensure_future(
                    self.ch.default_exchange.publish(aio_pika.Message(b), routing_key=name)))
        self.loop.run_until_complete(start())

    def wait(self, timeout_s: float) -> int:
        """Run the loop until every publish is answered or `timeout_s` passed; how many are confirmed."""
        if self.tasks:
            self.loop.run_until_complete(asyncio.wait(self.tasks, timeout=timeout_s))
        return sum(1 for t in self.tasks if t.done() and t.exception() is None)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(self.conn.close())
        self.loop.close()


def test_without_a_majority_nothing_is_confirmed_and_nothing_is_lost_after():
    with HutchCluster(n=3) as cluster:
        name = unique("sm")
        declare(cluster, 0, name, **{"x-initial-cluster-size": 3})
        publish(cluster, 0, name, [f"a{i}".encode() for i in range(10)])
        cluster.stop(1)
        cluster.stop(2)

        def restore() -> None:
            for i in (1, 2):
                cluster.nodes[i].start(wait=False)
            for i in (1, 2):
                cluster.nodes[i].wait_ready(60)
            cluster.wait_healthy()
        url = f"amqp://guest:guest@127.0.0.1:{cluster.nodes[0].amqp_port}/%2F"
        later = [f"b{i}".encode() for i in range(5)]
        p = Publisher(url)
        try:
            p.publish(name, later)
            # no confirm can come while two of three members are down: the publishes wait unanswered
            assert p.wait(6.0) == 0, "confirmed without a majority"
            restore()
            assert p.wait(60.0) == len(later)
        finally:
            p.close()
        expected = [f"a{i}".encode() for i in range(10)] + later
        for i in range(3):
            wait_until(lambda i=i: member_end(cluster, name, i) == 15, 30, f"node {i + 1}'s replica")
            assert read_all(cluster, i, name, 15) == list(enumerate(expected))


def test_with_fsync_in_the_background_killing_every_node_loses_no_confirmed_message(tmp_path):
    """A confirm means a majority wrote the batch; a killed process loses nothing the OS was
    given, so kill -9 of every member at once loses nothing confirmed."""
    with HutchCluster(n=3, extra_args=fsync_args(tmp_path, "background")) as cluster:
        name = unique("sb")
        declare(cluster, 0, name, **{"x-initial-cluster-size": 3})
        bodies = [f"m{i}".encode() for i in range(2000)]
        publish(cluster, 0, name, bodies)  # each one confirmed
        for i in range(3):
            cluster.kill(i)
        for i in range(3):
            cluster.start_node(i, wait_healthy=i == 2)
        wait_until(lambda: all(member_end(cluster, name, i) == len(bodies) for i in range(3)), 60,
                   "every replica back at its end")
        for i in range(3):
            assert read_all(cluster, i, name, len(bodies)) == list(enumerate(bodies))
