"""The AMQP 1.0 message format streams store (hutch.streamproto.amqp10).

- The type system (OASIS AMQP 1.0 part 1): every type round-trips with its type kept, the
  encodings given in the spec decode to what it says, and the decoder is total: whatever the
  bytes, it returns a value or raises AmqpDecodeError, never another exception.
- The message sections (part 3 §3.2): encode, decode, and messages written and read by the
  stream clients' own codecs (rstream, rbfly).
- The mapping to and from AMQP 0-9-1 content as RabbitMQ 3.13 does it (mc_amqpl / mc_amqp):
  properties, headers (nested tables too), message and correlation ids, x-death.
"""

from __future__ import annotations

import datetime
import math
import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from hutch.amqp import codec
from hutch.streamproto.amqp10 import (
    AMQP10_TYPE,
    NO_PROPERTIES,
    NO_VALUE,
    AmqpDecodeError,
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Float,
    Header,
    Int,
    Message,
    Properties,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
    decode_value,
    encode_value,
    from_basic,
    to_basic,
)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOME = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- values and their types

def typed(v):
    """A value with every type made explicit, floats by their bits (NaN equals NaN)."""
    if isinstance(v, Array):
        return ("array", v.element_type.__name__, typed(v.descriptor), [typed(x) for x in v])
    if isinstance(v, list):
        return ("list", [typed(x) for x in v])
    if isinstance(v, dict):
        return ("map", [(typed(k), typed(x)) for k, x in v.items()])
    if isinstance(v, Described):
        return ("described", typed(v.descriptor), typed(v.value))
    if isinstance(v, Float):
        return ("float", struct.pack(">f", v))
    if isinstance(v, float):
        return ("double", struct.pack(">d", v))
    return (type(v).__name__, v)


def ranged(cls, lo, hi):
    return st.integers(lo, hi).map(cls)


LEAVES = {
    type(None): st.none(),
    bool: st.booleans(),
    UByte: ranged(UByte, 0, 2**8 - 1),
    UShort: ranged(UShort, 0, 2**16 - 1),
    UInt: st.one_of(st.just(UInt(0)), ranged(UInt, 0, 255), ranged(UInt, 0, 2**32 - 1)),
    ULong: st.one_of(st.just(ULong(0)), ranged(ULong, 0, 255), ranged(ULong, 0, 2**64 - 1)),
    Byte: ranged(Byte, -2**7, 2**7 - 1),
    Short: ranged(Short, -2**15, 2**15 - 1),
    Int: st.one_of(ranged(Int, -128, 127), ranged(Int, -2**31, 2**31 - 1)),
    int: st.one_of(st.integers(-128, 127), st.integers(-2**63, 2**63 - 1)),
    Float: st.floats(width=32).map(Float),
    float: st.floats(),
    Timestamp: ranged(Timestamp, -2**63, 2**63 - 1),
    Char: st.characters(exclude_categories=("Cs",)).map(Char),
    uuid.UUID: st.uuids(),
    bytes: st.one_of(st.binary(max_size=20), st.binary(min_size=256, max_size=300)),
    str: st.one_of(st.text(max_size=20), st.text(min_size=256, max_size=300)),
    Symbol: st.one_of(st.text("abcxyz-:.", max_size=20), st.text("ab", min_size=256, max_size=260)).map(Symbol),
    Decimal32: st.binary(min_size=4, max_size=4).map(Decimal32),
    Decimal64: st.binary(min_size=8, max_size=8).map(Decimal64),
    Decimal128: st.binary(min_size=16, max_size=16).map(Decimal128),
}
HASHABLE = st.one_of(*(s for t, s in LEAVES.items() if t not in (float, Float)))  # NaN keys never match


def arrays(children):
    simple = st.sampled_from(sorted(LEAVES, key=lambda t: t.__name__)).flatmap(
        lambda t: st.lists(LEAVES[t], max_size=5).map(lambda xs: Array(xs, t)))
    nested = st.one_of(
        st.lists(st.lists(children, max_size=3), max_size=3).map(lambda xs: Array(xs, list)),
        st.lists(st.dictionaries(HASHABLE, children, max_size=3), max_size=3).map(lambda xs: Array(xs, dict)),
        st.lists(LEAVES[Symbol], max_size=3).map(lambda xs: Array(xs, Symbol, descriptor=ULong(0x77))),
    )
    return st.one_of(simple, nested)


VALUES = st.recursive(
    st.one_of(*LEAVES.values()),
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(HASHABLE, children, max_size=6),
        arrays(children),
        st.builds(Described, st.one_of(LEAVES[ULong], LEAVES[Symbol]), children),
    ),
    max_leaves=30,
)


@FAST
@given(VALUES)
def test_every_type_round_trips_with_its_type(v):
    assert typed(decode_value(encode_value(v))) == typed(v)


def test_long_lists_and_maps_take_the_32_bit_forms():
    items = [i if i % 3 else ("s" * (i % 300) if i % 2 else b"b" * i) for i in range(400)]
    encoded = encode_value(items)
    assert encoded[0] == 0xD0
    assert typed(decode_value(encoded)) == typed(items)
    m = {str(i): x for i, x in enumerate(items)}
    assert encode_value(m)[0] == 0xD1
    assert typed(decode_value(encode_value(m))) == typed(m)


