"""The stream-protocol client of `hutch perf` (hutch.lab.streamperf): URIs, offset specs, Create
arguments, the messages it publishes and how its consumer reads a chunk without decoding it."""

from __future__ import annotations

import pytest

from hutch.lab.perf import PerfConfig
from hutch.lab.streamperf import (
    CONFIRM_WINDOW_DEFAULT,
    STAMP,
    MessageTemplate,
    StreamEndpoint,
    create_arguments,
    first_stamp,
    offset_spec,
    record_stamps,
)
from hutch.streamproto import amqp10
from hutch.streamproto import chunk as chunks
from hutch.streamproto import frames as f


def test_uri_gives_host_port_credentials_and_vhost():
    ep = StreamEndpoint.from_uri("rabbitmq-stream://u%40x:p%2Fw@10.0.0.5:5553/v%2Fh")
    assert (ep.host, ep.port, ep.user, ep.password, ep.vhost) == ("10.0.0.5", 5553, "u@x", "p/w", "v/h")
    default = StreamEndpoint.from_uri("rabbitmq-stream://127.0.0.1")
    assert (default.port, default.user, default.vhost) == (5552, "guest", "/")
    assert default.at("localhost", 6000) == StreamEndpoint("localhost", 6000, "guest", "guest", "/")


def test_uri_of_another_protocol_is_refused():
    with pytest.raises(ValueError, match="rabbitmq-stream"):
        StreamEndpoint.from_uri("amqp://guest:guest@127.0.0.1:5672/%2F")


def test_offset_specs():
    assert offset_spec("first") == (f.OFFSET_TYPE_FIRST, None)
    assert offset_spec("last") == (f.OFFSET_TYPE_LAST, None)
    assert offset_spec("next") == (f.OFFSET_TYPE_NEXT, None)
    assert offset_spec("1234") == (f.OFFSET_TYPE_OFFSET, 1234)
    for bad in ("-1", "somewhere"):
        with pytest.raises(ValueError):
            offset_spec(bad)


def test_queue_arguments_become_create_arguments():
    args = {"x-queue-type": "stream", "x-initial-cluster-size": 3, "max-length-bytes": 10**9}
    assert create_arguments(args) == {"initial-cluster-size": "3", "max-length-bytes": "1000000000"}


def test_messages_are_amqp10_data_sections_stamped_with_time_and_id():
    t = MessageTemplate(1024)
    batch = t.batch(ts_ns=777, first_pid=5, first_id=(3 << 32) + 10, n=3)
    assert [pid for pid, _ in batch] == [5, 6, 7]
    for j, (_, m) in enumerate(batch):
        assert len(m) == t.record_size
        body = amqp10.Message.decode(m).body
        assert len(body) == 1024
        assert STAMP.unpack_from(body) == (777, (3 << 32) + 10 + j)


def test_a_publish_frame_carries_the_batch_as_the_server_decodes_it():
    t = MessageTemplate(64)
    batch = t.batch(1, 1, 0, 100)
    frame = f.encode(f.Publish(0, batch))
    cmd = f.decode_body(frame[4:])
    assert cmd.publisher_id == 0
    assert [(pid, bytes(m)) for pid, m in cmd.messages] == batch


def test_consumer_reads_the_first_stamp_from_the_chunk_without_decoding_records():
    t = MessageTemplate(100)
    records = [m for _, m in t.batch(42_000, 1, 9, 4)]
    c = chunks.encode(records, timestamp=1, epoch=1, first_offset=0)
    h = chunks.read_header(c)
    assert h.num_records == 4
    assert first_stamp(memoryview(c), h) == (42_000, 9)
    assert record_stamps(c) == [(42_000, 9), (42_000, 10), (42_000, 11), (42_000, 12)]


def test_small_bodies_use_the_short_data_section():
    t = MessageTemplate(16)  # str8-sized binary: a 5-byte section header
    assert t.stamp_at == 5
    c = chunks.encode([m for _, m in t.batch(5, 1, 6, 1)], timestamp=1, epoch=1)
    assert first_stamp(c, chunks.read_header(c)) == (5, 6)


def test_a_chunk_of_other_clients_messages_gives_no_stamp():
    c = chunks.encode([b"\x00\x53\x77\xa1\x05hello" + bytes(16)], timestamp=1, epoch=1)  # an amqp-value
    assert first_stamp(c, chunks.read_header(c)) is None
    short = chunks.encode([b"x"], timestamp=1, epoch=1)
    assert first_stamp(short, chunks.read_header(short)) is None


def test_stream_mode_confirms_with_a_default_window_and_refuses_amqp_only_options():
    cfg = PerfConfig(uris=["rabbitmq-stream://127.0.0.1:5552/%2F"], protocol="stream", size=1024)
    cfg.validate()
    assert cfg.confirm == CONFIRM_WINDOW_DEFAULT
    assert not cfg.draining
    for bad in ({"record_dir": "/tmp/x"}, {"autoack": True}, {"qos": 10}, {"offset": "nowhere"},
                {"credit": 0}, {"batch_size": 0}, {"uris": ["amqp://127.0.0.1"]}):
        with pytest.raises(ValueError):
            PerfConfig(**{"uris": ["rabbitmq-stream://127.0.0.1"], "protocol": "stream", **bad}).validate()


def test_errors_name_the_response_code_as_the_protocol_does():
    from hutch.lab.streamperf import StreamError

    e = StreamError(f.STREAM_DOES_NOT_EXIST, "Subscribe refused for stream 's'")
    assert str(e) == "Subscribe refused for stream 's': stream_does_not_exist (0x02)"
    assert "response code (0x7f)" in str(StreamError(0x7F, "Close"))


def test_a_publish_frame_stays_within_frame_max():
    from hutch.lab.streamperf import batch_max

    t = MessageTemplate(1024)
    assert batch_max(1048576, t.record_size, 100) == 100
    n = batch_max(65536, t.record_size, 100)
    assert n == 62
    assert len(f.encode(f.Publish(0, t.batch(1, 1, 0, n)))) <= 65536
    assert len(f.encode(f.Publish(0, t.batch(1, 1, 0, n + 1)))) > 65536
    assert batch_max(100, t.record_size, 100) == 1  # never nothing: the server says what it takes
