"""AMQP 0-9-1 connection-level protocol: header negotiation, handshake, limits, frame errors.

What the broker must send (codes and texts) is what RabbitMQ 3.10 sends. Where RabbitMQ's
text embeds Erlang terms (`{frame_too_large,200000,131064}`), only the code and the
symbolic prefix (`FRAME_ERROR`) are asserted; elsewhere the text is matched exactly,
because clients show it to users and some test suites compare it.
"""

from __future__ import annotations

import hashlib
import struct
import time

import amqp
import pika
import pika.exceptions
import pytest
from pamqp import commands, frame, heartbeat
from pamqp.header import ContentHeader

from tests.integration.helpers import connect
from tests.integration.rawamqp import (
    AMQP_0_9_1_HEADER,
    CLIENT_CAPABILITIES,
    PeerClosed,
    RawClient,
    raw_frame,
)

FRAME_MAX_DEFAULT = 131072
FRAME_OVERHEAD = 8


# -- protocol header ------------------------------------------------------------------------

@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x09\x00",
    b"AMQP\x00\x01\x00\x00",
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
], ids=["amqp-0-9-0", "amqp-1-0", "http"])
def test_unsupported_protocol_header_is_answered_with_0_9_1_header_then_closed(broker, header):
    with RawClient(broker.host, broker.port) as c:
        c.send(header)
        assert c.read_bytes(8) == AMQP_0_9_1_HEADER
        c.wait_closed(timeout_s=5)


