"""The server side of a stream protocol connection (hutch.streamproto.connection) against
rabbit_stream_reader.erl: the handshake in RabbitMQ's order, what RabbitMQ answers to a command
out of order, bad credentials or a refused vhost, the closes (client's, server's, and for broken
frames), tune negotiation, heartbeats and timeouts counted by ticks; then the real clients,
rstream 1.1.1 and rbfly 0.10.0, connecting over a real socket to a small asyncio server that
feeds StreamConnection and answers as a broker would.
"""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hutch.streamproto import chunk
from hutch.streamproto import frames as f
from hutch.streamproto.connection import (
    AWAIT_OPEN,
    CLOSE_SENT,
    CLOSED,
    OPEN,
    Authenticate,
    ConnectionClosed,
    ConnectionTimedOut,
    OpenVhost,
    ProtocolError,
    StreamConnection,
    negotiate,
    parse_amqplain,
    server_properties,
)

PROPS = server_properties("0.1.0", cluster_name="hutch@test")
ADVERTISED = {"advertised_host": "localhost", "advertised_port": "5552"}


def sent(conn: StreamConnection) -> list[f.Command]:
    """What the server queued, decoded as a client would."""
    decoder = f.FrameDecoder()
    decoder.feed(b"".join(bytes(b) for b in conn.data_to_send()))
    return list(decoder)


def feed(conn: StreamConnection, *cmds: f.Command) -> list:
    return list(conn.receive_data(b"".join(f.encode(c) for c in cmds)))