# Encodings as part 1 §1.6 of the spec gives them.
SPEC_VECTORS = [
    ("40", None), ("41", True), ("42", False), ("5601", True), ("5600", False),
    ("50ff", UByte(255)), ("60ffff", UShort(65535)), ("43", UInt(0)), ("5207", UInt(7)),
    ("7000010000", UInt(65536)), ("44", ULong(0)), ("5370", ULong(0x70)),
    ("80ffffffffffffffff", ULong(2**64 - 1)), ("51ff", Byte(-1)), ("618000", Short(-32768)),
    ("54ff", Int(-1)), ("7180000000", Int(-2**31)), ("5580", -128),
    ("817fffffffffffffff", 2**63 - 1), ("723f800000", Float(1.0)), ("82400921fb54442d18", math.pi),
    ("7300000041", Char("A")), ("730001f600", Char("\U0001F600")), ("830000018bcfe56800", Timestamp(1700000000000)),
    ("98" + "12345678123456781234567812345678", uuid.UUID("12345678-1234-5678-1234-567812345678")),
    ("a003010203", b"\x01\x02\x03"), ("b000000003010203", b"\x01\x02\x03"),
    ("a10568656c6c6f", "hello"), ("b10000000568656c6c6f", "hello"), ("a1026869", "hi"),
    ("a303666f6f", Symbol("foo")), ("b300000003666f6f", Symbol("foo")),
    ("45", []), ("c0030241" "42", [True, False]), ("d0000000060000000241" "42", [True, False]),
    ("c10702a30161a10162", {Symbol("a"): "b"}), ("d1000000080000000243" "a10162", {UInt(0): "b"}),
    ("e00402500102", Array([UByte(1), UByte(2)], UByte)),
    ("f0000000070000000250" "0102", Array([UByte(1), UByte(2)], UByte)),
    ("e00803a3016101620163", Array([Symbol("a"), Symbol("b"), Symbol("c")], Symbol)),
    ("f00000000d0000000270" "00000001" "00000002", Array([UInt(1), UInt(2)], UInt)),
    ("e0020540", Array([None] * 5, type(None))),
    ("e00702005370500102", Array([UByte(1), UByte(2)], UByte, descriptor=ULong(0x70))),
    ("005370c0020141", Described(ULong(0x70), [True])),
    ("00a30a616d71703a7468696e6745", Described(Symbol("amqp:thing"), [])),
    ("7401020304", Decimal32(b"\x01\x02\x03\x04")),
]


@pytest.mark.parametrize("hexed,value", SPEC_VECTORS)
def test_spec_encodings_decode_to_what_the_spec_says(hexed, value):
    assert typed(decode_value(bytes.fromhex(hexed))) == typed(value)


@pytest.mark.parametrize("value,hexed", [
    (None, "40"), (True, "41"), (False, "42"), (UInt(0), "43"), (UInt(255), "52ff"), (UInt(256), "7000000100"),
    (ULong(0), "44"), (ULong(7), "5307"), (0, "5500"), (-129, "81ffffffffffffff7f"), (Int(5), "5405"),
    ("", "a100"), ("x" * 256, "b100000100" + "78" * 256), ([], "45"), ({}, "c10100"),
    (Symbol("x-opt"), "a305782d6f7074"), (Timestamp(0), "830000000000000000"),
])
def test_encoder_writes_the_shortest_form(value, hexed):
    assert encode_value(value).hex() == hexed


@pytest.mark.parametrize("value", [UByte(256), UInt(-1), ULong(2**64), Byte(128), Short(2**15), Int(2**31),
                                   2**63, Float(1e39), Char("ab")])
def test_values_out_of_their_types_range_are_refused(value):
    with pytest.raises(ValueError):
        encode_value(value)


def test_a_python_type_with_no_amqp_meaning_is_refused():
    with pytest.raises(TypeError):
        encode_value(object())


# ---------------------------------------------------------------- the decoder is total

def assert_total(data: bytes) -> None:
    for decode in (decode_value, Message.decode, to_basic):
        try:
            decode(data)
        except AmqpDecodeError as e:
            assert str(e)


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_raise_nothing_but_amqp_decode_error(data):
    assert_total(data)


@FUZZ
@given(VALUES, st.data())
def test_mutated_encodings_raise_nothing_but_amqp_decode_error(v, data):
    encoded = bytearray(Message(value=v).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(encoded) - 1))
        encoded[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(encoded)))
    assert_total(bytes(encoded[:cut]))
    assert_total(bytes(encoded))


@FUZZ
@given(st.sampled_from(["full", "basic", "rstream"]), st.data())
def test_mutated_messages_raise_nothing_but_amqp_decode_error(kind, data):
    if kind == "full":
        encoded = full_message().encode()
    elif kind == "basic":
        encoded = from_basic(basic(content_type="t", delivery_mode=2, message_id="m", priority=1,
                                   headers={"a": 1, "x-b": {"c": [1, "d"]}, "CC": ["q"]}), b"body", "ex", "rk")
    else:
        encoded = RSTREAM_ENCODED
    mutated = bytearray(encoded)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(mutated) - 1))
        mutated[at] = data.draw(st.integers(0, 255))
    assert_total(bytes(mutated))
    assert_total(bytes(mutated[:data.draw(st.integers(0, len(mutated)))]))


