"""The route of a stored stream message (`hutch.streamproto.amqp10.route`): the exchange and
routing key an AMQP 0-9-1 publish had, which RabbitMQ gives back to an AMQP 0-9-1 consumer of
the stream, and None for a message that names none (a stream client's)."""

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