def plain(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def open_connection(frame_max: int = 131072, heartbeat_s: int = 30) -> StreamConnection:
    """A connection through its handshake; frame_max and heartbeat_s are the client's tune."""
    conn = StreamConnection(PROPS)
    feed(conn, f.PeerProperties(1, {"product": "test"}), f.SaslHandshake(2))
    assert [type(e) for e in feed(conn, f.SaslAuthenticate(3, "PLAIN", plain("guest", "guest")))] == [Authenticate]
    conn.accept_auth()
    assert [type(e) for e in feed(conn, f.Tune(frame_max, heartbeat_s), f.Open(4, "/"))] == [OpenVhost]
    conn.open_ok(ADVERTISED)
    sent(conn)
    assert conn.state == OPEN
    return conn


# ---------------------------------------------------------------- the handshake


def test_handshake_in_rabbitmq_order():
    conn = StreamConnection(PROPS)
    assert feed(conn, f.PeerProperties(1, {"product": "RabbitMQ Stream"})) == []
    [props] = sent(conn)
    assert props == f.PeerPropertiesResponse(1, f.OK, PROPS) and props.properties["product"] == "hutch"
    assert conn.client_properties == {"product": "RabbitMQ Stream"}

    assert feed(conn, f.SaslHandshake(2)) == []
    assert sent(conn) == [f.SaslHandshakeResponse(2, f.OK, ["PLAIN", "AMQPLAIN"])]

    [auth] = feed(conn, f.SaslAuthenticate(3, "PLAIN", plain("guest", "s3cret")))
    assert (type(auth), auth.mechanism, auth.username, auth.password, auth.update) == (
        Authenticate, "PLAIN", "guest", "s3cret", False)
    assert "s3cret" not in repr(auth)
    conn.accept_auth()
    assert sent(conn) == [f.SaslAuthenticateResponse(3, f.OK), f.Tune(1048576, 60)]  # RabbitMQ's defaults

    assert feed(conn, f.Tune(131072, 30)) == []
    assert (conn.state, conn.frame_max, conn.heartbeat_s) == (AWAIT_OPEN, 131072, 30)
    [opening] = feed(conn, f.Open(4, "/"))
    assert type(opening) is OpenVhost and opening.vhost == "/"
    conn.open_ok(ADVERTISED)
    assert sent(conn) == [f.OpenResponse(4, f.OK, ADVERTISED)]
    assert conn.is_open


@pytest.mark.parametrize("server,client,agreed", [
    (1048576, 131072, 131072), (1048576, 2097152, 1048576), (1048576, 0, 1048576), (0, 65536, 65536), (0, 0, 0),
])
def test_tune_takes_the_smaller_non_zero_value(server, client, agreed):
    assert negotiate(server, client) == agreed


def test_amqplain_credentials():
    table = b"".join(bytes([len(k)]) + k + b"S" + struct.pack(">I", len(v)) + v
                     for k, v in ((b"LOGIN", b"guest"), (b"PASSWORD", b"pw")))
    assert parse_amqplain(table) == ("guest", "pw")
    assert parse_amqplain(table[:-1]) is None
    assert parse_amqplain(b"\x05LOGINS\x00\x00\x00\x01g") is None  # no PASSWORD


@pytest.mark.parametrize("first", [
    f.DeclarePublisher(1, 0, "", "s1"), f.Open(1, "/"), f.SaslHandshake(1), f.SaslAuthenticate(1, "PLAIN", b"\0u\0p"),
    f.Tune(0, 0), f.Close(1, f.OK, "OK"), f.Deliver(1, b""),
])
def test_a_command_out_of_order_closes_the_socket_with_nothing_sent(first):
    conn = StreamConnection(PROPS)
    events = feed(conn, first)
    assert [type(e) for e in events] == [ProtocolError, ConnectionClosed]
    assert events[1].code == f.UNKNOWN_FRAME and not events[1].by_client
    assert conn.closed and sent(conn) == []


def test_open_before_authentication_closes():
    conn = StreamConnection(PROPS)
    feed(conn, f.PeerProperties(1, {}), f.SaslHandshake(2))
    sent(conn)
    events = feed(conn, f.Open(3, "/"))
    assert type(events[-1]) is ConnectionClosed and conn.closed and sent(conn) == []


@pytest.mark.parametrize("mechanism,data,code", [
    ("EXTERNAL", b"", f.SASL_MECHANISM_NOT_SUPPORTED),
    ("PLAIN", b"guest\x00guest", f.SASL_ERROR),  # no leading NUL: RabbitMQ's "response invalid"
    ("PLAIN", None, f.SASL_ERROR),
    ("AMQPLAIN", b"\x05LOGIN", f.SASL_ERROR),
])
def test_unusable_sasl_response_is_answered_then_closed(mechanism, data, code):
    conn = StreamConnection(PROPS)
    feed(conn, f.PeerProperties(1, {}), f.SaslHandshake(2))
    sent(conn)
    [closed] = feed(conn, f.SaslAuthenticate(3, mechanism, data))
    assert type(closed) is ConnectionClosed and closed.code == code
    assert sent(conn) == [f.SaslAuthenticateResponse(3, code)] and conn.closed


def test_refused_credentials_get_authentication_failure_then_the_socket_closes():
    conn = StreamConnection(PROPS)
    feed(conn, f.PeerProperties(1, {}), f.SaslHandshake(2), f.SaslAuthenticate(3, "PLAIN", plain("guest", "bad")))
    sent(conn)
    conn.reject_auth()
    assert sent(conn) == [f.SaslAuthenticateResponse(3, f.AUTHENTICATION_FAILURE)] and conn.closed


def test_refused_vhost_gets_virtual_host_access_failure_then_the_socket_closes():
    conn = StreamConnection(PROPS)
    feed(conn, f.PeerProperties(1, {}), f.SaslHandshake(2), f.SaslAuthenticate(3, "PLAIN", plain("u", "p")))
    conn.accept_auth()
    feed(conn, f.Tune(0, 0), f.Open(4, "nope"))
    sent(conn)
    conn.open_refused()
    assert sent(conn) == [f.OpenResponse(4, f.VIRTUAL_HOST_ACCESS_FAILURE)] and conn.closed


def test_frames_after_authenticate_wait_for_the_brokers_answer():
    conn = StreamConnection(PROPS)
    data = b"".join(f.encode(c) for c in (f.PeerProperties(1, {}), f.SaslHandshake(2),
                                          f.SaslAuthenticate(3, "PLAIN", plain("u", "p")),
                                          f.Tune(65536, 10), f.Open(4, "/")))
    assert [type(e) for e in conn.receive_data(data)] == [Authenticate]
    assert conn.paused and conn.buffered_bytes > 0  # tune and open held, not decoded
    conn.accept_auth()
    assert not conn.paused
    assert [type(e) for e in conn.receive_data(b"")] == [OpenVhost]
    assert conn.frame_max == 65536


def test_frames_are_limited_to_8192_bytes_until_open():
    conn = StreamConnection(PROPS)
    events = feed(conn, f.PeerProperties(1, {"x": "y" * 9000}))
    assert events[0].code == f.FRAME_TOO_LARGE and conn.closed and sent(conn) == []


# ---------------------------------------------------------------- an open connection


def test_broker_commands_are_handed_over_as_decoded():
    conn = open_connection()
    cmds = [f.Create(5, "s1", {"max-age": "1h"}), f.DeclarePublisher(6, 1, "ref", "s1"),
            f.Publish(1, [(1, b"a"), (2, b"b")]), f.Subscribe(7, 0, "s1", f.OFFSET_TYPE_FIRST, None, 10, {}),
            f.Credit(0, 1), f.StoreOffset("app", "s1", 2), f.QueryOffset(8, "app", "s1"), f.Metadata(9, ["s1"]),
            f.ConsumerUpdateResponse(1, f.OK, f.OFFSET_TYPE_NEXT, None)]
    assert feed(conn, *cmds) == cmds
    conn.respond(cmds[0], f.OK)
    conn.send(f.PublishConfirm(1, [1, 2]))
    assert sent(conn) == [f.CreateResponse(5, f.OK), f.PublishConfirm(1, [1, 2])]


def test_a_command_the_server_does_not_take_gets_close_unknown_frame():
    conn = open_connection()
    events = feed(conn, f.Open(9, "/"), f.Create(10, "s1", {}))  # frames after the close are ignored
    assert [type(e) for e in events] == [ProtocolError]
    assert sent(conn) == [f.Close(1, f.UNKNOWN_FRAME, "unknown frame")] and conn.state == CLOSE_SENT
    [closed] = feed(conn, f.CloseResponse(1, f.OK))
    assert (closed.code, closed.reason, closed.by_client) == (f.UNKNOWN_FRAME, "unknown frame", False)
    assert conn.closed


def test_a_frame_over_the_negotiated_frame_max_gets_close_frame_too_large():
    conn = open_connection(frame_max=1024)
    events = feed(conn, f.Publish(1, [(1, b"x" * 2000)]))
    assert [type(e) for e in events] == [ProtocolError]
    assert sent(conn) == [f.Close(1, f.FRAME_TOO_LARGE, "frame too large")]


def test_a_malformed_frame_gets_close_unknown_frame():
    conn = open_connection()
    body = struct.pack(">HHB", f.KEY_CREDIT, 1, 0)  # credit without its credit
    events = list(conn.receive_data(struct.pack(">I", len(body)) + body))
    assert [type(e) for e in events] == [ProtocolError]
    assert sent(conn) == [f.Close(1, f.UNKNOWN_FRAME, "unknown frame")]


def test_client_close_is_answered_and_ends_the_connection():
    conn = open_connection()
    [closed] = feed(conn, f.Close(12, f.OK, "OK"))
    assert (closed.code, closed.reason, closed.by_client) == (f.OK, "OK", True)
    assert sent(conn) == [f.CloseResponse(12, f.OK)] and conn.closed


def test_command_versions_exchange_and_deliver_version_2():
    conn = open_connection()
    chunk = b"\x50" + bytes(47)
    conn.send_deliver(3, chunk, committed_chunk_id=5)
    assert sent(conn) == [f.Deliver(3, chunk)]  # version 1 until the client asks
    assert feed(conn, f.ExchangeCommandVersions(5, [(f.KEY_DELIVER, 1, 2)])) == []
    assert sent(conn) == [f.ExchangeCommandVersionsResponse(5, f.OK, f.SERVER_COMMAND_VERSIONS)]
    conn.send_deliver(3, memoryview(chunk), committed_chunk_id=5)
    out = conn.data_to_send()
    assert out[1].obj is chunk  # the chunk itself goes out, not a copy
    decoder = f.FrameDecoder()
    decoder.feed(b"".join(bytes(b) for b in out))
    assert list(decoder) == [f.DeliverV2(3, 5, chunk)]


def test_server_close_waits_for_the_clients_answer():
    conn = open_connection()
    conn.close(f.INTERNAL_ERROR, "node shutting down")
    assert sent(conn) == [f.Close(1, f.INTERNAL_ERROR, "node shutting down")]
    assert feed(conn, f.Publish(1, [(1, b"late")]), f.Heartbeat()) == []
    [closed] = feed(conn, f.CloseResponse(1, f.OK))
    assert closed.code == f.INTERNAL_ERROR and conn.closed


def test_consumer_update_correlation_ids_count():
    conn = open_connection()
    assert [conn.consumer_update(0, True), conn.consumer_update(1, False)] == [1, 2]
    assert sent(conn) == [f.ConsumerUpdate(1, 0, True), f.ConsumerUpdate(2, 1, False)]


def test_reauthentication_keeps_the_user_and_the_mechanism():
    conn = open_connection()
    [auth] = feed(conn, f.SaslAuthenticate(20, "PLAIN", plain("guest", "new-token")))
    assert auth.update and auth.password == "new-token"
    conn.accept_auth()
    assert sent(conn) == [f.SaslAuthenticateResponse(20, f.OK)] and conn.is_open
    assert feed(conn, f.SaslAuthenticate(21, "PLAIN", plain("admin", "x"))) == []
    assert feed(conn, f.SaslAuthenticate(22, "AMQPLAIN", b"")) == []
    assert sent(conn) == [f.SaslAuthenticateResponse(21, f.SASL_CANNOT_CHANGE_USERNAME),
                          f.SaslAuthenticateResponse(22, f.SASL_CANNOT_CHANGE_MECHANISM)]
    assert conn.is_open


# ---------------------------------------------------------------- heartbeats and timeouts


def test_heartbeat_sent_when_nothing_went_out_for_half_an_interval():
    conn = open_connection(heartbeat_s=4)
    assert conn.tick_interval_s == 1.0
    assert conn.tick(100.0) == [] and sent(conn) == []
    assert conn.tick(101.0) == [] and sent(conn) == []
    assert conn.tick(102.0) == [] and sent(conn) == [f.Heartbeat()]
    conn.send(f.PublishConfirm(0, [1]))
    conn.data_to_send()
    assert conn.tick(103.0) == [] and sent(conn) == []  # something went out: no heartbeat needed


def test_peer_silent_for_two_intervals_times_out():
    conn = open_connection(heartbeat_s=4)
    conn.tick(100.0)
    feed(conn, f.Heartbeat())
    conn.tick(104.0)  # heard at 104
    assert conn.tick(111.0) == []
    [timed_out] = conn.tick(112.0)
    assert type(timed_out) is ConnectionTimedOut and conn.closed


def test_a_late_tick_sends_the_heartbeat_that_was_due_before_it_times_out():
    """A busy event loop ticks late: the heartbeat that came due goes out all the same, then the
    silent client is timed out (a timer of its own would have sent it in between)."""
    conn = open_connection(heartbeat_s=1)
    conn.tick(100.0)
    [timed_out] = conn.tick(102.5)  # one tick missed: due to speak, and silent for 2.5 intervals
    assert sent(conn)[:1] == [f.Heartbeat()]
    assert type(timed_out) is ConnectionTimedOut and conn.closed


def test_no_heartbeats_when_the_client_answers_0():
    conn = open_connection(heartbeat_s=0)  # the server proposed 60
    assert conn.heartbeat_s == 0
    assert [conn.tick(t) for t in (0.0, 1000.0, 5000.0)] == [[], [], []] and sent(conn) == []


def test_a_handshake_step_left_unanswered_times_out():
    conn = StreamConnection(PROPS)
    conn.tick(0.0)
    assert conn.tick(9.0) == []
    [timed_out] = conn.tick(10.0)
    assert timed_out.state == "await_peer_properties" and "lack of client action" in timed_out.reason
    assert conn.closed


# ---------------------------------------------------------------- fuzz


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300), cut=st.integers(0, 300), opened=st.booleans())
def test_fuzz_any_bytes_end_open_closing_or_closed(data, cut, opened):
    conn = open_connection() if opened else StreamConnection(PROPS)
    for part in (data[:cut], data[cut:]):
        for ev in conn.receive_data(part):
            if type(ev) is Authenticate:
                conn.accept_auth()
            elif type(ev) is OpenVhost:
                conn.open_ok({})
        sent(conn)  # every byte queued is a well-formed frame
    assert conn.state in (OPEN, CLOSE_SENT, CLOSED) or not opened