# what rstream 1.1.1 writes for a message with a header, properties, both maps and a data section
RSTREAM_ENCODED = bytes.fromhex(
    "005370c0080556015004404040005372c10d02a305782d666f6fa103626172005373c02b0da103696431a00567"
    "7565737440404040a30a746578742f706c61696e4040830000018bcfe56800404040005374c14110a101615401"
    "a10162a10374776fa10163c0050254015402a10164c10702a1016ba10176a101655601a10166823ff800000000"
    "0000a1016740a10168a00362696e005375a00568656c6c6f")


def test_nesting_is_bounded():
    deep = b"\xc0\x02\x01" * 200 + b"\x40"  # lists in lists, each claiming a size it cannot have
    with pytest.raises(AmqpDecodeError):
        decode_value(deep)
    v: list = []
    for _ in range(100):
        v = [v]
    with pytest.raises(AmqpDecodeError, match="nested deeper than 64"):
        decode_value(encode_value(v))
    described = b"\x00" * 5000 + b"\x40"
    with pytest.raises(AmqpDecodeError, match="nested deeper"):
        decode_value(described)


def test_sizes_are_checked_before_anything_is_built():
    with pytest.raises(AmqpDecodeError, match="claims"):
        decode_value(b"\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40")  # 4 billion nulls in 5 bytes
    with pytest.raises(AmqpDecodeError, match="claims"):
        decode_value(b"\xd0\x00\x00\x00\x04\xff\xff\xff\xff")
    with pytest.raises(AmqpDecodeError, match="truncated"):
        decode_value(b"\xb0\xff\xff\xff\xff\x00")


@pytest.mark.parametrize("hexed,text", [
    ("", "truncated value"), ("ff", "unknown type code 0xff"), ("5602", "boolean with value 0x02"),
    ("a105616263", "truncated str8"), ("a102ff fe", "not valid UTF-8"), ("4040", "1 bytes after"),
    ("c1020141", "odd number"), ("c004014040" "40", "its items end"),
    ("73ffffffff", "U\\+FFFFFFFF .* not a Unicode character"), ("730000d800", "U\\+D800 .* not a Unicode character"),
    ("c103024540", "key of type list"),
])
def test_malformed_values_say_what_is_wrong(hexed, text):
    with pytest.raises(AmqpDecodeError, match=text):
        decode_value(bytes.fromhex(hexed.replace(" ", "")))


# ---------------------------------------------------------------- message sections

def full_message(data=(b"part one, ", b"part two")) -> Message:
    return Message(
        list(data),
        header=Header(durable=True, priority=UByte(4), ttl=UInt(60000), first_acquirer=False,
                      delivery_count=UInt(2)),
        delivery_annotations={Symbol("x-da"): 1},
        message_annotations={Symbol("x-opt-key"): "v", ULong(7): [1, 2]},
        properties=Properties(message_id=uuid.uuid4(), user_id=b"guest", to="/queues/q", subject="s",
                              reply_to="r", correlation_id=ULong(9), content_type=Symbol("text/plain"),
                              content_encoding=Symbol("gzip"), absolute_expiry_time=Timestamp(2),
                              creation_time=Timestamp(1), group_id="g", group_sequence=UInt(3),
                              reply_to_group_id="rg"),
        application_properties={"k": "v", "n": 42, "f": 1.5, "b": True, "x": None},
        footer={Symbol("x-f"): b"sig"})


def test_a_message_with_every_section_round_trips():
    m = full_message()
    assert Message.decode(m.encode()) == m
    assert Message.decode(m.encode()).body == b"part one, part two"


def test_sections_are_written_in_the_specs_order_with_trailing_absent_fields_left_out():
    m = Message(b"x", header=Header(durable=True), properties=Properties(message_id="a"),
                message_annotations={"x-a": 1}, application_properties={"p": 1}, footer={"x-f": 1})
    assert m.encode().hex() == (
        "005370" "c0020141"                              # header: durable only
        "005372" "c10802a303782d61" "5501"               # message-annotations (a str key is a symbol)
        "005373" "c00401a10161"                          # properties: message-id only
        "005374" "c10602a10170" "5501"                   # application-properties
        "005375" "a00178"                                # data
        "005378" "c10802a303782d66" "5501")              # footer


def test_a_data_only_message_is_a_data_section():
    assert Message(b"hello").encode().hex() == "005375a00568656c6c6f"
    assert Message.decode(bytes.fromhex("005375a00568656c6c6f")) == Message(b"hello")
    big = b"x" * 70000
    assert Message.decode(Message(big).encode()).body == big


def test_amqp_value_and_sequence_bodies():
    for m in (Message(value=None), Message(value={"a": [1, Symbol("s")]}), Message(sequence=[[1, 2], ["x"]])):
        assert Message.decode(m.encode()) == m
    assert Message.decode(b"").value is NO_VALUE


