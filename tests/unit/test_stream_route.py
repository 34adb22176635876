"""What an AMQP 0-9-1 consumer of a stream gets besides the body: the route of a stored message
(`hutch.streamproto.amqp10.route`), the exchange and routing key an AMQP 0-9-1 publish had, which
RabbitMQ gives back (None for a message that names none, a stream client's); and the
`x-stream-offset` header (`hutch.streams.handle.with_offset`)."""

from __future__ import annotations

import pytest

from hutch.streamproto import amqp10


@pytest.mark.parametrize("props", [{}, {"headers": {"h": 1}}, {"message_id": "m-1", "timestamp": 1_700_000_000},
                                   {"delivery_mode": 2, "priority": 3, "content_type": "text/plain"}],
                         ids=["bare", "headers", "own-id", "header-section"])
def test_a_0_9_1_publish_keeps_its_exchange_and_routing_key(props):
    rec = amqp10.from_basic(props, b"body", "amq.direct", "rk")
    assert amqp10.route(rec) == ("amq.direct", "rk")
    assert amqp10.route(rec) == ("amq.direct", "rk")  # the second time from what was read lately


def test_messages_differing_only_in_their_properties_keep_their_own_routes():
    a = amqp10.from_basic({"message_id": "a"}, b"1", "x1", "k1")
    b = amqp10.from_basic({"message_id": "b"}, b"2", "x2", "k2")
    assert (amqp10.route(a), amqp10.route(b), amqp10.route(a)) == (("x1", "k1"), ("x2", "k2"), ("x1", "k1"))


def test_a_stream_clients_message_has_no_route():
    assert amqp10.route(amqp10.Message(data=b"abc").encode()) is None
    only_exchange = amqp10.Message(data=b"abc", message_annotations={amqp10.Symbol("x-exchange"): "e"})
    assert amqp10.route(only_exchange.encode()) is None
    value_body = amqp10.Message(value="v", message_annotations={amqp10.Symbol("x-exchange"): "e",
                                                                 amqp10.Symbol("x-routing-key"): "k"})
    assert amqp10.route(value_body.encode()) == ("e", "k")


def test_malformed_bytes_raise_the_decode_error():
    with pytest.raises(amqp10.AmqpDecodeError):
        amqp10.route(b"\x00\x53\x72\xc1\xff")


@pytest.mark.parametrize("props", [{}, {"headers": {"h": 1}, "delivery_mode": 2, "message_id": "m"},
                                   {"headers": {"x-stream-offset": 99, "text": "x-stream-offsetl"}}],
                         ids=["bare", "headers-and-more", "header-there-already"])
@pytest.mark.parametrize("offset", [0, 5, 2**40])
def test_a_delivery_carries_its_offset_as_the_header_edit_would_set_it(props, offset):
    from hutch.amqp import codec
    from hutch.streams.handle import with_offset

    raw, _body = amqp10.to_basic(amqp10.from_basic(props, b"b", "", "s"))
    expected = codec.edit_properties(raw, set_headers={"x-stream-offset": codec.typed_value(offset)})
    assert with_offset(raw, offset) == expected
    assert with_offset(raw, offset) == expected  # the second time from the properties made before
