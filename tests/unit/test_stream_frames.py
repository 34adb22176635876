"""RabbitMQ's stream protocol frames (hutch.streamproto.frames) against PROTOCOL.adoc and
rabbit_stream_core.erl: every command encodes and decodes back to itself in both directions,
the bytes match what the rstream client itself encodes (and rstream reads what hutch encodes),
a frame split anywhere still decodes, and whatever bytes arrive the decoder raises FrameError
and nothing else.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rstream import schema as rs
from rstream.constants import OffsetType
from rstream.encoding import decode_frame as rs_decode
from rstream.encoding import encode_frame as rs_encode
from rstream.encoding import encode_publish as rs_encode_publish

from hutch.streamproto import chunk
from hutch.streamproto import frames as f

CHUNK = chunk.encode([b"one", b"two", b""], timestamp=1700000000000, epoch=1)  # as a stream stores it

# client to server, then server to client; one example (or more) of every command
CLIENT_SENDS = [
    f.PeerProperties(1, {"product": "RabbitMQ Stream", "connection_name": "c\u00e9"}),
    f.SaslHandshake(2),
    f.SaslAuthenticate(3, "PLAIN", b"\x00guest\x00guest"),
    f.SaslAuthenticate(3, "PLAIN", None),
    f.Tune(1048576, 60),
    f.TuneResponse(65536, 0),
    f.Open(4, "/"),
    f.Close(5, f.OK, "OK"),
    f.Heartbeat(),
    f.DeclarePublisher(6, 3, "ref", "s1"),
    f.Publish(3, [(1, b"a"), (2, b""), (3, f.SubBatch(1, 2, 10, b"xyz"))]),
    f.PublishV2(3, [(1, "eu", b"a"), (2, "", b"bb")]),
    f.QueryPublisherSequence(7, "ref", "s1"),
    f.DeletePublisher(8, 3),
    f.Subscribe(9, 1, "s1", f.OFFSET_TYPE_OFFSET, 5, 10, {"single-active-consumer": "true", "name": "app"}),
    f.Subscribe(9, 2, "s1", f.OFFSET_TYPE_FIRST, None, 1, {}),
    f.Subscribe(9, 3, "s1", f.OFFSET_TYPE_TIMESTAMP, -1, 65535, {}),
    f.Credit(1, 5),
    f.StoreOffset("ref", "s1", 2**64 - 1),
    f.QueryOffset(10, "ref", "s1"),
    f.Unsubscribe(11, 1),
    f.Create(12, "s1", {"max-length-bytes": "1000000", "x-queue-leader-locator": "least-leaders"}),
    f.Delete(13, "s1"),
    f.Metadata(14, ["s1", "s2"]),
    f.Route(15, "rk", "invoices"),
    f.Partitions(16, "invoices"),
    f.ConsumerUpdateResponse(17, f.OK, f.OFFSET_TYPE_NONE, None),
    f.ConsumerUpdateResponse(17, f.OK, f.OFFSET_TYPE_OFFSET, 42),
    f.ExchangeCommandVersions(18, [(f.KEY_DELIVER, 1, 2), (f.KEY_PUBLISH, 1, 2)]),
    f.StreamStats(19, "s1"),
    f.CreateSuperStream(20, "invoices", ["invoices-0", "invoices-1"], ["0", "1"], {"max-age": "1h"}),
    f.DeleteSuperStream(21, "invoices"),
]
SERVER_SENDS = [
    f.PeerPropertiesResponse(1, f.OK, {"product": "hutch", "version": "0.1.0"}),
    f.SaslHandshakeResponse(2, f.OK, ["PLAIN", "AMQPLAIN"]),
    f.SaslAuthenticateResponse(3, f.OK),
    f.SaslAuthenticateResponse(3, f.SASL_CHALLENGE, b"challenge"),
    f.Tune(1048576, 60),
    f.OpenResponse(4, f.OK, {"advertised_host": "localhost", "advertised_port": "5552"}),
    f.OpenResponse(4, f.VIRTUAL_HOST_ACCESS_FAILURE),
    f.Close(1, f.UNKNOWN_FRAME, "unknown frame"),
    f.CloseResponse(5, f.OK),
    f.Heartbeat(),
    f.DeclarePublisherResponse(6, f.OK),
    f.PublishConfirm(3, [1, 2, 2**64 - 1]),
    f.PublishError(3, [(1, f.PUBLISHER_DOES_NOT_EXIST), (2, f.STREAM_NOT_AVAILABLE)]),
    f.QueryPublisherSequenceResponse(7, f.OK, 42),
    f.DeletePublisherResponse(8, f.OK),
    f.SubscribeResponse(9, f.SUBSCRIPTION_ID_ALREADY_EXISTS),
    f.Deliver(1, CHUNK),
    f.DeliverV2(1, 99, CHUNK),
    f.CreditResponse(f.SUBSCRIPTION_ID_DOES_NOT_EXIST, 7),
    f.QueryOffsetResponse(10, f.NO_OFFSET, 0),
    f.UnsubscribeResponse(11, f.OK),
    f.CreateResponse(12, f.STREAM_ALREADY_EXISTS),
    f.DeleteResponse(13, f.OK),
    f.MetadataResponse(14, [(0, "localhost", 5552), (1, "node2", 5553)],
                       [("s1", f.OK, 0, [1]), ("s2", f.STREAM_DOES_NOT_EXIST, 0xFFFF, [])]),
    f.MetadataUpdate(f.STREAM_NOT_AVAILABLE, "s1"),
    f.RouteResponse(15, f.OK, ["invoices-1"]),
    f.PartitionsResponse(16, f.OK, ["invoices-0", "invoices-1"]),
    f.ConsumerUpdate(17, 1, True),
    f.ExchangeCommandVersionsResponse(18, f.OK, f.SERVER_COMMAND_VERSIONS),
    f.StreamStatsResponse(19, f.OK, {"first_chunk_id": 0, "committed_chunk_id": -1}),
    f.CreateSuperStreamResponse(20, f.OK),
    f.DeleteSuperStreamResponse(21, f.OK),
]
ALL = CLIENT_SENDS + SERVER_SENDS


def decode_all(data: bytes, frame_max: int = 0) -> list[f.Command]:
    decoder = f.FrameDecoder(frame_max)
    decoder.feed(data)
    return list(decoder)


def test_every_command_has_an_example():
    assert {type(c) for c in ALL} == set(f.COMMANDS)
    assert len({(c.KEY, c.VERSION) for c in f.COMMANDS}) == len(f.COMMANDS)  # one layout per key and version


@pytest.mark.parametrize("cmd", ALL, ids=lambda c: type(c).__name__)
def test_round_trip(cmd):
    data = f.encode(cmd)
    assert struct.unpack_from(">I", data)[0] == len(data) - 4
    assert struct.unpack_from(">HH", data, 4) == (cmd.KEY, cmd.VERSION)
    assert decode_all(data) == [cmd]


def test_responses_set_the_top_bit_of_the_key():
    for cls in f.COMMANDS:
        if cls.__name__.endswith("Response"):
            assert cls.KEY & f.RESPONSE and cls.KEY & 0x7FFF in {c.KEY for c in f.COMMANDS}


def test_response_codes_have_rabbitmq_values():
    assert (f.OK, f.STREAM_DOES_NOT_EXIST, f.SASL_MECHANISM_NOT_SUPPORTED, f.AUTHENTICATION_FAILURE,
            f.VIRTUAL_HOST_ACCESS_FAILURE, f.UNKNOWN_FRAME, f.FRAME_TOO_LARGE, f.NO_OFFSET) == (
            1, 2, 7, 8, 12, 13, 14, 19)


# ---------------------------------------------------------------- what rstream sends, byte for byte

# captured from rstream 1.1.1's encoder (rstream.encoding.encode_frame / encode_publish)
RSTREAM_VECTORS = [
    ("0000003a001100010000000100000002000f636f6e6e656374696f6e5f6e616d65000163000770726f64756374000f"
     "5261626269744d512053747265616d",
     f.PeerProperties(1, {"connection_name": "c", "product": "RabbitMQ Stream"})),
    ("0000001f00130001000000030005504c41494e0000000c006775657374006775657374",
     f.SaslAuthenticate(3, "PLAIN", b"\x00guest\x00guest")),
    ("0000000c00140001001000000000003c", f.Tune(1048576, 60)),
    ("0000000b001500010000000400012f", f.Open(4, "/")),
    ("00000012000100010000000500000372656600027331", f.DeclarePublisher(5, 0, "ref", "s1")),
    ("0000001d000700010000000601000273310004000000000000000a000a00000000",
     f.Subscribe(6, 1, "s1", f.OFFSET_TYPE_OFFSET, 10, 10, {})),
    ("0000002600020001000000000200000000000000010000000568656c6c6f000000000000000200000000",
     f.Publish(0, [(1, b"hello"), (2, b"")])),
]


@pytest.mark.parametrize("hexdata,cmd", RSTREAM_VECTORS, ids=lambda x: type(x).__name__ if isinstance(x, f.Command) else "")
def test_known_vectors_from_rstream_decode(hexdata, cmd):
    assert decode_all(bytes.fromhex(hexdata)) == [cmd]


P = rs.Property


def _rstream_requests():
    """(rstream's request object, its bytes, the same request as hutch builds it)."""
    offset = rs.OffsetSpec.from_params
    pairs = [
        (rs.PeerProperties(1, [P("product", "RabbitMQ Stream")]), f.PeerProperties(1, {"product": "RabbitMQ Stream"})),
        (rs.SaslHandshake(2), f.SaslHandshake(2)),
        (rs.SaslAuthenticate(3, mechanism="PLAIN", data=b"\0u\0p"), f.SaslAuthenticate(3, "PLAIN", b"\0u\0p")),
        (rs.Tune(frame_max=131072, heartbeat=30), f.Tune(131072, 30)),
        (rs.Open(4, virtual_host="vh"), f.Open(4, "vh")),
        (rs.Close(5, code=1, reason="OK"), f.Close(5, 1, "OK")),
        (rs.Heartbeat(), f.Heartbeat()),
        (rs.Create(6, stream="s1", arguments=[P("max-age", "1h")]), f.Create(6, "s1", {"max-age": "1h"})),
        (rs.Delete(7, stream="s1"), f.Delete(7, "s1")),
        (rs.DeclarePublisher(8, publisher_id=2, reference="", stream="s1"), f.DeclarePublisher(8, 2, "", "s1")),
        (rs.QueryPublisherSequence(9, publisher_ref="ref", stream="s1"), f.QueryPublisherSequence(9, "ref", "s1")),
        (rs.DeletePublisher(10, publisher_id=2), f.DeletePublisher(10, 2)),
        (rs.Metadata(11, streams=["s1", "s2"]), f.Metadata(11, ["s1", "s2"])),
        (rs.Subscribe(12, subscription_id=0, stream="s1", offset_spec=offset(OffsetType.TIMESTAMP, 1700000000000),
                      credit=10, properties=[P("filter.0", "eu")]),
         f.Subscribe(12, 0, "s1", f.OFFSET_TYPE_TIMESTAMP, 1700000000000, 10, {"filter.0": "eu"})),
        (rs.Subscribe(13, subscription_id=1, stream="s1", offset_spec=offset(OffsetType.NEXT, None), credit=1,
                      properties=[P("single-active-consumer", "true")]),
         f.Subscribe(13, 1, "s1", f.OFFSET_TYPE_NEXT, None, 1, {"single-active-consumer": "true"})),
        (rs.Credit(subscription_id=1, credit=5), f.Credit(1, 5)),
        (rs.StoreOffset(reference="ref", stream="s1", offset=99), f.StoreOffset("ref", "s1", 99)),
        (rs.QueryOffset(14, reference="ref", stream="s1"), f.QueryOffset(14, "ref", "s1")),
        (rs.Unsubscribe(15, subscription_id=1), f.Unsubscribe(15, 1)),
        (rs.SuperStreamRoute(16, routing_key="k", super_stream="ss"), f.Route(16, "k", "ss")),
        (rs.SuperStreamPartitions(17, super_stream="ss"), f.Partitions(17, "ss")),
        (rs.ExchangeCommandVersionRequest(18, command_versions=[rs.FrameHandlerInfo(2, 1, 2)]),
         f.ExchangeCommandVersions(18, [(2, 1, 2)])),
        (rs.CreateSuperStream(19, super_stream="ss", partitions=["ss-0"], binding_keys=["0"], arguments=[P("a", "b")]),
         f.CreateSuperStream(19, "ss", ["ss-0"], ["0"], {"a": "b"})),
        (rs.DeleteSuperStream(20, super_stream="ss"), f.DeleteSuperStream(20, "ss")),
        (rs.ConsumerUpdateServerResponse(21, response_code=1, offset_specification=rs.OffsetSpecification(4, 7)),
         f.ConsumerUpdateResponse(21, f.OK, f.OFFSET_TYPE_OFFSET, 7)),
        (rs.PublishSubBatching(publisher_id=1, number_of_root_messages=1, publishing_id=5, compress_type=0x80 | 1 << 4,
                               subbatching_message_count=3, uncompressed_data_size=30, compressed_data_size=4,
                               messages=b"gzip"),
         f.Publish(1, [(5, f.SubBatch(1, 3, 30, b"gzip"))])),
    ]
    return [(r, rs_encode(r), ours) for r, ours in pairs]


@pytest.mark.parametrize("theirs,data,ours", _rstream_requests(), ids=lambda x: type(x).__name__)
def test_rstream_requests_decode_and_encode_the_same(theirs, data, ours):
    assert decode_all(data) == [ours]
    assert f.encode(ours) == data


def test_rstream_publish_v1_and_v2_are_the_same_bytes():
    msgs = [rs.Message(1, None, b"a" * 100), rs.Message(2, None, b"")]
    v1 = rs_encode_publish(rs.Publish(publisher_id=4, messages=msgs))
    assert f.encode(f.Publish(4, [(1, b"a" * 100), (2, b"")])) == v1
    msgs2 = [rs.Message(1, "eu", b"x"), rs.Message(2, "us", b"yy")]
    v2 = rs_encode_publish(rs.Publish(publisher_id=4, messages=msgs2), version_to_encode=2)
    assert decode_all(v2) == [f.PublishV2(4, [(1, "eu", b"x"), (2, "us", b"yy")])]
    assert f.encode(f.PublishV2(4, [(1, "eu", b"x"), (2, "us", b"yy")])) == v2


def test_a_publish_of_simple_messages_parses_framed_as_a_chunks_data():
    """The broker's fast path: the messages come as views of the frame, each after its size,
    which joined are the chunk data `chunk.frame` makes, and read as the (id, bytes) list."""
    records = [b"a" * 100, b"", b"\x00" * 3000]
    (cmd,) = decode_all(f.encode(f.Publish(4, [(7, records[0]), (8, records[1]), (9, records[2])])))
    msgs = cmd.messages
    assert type(msgs) is f.FramedMessages
    assert msgs.pids == [7, 8, 9] and msgs.size == sum(map(len, records))
    assert b"".join(msgs.parts) == chunk.frame(records)
    assert chunk.records(chunk.encode(records, timestamp=1, epoch=1)) == [bytes(p[4:]) for p in msgs.parts]
    assert msgs == [(7, records[0]), (8, records[1]), (9, records[2])] and len(msgs) == 3 and msgs[2] == (9, records[2])
    assert cmd == f.Publish(4, list(msgs)) and f.encode(cmd) == f.encode(f.Publish(4, list(msgs)))
    (mixed,) = decode_all(f.encode(f.Publish(4, [(1, b"a"), (2, f.SubBatch(0, 1, 5, b"\x00\x00\x00\x01x"))])))
    assert type(mixed.messages) is list  # a sub-batch: the general form


def _read_by_rstream(cmd: f.Command):
    return rs_decode(f.encode(cmd)[4:], version_to_decode=cmd.VERSION)


def test_rstream_reads_what_the_server_sends():
    assert _read_by_rstream(f.PeerPropertiesResponse(1, f.OK, {"product": "hutch"})) == rs.PeerPropertiesResponse(
        1, 1, [P("product", "hutch")])
    assert _read_by_rstream(f.SaslHandshakeResponse(2, f.OK, ["PLAIN", "AMQPLAIN"])) == rs.SaslHandshakeResponse(
        2, 1, ["PLAIN", "AMQPLAIN"])
    assert _read_by_rstream(f.SaslAuthenticateResponse(3, f.OK)) == rs.SaslAuthenticateResponse(3, 1)
    assert _read_by_rstream(f.Tune(1048576, 60)) == rs.Tune(1048576, 60)
    assert _read_by_rstream(f.OpenResponse(4, f.OK, {"advertised_host": "h", "advertised_port": "5552"})) == \
        rs.OpenResponse(4, 1, [P("advertised_host", "h"), P("advertised_port", "5552")])
    assert _read_by_rstream(f.OpenResponse(4, f.OK)) == rs.OpenResponse(4, 1, [])
    assert _read_by_rstream(f.CreateResponse(5, f.STREAM_ALREADY_EXISTS)) == rs.CreateResponse(5, 5)
    assert _read_by_rstream(f.MetadataResponse(6, [(0, "h", 5552)], [("s1", f.OK, 0, [0])])) == rs.MetadataResponse(
        6, [rs.Broker(0, "h", 5552)], [rs.StreamMetadata("s1", 1, 0, [0])])
    assert _read_by_rstream(f.PublishConfirm(1, [1, 2])) == rs.PublishConfirm(1, [1, 2])
    assert _read_by_rstream(f.PublishError(1, [(3, f.PUBLISHER_DOES_NOT_EXIST)])) == rs.PublishError(
        1, [rs.PublishingError(3, 0x12)])
    assert _read_by_rstream(f.QueryOffsetResponse(7, f.OK, 9)) == rs.QueryOffsetResponse(7, 1, 9)
    assert _read_by_rstream(f.QueryPublisherSequenceResponse(8, f.OK, 10)) == rs.QueryPublisherSequenceResponse(8, 1, 10)
    assert _read_by_rstream(f.CreditResponse(f.SUBSCRIPTION_ID_DOES_NOT_EXIST, 2)) == rs.CreditResponse(4, 2)
    assert _read_by_rstream(f.MetadataUpdate(f.STREAM_NOT_AVAILABLE, "s1")) == rs.MetadataUpdate(rs.MetadataInfo(6, "s1"))
    assert _read_by_rstream(f.Close(1, f.UNKNOWN_FRAME, "unknown frame")) == rs.Close(1, 13, "unknown frame")
    assert _read_by_rstream(f.CloseResponse(9, f.OK)) == rs.CloseResponse(9, 1)
    assert _read_by_rstream(f.RouteResponse(10, f.OK, ["ss-0"])) == rs.SuperStreamRouteResponse(10, 1, ["ss-0"])
    assert _read_by_rstream(f.PartitionsResponse(11, f.OK, ["ss-0"])) == rs.SuperStreamPartitionsResponse(11, 1, ["ss-0"])
    assert _read_by_rstream(f.ConsumerUpdate(12, 1, True)) == rs.ConsumerUpdateResponse(12, 1, 1)
    versions = _read_by_rstream(f.ExchangeCommandVersionsResponse(13, f.OK, f.SERVER_COMMAND_VERSIONS))
    # rstream looks the publish command up by its position (key - 1) in RabbitMQ's list
    assert versions.command_versions[f.KEY_PUBLISH - 1] == rs.FrameHandlerInfo(f.KEY_PUBLISH, 1, 2)
    deliver = _read_by_rstream(f.Deliver(3, CHUNK))
    assert (deliver.subscription_id, deliver.num_entries, deliver.get_messages()) == (3, 3, [b"one", b"two", b""])


# ---------------------------------------------------------------- the hot path


def test_deliver_prefix_then_the_chunk_is_the_whole_frame():
    for committed in (None, 7):
        cmd = f.Deliver(5, CHUNK) if committed is None else f.DeliverV2(5, committed, CHUNK)
        assert f.deliver_prefix(5, len(CHUNK), committed) + CHUNK == f.encode(cmd)


def test_decoded_deliver_chunk_is_a_view_not_a_copy():
    (cmd,) = decode_all(f.encode(f.Deliver(1, CHUNK)))
    assert isinstance(cmd.chunk, memoryview) and cmd.chunk == CHUNK


def test_publish_decodes_to_plain_pairs():
    (cmd,) = decode_all(f.encode(f.Publish(1, [(i, b"m%d" % i) for i in range(100)])))
    assert all(type(m) is tuple and type(m[0]) is int and type(m[1]) is bytes for m in cmd.messages)
    assert cmd.messages[42] == (42, b"m42")


# ---------------------------------------------------------------- partial reads


STREAM = b"".join(f.encode(c) for c in ALL)


def test_every_split_point_decodes_the_same():
    expected = decode_all(STREAM)
    for cut in range(len(STREAM) + 1):
        decoder = f.FrameDecoder()
        decoder.feed(STREAM[:cut])
        got = list(decoder)
        decoder.feed(STREAM[cut:])
        got += list(decoder)
        assert got == expected, cut


def test_one_byte_at_a_time():
    decoder = f.FrameDecoder()
    got = []
    for i in range(len(STREAM)):
        decoder.feed(STREAM[i:i + 1])
        got += list(decoder)
    assert got == ALL
    assert decoder.buffered_bytes == 0


# ---------------------------------------------------------------- errors


def test_frame_over_frame_max_is_frame_too_large_and_ends_decoding():
    data = f.encode(f.Publish(1, [(1, b"x" * 100)]))
    decoder = f.FrameDecoder(frame_max=len(data) - 5)
    decoder.feed(f.encode(f.Heartbeat()) + data[:8])  # refused from its size alone
    assert next(decoder) == f.Heartbeat()
    with pytest.raises(f.FrameError) as e:
        next(decoder)
    assert e.value.code == f.FRAME_TOO_LARGE
    decoder.feed(f.encode(f.Heartbeat()))
    assert list(decoder) == []
    assert decode_all(data, frame_max=len(data) - 4) == [f.Publish(1, [(1, b"x" * 100)])]


@pytest.mark.parametrize("body", [
    b"\x00\x2a\x00\x01",  # unknown key
    b"\x00\x01\x00\x02" + bytes(20),  # declare publisher has no version 2
    b"\x00\x17\x00\x01\x00",  # heartbeat with a byte left over
    b"\x00\x0f\x00\x01\x00\x00\x00\x01\xff\xff\xff\xff",  # metadata asking for 4 billion streams
    b"\x00\x1a\x00\x01\x00\x00\x00\x01\x01\x02",  # consumer update, active neither 0 nor 1
    b"\x00\x07\x00\x01\x00\x00\x00\x01\x01\x00\x01s\x00\x09\x00\x01",  # subscribe, offset type 9
    b"\x00",  # shorter than a key and a version
])
def test_malformed_frames_are_unknown_frame(body):
    with pytest.raises(f.FrameError) as e:
        decode_all(struct.pack(">I", len(body)) + body)
    assert e.value.code == f.UNKNOWN_FRAME


def test_decoding_goes_on_after_a_malformed_frame():
    bad = struct.pack(">IHH", 5, f.KEY_HEARTBEAT, 1) + b"\x00"
    decoder = f.FrameDecoder()
    decoder.feed(bad + f.encode(f.Heartbeat()))
    with pytest.raises(f.FrameError):
        next(decoder)
    assert list(decoder) == [f.Heartbeat()]


def _drain(decoder: f.FrameDecoder) -> None:
    """Decode until the decoder needs more bytes; every step consumes a frame or stops."""
    for _ in range(10_000):
        try:
            next(decoder)
        except StopIteration:
            return
        except f.FrameError:
            pass
    raise AssertionError("decoder did not stop")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=512), frame_max=st.sampled_from([0, 64, 8192]), cut=st.integers(0, 512))
