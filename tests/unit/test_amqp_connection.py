"""The server side of an AMQP 0-9-1 connection (hutch.amqp.connection) as a state machine.

Bytes in, events out, as a client would drive it: protocol header negotiation (spec 4.2.2),
the start/start-ok/tune/tune-ok/open handshake and its limits (4.2.3 frame_max, 4.9
channel_max), channel open/close/close-ok (4.2.4 and the channel class), content assembly
(4.2.6), the error codes of spec 1.7.2 and RabbitMQ's behaviour where the spec leaves a
choice, connection close in both directions, and heartbeats counted by `tick()`.
"""

from __future__ import annotations

import struct

import pytest
from pamqp import commands, encode

from hutch.amqp import codec, spec
from hutch.amqp.connection import (
    AUTHENTICATING,
    AWAIT_OPEN,
    AWAIT_START_OK,
    AWAIT_TUNE_OK,
    CLOSED,
    CLOSING,
    OPEN,
    OPENING,
    Connection,
)
from hutch.amqp.events import (
    Ack,
    Authenticate,
    ChannelClosed,
    ChannelFlow,
    ChannelOpened,
    ConnectionClosed,
    HeartbeatTimeout,
    Method,
    Nack,
    OpenVhost,
    Publish,
    Reject,
)


def only_method(amqp, conn, channel: int | None = None):
    (got,) = amqp.methods_out(conn)
    if channel is not None:
        assert got[0] == channel
    return got[1]


def assert_connection_closed_by_server(amqp, conn, code: int, class_method: tuple[int, int] | None = None):
    """The server sent connection.close with `code` and waits for close-ok."""
    assert conn.state == CLOSING
    m = only_method(amqp, conn, 0)
    assert isinstance(m, commands.Connection.Close)
    assert m.reply_code == code, m.reply_text
    assert m.reply_text.startswith(spec.REPLY_NAMES[code] + " - ")
    if class_method is not None:
        assert (m.class_id, m.method_id) == class_method
    assert conn.close_reason[0] == code
    # ... and once the client's close-ok arrives, the connection is over
    (ev,) = amqp.feed(conn, codec.method_frame(0, commands.Connection.CloseOk()))
    assert isinstance(ev, ConnectionClosed) and ev.code == code and not ev.by_client
    assert conn.state == CLOSED
    return m


# ================================================================== handshake (spec 2.2.4, 4.2.2)

def test_handshake_plain_happy_path(amqp):
    conn = Connection(amqp.SERVER_PROPERTIES)
    assert amqp.feed(conn, spec.PROTOCOL_HEADER) == []
    assert conn.state == AWAIT_START_OK
    start = only_method(amqp, conn, 0)
    assert isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == "PLAIN AMQPLAIN" and start.locales == "en_US"
    assert start.server_properties == amqp.SERVER_PROPERTIES

    (auth,) = amqp.feed(conn, amqp.plain_start_ok("alice", "s3cret"))
    assert isinstance(auth, Authenticate)
    assert (auth.mechanism, auth.username, auth.password) == ("PLAIN", "alice", "s3cret")
    assert auth.client_properties["product"] == "test"
    assert conn.capabilities == {"basic.nack": True}
    assert "s3cret" not in repr(auth)
    assert conn.state == AUTHENTICATING and amqp.output(conn) == b""

    conn.login_ok()
    tune = only_method(amqp, conn, 0)
    assert isinstance(tune, commands.Connection.Tune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    assert conn.state == AWAIT_TUNE_OK

    assert amqp.feed(conn, codec.method_frame(0, commands.Connection.TuneOk(
        channel_max=100, frame_max=65536, heartbeat=30))) == []
    assert (conn.channel_max, conn.frame_max, conn.heartbeat_s) == (100, 65536, 30)
    assert conn.state == AWAIT_OPEN

    (ov,) = amqp.feed(conn, codec.method_frame(0, commands.Connection.Open(virtual_host="/prod")))
    assert isinstance(ov, OpenVhost) and ov.vhost == "/prod" and conn.vhost == "/prod"
    assert conn.state == OPENING and not conn.is_open
    conn.open_ok()
    assert isinstance(only_method(amqp, conn, 0), commands.Connection.OpenOk)
    assert conn.is_open and conn.state == OPEN


def test_handshake_amqplain(amqp):
    conn = Connection(amqp.SERVER_PROPERTIES)
    amqp.feed(conn, spec.PROTOCOL_HEADER)
    response = encode.field_table({"LOGIN": "bob", "PASSWORD": "pw with spaces"})[4:]
    (auth,) = amqp.feed(conn, codec.method_frame(0, commands.Connection.StartOk(
        client_properties={}, mechanism="AMQPLAIN", response=response.decode(), locale="en_US")))
    assert isinstance(auth, Authenticate)
    assert (auth.mechanism, auth.username, auth.password) == ("AMQPLAIN", "bob", "pw with spaces")


def test_whole_handshake_in_one_read_then_one_byte_at_a_time(amqp):
    stream = (spec.PROTOCOL_HEADER + amqp.plain_start_ok())
    for chunking in ("whole", "bytes"):
        conn = Connection(amqp.SERVER_PROPERTIES)
        events = []
        if chunking == "whole":
            events += amqp.feed(conn, stream)
        else:
            for i in range(len(stream)):
                events += amqp.feed(conn, stream[i:i + 1])
        assert [type(e) for e in events] == [Authenticate]
        assert [type(m) for _c, m in amqp.methods_out(conn)] == [commands.Connection.Start]


def test_login_refused_closes_with_access_refused_when_the_client_can_hear_it(amqp):
    # clients announcing authentication_failure_close get connection.close 403 (RabbitMQ)
    conn = Connection(amqp.SERVER_PROPERTIES)
    amqp.feed(conn, spec.PROTOCOL_HEADER)
    amqp.feed(conn, codec.method_frame(0, commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}}, mechanism="PLAIN",
        response="\0mallory\0nope", locale="en_US")))
    conn.take_output()
    conn.login_refused("Login was refused using authentication mechanism PLAIN.")
    assert_connection_closed_by_server(amqp, conn, spec.ACCESS_REFUSED, (0, 0))  # RabbitMQ names no method