def test_section_descriptors_may_be_symbols():
    raw = b"\x00\xa3\x10amqp:data:binary" + b"\xa0\x02hi"
    assert Message.decode(raw).body == b"hi"


@pytest.mark.parametrize("hexed,text", [
    ("40", "expected a message section"),
    ("0053ff40", "unknown message section"),
    ("005375a1026869", "not binary"),
    ("005375a0016800" "5377" "40", "after another body section"),
    ("0053704500537045", "a second header"),
    ("005370c003015001", "header field durable"),
    ("005372a0016b", "not a map"),
])
def test_malformed_messages_say_what_is_wrong(hexed, text):
    with pytest.raises(AmqpDecodeError, match=text):
        Message.decode(bytes.fromhex(hexed))


def test_mixed_bodies_are_refused_on_encoding():
    with pytest.raises(ValueError):
        Message(b"x", value=1).encode()


# ---------------------------------------------------------------- other clients' codecs

def test_hutch_decodes_what_rstream_encodes():
    from rstream import AMQPMessage
    from rstream._pyamqp.message import Header as RHeader
    from rstream._pyamqp.message import Properties as RProperties

    mid = uuid.uuid4()
    sent = AMQPMessage(
        body=b"hello",
        header=RHeader(durable=True, priority=4, ttl=1000),
        properties=RProperties(message_id=mid, user_id=b"guest", reply_to="r", correlation_id="c",
                               content_type="text/plain", creation_time=1700000000000, group_id="g"),
        application_properties={"a": 1, "b": "two", "f": 1.5, "t": True, "n": None, "bin": b"\x00\x01"},
        message_annotations={"x-stream-filter-value": "eu"})
    m = Message.decode(bytes(sent))
    assert m.body == b"hello"
    assert m.header == Header(durable=True, priority=UByte(4), ttl=UInt(1000))
    assert m.properties == Properties(message_id=mid, user_id=b"guest", reply_to="r", correlation_id="c",
                                      content_type="text/plain", creation_time=Timestamp(1700000000000),
                                      group_id="g")
    assert m.application_properties == {"a": 1, "b": "two", "f": 1.5, "t": True, "n": None, "bin": b"\x00\x01"}
    assert m.message_annotations == {"x-stream-filter-value": "eu"}
    assert type(next(iter(m.message_annotations))) is Symbol

    props, body = to_basic(bytes(sent))
    p = codec.decode_properties(props)
    assert body == b"hello"
    assert (p.delivery_mode, p.priority, p.expiration, p.message_id) == (2, 4, "1000", mid.urn)
    assert (p.user_id, p.reply_to, p.correlation_id, p.content_type, p.app_id) == ("guest", "r", "c", "text/plain", "g")
    assert p.timestamp == datetime.datetime.fromtimestamp(1700000000, datetime.UTC)
    # binary goes as a longstr, as RabbitMQ sends it
    assert p.headers == {"x-stream-filter-value": "eu", "a": 1, "b": "two", "f": 1.5, "t": True, "n": None,
                         "bin": "\x00\x01"}


def test_rstream_encoded_sample_is_what_rstream_writes():
    from rstream import AMQPMessage
    from rstream._pyamqp.message import Header as RHeader
    from rstream._pyamqp.message import Properties as RProperties

    sent = AMQPMessage(
        body=b"hello", header=RHeader(durable=True, priority=4),
        properties=RProperties(message_id="id1", content_type=b"text/plain", creation_time=1700000000000,
                               user_id=b"guest"),
        application_properties={"a": 1, "b": "two", "c": [1, 2], "d": {"k": "v"}, "e": True, "f": 1.5, "g": None,
                                "h": b"bin"},
        message_annotations={"x-foo": "bar"})
    assert bytes(sent) == RSTREAM_ENCODED
    m = Message.decode(RSTREAM_ENCODED)
    assert m.application_properties == {"a": 1, "b": "two", "c": [1, 2], "d": {"k": "v"}, "e": True, "f": 1.5,
                                        "g": None, "h": b"bin"}
    assert type(m.application_properties["a"]) is Int  # rstream writes a Python int as an AMQP int


def test_rstream_decodes_what_hutch_encodes():
    from rstream import amqp_decoder

    got = amqp_decoder(full_message([b"one data section"]).encode())  # rstream reads one data section
    assert got.body == b"one data section"
    assert got.header.durable is True and got.header.priority == 4 and got.header.ttl == 60000
    assert got.properties.content_type == b"text/plain" and got.properties.user_id == b"guest"
    assert got.properties.creation_time == 1
    assert got.application_properties == {b"k": b"v", b"n": 42, b"f": 1.5, b"b": True, b"x": None}
    assert got.message_annotations[b"x-opt-key"] == b"v"

    stored = from_basic(codec.encode_properties(commands.Basic.Properties(
        content_type="application/json", delivery_mode=2, headers={"tenant": "acme", "x-trace": 7})),
        b'{"a": 1}', "orders", "eu.new")
    got = amqp_decoder(stored)
    assert got.body == b'{"a": 1}'
    assert got.header.durable is True
    assert got.properties.content_type == b"application/json"
    assert got.application_properties == {b"tenant": b"acme"}
    assert got.message_annotations == {b"x-trace": 7, b"x-exchange": b"orders", b"x-routing-key": b"eu.new"}