CLIENT_SESSION = [f.PeerProperties(1, {"product": "test"}), f.SaslHandshake(2),
                  f.SaslAuthenticate(3, "PLAIN", b"\x00guest\x00guest"), f.Tune(65536, 10), f.Open(4, "/"),
                  f.ExchangeCommandVersions(5, [(f.KEY_DELIVER, 1, 2)]), f.Create(6, "s1", {}),
                  f.DeclarePublisher(7, 0, "", "s1"), f.Publish(0, [(1, b"a"), (2, b"bc")]),
                  f.Subscribe(8, 0, "s1", f.OFFSET_TYPE_FIRST, None, 5, {}), f.Credit(0, 1), f.Heartbeat(),
                  f.SaslAuthenticate(9, "PLAIN", b"\x00guest\x00new"), f.Close(10, f.OK, "OK")]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255), st.sampled_from("sid")), max_size=4),
       cuts=st.lists(st.integers(0, 10_000), max_size=5), refuse=st.booleans())
def test_fuzz_mutated_client_sessions(edits, cuts, refuse):
    data = bytearray(b"".join(f.encode(c) for c in CLIENT_SESSION))
    for where, byte, how in edits:
        i = where % (len(data) + 1)
        if how == "s" and i < len(data):
            data[i] = byte
        elif how == "i":
            data[i:i] = bytes([byte])
        elif how == "d":
            del data[i:i + 1]
    conn = StreamConnection(PROPS)
    start = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts) + [len(data)]:
        for ev in conn.receive_data(bytes(data[start:cut])):
            if type(ev) is Authenticate:
                conn.reject_auth() if refuse and ev.update else conn.accept_auth()
            elif type(ev) is OpenVhost:
                conn.open_ok({})
            elif type(ev) in (f.Create, f.DeclarePublisher, f.Subscribe):
                conn.respond(ev, f.OK)
        start = cut
        sent(conn)
        conn.tick(float(cut))


