"""How a node turns stream-protocol Publish frames into chunks, on one node with a raw client
(tests.support.stream_client): a publisher's frames that arrive together become one entry and
one chunk (as osiris's writer batches what is waiting), each frame still confirmed, deduplicated
and filtered as its own; a batch never grows past what one Deliver frame carries. hutch only:
when RabbitMQ cuts its chunks depends on its processes' timing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hutch.streamproto import frames as f
from hutch.streams.host import BATCH_BYTES_MAX
from tests.support.brokers import HutchNode
from tests.support.stream_client import amqp_body, chunk_bodies, create, raw, unique


@pytest.fixture(scope="module")
def hutch_node() -> Iterator[HutchNode]:
    with HutchNode() as node:
        yield node


def _confirm_all(c, count: int) -> list[int]:
    confirmed: list[int] = []
    while len(confirmed) < count:
        confirmed.extend(c.recv(f.PublishConfirm).publishing_ids)
    return confirmed


def _chunks(c, name: str, count: int) -> list[list[bytes]]:
    """The chunks of `name` from first, until `count` messages were read."""
    assert c.call(f.Subscribe(c.cid(), 1, name, f.OFFSET_TYPE_FIRST, None, 100)).code == f.OK
    out: list[list[bytes]] = []
    while sum(map(len, out)) < count:
        out.append(chunk_bodies(c.recv(f.Deliver, f.DeliverV2).chunk))
    assert c.call(f.Unsubscribe(c.cid(), 1)).code == f.OK
    return out


def test_publish_frames_that_arrive_together_become_one_chunk_and_each_is_confirmed(hutch_node):
    name = unique()
    with raw(hutch_node) as c:
        create(c, name)
        assert c.call(f.DeclarePublisher(c.cid(), 1, "", name)).code == f.OK
        frames = [f.Publish(1, [(pid, amqp_body(f"m{pid}")) for pid in range(k * 3 + 1, k * 3 + 4)])
                  for k in range(5)]
        c.send(*frames)  # one write: the node reads them in one go
        assert sorted(_confirm_all(c, 15)) == list(range(1, 16))
        assert _chunks(c, name, 15) == [[f"m{i}".encode() for i in range(1, 16)]]


def test_a_batch_with_a_reference_deduplicates_ids_it_holds_twice(hutch_node):
    name = unique()
    with raw(hutch_node) as c:
        create(c, name)
        assert c.call(f.DeclarePublisher(c.cid(), 1, "writer-a", name)).code == f.OK
        # the second frame repeats ids 2 and 3 (a client resending): confirmed, stored once
        c.send(f.Publish(1, [(1, amqp_body("a")), (2, amqp_body("b")), (3, amqp_body("c"))]),
               f.Publish(1, [(2, amqp_body("b")), (3, amqp_body("c")), (4, amqp_body("d"))]))
        assert sorted(_confirm_all(c, 6)) == [1, 2, 2, 3, 3, 4]
        assert [b for ch in _chunks(c, name, 4) for b in ch] == [b"a", b"b", b"c", b"d"]
        seq = c.call(f.QueryPublisherSequence(c.cid(), "writer-a", name))
        assert (seq.code, seq.sequence) == (f.OK, 4)


def test_a_batch_is_cut_at_its_byte_limit_so_that_every_chunk_fits_a_deliver_frame(hutch_node):
    name = unique()
    body = amqp_body("x" * (64 << 10))
    per_frame = 4
    frames_n = BATCH_BYTES_MAX // (len(body) * per_frame) + 2  # more than one batch's worth
    with raw(hutch_node) as c:
        create(c, name)
        assert c.call(f.DeclarePublisher(c.cid(), 1, "", name)).code == f.OK
        pid = 0
        frames = []
        for _ in range(frames_n):
            frames.append(f.Publish(1, [(pid + i + 1, body) for i in range(per_frame)]))
            pid += per_frame
        c.send(*frames)
        assert len(_confirm_all(c, pid)) == pid
        got = _chunks(c, name, pid)
        assert len(got) >= 2
        assert all(sum(map(len, ch)) <= BATCH_BYTES_MAX for ch in got)
        assert sum(map(len, got)) == pid