def test_login_refused_just_drops_older_clients(amqp):
    # without the capability the spec's only signal is the socket closing
    conn = Connection(amqp.SERVER_PROPERTIES)
    amqp.feed(conn, spec.PROTOCOL_HEADER)
    amqp.feed(conn, amqp.plain_start_ok("mallory", "nope"))
    conn.take_output()
    conn.login_refused("Login was refused using authentication mechanism PLAIN.")
    assert conn.state == CLOSED and conn.close_reason[0] == spec.ACCESS_REFUSED
    assert amqp.output(conn) == b""


def test_mechanism_the_server_never_offered_drops_the_connection(amqp):
    conn = Connection(amqp.SERVER_PROPERTIES)
    amqp.feed(conn, spec.PROTOCOL_HEADER)
    conn.take_output()
    (ev,) = amqp.feed(conn, codec.method_frame(0, commands.Connection.StartOk(
        client_properties={}, mechanism="EXTERNAL", response="", locale="en_US")))
    assert isinstance(ev, ConnectionClosed) and ev.code == spec.COMMAND_INVALID and not ev.by_client
    assert conn.state == CLOSED and amqp.output(conn) == b""


@pytest.mark.parametrize("mechanism,response", [
    ("PLAIN", "no-nul-separators"),
    ("AMQPLAIN", "\x05LOGINS\x00\x00\x00\xff"),  # table entry longer than the response
])
def test_malformed_login_response_is_access_refused(amqp, mechanism, response):
    conn = Connection(amqp.SERVER_PROPERTIES)
    amqp.feed(conn, spec.PROTOCOL_HEADER)
    conn.take_output()
    (ev,) = amqp.feed(conn, codec.method_frame(0, commands.Connection.StartOk(
        client_properties={}, mechanism=mechanism, response=response, locale="en_US")))
    assert isinstance(ev, ConnectionClosed) and ev.code == spec.ACCESS_REFUSED
    assert_connection_closed_by_server(amqp, conn, spec.ACCESS_REFUSED, (10, 11))


@pytest.mark.parametrize("header", [
    b"AMQP\x01\x01\x00\x0a",  # AMQP 0-10
    b"AMQP\x00\x00\x09\x00",  # 0-9
    b"AMQP\x00\x00\x08\x00",  # 0-8 as old clients send it
    b"GET / HTTP/1.1\r\n\r\n",
    b"\x01\x00\x00\x00\x00\x00\x0c",
])
def test_wrong_protocol_header_gets_ours_back_and_the_connection_ends(amqp, header):
    conn = Connection(amqp.SERVER_PROPERTIES)
    events = amqp.feed(conn, header)
    assert len(events) == 1 and isinstance(events[0], ConnectionClosed) and not events[0].by_client
    assert amqp.output(conn) == spec.PROTOCOL_HEADER  # spec 4.2.2: reply with the version we speak
    assert conn.state == CLOSED
    assert amqp.feed(conn, spec.PROTOCOL_HEADER + amqp.plain_start_ok()) == []
    assert amqp.output(conn) == b""