# ---------------------------------------------------------------- real clients over a real socket


def osiris_chunk(records: list[bytes]) -> bytes:
    return chunk.encode(records, timestamp=1700000000000, epoch=1)


class MiniBroker:
    """Just enough of a broker behind StreamConnection for a client to create a stream, publish
    (every message confirmed) and subscribe (the chunk it is given is delivered). It accepts any
    password, records every event and every byte each connection received."""

    def __init__(self, chunk: bytes):
        self.chunk = chunk
        self.events: list = []
        self.received: list[bytes] = []
        self.port = 0
        self.published = asyncio.Event()

    def handle(self, conn: StreamConnection, ev) -> None:
        self.events.append(ev)
        t = type(ev)
        if t is Authenticate:
            conn.accept_auth()
        elif t is OpenVhost:
            conn.open_ok({"advertised_host": "127.0.0.1", "advertised_port": str(self.port)})
        elif t in (f.Create, f.Delete, f.DeclarePublisher, f.DeletePublisher, f.Unsubscribe, f.CreateSuperStream):
            conn.respond(ev, f.OK)
        elif t is f.Route:
            conn.send(f.RouteResponse(ev.correlation_id, f.OK, [f"{ev.super_stream}-{ev.routing_key}"]))
        elif t is f.Partitions:
            conn.send(f.PartitionsResponse(ev.correlation_id, f.OK, [f"{ev.super_stream}-0", f"{ev.super_stream}-1"]))
        elif t is f.Metadata:
            conn.send(f.MetadataResponse(ev.correlation_id, [(0, "127.0.0.1", self.port)],
                                         [(s, f.OK, 0, []) for s in ev.streams]))
        elif t is f.QueryPublisherSequence:
            conn.send(f.QueryPublisherSequenceResponse(ev.correlation_id, f.OK, 0))
        elif t is f.Publish:
            conn.send(f.PublishConfirm(ev.publisher_id, [pid for pid, _ in ev.messages]))
        elif t is f.Subscribe:
            conn.respond(ev, f.OK)
            conn.send_deliver(ev.subscription_id, self.chunk)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = StreamConnection(PROPS)
        received = bytearray()
        try:
            while not conn.closed:
                data = await reader.read(65536)
                if not data:
                    break
                received += data
                for ev in conn.receive_data(data):
                    self.handle(conn, ev)
                out = conn.data_to_send()
                if out:
                    writer.writelines(out)
                    await writer.drain()
        finally:
            self.received.append(bytes(received))
            writer.close()

    def of(self, *types: type) -> list:
        return [e for e in self.events if type(e) in types]


