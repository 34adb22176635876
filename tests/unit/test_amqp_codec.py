"""hutch.amqp.codec against pamqp, the generic AMQP 0-9-1 codec it wraps.

Every method in pamqp's table must survive `codec.method_frame` -> `codec.decode_method`, and
the hand-written hot-path encoders (basic.deliver, basic.get-ok, basic.return, confirms,
content header and body frames split at frame_max) must produce exactly the bytes pamqp's
generic marshalling produces (spec 4.2.3 frame layout, 4.2.6 content framing). On the way
in, `decode_publish` and `summarize_properties` must read what pamqp reads.
"""

from __future__ import annotations

import datetime
import decimal
import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pamqp import body as pbody
from pamqp import commands, frame
from pamqp import header as pheader

from hutch.amqp import codec, spec
from hutch.amqp.events import Method

# basic.recover-async is deprecated in 0-9-1 and pamqp says so each time one is built
pytestmark = pytest.mark.filterwarnings("ignore:This command is deprecated in AMQP 0-9-1:DeprecationWarning")

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------ strategies

utf8_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=24)
# exchange and queue names pamqp accepts (its DOMAIN_REGEX), within a short string
names = st.text(alphabet="abcXYZ019-_.:@#,/+ ", max_size=40)
short_texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)


def _utc_seconds(dt: datetime.datetime) -> datetime.datetime:
    return dt.replace(microsecond=0)


# pamqp reads a timestamp above 2**32 as milliseconds, so stay within 1970..2106
timestamps = st.datetimes(min_value=datetime.datetime(1970, 1, 2), max_value=datetime.datetime(2105, 1, 1),
                          timezones=st.just(datetime.UTC)).map(_utc_seconds)

scalar_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1),
    st.floats(width=32, allow_nan=False),  # table floats travel as 'f' (single precision)
    st.builds(lambda m, s: decimal.Decimal(m).scaleb(-s), st.integers(0, 2 ** 31 - 1), st.integers(0, 12)),
    utf8_text,
    st.binary(max_size=16).map(bytearray),
    timestamps,
)
table_keys = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
field_values = st.recursive(
    scalar_values,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(table_keys, inner, max_size=4)),
    max_leaves=12,
)
field_tables = st.dictionaries(table_keys, field_values, max_size=5)

basic_properties = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | short_texts,
    content_encoding=st.none() | short_texts,
    headers=st.none() | field_tables,
    delivery_mode=st.none() | st.integers(1, 2),
    priority=st.none() | st.integers(0, 255),
    correlation_id=st.none() | short_texts,
    reply_to=st.none() | short_texts,
    expiration=st.none() | st.integers(0, 10 ** 9).map(str),
    message_id=st.none() | short_texts,
    timestamp=st.none() | timestamps,
    message_type=st.none() | short_texts,
    user_id=st.none() | short_texts,
    app_id=st.none() | short_texts,
    cluster_id=st.just(""),  # deprecated: pamqp requires it empty
)

# fields pamqp's validate() pins to one value
_PINNED = {"ticket": 0, "capabilities": "", "known_hosts": "", "out_of_band": "0", "channel_id": "0",
           "insist": False, "cluster_id": ""}
_BY_TYPE = {
    "octet": st.integers(0, 255),
    "short": st.integers(0, 0xFFFF),
    "long": st.integers(0, 0xFFFFFFFF),
    "longlong": st.integers(0, 2 ** 63 - 1),  # pamqp packs longlong signed
    "bit": st.booleans(),
    "shortstr": names,
    "longstr": utf8_text,
    "table": field_tables,
}

ALL_METHODS = sorted(commands.INDEX_MAPPING.items())


def method_strategy(cls) -> st.SearchStrategy:
    fields = {name: st.just(_PINNED[name]) if name in _PINNED else _BY_TYPE[cls.amqp_type(name)]
              for name in cls.__slots__}
    return st.fixed_dictionaries(fields)


