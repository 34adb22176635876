"""Bad input on the stream protocol against a running node: a clear error response or a closed
connection, never a crashed node, never a node that spends memory on a client's say-so.

- A gzip sub-batch that inflates to far more than it declares (a gzip bomb) is refused with a
  `PublishError` (PRECONDITION_FAILED) without being inflated; one that honestly declares more
  than `SUB_BATCH_BYTES_MAX` is refused before it is inflated.
- An AMQP 0-9-1 message too large for a stream's Raft entry is nacked, and the stream goes on.
- Fuzzing with well-formed commands carrying any values (unknown streams and ids, offsets of
  every type, credits, references too long, arguments RabbitMQ refuses, bad sub-batches, commands
  out of place): every session ends with answers or a close with a protocol code, never
  INTERNAL_ERROR; the node logs no error handling a command and goes on serving, and an AMQP
  0-9-1 consumer reads whatever the fuzzing wrote.
"""

from __future__ import annotations

import socket
import struct
import zlib

import pika
import pika.exceptions
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hutch.broker.streamsession import SUB_BATCH_BYTES_MAX
from hutch.streamproto import frames as f
from hutch.streams.host import ENTRY_BYTES_MAX
from tests.support.brokers import HutchNode, wait_until
from tests.support.stream_client import Raw, amqp_body, create, publish_chunks, raw, read_all, unique

pytestmark = pytest.mark.timeout(180)
NAMES = ["fz-shared", "fz-other", "fz-super-0", "", "no-such-stream", "x" * 300]
SUPER = ["fz-super", "no-such-super"]
PROBE_ID = 0xFFFFFFFF


@pytest.fixture(scope="module")
def node():
    with HutchNode() as n:
        with raw(n) as c:
            for name in NAMES[:2]:
                create(c, name)
                publish_chunks(c, name, [["one", "two"], ["three"]])
        yield n