async def _with_server(chunk: bytes, client) -> MiniBroker:
    broker = MiniBroker(chunk)
    server = await asyncio.start_server(broker.serve, "127.0.0.1", 0)
    broker.port = server.sockets[0].getsockname()[1]
    try:
        async with asyncio.timeout(20):
            await client(broker)
    finally:
        server.close()
        await server.wait_closed()
    return broker


def _frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        size = struct.unpack_from(">I", data, pos)[0]
        out.append(data[pos:pos + 4 + size])
        pos += 4 + size
    return out


def _reencodes_byte_for_byte(frame: bytes) -> bool:
    [cmd] = list(_decoder_of(frame))
    again = f.encode(cmd)
    if type(cmd) is f.Subscribe and not cmd.properties:
        return again[4:] + b"\x00\x00\x00\x00" == frame[4:]  # an empty property count RabbitMQ leaves out
    return again == frame


def _decoder_of(data: bytes) -> f.FrameDecoder:
    decoder = f.FrameDecoder()
    decoder.feed(data)
    return decoder


def test_rstream_connects_creates_publishes_and_consumes():
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

    async def client(broker: MiniBroker) -> None:
        async with Producer("127.0.0.1", broker.port, username="guest", password="any") as producer:
            await producer.create_stream("invoices")
            await producer.send_wait("invoices", b"invoice 1")
        got: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_message(msg, _ctx) -> None:
            if not got.done():
                got.set_result(msg)

        consumer = Consumer("127.0.0.1", broker.port, username="guest", password="any")
        await consumer.start()
        try:
            await consumer.subscribe("invoices", on_message,
                                     offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
            assert await got == b"from the stream"
        finally:
            await consumer.close()

    broker = asyncio.run(_with_server(osiris_chunk([b"from the stream"]), client))
    auths = broker.of(Authenticate)
    assert auths and all((a.mechanism, a.username, a.password) == ("PLAIN", "guest", "any") for a in auths)
    assert {e.vhost for e in broker.of(OpenVhost)} == {"/"}
    assert broker.of(f.Create)[0].stream == "invoices"
    assert broker.of(f.DeclarePublisher)[0].stream == "invoices"
    assert broker.of(f.Publish)[0].messages == [(1, b"invoice 1")]
    subscribe = broker.of(f.Subscribe)[0]
    assert (subscribe.stream, subscribe.offset_type) == ("invoices", f.OFFSET_TYPE_FIRST)
    # what rstream sent, frame by frame: it decodes, and encodes back to the same bytes
    first = _frames(broker.received[0])
    assert isinstance(next(_decoder_of(first[0])), f.PeerProperties)
    assert all(_reencodes_byte_for_byte(fr) for data in broker.received for fr in _frames(data))


def test_rbfly_connects_creates_publishes_and_consumes():
    from rbfly.streams import streams_client

    async def client(broker: MiniBroker) -> None:
        rb = streams_client(f"rabbitmq-stream://guest:any@127.0.0.1:{broker.port}/")
        try:
            await rb.create_stream("invoices")
            async with rb.publisher("invoices") as publisher:
                await publisher.send(b"invoice 1")
            async for msg in rb.subscribe("invoices"):
                assert msg == b"from the stream"
                break
        finally:
            await rb.disconnect()

    amqp_data_section = b"\x00\x53\x75\xa0\x0f" + b"from the stream"  # rbfly reads AMQP 1.0 messages
    broker = asyncio.run(_with_server(osiris_chunk([amqp_data_section]), client))
    [auth] = broker.of(Authenticate)
    assert (auth.username, auth.password) == ("guest", "any")
    assert broker.of(f.Create)[0].stream == "invoices"
    [publish] = broker.of(f.Publish)
    assert publish.messages[0][1].endswith(b"invoice 1")
    assert broker.of(f.Subscribe)[0].stream == "invoices"
    [closed] = broker.of(ConnectionClosed)
    assert closed.by_client and closed.code == f.OK
    assert all(_reencodes_byte_for_byte(fr) for data in broker.received for fr in _frames(data))


def test_rstream_super_stream_producer_creates_routes_and_publishes():
    from rstream import RouteType, SuperStreamCreationOption, SuperStreamProducer

    async def client(broker: MiniBroker) -> None:
        confirmed: asyncio.Future = asyncio.get_running_loop().create_future()

        async def routing_key(_message) -> str:
            return "1"

        async def on_confirm(status) -> None:
            if not confirmed.done():
                confirmed.set_result(status.is_confirmed)

        async with SuperStreamProducer("127.0.0.1", broker.port, username="guest", password="any",
                                       super_stream="invoices", routing=RouteType.Key,
                                       routing_extractor=routing_key,
                                       super_stream_creation_option=SuperStreamCreationOption(n_partitions=2),
                                       ) as producer:
            await producer.send(b"invoice 1", on_publish_confirm=on_confirm)
            assert await confirmed
            assert await (await producer.default_client).partitions("invoices") == ["invoices-0", "invoices-1"]

    broker = asyncio.run(_with_server(b"", client))
    [create] = broker.of(f.CreateSuperStream)
    assert (create.name, create.partitions, create.binding_keys) == (
        "invoices", ["invoices-0", "invoices-1"], ["0", "1"])
    [route] = broker.of(f.Route)
    assert (route.routing_key, route.super_stream) == ("1", "invoices")
    assert broker.of(f.DeclarePublisher)[0].stream == "invoices-1"
    assert broker.of(f.Publish)[0].messages == [(1, b"invoice 1")]
    assert broker.of(f.Partitions)[0].super_stream == "invoices"