def test_rbfly_and_hutch_read_each_other():
    from rbfly.amqp import decode_amqp, encode_amqp
    from rbfly.amqp._message import msg_ctx

    buf = bytearray(4096)
    n = encode_amqp(buf, msg_ctx(b"hello", app_properties={"a": 1, "b": "two", "c": 1.5, "d": True}))
    m = Message.decode(bytes(buf[:n]))
    assert m.body == b"hello" and m.application_properties == {"a": 1, "b": "two", "c": 1.5, "d": True}
    props, body = to_basic(bytes(buf[:n]))
    assert body == b"hello" and codec.decode_properties(props).headers == {"a": 1, "b": "two", "c": 1.5, "d": True}

    got = decode_amqp(full_message([b"one data section"]).encode())  # rbfly reads one data section
    assert got.body == b"one data section"
    assert got.header.durable is True and got.header.priority == 4
    assert got.properties.content_type.name == "text/plain" and got.properties.group_id == "g"
    assert got.app_properties == {"k": "v", "n": 42, "f": 1.5, "b": True, "x": None}
    assert decode_amqp(Message(value={"a": 1}).encode()).body == {"a": 1}
    assert decode_amqp(Message(b"x" * 300).encode()).body == b"x" * 300
    stored = from_basic(NO_PROPERTIES, b"plain", "", "q")
    assert decode_amqp(stored).body == b"plain"


# ---------------------------------------------------------------- AMQP 0-9-1 -> AMQP 1.0

def basic(**kwargs) -> bytes:
    return codec.encode_properties(commands.Basic.Properties(**kwargs))


def test_a_publish_without_properties_is_transient_and_keeps_its_route():
    # no header section (AMQP 1.0's default: not durable), so that a 0-9-1 consumer gets no
    # delivery mode back, as RabbitMQ 3.10.8 gives it; delivery mode 1 is kept as durable false
    m = Message.decode(from_basic(NO_PROPERTIES, b"body", "amq.topic", "a.b"))
    assert m.header is None
    assert to_basic(from_basic(NO_PROPERTIES, b"body", "", "q"))[0] == NO_PROPERTIES
    transient = Message.decode(from_basic({"delivery_mode": 1}, b"body", "", "q"))
    assert transient.header == Header(durable=False)
    assert m.message_annotations == {"x-exchange": "amq.topic", "x-routing-key": "a.b"}
    assert m.properties is None and m.application_properties is None
    assert m.data == [b"body"]


def test_basic_properties_map_to_the_header_and_properties_sections():
    mid = uuid.uuid4()
    raw = basic(content_type="text/plain", content_encoding="gzip", delivery_mode=2, priority=7,
                correlation_id="corr", reply_to="amq.rabbitmq.reply-to", expiration="60000",
                message_id=mid.urn, timestamp=datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC),
                message_type="order.created", user_id="guest", app_id="shop")
    m = Message.decode(from_basic(raw, b"{}", "ex", "rk"))
    assert m.header == Header(durable=True, priority=UByte(7), ttl=UInt(60000))
    assert m.properties == Properties(
        message_id=mid, user_id=b"guest", reply_to="amq.rabbitmq.reply-to", correlation_id="corr",
        content_type=Symbol("text/plain"), content_encoding=Symbol("gzip"),
        creation_time=Timestamp(1704153600000), group_id="shop")
    assert m.message_annotations == {"x-basic-type": "order.created", "x-exchange": "ex", "x-routing-key": "rk"}
    assert type(m.properties.content_type) is Symbol


def test_headers_become_application_properties_and_x_headers_message_annotations():
    headers = {"tenant": "acme", "count": 3, "big": 2**40, "ratio": 0.5, "ok": True, "none": None,
               "when": datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC),
               "nested": {"a": {"b": [1, "c"]}}, "list": [1, 2],
               "x-match": "all", "x-nested": {"a": {"b": [1, "c", {"d": False}]}}, "x-list": ["a", 1],
               "CC": ["q2", "q3"], "BCC": ["secret"]}
    raw = codec.edit_properties(basic(headers=headers), set_headers={"blob": b"x\x00\x00\x00\x02\xff\x00"})
    m = Message.decode(from_basic(raw, b"", "ex", "rk"))
    ap = m.application_properties
    assert ap == {"tenant": "acme", "count": 3, "big": 2**40, "ratio": 0.5, "ok": True, "none": None,
                  "when": 1704153600000, "blob": b"\xff\x00"}  # tables and arrays are not carried
    assert (type(ap["count"]), type(ap["big"]), type(ap["when"])) == (Byte, int, Timestamp)  # 0-9-1 types kept
    ma = m.message_annotations
    assert ma == {"x-match": "all", "x-nested": {"a": {"b": [1, "c", {"d": False}]}}, "x-list": ["a", 1],
                  "x-cc": ["q2", "q3"], "x-exchange": "ex", "x-routing-key": "rk"}
    assert all(type(k) is Symbol for k in ma["x-nested"]) and all(type(k) is Symbol for k in ma["x-nested"]["a"])