def test_partial_protocol_header_waits_for_the_rest(amqp):
    conn = Connection(amqp.SERVER_PROPERTIES)
    assert amqp.feed(conn, b"AMQ") == [] and conn.state != CLOSED and amqp.output(conn) == b""
    assert amqp.feed(conn, b"P\x00\x00\x09") == []
    assert amqp.feed(conn, b"\x01") == []
    assert conn.state == AWAIT_START_OK


def test_protocol_header_prefix_mismatch_is_detected_before_eight_bytes(amqp):
    conn = Connection(amqp.SERVER_PROPERTIES)
    (ev,) = amqp.feed(conn, b"GE")
    assert isinstance(ev, ConnectionClosed) and conn.state == CLOSED
    assert amqp.output(conn) == spec.PROTOCOL_HEADER


def _started(amqp) -> Connection:
    conn = Connection(amqp.SERVER_PROPERTIES)
    amqp.feed(conn, spec.PROTOCOL_HEADER)
    conn.take_output()
    return conn


def _tuned(amqp) -> Connection:
    conn = _started(amqp)
    amqp.feed(conn, amqp.plain_start_ok())
    conn.login_ok()
    conn.take_output()
    return conn


@pytest.mark.parametrize("frame,code", [
    # methods out of the handshake's order
    (codec.method_frame(0, commands.Connection.Open(virtual_host="/")), spec.COMMAND_INVALID),
    (codec.method_frame(0, commands.Connection.TuneOk(channel_max=0, frame_max=0, heartbeat=0)),
     spec.COMMAND_INVALID),
    (codec.method_frame(0, commands.Queue.Declare(queue="q")), spec.COMMAND_INVALID),
    # anything but a method on channel 0
    (codec.method_frame(1, commands.Channel.Open()), spec.UNEXPECTED_FRAME),
    (struct.pack(">BHI", 2, 0, 14) + struct.pack(">HHQ", 60, 0, 0) + b"\x00\x00" + b"\xce", spec.UNEXPECTED_FRAME),
    (struct.pack(">BHI", 3, 0, 1) + b"x" + b"\xce", spec.UNEXPECTED_FRAME),
])
def test_frames_before_start_ok_are_refused(amqp, frame, code):
    conn = _started(amqp)
    assert amqp.feed(conn, frame) == []
    assert_connection_closed_by_server(amqp, conn, code)


def test_methods_out_of_handshake_order_are_command_invalid(amqp):
    # open before tune-ok
    conn = _tuned(amqp)
    amqp.feed(conn, codec.method_frame(0, commands.Connection.Open(virtual_host="/")))
    assert_connection_closed_by_server(amqp, conn, spec.COMMAND_INVALID, (10, 40))
    # a second start-ok while the broker is still checking the first
    conn = _started(amqp)
    amqp.feed(conn, amqp.plain_start_ok())
    amqp.feed(conn, amqp.plain_start_ok())
    assert_connection_closed_by_server(amqp, conn, spec.COMMAND_INVALID, (10, 11))
    # channel.open between connection.open and open-ok
    conn = _tuned(amqp)
    amqp.feed(conn, codec.method_frame(0, commands.Connection.TuneOk(channel_max=0, frame_max=0, heartbeat=0)))
    amqp.feed(conn, codec.method_frame(0, commands.Connection.Open(virtual_host="/")))
    assert conn.state == OPENING
    amqp.feed(conn, codec.method_frame(1, commands.Channel.Open()))
    assert_connection_closed_by_server(amqp, conn, spec.UNEXPECTED_FRAME)


def test_heartbeats_during_the_handshake_are_ignored(amqp):
    conn = _started(amqp)
    assert amqp.feed(conn, codec.HEARTBEAT_FRAME * 3) == []
    (auth,) = amqp.feed(conn, amqp.plain_start_ok())
    assert isinstance(auth, Authenticate)


def test_client_close_during_the_handshake_gets_close_ok(amqp):
    conn = _tuned(amqp)
    (ev,) = amqp.feed(conn, codec.method_frame(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)))
    assert isinstance(ev, ConnectionClosed) and ev.by_client and (ev.code, ev.text) == (200, "bye")
    assert isinstance(only_method(amqp, conn, 0), commands.Connection.CloseOk)
    assert conn.state == CLOSED


# ------------------------------------------------------------------ tune-ok negotiation

@pytest.mark.parametrize("channel_max,frame_max,text", [
    (0, 4095, "frame_max=4095 < 4096"),  # below the spec's minimum frame size
    (0, 1, "frame_max=1 < 4096"),
    (0, 131073, "frame_max=131073 > 131072"),  # above what the server offered
    (2048, 131072, "channel_max=2048 > 2047"),
])
def test_tune_ok_outside_the_limits_is_not_allowed(amqp, channel_max, frame_max, text):
    conn = _tuned(amqp)
    amqp.feed(conn, codec.method_frame(0, commands.Connection.TuneOk(
        channel_max=channel_max, frame_max=frame_max, heartbeat=0)))
    m = assert_connection_closed_by_server(amqp, conn, spec.NOT_ALLOWED)
    assert text in m.reply_text