def assert_same_method(got, want) -> None:
    assert type(got) is type(want)
    for name in want.__slots__:
        assert getattr(got, name) == getattr(want, name), name


def build(cls, kwargs):
    try:
        return cls(**kwargs)
    except ValueError:  # a value pamqp's validate() refuses (e.g. a name it forbids)
        assume(False)


# ------------------------------------------------------------------ method table

def test_codec_method_table_is_pamqps_whole_table():
    assert len(codec.METHODS) == 64
    assert codec.METHODS[0x003C0028] is commands.Basic.Publish


@pytest.mark.parametrize("index,cls", ALL_METHODS, ids=[c.name for _i, c in ALL_METHODS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_method_round_trips_through_method_frame_and_decode_method(index, cls, data):
    method = build(cls, data.draw(method_strategy(cls)))
    channel = data.draw(st.integers(0, 0xFFFF))
    raw = codec.method_frame(channel, method)
    assert raw == frame.marshal(method, channel)  # byte for byte what pamqp produces
    ftype, ch, size = struct.unpack_from(">BHI", raw)
    assert (ftype, ch, size + 8, raw[-1]) == (spec.FRAME_METHOD, channel, len(raw), spec.FRAME_END)
    assert struct.unpack_from(">I", raw, 7)[0] == index
    assert_same_method(codec.decode_method(raw[7:-1]), method)


# methods the connection core turns into their own events (or refuses on a non-zero channel)
_OWN_EVENTS = {"Channel.Open", "Channel.Close", "Channel.CloseOk", "Channel.Flow", "Basic.Publish",
               "Basic.Ack", "Basic.Nack", "Basic.Reject"}
PASSED_THROUGH = [(i, c) for i, c in ALL_METHODS if i >> 16 != 10 and c.name not in _OWN_EVENTS]


@pytest.mark.parametrize("index,cls", PASSED_THROUGH, ids=[c.name for _i, c in PASSED_THROUGH])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_methods_on_an_open_channel_reach_the_broker_as_method_events(amqp, index, cls, data):
    method = build(cls, data.draw(method_strategy(cls)))
    conn = amqp.open_connection(channels=(7,))
    (ev,) = amqp.feed(conn, codec.method_frame(7, method))
    assert type(ev) is Method and ev.channel == 7
    assert_same_method(ev.method, method)
    assert conn.is_open and amqp.output(conn) == b""


def test_unknown_method_index_is_command_invalid():
    with pytest.raises(spec.AMQPError) as e:
        codec.decode_method(struct.pack(">HH", 60, 99))
    assert e.value.code == spec.COMMAND_INVALID


def test_truncated_method_arguments_fail_only_as_frame_errors():
    raw = codec.method_frame(1, commands.Queue.Declare(queue="q", arguments={"x-max-length": 10}))
    payload = raw[7:-1]
    for cut in range(4, len(payload)):
        try:
            codec.decode_method(payload[:cut])
        except spec.AMQPError as e:  # RabbitMQ: frame_error "cannot decode"
            assert e.code == spec.FRAME_ERROR
            assert (e.class_id, e.method_id) == (50, 10)


def test_deeply_nested_table_is_a_frame_error_not_a_crash():
    inner = b"V"
    for _ in range(3000):  # far deeper than any recursive decoder can follow
        inner = b"F" + struct.pack(">I", len(inner) + 2) + b"\x01k" + inner
    table = struct.pack(">I", len(inner) + 2) + b"\x01k" + inner
    payload = struct.pack(">HHH", 50, 10, 0) + b"\x01q" + b"\x00" + table
    with pytest.raises(spec.AMQPError) as e:
        codec.decode_method(payload)
    assert e.value.code == spec.FRAME_ERROR


# ------------------------------------------------------------------ content framing (spec 4.2.6)

def reference_content(channel: int, props: commands.Basic.Properties, body: bytes, frame_max: int) -> bytes:
    """Content as pamqp marshals it, split by the spec's rule: body frames of at most
    frame_max - 8 payload bytes, no body frame at all for an empty body."""
    out = [frame.marshal(pheader.ContentHeader(0, len(body), props), channel)]
    chunk = frame_max - 8
    for off in range(0, len(body), chunk):
        out.append(frame.marshal(pbody.ContentBody(body[off:off + chunk]), channel))
    return b"".join(out)


def joined(parts) -> bytes:
    return b"".join(bytes(p) for p in parts)


@pytest.mark.parametrize("frame_max", [4096, 4097, 131072])
def test_content_frames_split_at_frame_max_boundaries(amqp, frame_max):
    chunk = frame_max - 8
    props = commands.Basic.Properties(content_type="text/plain", delivery_mode=2)
    for size in (0, 1, chunk - 1, chunk, chunk + 1, 2 * chunk, 2 * chunk + 1, 3 * chunk):
        body = bytes(i % 251 for i in range(size))
        got = joined(codec.content_frames(3, props.marshal(), body, frame_max))
        assert got == reference_content(3, props, body, frame_max), size
        frames = amqp.parse(got)
        assert frames[0].type == spec.FRAME_HEADER
        bodies = frames[1:]
        assert len(bodies) == -(-size // chunk)  # exact multiples: no empty trailing frame
        assert all(f.type == spec.FRAME_BODY and 0 < len(f.payload) <= chunk for f in bodies)
        assert all(8 + len(f.payload) <= frame_max for f in frames)
        assert b"".join(f.payload for f in bodies) == body


@FAST
@given(channel=st.integers(1, 0xFFFF), ctag=names, tag=st.integers(1, 2 ** 63 - 1), redelivered=st.booleans(),
       exchange=names, routing_key=short_texts, props=basic_properties,
       frame_max=st.sampled_from([4096, 4100, 8192, 131072]),
       size=st.one_of(st.integers(0, 9000), st.sampled_from([0, 4088, 8176, 4092, 8184])))
def test_deliver_frames_match_pamqp(channel, ctag, tag, redelivered, exchange, routing_key, props, frame_max, size):
    body = bytes(size % 7 for _ in range(size))
    got = joined(codec.deliver_frames(channel, codec.shortstr(ctag), tag, redelivered,
                                      codec.route_encoding(exchange, routing_key), props.marshal(), body, frame_max))
    want = frame.marshal(commands.Basic.Deliver(consumer_tag=ctag, delivery_tag=tag, redelivered=redelivered,
                                                exchange=exchange, routing_key=routing_key), channel)
    assert got == want + reference_content(channel, props, body, frame_max)


@FAST
@given(channel=st.integers(1, 0xFFFF), tag=st.integers(1, 2 ** 63 - 1), redelivered=st.booleans(),
       exchange=names, routing_key=short_texts, count=st.integers(0, 0xFFFFFFFF), props=basic_properties,
       frame_max=st.sampled_from([4096, 131072]), size=st.integers(0, 9000))
def test_get_ok_frames_match_pamqp(channel, tag, redelivered, exchange, routing_key, count, props, frame_max, size):
    body = b"g" * size
    got = joined(codec.get_ok_frames(channel, tag, redelivered, codec.route_encoding(exchange, routing_key), count,
                                     props.marshal(), body, frame_max))
    want = frame.marshal(commands.Basic.GetOk(delivery_tag=tag, redelivered=redelivered, exchange=exchange,
                                              routing_key=routing_key, message_count=count), channel)
    assert got == want + reference_content(channel, props, body, frame_max)


@FAST
@given(channel=st.integers(1, 0xFFFF), code=st.sampled_from([spec.NO_ROUTE, spec.NO_CONSUMERS]),
       text=st.sampled_from(["NO_ROUTE", "NO_CONSUMERS", ""]), exchange=names, routing_key=short_texts,
       props=basic_properties, frame_max=st.sampled_from([4096, 131072]), size=st.integers(0, 9000))
def test_return_frames_match_pamqp(channel, code, text, exchange, routing_key, props, frame_max, size):
    body = b"r" * size
    got = joined(codec.return_frames(channel, code, text, codec.route_encoding(exchange, routing_key),
                                     props.marshal(), body, frame_max))
    want = frame.marshal(commands.Basic.Return(reply_code=code, reply_text=text, exchange=exchange,
                                               routing_key=routing_key), channel)
    assert got == want + reference_content(channel, props, body, frame_max)


@FAST
@given(channel=st.integers(0, 0xFFFF), tag=st.integers(0, 2 ** 63 - 1), multiple=st.booleans())
def test_confirm_frames_match_pamqp_ack_and_nack(channel, tag, multiple):
    assert codec.confirm_frame(channel, tag, multiple) == frame.marshal(
        commands.Basic.Ack(delivery_tag=tag, multiple=multiple), channel)
    assert codec.confirm_frame(channel, tag, multiple, nack=True) == frame.marshal(
        commands.Basic.Nack(delivery_tag=tag, multiple=multiple, requeue=False), channel)


def test_heartbeat_frame_is_type_8_on_channel_0_with_no_payload():
    from pamqp import heartbeat
    assert codec.HEARTBEAT_FRAME == frame.marshal(heartbeat.Heartbeat(), 0)


def test_shortstr_refuses_more_than_255_bytes():
    assert codec.shortstr("é" * 127) == bytes([254]) + ("é" * 127).encode()
    with pytest.raises(ValueError):
        codec.shortstr("é" * 128)


# ------------------------------------------------------------------ decoding the hot path

@FAST
@given(exchange=names, routing_key=short_texts, mandatory=st.booleans(), immediate=st.booleans())
def test_decode_publish_agrees_with_pamqp(exchange, routing_key, mandatory, immediate):
    m = commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory,
                               immediate=immediate)
    payload = codec.method_frame(1, m)[7:-1]
    ex, rk, route_enc, mand, imm = codec.decode_publish(payload)
    ref = codec.decode_method(payload)
    assert (ex, rk, mand, imm) == (ref.exchange, ref.routing_key, ref.mandatory, ref.immediate)
    assert route_enc == codec.route_encoding(exchange, routing_key)


def test_decode_publish_refuses_every_truncation_with_an_amqp_error():
    payload = codec.method_frame(1, commands.Basic.Publish(exchange="amq.topic", routing_key="a.b.c"))[7:-1]
    for cut in range(0, len(payload)):
        with pytest.raises(spec.AMQPError) as e:
            codec.decode_publish(payload[:cut])
        assert e.value.code == spec.FRAME_ERROR and (e.value.class_id, e.value.method_id) == (60, 40)


def test_decode_publish_refuses_invalid_utf8_routing_key():
    payload = struct.pack(">HHH", 60, 40, 0) + b"\x00" + b"\x02\xff\xfe" + b"\x00"
    with pytest.raises(spec.AMQPError) as e:
        codec.decode_publish(payload)
    assert e.value.code == spec.FRAME_ERROR


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(props=basic_properties)
def test_summarize_properties_agrees_with_pamqp(props):
    raw = props.marshal()
    ref = codec.decode_properties(raw)
    s = codec.summarize_properties(raw)
    assert s.delivery_mode == (ref.delivery_mode or 0)
    assert s.priority == (ref.priority or 0)
    assert s.expiration == ref.expiration
    assert s.user_id == ref.user_id
    assert (s.headers_span is None) == (ref.headers is None)
    assert codec.decode_headers(raw, s.headers_span) == (ref.headers or {})
    assert codec.decode_headers(raw, s.headers_span) == (props.headers or {})


@FAST
@given(props=basic_properties.filter(lambda p: p.marshal() != b"\x00\x00"), data=st.data())
def test_summarize_properties_refuses_truncated_property_lists(props, data):
    raw = props.marshal()
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(spec.AMQPError) as e:
        codec.summarize_properties(raw[:cut])
    assert e.value.code == spec.SYNTAX_ERROR


def test_summarize_properties_reads_empty_strings_and_no_properties():
    assert codec.summarize_properties(b"\x00\x00").headers_span is None
    # expiration and user_id present but empty (pamqp never sends these, other clients may)
    raw = struct.pack(">H", (1 << 8) | (1 << 4)) + b"\x00" + b"\x00"
    s = codec.summarize_properties(raw)
    assert (s.expiration, s.user_id) == ("", "")


def test_decode_headers_refuses_a_malformed_table():
    raw = struct.pack(">H", 1 << 13) + struct.pack(">I", 3) + b"\x01k?"  # '?' is no field type
    s = codec.summarize_properties(raw)
    with pytest.raises(spec.AMQPError) as e:
        codec.decode_headers(raw, s.headers_span)
    assert e.value.code == spec.SYNTAX_ERROR


def test_decode_content_header_reads_class_size_and_raw_props():
    props = commands.Basic.Properties(delivery_mode=2).marshal()
    payload = frame.marshal(pheader.ContentHeader(0, 123456789012, commands.Basic.Properties(delivery_mode=2)),
                            5)[7:-1]
    assert codec.decode_content_header(payload) == (60, 123456789012, props)
    with pytest.raises(spec.AMQPError) as e:
        codec.decode_content_header(payload[:13])
    assert e.value.code == spec.FRAME_ERROR


def test_encode_table_round_trips_through_decode_headers():
    table = {"x-death": [{"count": 1, "reason": "expired"}], "n": 5}
    raw = struct.pack(">H", 1 << 13) + codec.encode_table(table)
    assert codec.decode_headers(raw, codec.summarize_properties(raw).headers_span) == table


# -- editing properties in place (dead-lettering, direct reply-to) -------------------------------

def test_edit_properties_keeps_every_untouched_header_byte_for_byte():
    # a Java-style publisher's headers: a 32-bit int, a long, a byte, a nested table
    raw_headers = (codec.shortstr("retries") + b"I" + struct.pack(">i", 3)
                   + codec.shortstr("big") + b"l" + struct.pack(">q", 7)
                   + codec.shortstr("tiny") + b"b" + b"\x01"
                   + codec.shortstr("nested") + b"F" + struct.pack(">I", 10) + codec.shortstr("k") + b"S"
                   + struct.pack(">I", 3) + b"v" * 3)
    props = (struct.pack(">H", 0b0011_0001_0000_0000) + struct.pack(">I", len(raw_headers)) + raw_headers
             + b"\x02" + codec.shortstr("60000"))
    edited = codec.edit_properties(props, set_headers={"x-first-death-reason": codec.typed_value("expired")},
                                   drop=("expiration",))
    s = codec.summarize_properties(edited)
    assert s.expiration is None and s.delivery_mode == 2
    entries = dict(codec.table_entries(edited[s.headers_span[0] + 4:s.headers_span[1]]))
    assert entries["retries"] == b"I" + struct.pack(">i", 3)
    assert entries["big"] == b"l" + struct.pack(">q", 7)
    assert entries["tiny"] == b"b\x01"
    assert entries["x-first-death-reason"] == b"S" + struct.pack(">I", 7) + b"expired"
    assert codec.decode_headers(edited, s.headers_span)["nested"] == {"k": "vvv"}


def test_typed_value_writes_counts_as_signed_64_bit_as_rabbitmq_does():
    assert codec.typed_value(1) == b"l" + struct.pack(">q", 1)
    assert codec.typed_value(["a"]) == b"A" + struct.pack(">I", 6) + b"S" + struct.pack(">I", 1) + b"a"


def test_edit_properties_replaces_reply_to():
    props = codec.edit_properties(b"\x00\x00", set_shortstr={"reply_to": "amq.rabbitmq.reply-to.abc"})
    assert codec.decode_properties(props).reply_to == "amq.rabbitmq.reply-to.abc"