def test_properties_may_be_given_as_a_mapping():
    stored = from_basic({"content_type": "text/plain", "delivery_mode": 2, "headers": {"a": 1, "x-b": "c"},
                         "type": "t"}, b"x", "", "q")
    m = Message.decode(stored)
    assert m.header.durable is True and m.properties.content_type == "text/plain"
    assert m.application_properties == {"a": 1} and m.message_annotations["x-b"] == "c"
    assert m.message_annotations["x-basic-type"] == "t"


def test_longstr_headers_that_are_not_utf8_are_binary():
    raw = basic(headers={"s": "text", "t": "bad\x00nul"})
    # pamqp writes str as 'S'; a NUL or invalid UTF-8 makes RabbitMQ carry it as binary
    ap = Message.decode(from_basic(raw, b"", "", "q")).application_properties
    assert ap == {"s": "text", "t": b"bad\x00nul"}


def test_malformed_raw_properties_are_refused():
    with pytest.raises(ValueError, match="malformed content header properties"):
        from_basic(b"\x20\x00\x00\x00\x00\x09\x01a", b"", "", "q")


# ---------------------------------------------------------------- AMQP 1.0 -> AMQP 0-9-1

def props_of(encoded: bytes) -> tuple[commands.Basic.Properties, bytes]:
    raw, body = to_basic(encoded)
    return codec.decode_properties(raw), body


def test_a_data_only_message_has_no_properties():
    assert to_basic(Message(b"hi").encode()) == (NO_PROPERTIES, b"hi")


def test_data_sections_are_concatenated():
    p, body = props_of(Message([b"a", b"b", b"c"], header=Header(durable=True)).encode())
    assert body == b"abc" and p.delivery_mode == 2 and p.message_type is None


def test_amqp_value_and_sequence_bodies_are_kept_encoded_with_type_amqp_1_0():
    m = Message(value={"a": [1, 2]}, application_properties={"k": "v"})
    p, body = props_of(m.encode())
    assert p.message_type == AMQP10_TYPE
    assert Message.decode(body) == Message(value={"a": [1, 2]})
    # and back: a 0-9-1 message of type amqp-1.0 is those sections again
    again = Message.decode(from_basic(codec.encode_properties(p), body, "", "q"))
    assert again.value == {"a": [1, 2]} and again.data == []
    seq = Message(sequence=[[1], [2]])
    p, body = props_of(seq.encode())
    assert p.message_type == AMQP10_TYPE and Message.decode(body) == seq


@pytest.mark.parametrize("message_id,expected_property,expected_header", [
    (uuid.UUID("12345678-1234-5678-1234-567812345678"), "urn:uuid:12345678-1234-5678-1234-567812345678", None),
    (ULong(42), "42", None),
    ("short", "short", None),
    ("l" * 300, None, "l" * 300),
    (b"\x01\x02", None, b"\x01\x02"),
])
def test_message_and_correlation_ids_as_rabbitmq_maps_them(message_id, expected_property, expected_header):
    m = Message(b"", properties=Properties(message_id=message_id, correlation_id=message_id))
    p, _ = props_of(m.encode())
    assert p.message_id == expected_property and p.correlation_id == expected_property
    headers = p.headers or {}
    assert headers.get("x-message-id") == expected_header
    assert headers.get("x-correlation-id") == expected_header


def test_header_fields_win_over_x_basic_annotations():
    ma = {"x-basic-delivery-mode": UByte(2), "x-basic-priority": UByte(3), "x-basic-expiration": "500",
          "x-basic-type": "t"}
    p, _ = props_of(Message(b"", message_annotations=ma).encode())
    assert (p.delivery_mode, p.priority, p.expiration, p.message_type, p.headers) == (2, 3, "500", "t", None)
    p, _ = props_of(Message(b"", header=Header(durable=False, priority=UByte(9), ttl=UInt(10)),
                            message_annotations=ma).encode())
    assert (p.delivery_mode, p.priority, p.expiration) == (1, 9, "10")


def test_annotations_and_application_properties_become_headers():
    ma = {"x-exchange": "ex", "x-routing-key": "rk", "x-cc": ["a", "b"], "x-custom": {"k": [Symbol("s"), UInt(1)]},
          "x-opt-rabbitmq-received-time": Timestamp(1234), "not-x": 1, ULong(5): 1}
    ap = {"s": "v", "i": Int(-5), "u": UInt(7), "l": ULong(2**64 - 1), "ts": Timestamp(5999), "bin": b"\x00",
          "sym": Symbol("y"), "id": uuid.UUID(int=1), "dec": Decimal64(b"\x00" * 8), "flt": Float(0.5)}
    p, _ = props_of(Message(b"", message_annotations=ma, application_properties=ap).encode())
    assert p.headers == {
        "CC": ["a", "b"], "x-custom": {"k": ["s", 1]}, "timestamp_in_ms": 1234,
        "s": "v", "i": -5, "u": 7, "l": str(2**64 - 1), "ts": datetime.datetime(1970, 1, 1, 0, 0, 5,
                                                                                  tzinfo=datetime.UTC),
        "bin": "\x00", "sym": "y", "id": uuid.UUID(int=1).urn, "flt": 0.5}
    raw, _ = to_basic(Message(b"", application_properties={"u": UInt(7), "i": Int(-5), "b": Byte(1)}).encode())
    assert b"\x01uI" not in raw and b"\x01ui\x00\x00\x00\x07" in raw and b"\x01iI\xff\xff\xff\xfb" in raw