def test_tune_ok_zero_means_the_servers_limit(amqp):
    conn = amqp.open_connection(client_frame_max=0, client_channel_max=0)
    assert (conn.frame_max, conn.channel_max) == (131072, 2047)


def test_tune_ok_lower_limits_are_adopted_and_enforced(amqp):
    conn = amqp.open_connection(client_frame_max=4096, client_channel_max=3, channels=())
    assert (conn.frame_max, conn.channel_max) == (4096, 3)
    # as RabbitMQ: channel_max bounds how many channels are open, whatever their numbers
    for n in (3, 9, 65535):
        (ev,) = amqp.feed(conn, codec.method_frame(n, commands.Channel.Open()))
        assert isinstance(ev, ChannelOpened)
    conn.take_output()
    amqp.feed(conn, codec.method_frame(4, commands.Channel.Open()))
    m = assert_connection_closed_by_server(amqp, conn, spec.NOT_ALLOWED, (20, 10))
    assert m.reply_text == ("NOT_ALLOWED - number of channels opened (3) has reached the negotiated "
                            "channel_max (3)")
    # a frame of exactly 4096 bytes is fine, and so (RabbitMQ's tolerance) is a payload of 4096
    # bytes; one byte more is a frame error
    conn = amqp.open_connection(client_frame_max=4096)
    events = amqp.feed(conn, amqp.publish(1, b"x" * (4096 - 8), frame_max=4096))
    assert [type(e) for e in events] == [Publish]
    events = amqp.feed(conn, amqp.publish(1, b"x" * 4096, frame_max=4096 + 8))
    assert [type(e) for e in events] == [Publish]
    amqp.feed(conn, amqp.publish(1, b"x" * 4097, frame_max=4096 + 9))
    assert_connection_closed_by_server(amqp, conn, spec.FRAME_ERROR)


# ================================================================== channels

def test_channel_open_and_client_close(amqp):
    conn = amqp.open_connection(channels=())
    (ev,) = amqp.feed(conn, codec.method_frame(5, commands.Channel.Open()))
    assert isinstance(ev, ChannelOpened) and ev.channel == 5
    assert isinstance(only_method(amqp, conn, 5), commands.Channel.OpenOk)
    assert conn.channel_is_open(5) and conn.open_channels() == [5]

    (ev,) = amqp.feed(conn, codec.method_frame(5, commands.Channel.Close(reply_code=200, reply_text="done", class_id=0, method_id=0)))
    assert isinstance(ev, ChannelClosed) and (ev.channel, ev.code, ev.text) == (5, 200, "done")
    assert isinstance(only_method(amqp, conn, 5), commands.Channel.CloseOk)
    assert not conn.channel_is_open(5) and conn.open_channels() == []
    # the client may reuse the number at once: its close was acknowledged
    (ev,) = amqp.feed(conn, codec.method_frame(5, commands.Channel.Open()))
    assert isinstance(ev, ChannelOpened)


def test_server_closed_channel_is_reused_only_after_close_ok(amqp):
    conn = amqp.open_connection(channels=(1, 2))
    conn.close_channel(1, spec.NOT_FOUND, "no queue 'q' in vhost '/'", 50, 10)
    m = only_method(amqp, conn, 1)
    assert isinstance(m, commands.Channel.Close)
    assert (m.reply_code, m.reply_text, m.class_id, m.method_id) == (
        404, "NOT_FOUND - no queue 'q' in vhost '/'", 50, 10)
    assert not conn.channel_is_open(1) and conn.open_channels() == [2]
    conn.close_channel(1, spec.NOT_FOUND, "again")  # closing twice sends nothing more
    assert amqp.output(conn) == b""

    # until close-ok, everything on channel 1 is dropped, a channel.open included
    dropped = (codec.method_frame(1, commands.Queue.Declare(queue="q")) + amqp.publish(1, b"lost")
               + codec.method_frame(1, commands.Basic.Ack(delivery_tag=1)) + codec.method_frame(1, commands.Channel.Open()))
    assert amqp.feed(conn, dropped) == []
    assert amqp.output(conn) == b"" and conn.is_open
    # other channels carry on meanwhile
    (ev,) = amqp.feed(conn, amqp.publish(2, b"kept"))
    assert isinstance(ev, Publish) and ev.channel == 2 and ev.body == b"kept"

    assert amqp.feed(conn, codec.method_frame(1, commands.Channel.CloseOk())) == []
    (ev,) = amqp.feed(conn, codec.method_frame(1, commands.Channel.Open()))
    assert isinstance(ev, ChannelOpened) and conn.channel_is_open(1)