def test_connection_start_offers_0_9_1_with_plain_and_amqplain(broker):
    with RawClient(broker.host, broker.port) as c:
        c.send(AMQP_0_9_1_HEADER)
        start = c.expect(commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert set(start.mechanisms.split()) >= {"PLAIN", "AMQPLAIN"}
    assert "en_US" in start.locales.split()
    props = start.server_properties
    for key in ("product", "version", "platform"):
        assert isinstance(props[key], str) and props[key], key


def test_connection_start_advertises_rabbitmq_capabilities(broker):
    with RawClient(broker.host, broker.port) as c:
        c.send(AMQP_0_9_1_HEADER)
        capabilities = c.expect(commands.Connection.Start).server_properties["capabilities"]
    for name in ("publisher_confirms", "exchange_exchange_bindings", "basic.nack",
                 "consumer_cancel_notify", "connection.blocked", "consumer_priorities",
                 "authentication_failure_close", "per_consumer_qos"):
        assert capabilities.get(name) is True, name


def test_tune_offers_channel_max_2047_frame_max_131072_heartbeat_60(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake(open_connection=False)
    assert (c.tune.channel_max, c.tune.frame_max, c.tune.heartbeat) == (2047, FRAME_MAX_DEFAULT, 60)


# -- authentication and vhosts -----------------------------------------------------------------

def test_plain_login_opens_connection_and_channel(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)


def test_amqplain_login_opens_connection(broker):
    conn = amqp.Connection(f"{broker.host}:{broker.port}", userid="guest", password="guest",
                           login_method="AMQPLAIN", connect_timeout=5)
    conn.connect()
    try:
        ch = conn.channel()
        name, _, _ = ch.queue_declare("", exclusive=True)
        assert name.startswith("amq.gen-")
    finally:
        conn.close()


def test_amqplain_bad_password_is_refused_with_403_naming_amqplain(broker):
    conn = amqp.Connection(f"{broker.host}:{broker.port}", userid="guest", password="wrong",
                           login_method="AMQPLAIN", connect_timeout=5)
    with pytest.raises(amqp.exceptions.AccessRefused) as info:
        conn.connect()
    assert info.value.reply_text == ("ACCESS_REFUSED - Login was refused using authentication mechanism "
                                     "AMQPLAIN. For details see the broker logfile.")


def test_bad_password_is_refused_with_403_access_refused(broker):
    with RawClient(broker.host, broker.port) as c:
        c.send(AMQP_0_9_1_HEADER)
        c.expect(commands.Connection.Start)
        c.send_frame(commands.Connection.StartOk(
            client_properties={"capabilities": CLIENT_CAPABILITIES},
            mechanism="PLAIN", response="\x00guest\x00wrong-password"))
        close = c.expect_connection_close()
        c.wait_closed()
    assert close.reply_code == 403
    assert close.reply_text == ("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
                                "For details see the broker logfile.")


def test_bad_password_without_authentication_failure_close_capability_drops_socket(broker):
    with RawClient(broker.host, broker.port) as c:
        c.send(AMQP_0_9_1_HEADER)
        c.expect(commands.Connection.Start)
        c.send_frame(commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                 response="\x00guest\x00wrong-password"))
        with pytest.raises(PeerClosed):
            c.read_frame()


def test_pika_reports_bad_credentials_as_authentication_error(broker):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        connect(broker, credentials=pika.PlainCredentials("guest", "nope"))
    assert "ACCESS_REFUSED" in str(info.value)


def test_unknown_mechanism_drops_socket(broker):
    with RawClient(broker.host, broker.port) as c:
        c.send(AMQP_0_9_1_HEADER)
        c.expect(commands.Connection.Start)
        c.send_frame(commands.Connection.StartOk(
            client_properties={"capabilities": CLIENT_CAPABILITIES}, mechanism="NOPE", response="x"))
        with pytest.raises(PeerClosed):
            c.read_frame()


def test_unknown_vhost_is_refused_with_530_not_allowed(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake(open_connection=False)
        c.send_frame(commands.Connection.Open(virtual_host="no-such-vhost"))
        close = c.expect_connection_close()
    assert (close.reply_code, close.reply_text) == (530, "NOT_ALLOWED - vhost no-such-vhost not found")
    assert (close.class_id, close.method_id) == (10, 40)


# -- negotiated limits -----------------------------------------------------------------------

@pytest.mark.parametrize("frame_max", [0, 4096], ids=["default-frame-max", "negotiated-4096"])
def test_frame_larger_than_frame_max_closes_connection_with_501_frame_error(broker, frame_max):
    with RawClient(broker.host, broker.port) as c:
        c.handshake(frame_max=frame_max)
        c.open_channel(1)
        limit = frame_max or FRAME_MAX_DEFAULT
        body_size = limit + 100
        c.send_frame(commands.Basic.Publish(exchange="", routing_key="nowhere"), 1)
        c.send_frame(ContentHeader(0, body_size, commands.Basic.Properties()), 1)
        c.send(raw_frame(3, 1, b"x" * body_size))
        close = c.expect_connection_close()
    assert close.reply_code == 501
    assert close.reply_text.startswith("FRAME_ERROR - ")


def test_frame_exactly_frame_max_is_accepted(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake(frame_max=4096)
        c.open_channel(1)
        c.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)
        queue = c.expect(commands.Queue.DeclareOk).queue
        body = b"y" * (4096 - FRAME_OVERHEAD)
        c.send_frame(commands.Basic.Publish(exchange="", routing_key=queue), 1)
        c.send_frame(ContentHeader(0, len(body), commands.Basic.Properties()), 1)
        c.send(raw_frame(3, 1, body))
        c.send_frame(commands.Basic.Get(queue=queue, no_ack=True), 1)
        assert c.expect(commands.Basic.GetOk).message_count == 0
        c.expect(ContentHeader)
        _, got = c.read_frame()
        assert got.value == body


def test_opening_more_channels_than_channel_max_closes_connection_with_530(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake(channel_max=2)
        c.open_channel(1)
        c.open_channel(2)
        c.send_frame(commands.Channel.Open(), 3)
        close = c.expect_connection_close()
    assert close.reply_code == 530
    assert close.reply_text == ("NOT_ALLOWED - number of channels opened (2) has reached "
                                "the negotiated channel_max (2)")


def _refused_before_open(c: RawClient) -> bool:
    """True if the broker, after tune-ok and connection.open, ends the connection without
    opening it (connection.close or just closing the socket)."""
    try:
        while True:
            _, value = c.read_frame()
            if isinstance(value, commands.Connection.OpenOk):
                return False
            if isinstance(value, commands.Connection.Close):
                return True
    except PeerClosed:
        return True


@pytest.mark.parametrize("frame_max", [1024, FRAME_MAX_DEFAULT * 2], ids=["below-4096", "above-offer"])
def test_tune_ok_with_frame_max_out_of_range_is_refused(broker, frame_max):
    with RawClient(broker.host, broker.port) as c:
        c.handshake(frame_max=frame_max, open_connection=False)
        c.send_frame(commands.Connection.Open(virtual_host="/"))
        assert _refused_before_open(c)


def test_tune_ok_with_a_longer_heartbeat_than_offered_is_accepted(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake(heartbeat_s=120)
        c.open_channel(1)


def test_channel_open_before_connection_open_closes_connection_with_505(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake(open_connection=False)
        c.send_frame(commands.Channel.Open(), 1)
        close = c.expect_connection_close()
    assert close.reply_code == 505
    assert close.reply_text.startswith("UNEXPECTED_FRAME - ")


# -- malformed and misplaced frames ------------------------------------------------------------

def _truncated_method_arguments(c: RawClient) -> None:
    c.send(raw_frame(1, 1, struct.pack(">HH", 50, 10) + b"\x00"))  # queue.declare, one byte of args


def _bad_frame_end(c: RawClient) -> None:
    data = frame.marshal(commands.Queue.Declare(queue="", exclusive=True), 1)
    c.send(data[:-1] + b"\x00")


def _unknown_frame_type(c: RawClient) -> None:
    c.send(raw_frame(9, 1, b"abc"))


def _body_without_publish(c: RawClient) -> None:
    c.send(raw_frame(3, 1, b"abc"))


def _heartbeat_on_a_channel(c: RawClient) -> None:
    c.send(raw_frame(8, 1, b""))


def _method_while_content_header_expected(c: RawClient) -> None:
    c.send_frame(commands.Basic.Publish(exchange="", routing_key="nowhere"), 1)
    c.send_frame(commands.Basic.Qos(prefetch_count=1), 1)


def _channel_method_on_channel_zero(c: RawClient) -> None:
    c.send_frame(commands.Queue.Declare(queue="", exclusive=True), 0)


def _method_on_unopened_channel(c: RawClient) -> None:
    c.send_frame(commands.Queue.Declare(queue="", exclusive=True), 5)


def _second_channel_open(c: RawClient) -> None:
    c.send_frame(commands.Channel.Open(), 1)


def _connection_method_on_a_channel(c: RawClient) -> None:
    c.send_frame(commands.Connection.Open(virtual_host="/"), 1)


# (what the client does wrong, reply code, exact reply text or the prefix before " - ")
FRAME_ERRORS = [
    (_truncated_method_arguments, 501, "FRAME_ERROR"),
    (_bad_frame_end, 501, "FRAME_ERROR"),
    (_unknown_frame_type, 501, "FRAME_ERROR"),
    (_body_without_publish, 505,
     "UNEXPECTED_FRAME - expected method frame, got non method frame instead"),
    (_heartbeat_on_a_channel, 505, "UNEXPECTED_FRAME"),
    (_method_while_content_header_expected, 505,
     "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead"),
    (_channel_method_on_channel_zero, 504, "CHANNEL_ERROR - unexpected method in connection state running"),
    (_method_on_unopened_channel, 504, "CHANNEL_ERROR - expected 'channel.open'"),
    (_second_channel_open, 504, "CHANNEL_ERROR - second 'channel.open' seen"),
    (_connection_method_on_a_channel, 503, "COMMAND_INVALID - unimplemented method"),
]


@pytest.mark.parametrize("mistake,code,text", FRAME_ERRORS,
                         ids=[m.__name__.lstrip("_") for m, _, _ in FRAME_ERRORS])
def test_protocol_violation_closes_only_that_connection_with_the_right_code(broker, mistake, code, text):
    bystander = connect(broker)
    try:
        bystander_ch = bystander.channel()
        queue = bystander_ch.queue_declare("", exclusive=True).method.queue
        with RawClient(broker.host, broker.port) as c:
            c.handshake()
            c.open_channel(1)
            mistake(c)
            close = c.expect_connection_close()
            c.wait_closed()
        assert close.reply_code == code
        if " - " in text:
            assert close.reply_text == text
        else:
            assert close.reply_text.startswith(text + " - ")
        # the other connection carries on as if nothing happened
        bystander_ch.basic_publish("", queue, b"still here")
        _, _, body = bystander_ch.basic_get(queue, auto_ack=True)
        assert body == b"still here"
    finally:
        bystander.close()


# -- heartbeats ---------------------------------------------------------------------------------

def test_silent_client_with_heartbeat_1_is_disconnected_after_about_two_intervals(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake(heartbeat_s=1)
        t0 = time.monotonic()
        server_heartbeats = 0
        with pytest.raises(PeerClosed):
            while time.monotonic() - t0 < 10:
                _, value = c.read_frame(timeout_s=10)
                server_heartbeats += isinstance(value, heartbeat.Heartbeat)
        silent_s = time.monotonic() - t0
    assert 1.5 <= silent_s <= 5.0, silent_s
    assert server_heartbeats >= 1


def test_client_that_keeps_heartbeating_stays_connected(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake(heartbeat_s=1)
        t0 = time.monotonic()
        server_heartbeats = 0
        while time.monotonic() - t0 < 4.0:
            c.send_heartbeat()
            try:
                _, value = c.read_frame(timeout_s=0.4)
                server_heartbeats += isinstance(value, heartbeat.Heartbeat)
            except TimeoutError:
                pass
        c.open_channel(1)
    assert server_heartbeats >= 3


def test_heartbeat_zero_disables_heartbeats_both_ways(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake(heartbeat_s=0)
        with pytest.raises(TimeoutError):  # 3 s of silence: no heartbeat from the broker ...
            c.read_frame(timeout_s=3.0)
        c.open_channel(1)  # ... and the silent client is still welcome


def test_client_that_keeps_sending_methods_stays_connected(broker):
    """Any frame counts as a sign of life, not only heartbeat frames."""
    with RawClient(broker.host, broker.port) as c:
        c.handshake(heartbeat_s=1)
        c.open_channel(1)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4.0:
            c.send_frame(commands.Basic.Qos(prefetch_count=10), 1)
            c.expect(commands.Basic.QosOk)
            time.sleep(0.3)
        c.open_channel(2)


def test_pika_heartbeat_negotiation_takes_the_lower_value(broker):
    conn = connect(broker, heartbeat=5)
    try:
        assert conn._impl.params.heartbeat == 5
        conn.channel().queue_declare("", exclusive=True)
    finally:
        conn.close()


def test_update_secret_is_answered_with_update_secret_ok(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake()
        c.send_frame(commands.Connection.UpdateSecret(new_secret="guest", reason="rotation"))
        c.expect(commands.Connection.UpdateSecretOk)
        c.open_channel(1)


def test_many_concurrent_connections_each_get_their_own_answers(broker):
    conns = [connect(broker) for _ in range(100)]
    try:
        channels = [c.channel() for c in conns]
        queues = [ch.queue_declare("", exclusive=True).method.queue for ch in channels]
        for i, (ch, q) in enumerate(zip(channels, queues, strict=True)):
            ch.basic_publish("", q, str(i).encode())
        for i, (ch, q) in enumerate(zip(channels, queues, strict=True)):
            method, _, body = ch.basic_get(q, auto_ack=True)
            assert body == str(i).encode()
    finally:
        for c in conns:
            c.close()


# -- nowait ---------------------------------------------------------------------------------------

def test_nowait_methods_get_no_reply_and_take_effect_in_order(broker):
    """Declares, binds, consume, confirm.select, cancel, purge and deletes with nowait set:
    the broker answers none of them, yet each has happened before the next method runs."""
    with RawClient(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        x, q = "hutch-tests.nowait.x", "hutch-tests.nowait.q"
        c.send_frame(commands.Exchange.Declare(exchange=x, exchange_type="fanout", auto_delete=True, nowait=True), 1)
        c.send_frame(commands.Queue.Declare(queue=q, exclusive=True, nowait=True), 1)
        c.send_frame(commands.Queue.Bind(queue=q, exchange=x, nowait=True), 1)
        c.send_frame(commands.Basic.Consume(queue=q, consumer_tag="nw", no_ack=True, nowait=True), 1)
        c.send_frame(commands.Confirm.Select(nowait=True), 1)
        c.send_frame(commands.Basic.Publish(exchange=x, routing_key=""), 1)
        c.send_frame(ContentHeader(0, 1, commands.Basic.Properties()), 1)
        c.send(raw_frame(3, 1, b"m"))
        deliver = c.expect(commands.Basic.Deliver)
        assert (deliver.consumer_tag, deliver.exchange) == ("nw", x)
        c.expect(ContentHeader)
        c.read_frame()
        assert c.expect(commands.Basic.Ack).delivery_tag == 1
        c.send_frame(commands.Basic.Cancel(consumer_tag="nw", nowait=True), 1)
        c.send_frame(commands.Queue.Purge(queue=q, nowait=True), 1)
        c.send_frame(commands.Queue.Unbind(queue=q, exchange=x), 1)
        c.expect(commands.Queue.UnbindOk)  # the first reply is to the first method that wants one
        c.send_frame(commands.Queue.Delete(queue=q, nowait=True), 1)
        c.send_frame(commands.Exchange.Delete(exchange=x, nowait=True), 1)
        c.send_frame(commands.Queue.Declare(queue=q, passive=True), 1)
        close = c.expect(commands.Channel.Close)
    assert (close.reply_code, close.reply_text) == (404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_nowait_method_that_fails_still_closes_the_channel(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send_frame(commands.Queue.Declare(queue="hutch-tests-surely-missing", passive=True, nowait=True), 1)
        close = c.expect(commands.Channel.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (404, 50, 10)


# -- channels ---------------------------------------------------------------------------------

def test_channel_close_then_reopen_same_number(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send_frame(commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 1)
        c.expect(commands.Channel.CloseOk)
        c.open_channel(1)
        c.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)
        c.expect(commands.Queue.DeclareOk)


def test_after_a_channel_error_the_broker_ignores_the_channel_until_close_ok(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send_frame(commands.Queue.Declare(queue="hutch-tests-surely-missing", passive=True), 1)
        close = c.expect(commands.Channel.Close)
        assert (close.reply_code, close.class_id, close.method_id) == (404, 50, 10)
        c.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)  # dropped: no answer
        c.send_frame(commands.Channel.CloseOk(), 1)
        c.open_channel(1)  # the first frame back is the new open-ok, not a declare-ok
        c.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)
        c.expect(commands.Queue.DeclareOk)


def test_channel_flow_active_true_is_acknowledged(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send_frame(commands.Channel.Flow(active=True), 1)
        assert c.expect(commands.Channel.FlowOk).active is True


def test_channel_flow_active_false_is_540_not_implemented(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send_frame(commands.Channel.Flow(active=False), 1)
        close = c.expect_connection_close()
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - active=false")
    assert (close.class_id, close.method_id) == (20, 20)


def test_many_channels_on_one_connection(conn):
    channels = [conn.channel() for _ in range(100)]
    assert len({c.channel_number for c in channels}) == 100
    for c in channels[::2]:
        c.close()
    assert all(c.is_open for c in channels[1::2])
    channels[1].queue_declare("", exclusive=True)


def test_connection_close_is_answered_with_close_ok(broker):
    with RawClient(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send_frame(commands.Connection.Close(reply_code=200, reply_text="Goodbye", class_id=0, method_id=0))
        c.expect(commands.Connection.CloseOk)


# -- content framing ----------------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, FRAME_MAX_DEFAULT - FRAME_OVERHEAD, FRAME_MAX_DEFAULT,
                                  1 << 20, 10 << 20],
                         ids=["empty", "one-byte", "one-full-frame", "just-over-one-frame", "1MiB", "10MiB"])
def test_body_split_across_frames_round_trips(ch, size):
    queue = ch.queue_declare("", exclusive=True).method.queue
    body = hashlib.sha256(str(size).encode()).digest() * (size // 32) + b"z" * (size % 32)
    ch.basic_publish("", queue, body)
    method, _, got = ch.basic_get(queue, auto_ack=True)
    assert method is not None
    assert len(got) == size
    assert got == body


def test_body_split_across_small_negotiated_frames_round_trips(broker):
    conn = connect(broker, frame_max=4096)
    try:
        ch = conn.channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        body = bytes(range(256)) * 1000
        ch.basic_publish("", queue, body)
        _, _, got = ch.basic_get(queue, auto_ack=True)
        assert got == body
    finally:
        conn.close()