def peak_rss_kb(node: HutchNode) -> int:
    with open(f"/proc/{node.proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def gzip_of_zeros(total: int) -> bytes:
    """One record of `total` zero bytes as a sub-batch's data (its uint32 size, then the record),
    compressed as one gzip member without ever holding the record."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(struct.pack(">I", total))]
    block = bytes(1 << 20)
    for _ in range(total // len(block)):
        out.append(z.compress(block))
    out.append(z.compress(bytes(total % len(block))))
    out.append(z.flush())
    return b"".join(out)


@pytest.mark.parametrize("declared", ["less than it inflates to", "the truth, over the limit"])
def test_a_gzip_sub_batch_that_would_inflate_past_the_limit_is_refused_without_inflating_it(node, declared):
    inflated = 64 << 20  # zeros, in about 64 KB of gzip
    data = gzip_of_zeros(inflated)
    uncompressed = 1000 if declared == "less than it inflates to" else inflated + 4
    name = unique()
    before_kb = peak_rss_kb(node)
    with raw(node) as c:
        create(c, name)
        assert c.call(f.DeclarePublisher(c.cid(), 1, "", name)).code == f.OK
        c.send(f.Publish(1, [(1, f.SubBatch(1, 1, uncompressed, data)), (2, amqp_body("after"))]))
        assert c.recv(f.PublishError) == f.PublishError(1, [(1, f.PRECONDITION_FAILED)])
        assert c.recv(f.PublishConfirm).publishing_ids == [2]  # the rest of the frame is taken
        assert read_all(c, name, 1) == [b"after"]
    assert peak_rss_kb(node) - before_kb < inflated // 1024 // 2, "the node inflated the sub-batch"


@pytest.mark.parametrize("over", [0, 1])
def test_a_sub_batch_of_the_limit_is_taken_and_one_byte_more_is_refused(node, over):
    overhead = len(amqp_body("x" * 1000)) - 1000  # a body this long takes the 32-bit length forms
    record = amqp_body("x" * (SUB_BATCH_BYTES_MAX - 4 - overhead + over))
    raw_data = struct.pack(">I", len(record)) + record
    assert len(raw_data) == SUB_BATCH_BYTES_MAX + over
    name = unique()
    with raw(node) as c:
        create(c, name)
        assert c.call(f.DeclarePublisher(c.cid(), 1, "", name)).code == f.OK
        c.send(f.Publish(1, [(1, f.SubBatch(1, 1, len(raw_data), zlib.compress(raw_data, wbits=31)))]))
        answer = c.recv(f.PublishConfirm, f.PublishError)
        if over:
            assert answer == f.PublishError(1, [(1, f.PRECONDITION_FAILED)])
        else:
            assert answer == f.PublishConfirm(1, [1])
            assert read_all(c, name, 1) == [b"x" * (SUB_BATCH_BYTES_MAX - 4 - overhead)]


def test_a_gzip_sub_batch_in_several_members_within_the_limit_is_taken(node):
    records = [amqp_body(f"m{i}") for i in range(3)]
    raw_data = b"".join(struct.pack(">I", len(r)) + r for r in records)
    members = b"".join(zlib.compress(raw_data[i:i + 7], wbits=31) for i in range(0, len(raw_data), 7))
    name = unique()
    with raw(node) as c:
        create(c, name)
        assert c.call(f.DeclarePublisher(c.cid(), 1, "", name)).code == f.OK
        c.send(f.Publish(1, [(1, f.SubBatch(1, 3, len(raw_data), members))]))
        assert c.recv(f.PublishConfirm, f.PublishError) == f.PublishConfirm(1, [1])
        assert read_all(c, name, 3) == [b"m0", b"m1", b"m2"]


def test_an_amqp_message_too_large_for_a_stream_entry_is_nacked_and_the_stream_goes_on(node):
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp_port, heartbeat=0,
                                                             blocked_connection_timeout=60))
    try:
        ch = conn.channel()
        name = unique()
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", name, b"x" * (ENTRY_BYTES_MAX + 1))
        ch.basic_publish("", name, b"small")
        assert ch.queue_declare(name, passive=True).method.message_count == 1
    finally:
        conn.close()
    assert f"stream '{name}' in vhost '/': refused 1 message(s)" in node.log()


@pytest.mark.parametrize("argument", ["max-length-bytes", "initial-cluster-size", "stream-max-segment-size-bytes"])
def test_a_create_with_an_integer_argument_past_64_bits_is_refused(node, argument):
    """Found by the fuzzing below: the value could not be written to the catalogue's log, and
    the connection was closed with an internal error."""
    with raw(node) as c:
        name = unique()
        got = c.call(f.Create(c.cid(), name, {argument: "99999999999999999999999"}))
        assert got.code == f.PRECONDITION_FAILED
        meta = c.call(f.Metadata(c.cid(), [name]))  # the connection goes on; no stream was made
        assert [(s[0], s[1]) for s in meta.streams] == [(name, f.STREAM_DOES_NOT_EXIST)]
    assert "error while handling a command" not in node.log()


# ---------------------------------------------------------------- fuzzing with well-formed commands

cids = st.integers(0, PROBE_ID - 1)
small_ids = st.one_of(st.integers(0, 3), st.integers(0, 255))
names = st.one_of(st.just(NAMES[0]), st.sampled_from(NAMES))  # half of them a stream that is there
deletable = st.sampled_from(NAMES[1:])  # fz-shared stays, for the commands that use a stream
references = st.sampled_from(["", "ref", "g", "r" * 300])
u64 = st.integers(0, 2 ** 64 - 1)
offset_specs = st.one_of(st.tuples(st.sampled_from([f.OFFSET_TYPE_FIRST, f.OFFSET_TYPE_LAST, f.OFFSET_TYPE_NEXT]),
                                   st.none()),
                         st.tuples(st.just(f.OFFSET_TYPE_OFFSET), u64),
                         st.tuples(st.just(f.OFFSET_TYPE_TIMESTAMP), st.integers(-2 ** 63, 2 ** 63 - 1)))
properties = st.dictionaries(
    st.sampled_from(["single-active-consumer", "name", "super-stream", "filter.0", "match-unfiltered", "x"]),
    st.sampled_from(["true", "false", "", "g", "red", "fz-super"]), max_size=3)
arguments = st.dictionaries(
    st.sampled_from(["max-length-bytes", "max-age", "stream-max-segment-size-bytes", "initial-cluster-size",
                     "queue-leader-locator", "stream-filter-size-bytes", "x-unknown"]),
    st.sampled_from(["1", "0", "-1", "7D", "10 days", "balanced", "abc", "99999999999999999999999"]), max_size=3)
bodies = st.one_of(st.binary(max_size=24), st.builds(amqp_body, st.text(max_size=8)))
sub_batches = st.builds(f.SubBatch, st.sampled_from([0, 1, 2, 7]), st.integers(0, 0xFFFF),
                        st.integers(0, 2 ** 32 - 1), st.binary(max_size=40))
commands = st.one_of(
    st.builds(f.DeclarePublisher, cids, small_ids, references, names),
    st.builds(f.Publish, small_ids, st.lists(st.tuples(u64, st.one_of(bodies, sub_batches)), max_size=4)),
    st.builds(f.PublishV2, small_ids, st.lists(st.tuples(u64, st.sampled_from(["", "red"]), bodies), max_size=4)),
    st.builds(f.QueryPublisherSequence, cids, references, names),
    st.builds(f.DeletePublisher, cids, small_ids),
    st.builds(lambda c, s, n, o, cr, p: f.Subscribe(c, s, n, o[0], o[1], cr, p),
              cids, small_ids, names, offset_specs, st.integers(0, 0xFFFF), properties),
    st.builds(f.Credit, small_ids, st.integers(0, 0xFFFF)),
    st.builds(f.StoreOffset, references, names, u64),
    st.builds(f.QueryOffset, cids, references, names),
    st.builds(f.Unsubscribe, cids, small_ids),
    st.builds(f.Create, cids, deletable, arguments),
    st.builds(f.Delete, cids, deletable),
    st.builds(f.Metadata, cids, st.lists(names, max_size=3)),
    st.builds(f.StreamStats, cids, names),
    st.builds(f.Route, cids, st.sampled_from(["0", "1", "", "k"]), st.sampled_from(SUPER)),
    st.builds(f.Partitions, cids, st.sampled_from(SUPER)),
    st.builds(lambda c, code, o: f.ConsumerUpdateResponse(c, code, o[0], o[1]), cids, st.integers(0, 0xFFFF),
              st.one_of(st.just((f.OFFSET_TYPE_NONE, None)), offset_specs)),
    st.builds(f.CreateSuperStream, cids, st.sampled_from(SUPER), st.lists(deletable, max_size=2),
              st.lists(st.sampled_from(["0", "k", ""]), max_size=2), arguments),
    st.builds(f.DeleteSuperStream, cids, st.sampled_from(SUPER)),
    st.builds(f.ExchangeCommandVersions, cids,
              st.lists(st.tuples(st.integers(0, 0xFFFF), st.integers(0, 3), st.integers(0, 3)), max_size=3)),
    st.just(f.Heartbeat()),
)
misplaced = st.one_of(  # after open: the handshake's commands, and the server's own (they end the session)
    st.builds(f.Tune, st.integers(0, 2 ** 32 - 1), st.integers(0, 100)),
    st.builds(f.PeerProperties, cids, st.just({})),
    st.builds(f.PublishConfirm, small_ids, st.lists(u64, max_size=2)),
)


def _session(node: HutchNode, cmds: list[f.Command]) -> list[f.Command]:
    """Send the commands, then a Metadata probe; what came back until its answer or the close."""
    c = Raw(node.stream_port)
    try:
        c.handshake()
        c.send(*cmds, f.Metadata(PROBE_ID, []))
        while not any((type(x) is f.MetadataResponse and x.correlation_id == PROBE_ID) or type(x) is f.Close
                      for x in c.inbox):
            if not c._read():
                break
        return list(c.inbox)
    finally:
        c.close()


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(cmds=st.lists(st.one_of(commands, commands, commands, commands, commands, commands, misplaced),
                    min_size=1, max_size=12))
def test_fuzz_well_formed_commands_with_any_values_get_answers_or_a_protocol_close(node, cmds):
    got = _session(node, cmds)
    closes = [x for x in got if type(x) is f.Close]
    assert all(x.code != f.INTERNAL_ERROR for x in closes), closes
    assert node.proc.poll() is None


def test_after_the_fuzzing_the_node_logged_no_error_and_serves_both_protocols(node):
    log = node.log()
    assert "error while handling a command" not in log and "Traceback" not in log, log[-3000:]
    with raw(node) as c:
        create(c, "fz-shared-after")
        publish_chunks(c, "fz-shared-after", [["alive"]])
        assert read_all(c, "fz-shared-after", 1) == [b"alive"]
    # whatever the fuzzing wrote to a stream, an AMQP 0-9-1 consumer reads it
    with raw(node) as c:
        code = c.call(f.Create(c.cid(), "fz-shared", {})).code
        assert code in (f.OK, f.STREAM_ALREADY_EXISTS)
        c.send(f.DeclarePublisher(c.cid(), 1, "", "fz-shared"))
        c.send(f.Publish(1, [(1, b"\x00\x53\x75not amqp 1.0"), (2, amqp_body("last"))]))
        while True:
            confirm = c.recv(f.PublishConfirm, f.PublishError)
            if type(confirm) is f.PublishConfirm and 2 in confirm.publishing_ids:
                break
        end = c.call(f.StreamStats(c.cid(), "fz-shared")).stats["committed_chunk_id"]
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp_port, heartbeat=0))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        seen: list[tuple[int, bytes]] = []

        def on(c, m, p, b):
            seen.append((p.headers["x-stream-offset"], b))
            c.basic_ack(m.delivery_tag)
        ch.basic_consume("fz-shared", on, arguments={"x-stream-offset": "first"})
        wait_until(lambda: (conn.process_data_events(0.05), bool(seen) and seen[-1][1] == b"last")[1], 30,
                   "the stream read to its end")
        assert seen[-1][0] >= end
        offsets = [o for o, _b in seen]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    finally:
        conn.close()
    with socket.create_connection(("127.0.0.1", node.stream_port), timeout=5):
        pass