def test_channel_close_crossing_the_servers_close_gets_close_ok(amqp):
    conn = amqp.open_connection()
    conn.close_channel(1, spec.PRECONDITION_FAILED, "unknown delivery tag 9", 60, 80)
    conn.take_output()
    assert amqp.feed(conn, codec.method_frame(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))) == []
    assert isinstance(only_method(amqp, conn, 1), commands.Channel.CloseOk)
    assert amqp.feed(conn, codec.method_frame(1, commands.Channel.CloseOk())) == []
    assert 1 not in conn.open_channels()
    (ev,) = amqp.feed(conn, codec.method_frame(1, commands.Channel.Open()))
    assert isinstance(ev, ChannelOpened)


def test_second_channel_open_is_channel_error(amqp):
    conn = amqp.open_connection()
    amqp.feed(conn, codec.method_frame(1, commands.Channel.Open()))
    assert_connection_closed_by_server(amqp, conn, spec.CHANNEL_ERROR, (20, 10))


@pytest.mark.parametrize("frame", [
    codec.method_frame(9, commands.Queue.Declare(queue="q")),
    codec.method_frame(9, commands.Basic.Publish(exchange="", routing_key="q")),
    codec.method_frame(9, commands.Basic.Ack(delivery_tag=1)),
    codec.method_frame(9, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)),
    struct.pack(">BHI", 2, 9, 14) + struct.pack(">HHQ", 60, 0, 0) + b"\x00\x00" + b"\xce",
    struct.pack(">BHI", 3, 9, 1) + b"x" + b"\xce",
])
def test_frames_on_an_unopened_channel_are_channel_error(amqp, frame):
    conn = amqp.open_connection()
    assert amqp.feed(conn, frame) == []
    assert_connection_closed_by_server(amqp, conn, spec.CHANNEL_ERROR)


def test_channel_flow_active_is_answered_and_reported(amqp):
    conn = amqp.open_connection()
    (ev,) = amqp.feed(conn, codec.method_frame(1, commands.Channel.Flow(active=True)))
    assert isinstance(ev, ChannelFlow) and (ev.channel, ev.active) == (1, True)
    m = only_method(amqp, conn, 1)
    assert isinstance(m, commands.Channel.FlowOk) and m.active is True


def test_channel_flow_inactive_from_a_client_is_not_implemented(amqp):
    # RabbitMQ 3.x refuses client-initiated flow control with a connection error
    conn = amqp.open_connection()
    assert amqp.feed(conn, codec.method_frame(1, commands.Channel.Flow(active=False))) == []
    assert_connection_closed_by_server(amqp, conn, spec.NOT_IMPLEMENTED, (20, 20))


def test_acks_nacks_and_rejects_become_their_own_events(amqp):
    conn = amqp.open_connection()
    events = amqp.feed(conn, codec.method_frame(1, commands.Basic.Ack(delivery_tag=7, multiple=True))
                       + codec.method_frame(1, commands.Basic.Nack(delivery_tag=8, multiple=False, requeue=True))
                       + codec.method_frame(1, commands.Basic.Reject(delivery_tag=2 ** 63 - 1, requeue=False)))
    assert [type(e) for e in events] == [Ack, Nack, Reject]
    assert (events[0].delivery_tag, events[0].multiple) == (7, True)
    assert (events[1].delivery_tag, events[1].multiple, events[1].requeue) == (8, False, True)
    assert (events[2].delivery_tag, events[2].requeue) == (2 ** 63 - 1, False)


@pytest.mark.parametrize("index", [0x003C0028, 0x003C0050, 0x003C0078, 0x003C005A])
def test_truncated_hot_path_methods_are_frame_errors(amqp, index):
    # RabbitMQ: frame_error "cannot decode", as for any method whose arguments do not parse
    conn = amqp.open_connection()
    assert amqp.feed(conn, amqp.frame(1, 1, struct.pack(">I", index) + b"\x00")) == []
    m = assert_connection_closed_by_server(amqp, conn, spec.FRAME_ERROR, divmod(index, 0x10000))
    assert "cannot decode" in m.reply_text


def test_connection_methods_on_a_non_zero_channel_are_command_invalid(amqp):
    conn = amqp.open_connection()
    amqp.feed(conn, codec.method_frame(1, commands.Connection.Close(
        reply_code=200, reply_text="", class_id=0, method_id=0)))
    assert_connection_closed_by_server(amqp, conn, spec.COMMAND_INVALID, (10, 50))