def test_properties_that_do_not_fit_0_9_1_are_dropped():
    m = Message(b"", properties=Properties(user_id=b"\xff\xfe", reply_to="r" * 300, group_id="g" * 256,
                                           content_type=Symbol("t"), creation_time=Timestamp(-5000)))
    p, _ = props_of(m.encode())
    assert (p.user_id, p.reply_to, p.app_id, p.content_type, p.timestamp) == (None, None, None, "t", None)


# ---------------------------------------------------------------- both ways

def test_a_0_9_1_message_comes_back_as_it_went_in():
    headers = {"tenant": "acme", "n": 3, "x-match": "any", "x-nested": {"a": {"b": [1, "c"]}}, "CC": ["q2"]}
    kwargs = dict(content_type="text/plain", content_encoding="utf-8", headers=headers, delivery_mode=2,
                  priority=5, correlation_id="c", reply_to="r", expiration="1000", message_id="m",
                  timestamp=datetime.datetime(2024, 5, 6, tzinfo=datetime.UTC), message_type="t",
                  user_id="guest", app_id="a")
    p, body = props_of(from_basic(basic(**kwargs), b"payload", "ex", "rk"))
    assert body == b"payload"
    for name, value in kwargs.items():
        got = getattr(p, name)
        assert got == value, name


def test_a_0_9_1_message_without_delivery_mode_comes_back_without_one():
    # as RabbitMQ 3.10.8 gives it (tests/integration/test_streams.py compares)
    p, body = props_of(from_basic(NO_PROPERTIES, b"x", "", "q"))
    assert p.delivery_mode is None and body == b"x" and p.headers is None


def test_x_death_survives_the_stream_as_x_opt_deaths():
    x_death = [{"count": 2, "reason": "expired", "queue": "q1", "exchange": "dlx", "routing-keys": ["q1"],
                "time": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
                "original-expiration": "100"}]
    stored = from_basic(basic(headers={"x-death": x_death}), b"", "dlx", "q1")
    deaths = Message.decode(stored).message_annotations["x-opt-deaths"]
    assert isinstance(deaths, Array) and deaths[0]["reason"] == "expired" and type(deaths[0]["reason"]) is Symbol
    assert deaths[0]["first-time"] == 1704067200000 and deaths[0]["ttl"] == 100
    p, _ = props_of(stored)
    assert p.headers == {"x-death": [{"original-expiration": "100", "count": 2, "reason": "expired",
                                      "queue": "q1",
                                      "time": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
                                      "exchange": "dlx", "routing-keys": ["q1"]}]}


SHORTSTR = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
HEADER_VALUES = st.recursive(
    st.one_of(SHORTSTR, st.integers(-2**63, 2**63 - 1), st.booleans(), st.none()),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.text("abc", max_size=5), children, max_size=3)),
    max_leaves=10)


@FAST
@given(st.fixed_dictionaries({}, optional={
    "content_type": SHORTSTR, "content_encoding": SHORTSTR, "correlation_id": SHORTSTR, "reply_to": SHORTSTR,
    "message_id": SHORTSTR, "message_type": SHORTSTR, "user_id": SHORTSTR, "app_id": SHORTSTR,
    "priority": st.integers(0, 255), "delivery_mode": st.sampled_from([1, 2]),
    "expiration": st.integers(0, 2**32 - 1).map(str),
    "headers": st.dictionaries(st.text("xyz-", min_size=1, max_size=8).filter(lambda k: k not in (
        "x-death", "CC", "BCC") and not k.startswith(("x-basic-", "x-exchange", "x-routing-key"))),
        HEADER_VALUES, max_size=5)}), st.binary(max_size=50))
def test_0_9_1_properties_and_x_headers_survive_a_stream(kwargs, body):
    if kwargs.get("message_type") == AMQP10_TYPE:
        return
    p, got_body = props_of(from_basic(basic(**kwargs), body, "ex", "rk"))
    assert got_body == body
    for name, value in kwargs.items():
        got = getattr(p, name)
        if value == "":
            continue  # pamqp does not send an empty short string property
        if name == "headers":
            # x- headers keep everything; other headers lose tables and arrays, as in RabbitMQ
            value = {k: v for k, v in value.items() if k.startswith("x-") or not isinstance(v, (list, dict))}
            got = got or {}
        assert got == value, name


@SOME
@given(st.dictionaries(st.text(max_size=10), VALUES, max_size=4), st.dictionaries(
    st.text("x-abc", min_size=2, max_size=8).map(Symbol), VALUES, max_size=4))