def test_fuzz_random_bytes_raise_only_frame_error(data, frame_max, cut):
    decoder = f.FrameDecoder(frame_max)
    decoder.feed(data[:cut])
    _drain(decoder)
    decoder.feed(data[cut:])
    _drain(decoder)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=64), key=st.sampled_from(sorted({c.KEY for c in f.COMMANDS})), version=st.integers(1, 2))
def test_fuzz_random_bodies_of_known_keys_raise_only_frame_error(body, key, version):
    try:
        f.decode_body(struct.pack(">HH", key, version) + body)
    except f.FrameError:
        pass


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(picks=st.lists(st.sampled_from(range(len(ALL))), min_size=1, max_size=6),
       edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255), st.sampled_from("sid")), max_size=6),
       cuts=st.lists(st.integers(0, 10_000), max_size=4))
def test_fuzz_mutated_valid_frames_raise_only_frame_error(picks, edits, cuts):
    data = bytearray(b"".join(f.encode(ALL[i]) for i in picks))
    for where, byte, how in edits:
        i = where % (len(data) + 1)
        if how == "s" and i < len(data):
            data[i] = byte
        elif how == "i":
            data[i:i] = bytes([byte])
        elif how == "d":
            del data[i:i + 1]
    decoder = f.FrameDecoder(frame_max=4096)
    start = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts) + [len(data)]:
        decoder.feed(bytes(data[start:cut]))
        start = cut
        _drain(decoder)


@settings(max_examples=200, deadline=None)
@given(pid=st.integers(0, 255), msgs=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.binary(max_size=40)), max_size=20),
       text=st.text(max_size=20), props=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4))
def test_generated_commands_round_trip(pid, msgs, text, props):
    for cmd in (f.Publish(pid, msgs), f.PublishV2(pid, [(i, text, m) for i, m in msgs]),
                f.Create(1, text, props), f.PeerPropertiesResponse(2, f.OK, props),
                f.Subscribe(3, pid, text, f.OFFSET_TYPE_LAST, None, 10, props)):
        assert decode_all(f.encode(cmd)) == [cmd]


def test_the_protocol_core_imports_only_the_standard_library():
    import ast
    import sys
    from pathlib import Path

    from hutch.streamproto import connection

    for module in (f, connection):
        tree = ast.parse(Path(module.__file__).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or name.startswith("hutch.streamproto") or top == "__future__", name