def test_other_methods_on_channel_zero_are_channel_error(amqp):
    # RabbitMQ: "unexpected method in connection state running"
    conn = amqp.open_connection()
    amqp.feed(conn, codec.method_frame(0, commands.Queue.Declare(queue="q")))
    m = assert_connection_closed_by_server(amqp, conn, spec.CHANNEL_ERROR, (50, 10))
    assert "unexpected method" in m.reply_text


def test_content_frames_on_channel_zero_are_unexpected(amqp):
    conn = amqp.open_connection()
    amqp.feed(conn, amqp.header(0, 0))
    assert_connection_closed_by_server(amqp, conn, spec.UNEXPECTED_FRAME)


def test_other_connection_methods_on_channel_zero_go_to_the_broker(amqp):
    conn = amqp.open_connection()
    (ev,) = amqp.feed(conn, codec.method_frame(0, commands.Connection.UpdateSecret(new_secret="t", reason="r")))
    assert isinstance(ev, Method) and ev.channel == 0 and ev.method.name == "Connection.UpdateSecret"


def test_heartbeat_on_a_non_zero_channel_is_unexpected_frame(amqp):
    conn = amqp.open_connection()
    amqp.feed(conn, amqp.frame(spec.FRAME_HEARTBEAT, 1, b""))
    assert_connection_closed_by_server(amqp, conn, spec.UNEXPECTED_FRAME)


def test_unknown_frame_type_is_a_frame_error(amqp):
    conn = amqp.open_connection()
    amqp.feed(conn, amqp.frame(4, 1, b"abc"))
    assert_connection_closed_by_server(amqp, conn, spec.FRAME_ERROR)


# ================================================================== content (spec 4.2.6)

PROPS = commands.Basic.Properties(content_type="application/json", delivery_mode=2,
                                  headers={"k": [1, "two", {"three": 3}]}).marshal()


def test_content_is_assembled_across_many_body_frames(amqp):
    conn = amqp.open_connection(client_frame_max=4096)
    body = bytes(range(256)) * 100  # 25600 bytes -> 7 body frames of at most 4088 bytes
    stream = amqp.publish(1, body, exchange="amq.topic", routing_key="a.b", props=PROPS, frame_max=4096)
    assert len([f for f in amqp.parse(stream) if f.type == spec.FRAME_BODY]) == 7
    (ev,) = amqp.feed(conn, stream)
    assert isinstance(ev, Publish)
    assert (ev.channel, ev.exchange, ev.routing_key, ev.mandatory, ev.immediate) == (1, "amq.topic", "a.b", False, False)
    assert ev.route_enc == codec.route_encoding("amq.topic", "a.b")
    assert ev.props == PROPS and ev.body == body
    assert conn._channels[1].parts == [] and conn.buffered_bytes == 0


def test_content_fed_one_byte_at_a_time_gives_the_same_publish(amqp):
    conn = amqp.open_connection(client_frame_max=4096)
    body = b"0123456789" * 900
    stream = (amqp.publish(1, body, routing_key="rk", props=PROPS, frame_max=4096)
              + codec.method_frame(1, commands.Basic.Publish(exchange="", routing_key="e", mandatory=True))
              + amqp.header(1, 0, PROPS))
    events = []
    for i in range(len(stream)):
        events += amqp.feed(conn, stream[i:i + 1])
        assert conn.buffered_bytes < conn.frame_max
    assert [type(e) for e in events] == [Publish, Publish]
    assert events[0].body == body and events[0].props == PROPS and events[0].routing_key == "rk"
    # an empty body has no body frames: the header completes the message
    assert events[1].body == b"" and events[1].mandatory and events[1].routing_key == "e"


def test_content_on_different_channels_may_interleave(amqp):
    conn = amqp.open_connection(channels=(1, 2))
    frames_1 = amqp.parse(amqp.publish(1, b"a" * 10000, routing_key="one", frame_max=4096))
    frames_2 = amqp.parse(amqp.publish(2, b"b" * 6000, routing_key="two", frame_max=4096))
    stream = b""
    for i in range(max(len(frames_1), len(frames_2))):
        for fs in (frames_1, frames_2):
            if i < len(fs):
                stream += amqp.frame(fs[i].type, fs[i].channel, fs[i].payload)
    events = amqp.feed(conn, stream)
    assert sorted((e.channel, e.routing_key, e.body) for e in events) == [
        (1, "one", b"a" * 10000), (2, "two", b"b" * 6000)]


