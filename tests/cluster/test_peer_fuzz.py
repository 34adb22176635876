"""The peer protocol under malformed and hostile messages, as the AMQP codec is fuzzed.

Two real nodes of a three-member cluster run; the test plays the third member: it proves the
cluster secret like a node does (`PeerCodec`), then sends messages that are well framed but
malformed inside, on every group a node listens to: Raft messages, queue traffic ("q": remote
queue batches, quorum forwarding and effects, GM ring messages, node figures) and cluster
calls ("rpc": catalogue proposals, joins, forgets, member lists). Each message gets a fresh
link, because a node may close a link on what it cannot handle.

A node must survive all of it: it stays up and serves clients, it never logs a handler
failure (the traceback of an exception a message caused), and the catalogue, the one state
every member replicates, is still the same on both nodes afterwards.
"""

from __future__ import annotations

import asyncio
import json

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hutch.cluster.wire import HandshakeRefused, PeerCodec
from tests.support.brokers import wait_until
from tests.support.hutch_cluster import HutchCluster

pytestmark = pytest.mark.timeout(300)
FAKE = 2  # the member the test plays
HANDLER_FAILURE = "could not be handled"


@pytest.fixture(scope="module")
def cluster():
    c = HutchCluster(n=3)
    try:
        for node in c.nodes[:FAKE]:
            node.start(wait=False)
        for node in c.nodes[:FAKE]:
            node.wait_ready(60)
        def led() -> bool:
            try:
                return all(c.cluster_status(i).get("leader") for i in range(FAKE))
            except OSError:  # the default user comes with the catalogue's first leader
                return False

        wait_until(led, 60, "a catalogue leader")
        yield c
    finally:
        c.cleanup()


class FakePeer:
    """The third member, as far as the wire can tell."""

    def __init__(self, cluster: HutchCluster, target: int):
        self.cluster, self.target = cluster, target
        self.secret = cluster.secret_file.read_text().strip()
        self.incarnation = 1000

    async def send(self, group, payload) -> None:
        async with asyncio.timeout(20):
            while True:
                try:
                    return await self._send(group, payload)
                except HandshakeRefused as e:  # the node was dialling us at that moment: as a node does, again
                    assert e.reason == "simultaneous connect", e
                    await asyncio.sleep(0.05)

    async def _send(self, group, payload) -> None:
        node = self.cluster.nodes[self.target]
        self.incarnation += 1  # a restarted node, as far as the target can tell: the old link goes
        codec = PeerCodec(self.cluster.names[FAKE], self.secret, "dialler", incarnation=self.incarnation,
                          expected_peer=node.name)
        reader, writer = await asyncio.open_connection("127.0.0.1", node.peer_port)
        try:
            writer.write(codec.data_to_send())
            while not codec.is_open:
                data = await reader.read(65536)
                assert data, "the node closed the link during the handshake"
                codec.feed(data)
                writer.write(codec.data_to_send())
            writer.write(codec.encode(group, payload))
            await writer.drain()
        finally:
            writer.close()


leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False),
                 st.text(max_size=20), st.binary(max_size=40))
value = st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                   st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                     max_leaves=12)
Q_KINDS = {"RQ": 2, "ST": 2, "QP": 3, "QE": 2, "G": 4, "NI": 2, "CC": 2}
RPC_KINDS = {"propose": 2, "join": 3, "forget": 2, "leaving": 1, "members": 2}


@st.composite
def message(draw):
    """A group and a payload: the right outer shape with random insides, or anything at all."""
    group = draw(st.sampled_from(["raft", "q", "rpc", "meta", 77]))
    if draw(st.booleans()):
        return group, draw(value)
    if group == "q":
        kind = draw(st.sampled_from(sorted(Q_KINDS)))
        return group, [kind, *draw(st.lists(value, min_size=Q_KINDS[kind] - 1, max_size=Q_KINDS[kind] - 1))]
    if group == "rpc":
        kind = draw(st.sampled_from(sorted(RPC_KINDS)))
        return group, [kind, *draw(st.lists(value, min_size=RPC_KINDS[kind] - 1, max_size=RPC_KINDS[kind] - 1))]
    if group == "raft":
        return group, [draw(st.one_of(st.integers(0, 3), value)), draw(st.one_of(st.binary(max_size=60), value))]
    return group, draw(value)


def _failures(log: str) -> str:
    """Each distinct handler failure in a node's log: where it was raised and what."""
    seen = {}
    for chunk in log.split(HANDLER_FAILURE)[1:]:
        lines = [ln for ln in chunk.splitlines() if ln.strip()]
        frames = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
        error = next((ln for ln in lines[1:] if not ln.startswith((" ", "Traceback", "2026", "20"))), "?")
        seen.setdefault((" <- ".join(reversed(frames[-3:])) if frames else "?", error.split(":")[0]), error)
    return "\n".join(f"{where}: {err}" for (where, _kind), err in seen.items())


def _definitions(cluster: HutchCluster, i: int) -> dict:
    d = cluster.api(i, "/api/definitions")
    d.pop("rabbit_version", None)
    d.pop("hutch_version", None)
    return d


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(cases=st.lists(message(), min_size=1, max_size=4), target=st.integers(0, FAKE - 1))
def test_malformed_peer_messages_never_fail_a_handler_or_a_node(cluster, cases, target):
    peer = FakePeer(cluster, target)

    async def go():
        for group, payload in cases:
            await peer.send(group, payload)
    asyncio.run(go())
    for i in range(FAKE):
        assert cluster.nodes[i].proc.poll() is None, f"{cluster.names[i]} died"


def test_after_the_fuzzing_both_nodes_serve_and_agree(cluster):
    # runs after the fuzz test above (pytest keeps file order)
    for i in range(FAKE):
        log = cluster.nodes[i].log_path.read_text(errors="replace")
        assert HANDLER_FAILURE not in log, _failures(log)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port))
        ch = conn.channel()
        ch.queue_declare(f"after-fuzz-{i}", durable=True)
        ch.close()
        conn.close()
    wait_until(lambda: _definitions(cluster, 0) == _definitions(cluster, 1), 20, "the same catalogue on both nodes")
    assert json.dumps(_definitions(cluster, 0), sort_keys=True).count("after-fuzz-") == 2