def test_any_application_properties_and_annotations_convert_to_0_9_1(ap, ma):
    raw, _ = to_basic(Message(b"x", application_properties=ap, message_annotations=ma).encode())
    # well-formed 0-9-1 properties, whatever the AMQP 1.0 values were
    summary = codec.summarize_properties(raw)
    if summary.headers_span is not None:
        start, end = summary.headers_span
        assert end == len(raw)
        codec.table_entries(raw[start + 4:end])


# ---------------------------------------------------------------- remembered conversions

def test_remembered_conversions_give_each_message_its_own_body():
    props = basic(content_type="text/plain", delivery_mode=2, headers={"k": "v", "x-k": 1})
    for body in (b"first", b"second" * 100, b""):  # the second and third find the head remembered
        m = Message.decode(from_basic(props, body, "ex", "rk"))
        assert m.body == body and m.application_properties == {"k": "v"} and m.header.durable is True
    head = Message(b"", header=Header(durable=True), application_properties={"k": "v"})
    for data in ([b"one"], [b"a", b"b" * 300], [b""]):
        head.data = data
        p, body = props_of(head.encode())
        assert body == b"".join(data) and p.headers == {"k": "v"} and p.delivery_mode == 2


def test_amqp_1_0_bodies_are_never_taken_from_what_was_remembered():
    props = basic(message_type=AMQP10_TYPE)
    for value in ("one", "two"):
        body = Message(value=value).encode()
        assert Message.decode(from_basic(props, body, "", "q")).value == value
    # a body of type amqp-1.0 that is not AMQP 1.0 sections is kept as data
    assert Message.decode(from_basic(props, b"not sections", "", "q")).body == b"not sections"


def test_what_is_remembered_is_bounded():
    from hutch.streamproto import amqp10

    for i in range(amqp10._CONVERSIONS_CACHED_MAX + 10):
        stored = from_basic(basic(message_id=str(i)), b"", "", "q")
        to_basic(stored)
    assert len(amqp10._from_basic_cached) <= amqp10._CONVERSIONS_CACHED_MAX
    assert len(amqp10._to_basic_cached) <= amqp10._CONVERSIONS_CACHED_MAX
    big = basic(headers={"big": "x" * 2000})
    n = len(amqp10._from_basic_cached)
    from_basic(big, b"", "", "q")
    assert len(amqp10._from_basic_cached) == n  # too big to remember


def forget_conversions() -> None:
    from hutch.streamproto import amqp10

    amqp10._from_basic_cached.clear()
    amqp10._to_basic_cached.clear()
    amqp10._templates_cached.clear()
    amqp10._headers_cached.clear()


@SOME
@given(st.fixed_dictionaries({}, optional={
    "message_id": st.one_of(LEAVES[str], LEAVES[ULong], LEAVES[uuid.UUID], LEAVES[bytes]),
    "correlation_id": st.one_of(LEAVES[str], LEAVES[uuid.UUID]),
    "creation_time": LEAVES[Timestamp], "content_type": LEAVES[Symbol], "user_id": LEAVES[bytes],
    "reply_to": LEAVES[str], "group_id": LEAVES[str]}),
    st.dictionaries(st.text(max_size=8), VALUES, max_size=3),
    st.dictionaries(st.text("x-abc", min_size=2, max_size=8).map(Symbol), VALUES, max_size=3),
    st.one_of(st.none(), st.builds(Header, st.one_of(st.none(), st.booleans()),
                                   st.one_of(st.none(), LEAVES[UByte]), st.one_of(st.none(), LEAVES[UInt]))),
    st.lists(LEAVES[bytes], min_size=1, max_size=3))
def test_a_message_converts_the_same_whatever_was_converted_before(props, ap, ma, header, data):
    m = Message(data, header=header, properties=Properties(**props) if props else None,
                application_properties=ap or None, message_annotations=ma or None)
    encoded = m.encode()
    forget_conversions()
    cold = to_basic(encoded)
    # the same message again (all remembered), then with other properties (the rest remembered)
    assert to_basic(encoded) == cold
    m.properties = Properties(message_id="other")
    forget_conversions()
    fresh = to_basic(m.encode())
    forget_conversions()
    to_basic(encoded)
    assert to_basic(m.encode()) == fresh
    assert cold[1] == b"".join(data)


@SOME
@given(st.dictionaries(st.text("xyzC-", min_size=1, max_size=6), HEADER_VALUES, max_size=4),
       st.lists(SHORTSTR.filter(bool), min_size=1, max_size=3), st.sampled_from([None, "t", AMQP10_TYPE]))
def test_a_publish_converts_the_same_whatever_was_converted_before(headers, ids, message_type):
    forget_conversions()
    from_basic(basic(message_id="first", headers=headers, message_type=message_type), b"b", "ex", "rk")
    for message_id in ids:
        raw = basic(message_id=message_id, headers=headers, message_type=message_type)
        partly_remembered = from_basic(raw, b"b", "ex", "rk")  # the headers' sections were converted
        remembered = from_basic(raw, b"b", "ex", "rk")  # all of it was
        forget_conversions()
        assert from_basic(raw, b"b", "ex", "rk") == partly_remembered == remembered