@pytest.mark.parametrize("frames", [
    lambda a: a.header(1, 5),  # header with no publish before it
    lambda a: a.body(1, b"x"),  # body with no publish before it
    lambda a: codec.method_frame(1, commands.Basic.Publish()) + a.body(1, b"x"),  # body before header
    lambda a: codec.method_frame(1, commands.Basic.Publish()) + codec.method_frame(1, commands.Basic.Qos()),
    lambda a: codec.method_frame(1, commands.Basic.Publish()) + a.header(1, 4) + a.body(1, b"ab")
    + codec.method_frame(1, commands.Basic.Qos()),  # method before the body is complete
    lambda a: codec.method_frame(1, commands.Basic.Publish()) + a.header(1, 2) + a.header(1, 2),
    lambda a: a.publish(1, b"done") + a.body(1, b"more"),  # body after the message completed
])
def test_content_frames_out_of_order_are_unexpected_frame(amqp, frames):
    conn = amqp.open_connection()
    amqp.feed(conn, frames(amqp))
    assert_connection_closed_by_server(amqp, conn, spec.UNEXPECTED_FRAME)


def test_body_larger_than_declared_is_a_frame_error(amqp):
    conn = amqp.open_connection()
    stream = codec.method_frame(1, commands.Basic.Publish()) + amqp.header(1, 5) + amqp.body(1, b"abc")
    assert amqp.feed(conn, stream + amqp.body(1, b"def")) == []
    assert_connection_closed_by_server(amqp, conn, spec.FRAME_ERROR)


def test_content_header_for_another_class_is_unexpected_frame(amqp):
    conn = amqp.open_connection()
    amqp.feed(conn, codec.method_frame(1, commands.Basic.Publish()) + amqp.header(1, 1, class_id=50))
    m = assert_connection_closed_by_server(amqp, conn, spec.UNEXPECTED_FRAME, (60, 40))
    assert "class 50" in m.reply_text


def test_oversized_frame_is_refused_from_its_header_alone(amqp):
    conn = amqp.open_connection()
    # only the 7-byte header of a frame declaring far more than frame_max
    assert amqp.feed(conn, struct.pack(">BHI", 3, 1, 0xFFFFFFF0) + b"x") == []
    assert conn.buffered_bytes == 0
    m = assert_connection_closed_by_server(amqp, conn, spec.FRAME_ERROR)
    assert "frame_max" in m.reply_text


def test_bad_frame_end_octet_is_a_frame_error(amqp):
    conn = amqp.open_connection()
    raw = bytearray(codec.method_frame(1, commands.Basic.Qos(prefetch_count=1)))
    raw[-1] = 0x00
    amqp.feed(conn, bytes(raw))
    assert_connection_closed_by_server(amqp, conn, spec.FRAME_ERROR)


def test_message_larger_than_message_bytes_max_is_refused_at_the_header(amqp):
    conn = amqp.open_connection(channels=(1, 2), message_bytes_max=1000)
    stream = codec.method_frame(1, commands.Basic.Publish(exchange="", routing_key="q")) + amqp.header(1, 1001)
    (ev,) = amqp.feed(conn, stream)
    assert isinstance(ev, ChannelClosed) and (ev.channel, ev.code) == (1, spec.PRECONDITION_FAILED)
    m = only_method(amqp, conn, 1)
    assert isinstance(m, commands.Channel.Close)
    assert (m.reply_code, m.class_id, m.method_id) == (406, 60, 40)
    assert m.reply_text == "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000"
    # the body frames that follow are dropped, not buffered
    assert amqp.feed(conn, amqp.body(1, b"x" * 1000) + amqp.body(1, b"y")) == []
    assert conn._channels[1].parts == [] and conn.buffered_bytes == 0
    assert conn.is_open and amqp.output(conn) == b""
    # at the limit is fine, on another channel
    (ev,) = amqp.feed(conn, amqp.publish(2, b"z" * 1000))
    assert isinstance(ev, Publish) and len(ev.body) == 1000
    amqp.feed(conn, codec.method_frame(1, commands.Channel.CloseOk()))
    (ev,) = amqp.feed(conn, codec.method_frame(1, commands.Channel.Open()))
    assert isinstance(ev, ChannelOpened)


def test_frames_after_the_broker_closes_a_channel_mid_read_are_dropped(amqp):
    conn = amqp.open_connection()
    stream = amqp.publish(1, b"first") + amqp.publish(1, b"second")
    seen = []
    for ev in conn.receive_data(stream):
        seen.append(ev)
        conn.close_channel(1, spec.NOT_FOUND, "no exchange ''")
    assert [e.body for e in seen] == [b"first"]


# ================================================================== closing the connection

def test_client_close_gets_close_ok_and_ends_the_connection(amqp):
    conn = amqp.open_connection()
    (ev,) = amqp.feed(conn, codec.method_frame(0, commands.Connection.Close(
        reply_code=320, reply_text="shutdown", class_id=0, method_id=0)) + amqp.publish(1, b"ignored"))
    assert isinstance(ev, ConnectionClosed) and ev.by_client and (ev.code, ev.text) == (320, "shutdown")
    assert isinstance(only_method(amqp, conn, 0), commands.Connection.CloseOk)
    assert conn.state == CLOSED
    assert amqp.feed(conn, amqp.publish(1, b"after")) == [] and amqp.output(conn) == b""


