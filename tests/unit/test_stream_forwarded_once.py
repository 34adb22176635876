"""A stream-protocol publisher without a reference, on a node that does not lead the stream
(docs/streams.md, "Publishing through another node").

Its node forwards each batch to the leader and sends it again when a new leader is known. If
the old leader had replicated the entry before it died, the new leader's log holds it already,
and without deduplication it was stored twice (seen once under load in
tests/cluster/test_stream_protocol.py: one batch of 20 in a stream of 400). The publisher's own
ids are not deduplicated without a reference, as in RabbitMQ, so the node numbers the records
itself, under the publisher's writer id, and the entry sent again is stored once."""

from __future__ import annotations

from types import SimpleNamespace

from hutch.cluster.peers import Peers
from hutch.store.stream_log import StreamLog
from hutch.streamproto import chunk
from hutch.streams import machine as sm
from hutch.streams.host import StreamHost


def _forwarding_node() -> tuple[StreamHost, list, SimpleNamespace]:
    sent: list = []
    peers = Peers("n2", lambda peer, payload: sent.append((peer, payload)) or True, lambda _n: True,
                  lambda fn, *args: fn(*args))
    host = StreamHost(peers, SimpleNamespace(now_ms=lambda: 0, schedule=lambda: None))
    host.raft = SimpleNamespace(leader=lambda gid: "n1")
    q = host.queues[7] = SimpleNamespace(gid=7, deleted=False, members=("n1", "n2", "n3"), name="s", vhost="/")
    return host, sent, q


def _entries(sent: list) -> list[list]:
    return [sm.decode_entry(payload[2]) for peer, payload in sent if peer == "n1" and payload[0] == "SP"]


def test_the_node_numbers_a_reference_less_publishers_records(tmp_path):
    host, sent, q = _forwarding_node()
    host.write(q, "session-1/0", None, [b"m1", b"m2"], None, lambda w: None)
    host.flush()
    host.write(q, "session-1/0", None, [b"m3"], None, lambda w: None)
    host.flush()
    (first, second) = _entries(sent)
    assert (first[5], first[6]) == ("session-1/0", [1, 2])
    assert (second[5], second[6]) == ("session-1/0", [3])

    # the first entry reached the new leader's log through the old one, and is sent again
    log = StreamLog(tmp_path / "s", fsync=False)
    try:
        m = sm.StreamMachine(log)
        data = [payload[2] for _peer, payload in sent]
        m.apply(data[0])
        again = m.apply(data[0])
        m.apply(data[1])
        assert again.duplicates == 2
        got = [r for _info, d in log.read(log.first_offset, 1 << 30) for r in chunk.records(d)]
        assert got == [b"m1", b"m2", b"m3"]
    finally:
        log.close()


def test_a_publisher_that_goes_is_forgotten():
    host, sent, q = _forwarding_node()
    host.write(q, "session-1/0", None, [b"m1"], None, lambda w: None)
    host.flush()
    host.forget_writer("session-1/0")
    host.write(q, "session-1/0", None, [b"m2"], None, lambda w: None)
    host.flush()
    assert [e[6] for e in _entries(sent)] == [[1], [1]]