def test_server_close_waits_for_close_ok_and_ignores_everything_else(amqp):
    conn = amqp.open_connection()
    conn.close(spec.CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'")
    conn.close(spec.INTERNAL_ERROR, "second close is ignored")
    m = only_method(amqp, conn, 0)
    assert (m.reply_code, m.reply_text) == (320, "CONNECTION_FORCED - broker forced connection closure "
                                                 "with reason 'shutdown'")
    assert conn.state == CLOSING
    ignored = (amqp.publish(1, b"late") + codec.method_frame(1, commands.Basic.Ack(delivery_tag=1))
               + codec.method_frame(2, commands.Channel.Open()) + codec.HEARTBEAT_FRAME)
    assert amqp.feed(conn, ignored) == [] and conn.state == CLOSING and amqp.output(conn) == b""
    (ev,) = amqp.feed(conn, codec.method_frame(0, commands.Connection.CloseOk()))
    assert isinstance(ev, ConnectionClosed) and not ev.by_client and ev.code == 320
    assert conn.state == CLOSED


def test_close_crossing_the_servers_close_gets_close_ok(amqp):
    conn = amqp.open_connection()
    conn.close(spec.CONNECTION_FORCED, "going away")
    conn.take_output()
    (ev,) = amqp.feed(conn, codec.method_frame(0, commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0)))
    assert isinstance(ev, ConnectionClosed) and ev.code == 320
    assert isinstance(only_method(amqp, conn, 0), commands.Connection.CloseOk)
    assert conn.state == CLOSED


def test_reply_text_is_cut_to_a_short_string(amqp):
    conn = amqp.open_connection()
    conn.close_channel(1, spec.NOT_FOUND, "q" * 400)
    m = only_method(amqp, conn, 1)
    assert len(m.reply_text) == spec.SHORTSTR_MAX and m.reply_text.endswith("...")
    conn.close(spec.INTERNAL_ERROR, "é" * 300)  # cut by bytes, never inside a character
    m = only_method(amqp, conn, 0)
    assert len(m.reply_text.encode()) <= spec.SHORTSTR_MAX and m.reply_text.startswith("INTERNAL_ERROR - éé")


def test_closing_ticks_count_while_waiting_for_close_ok(amqp):
    conn = amqp.open_connection(client_heartbeat_s=60)
    conn.close(spec.CONNECTION_FORCED, "bye")
    conn.take_output()
    for _ in range(3):
        assert conn.tick() == []
    assert conn.closing_ticks == 3 and amqp.output(conn) == b""  # no heartbeats while closing


# ================================================================== heartbeats

def test_heartbeat_is_sent_only_when_nothing_else_went_out(amqp):
    conn = amqp.open_connection(client_heartbeat_s=10)
    assert conn.heartbeat_s == 10
    conn.tick()  # the handshake's output was taken since the last tick: no heartbeat needed
    assert amqp.output(conn) == b""
    conn.tick()
    assert amqp.output(conn) == codec.HEARTBEAT_FRAME
    conn.tick()  # the heartbeat itself went out: counts as traffic
    assert amqp.output(conn) == b""
    conn.tick()
    assert amqp.output(conn) == codec.HEARTBEAT_FRAME
    conn.send_method(1, commands.Basic.QosOk())
    conn.tick()  # pending output will go out anyway
    assert [type(m) for _c, m in amqp.methods_out(conn)] == [commands.Basic.QosOk]


def test_peer_silent_for_four_ticks_is_a_heartbeat_timeout(amqp):
    conn = amqp.open_connection(client_heartbeat_s=10)
    conn.tick()  # the handshake was the last traffic
    for _ in range(3):
        assert conn.tick() == []
        assert conn.state == OPEN
    (ev,) = conn.tick()
    assert isinstance(ev, HeartbeatTimeout) and ev.timeout_s == 10
    assert conn.state == CLOSED
    assert amqp.feed(conn, codec.HEARTBEAT_FRAME) == []


def test_any_frame_from_the_peer_resets_the_silence_count(amqp):
    conn = amqp.open_connection(client_heartbeat_s=10)
    for _ in range(10):
        assert conn.tick() == []
        assert conn.tick() == []
        assert conn.tick() == []
        amqp.feed(conn, codec.HEARTBEAT_FRAME)
    assert conn.state == OPEN


def test_heartbeat_zero_disables_heartbeats(amqp):
    conn = amqp.open_connection(client_heartbeat_s=0)
    for _ in range(20):
        assert conn.tick() == []
    assert conn.state == OPEN and amqp.output(conn) == b""
