"""The server side of one stream protocol connection (port 5552), as a state machine without I/O.

Bytes go in (`receive_data`, a generator of events), bytes come out (`data_to_send`, a list of
buffers for `writelines`). The core never touches a socket, a clock or a file: the runtime calls
`tick(now_s)` every `tick_interval_s` and the core decides, by counting reads and writes, when a
heartbeat is due and when the peer has been silent too long.

The handshake follows rabbit_stream_reader.erl (RabbitMQ 3.13), in its order, one step each:

    peer properties -> SASL handshake -> SASL authenticate -> (server) tune -> tune -> open

What the core does alone: answers peer properties with the server's properties, offers the
SASL mechanisms (PLAIN and AMQPLAIN) and decodes the client's response, proposes frame_max and
heartbeat and takes the smaller non-zero value of each side (a client's heartbeat 0 turns
heartbeats off, as in RabbitMQ), answers an exchange of command
versions (and delivers version 2 to clients that announce it), heartbeats, and both closes. A
command out of order before the connection is open is answered as RabbitMQ answers it: the
socket closes with nothing sent. After open, a command the server does not take gets a close
with UNKNOWN_FRAME ("unknown frame"), a frame over frame_max a close with FRAME_TOO_LARGE; frames
are bounded by 8192 bytes until open, like RabbitMQ's initial_frame_max.

What it never decides: whether credentials are good (`Authenticate` -> `accept_auth()` or
`reject_auth(code)`), whether a vhost may be used (`OpenVhost` -> `open_ok(properties)` or
`open_refused(code)`), or anything about streams: every command of an open connection is handed
over as the decoded `frames` object (a `Publish` carries its list of (publishing id, message)
pairs as they came) and the broker answers with `send` or `respond`. While an answer to
`Authenticate` or `OpenVhost` is awaited the connection reads no further; an answer given later
than the event is resumed by `receive_data(b"")`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from hutch.streamproto import frames as f

# states, named for what the connection waits for
AWAIT_PEER_PROPERTIES = "await_peer_properties"
AWAIT_SASL_HANDSHAKE = "await_sasl_handshake"
AWAIT_SASL_AUTHENTICATE = "await_sasl_authenticate"
CHECKING_CREDENTIALS = "checking_credentials"  # the broker's answer to Authenticate
AWAIT_TUNE = "await_tune"
AWAIT_OPEN = "await_open"
OPENING = "opening"  # the broker's answer to OpenVhost
OPEN = "open"
CLOSE_SENT = "close_sent"
CLOSED = "closed"

DEFAULT_FRAME_MAX = 1048576  # RabbitMQ's defaults
DEFAULT_HEARTBEAT_S = 60
INITIAL_FRAME_MAX = 8192  # frames accepted before open
NEGOTIATION_STEP_TIMEOUT_S = 10.0  # RabbitMQ's connection_negotiation_step_timeout
MECHANISMS = ("PLAIN", "AMQPLAIN")

# the handshake as a table: in each state, the commands taken and what takes them
_HANDSHAKE: dict[str, dict[type[f.Command], str]] = {
    AWAIT_PEER_PROPERTIES: {f.PeerProperties: "_on_peer_properties"},
    AWAIT_SASL_HANDSHAKE: {f.SaslHandshake: "_on_sasl_handshake"},
    AWAIT_SASL_AUTHENTICATE: {f.SaslAuthenticate: "_on_sasl_authenticate"},
    AWAIT_TUNE: {f.Tune: "_on_tune", f.TuneResponse: "_on_tune", f.Open: "_on_open"},
    AWAIT_OPEN: {f.Open: "_on_open"},
}
_PAUSED = (CHECKING_CREDENTIALS, OPENING)

# what an open connection hands to the broker as it came
BROKER_COMMANDS: frozenset[type[f.Command]] = frozenset({
    f.DeclarePublisher, f.Publish, f.PublishV2, f.QueryPublisherSequence, f.DeletePublisher,
    f.Subscribe, f.Credit, f.StoreOffset, f.QueryOffset, f.Unsubscribe, f.Create, f.Delete,
    f.Metadata, f.Route, f.Partitions, f.ConsumerUpdateResponse, f.StreamStats,
    f.CreateSuperStream, f.DeleteSuperStream,
})

# requests answered with nothing but a code, and the class of that answer
_CODE_RESPONSES: dict[type[f.Command], type[f.Response]] = {
    f.DeclarePublisher: f.DeclarePublisherResponse, f.DeletePublisher: f.DeletePublisherResponse,
    f.Subscribe: f.SubscribeResponse, f.Unsubscribe: f.UnsubscribeResponse, f.Create: f.CreateResponse,
    f.Delete: f.DeleteResponse, f.CreateSuperStream: f.CreateSuperStreamResponse,
    f.DeleteSuperStream: f.DeleteSuperStreamResponse, f.Close: f.CloseResponse,
}

# the close reason RabbitMQ sends with each code it closes with
_CLOSE_REASONS = {f.UNKNOWN_FRAME: "unknown frame", f.FRAME_TOO_LARGE: "frame too large"}
_HEARTBEAT = f.encode(f.Heartbeat())


# ---------------------------------------------------------------- events


class Event:
    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"


class Authenticate(Event):
    """The client's SASL response, decoded: the broker calls `accept_auth()` or `reject_auth()`.
    `update` is set when an open connection re-authenticates (a new secret, same user)."""

    __slots__ = ("mechanism", "username", "password", "update")

    def __init__(self, mechanism: str, username: str, password: str, update: bool = False):
        self.mechanism = mechanism
        self.username = username
        self.password = password
        self.update = update

    def __repr__(self) -> str:  # never show the password
        return f"Authenticate(mechanism={self.mechanism!r}, username={self.username!r}, update={self.update})"


class OpenVhost(Event):
    """The client asks for a virtual host: the broker calls `open_ok()` or `open_refused()`."""

    __slots__ = ("vhost",)

    def __init__(self, vhost: str):
        self.vhost = vhost


class ProtocolError(Event):
    """The client broke the protocol: `code` is what the close says, `detail` what to log."""

    __slots__ = ("code", "detail")

    def __init__(self, code: int, detail: str):
        self.code = code
        self.detail = detail


class ConnectionClosed(Event):
    """The connection is over: the client closed it (the answer is queued), acknowledged the
    server's close, or broke the protocol before open. The runtime flushes `data_to_send()`
    and closes the socket."""

    __slots__ = ("code", "reason", "by_client")

    def __init__(self, code: int, reason: str, by_client: bool):
        self.code = code
        self.reason = reason
        self.by_client = by_client


class ConnectionTimedOut(Event):
    """No heartbeat or other data for two heartbeat intervals, or a handshake step (or the
    wait for a close's answer) took longer than the negotiation timeout. The socket closes."""

    __slots__ = ("state", "reason")

    def __init__(self, state: str, reason: str):
        self.state = state
        self.reason = reason


# ---------------------------------------------------------------- SASL


def negotiate(server: int, client: int) -> int:
    """The smaller non-zero value of the two; 0 (no limit, no heartbeat) only if both say so."""
    if server and client:
        return min(server, client)
    return server or client


def parse_plain(data: bytes) -> tuple[str, str] | None:
    """PLAIN as RabbitMQ reads it: NUL, user, NUL, password (no authorisation identity)."""
    if not data or data[0] != 0:
        return None
    user, sep, password = data[1:].partition(b"\x00")
    if not sep or b"\x00" in password:
        return None
    return user.decode("utf-8", "surrogateescape"), password.decode("utf-8", "surrogateescape")


def parse_amqplain(data: bytes) -> tuple[str, str] | None:
    """AMQPLAIN: an AMQP 0-9-1 field table without its length, holding LOGIN and PASSWORD as
    long strings."""
    fields: dict[bytes, bytes] = {}
    pos, end = 0, len(data)
    while pos < end:
        n = data[pos]
        name = data[pos + 1:pos + 1 + n]
        pos += 1 + n
        if pos + 5 > end or data[pos] != 0x53:  # 'S', a long string
            return None
        size = struct.unpack_from(">I", data, pos + 1)[0]
        pos += 5
        if pos + size > end:
            return None
        fields[name] = data[pos:pos + size]
        pos += size
    if b"LOGIN" not in fields or b"PASSWORD" not in fields:
        return None
    return (fields[b"LOGIN"].decode("utf-8", "surrogateescape"),
            fields[b"PASSWORD"].decode("utf-8", "surrogateescape"))


_PARSERS = {"PLAIN": parse_plain, "AMQPLAIN": parse_amqplain}


def server_properties(version: str, cluster_name: str = "", platform: str = "Python") -> dict[str, str]:
    """What a server tells a client about itself in the peer properties exchange."""
    return {
        "product": "hutch",
        "version": version,
        "cluster_name": cluster_name,
        "platform": platform,
        "copyright": "Copyright (c) the hutch authors",
        "information": "Licensed under the Apache License 2.0",
    }


# ---------------------------------------------------------------- the connection


class StreamConnection:
    """One client connection. See the module docstring for the contract."""

    def __init__(self, properties: dict[str, str], *, frame_max: int = DEFAULT_FRAME_MAX,
                 heartbeat_s: int = DEFAULT_HEARTBEAT_S, initial_frame_max: int = INITIAL_FRAME_MAX,
                 mechanisms: tuple[str, ...] = MECHANISMS,
                 negotiation_timeout_s: float = NEGOTIATION_STEP_TIMEOUT_S):
        self.server_properties = properties
        self.frame_max = frame_max  # proposed in tune, then what was negotiated
        self.heartbeat_s = heartbeat_s
        self.mechanisms = tuple(m for m in mechanisms if m in _PARSERS)
        self.negotiation_timeout_s = negotiation_timeout_s
        self.state = AWAIT_PEER_PROPERTIES
        self.client_properties: dict[str, str] = {}
        self.mechanism = ""
        self.username = ""
        self.vhost = ""
        self.deliver_version = 1  # 2 once the client announced it in an exchange of versions
        self.close_reason: tuple[int, str] | None = None
        self._decoder = f.FrameDecoder(initial_frame_max)
        self._tuned = False
        self._pending_correlation_id = 0  # of the SaslAuthenticate or Open being decided
        self._reauthenticating = False
        self._next_correlation_id = 1  # for requests the server sends
        self._out: list[bytes | memoryview] = []
        # counted, not timed: tick() compares them with what it saw last time
        self._reads = 0
        self._flushes = 0
        self._tick_reads = -1
        self._tick_flushes = -1
        self._tick_state = ""
        self._heard_at = 0.0
        self._spoke_at = 0.0
        self._state_since = 0.0

    # ------------------------------------------------------------ queries

    @property
    def is_open(self) -> bool:
        return self.state == OPEN

    @property
    def closed(self) -> bool:
        return self.state == CLOSED

    @property
    def paused(self) -> bool:
        """The broker's answer to Authenticate or OpenVhost is awaited: nothing more is decoded
        until it comes, and the runtime reads no more from the socket meanwhile."""
        return self.state in _PAUSED

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet decoded (a partial frame, or frames held while paused)."""
        return self._decoder.buffered_bytes

    @property
    def tick_interval_s(self) -> float:
        """How often the runtime calls `tick`."""
        if self._tuned and self.heartbeat_s:
            return min(1.0, self.heartbeat_s / 2)
        return 1.0

    # ------------------------------------------------------------ output

    def data_to_send(self) -> list[bytes | memoryview]:
        out = self._out
        if out:
            self._out = []
            self._flushes += 1
        return out

    def send(self, cmd: f.Command) -> None:
        self._out.append(f.encode(cmd))

    def respond(self, request: f.Command, code: int) -> None:
        """Answer a request whose response is only a code (declare publisher, subscribe,
        create, ...)."""
        self._out.append(f.encode(_CODE_RESPONSES[type(request)](request.correlation_id, code)))

    def send_deliver(self, subscription_id: int, chunk: bytes | memoryview, committed_chunk_id: int = 0) -> None:
        """Queue one chunk for a subscription as it is stored: the prefix and the chunk go out
        as two buffers, the chunk never copied. Version 2 (with the committed chunk id) to
        clients that asked for it."""
        committed = committed_chunk_id if self.deliver_version == 2 else None
        self._out.append(f.deliver_prefix(subscription_id, len(chunk), committed))
        self._out.append(chunk)

    def consumer_update(self, subscription_id: int, active: bool) -> int:
        """Tell a single active consumer it is now active or not; returns the correlation id
        its `ConsumerUpdateResponse` will carry."""
        cid = self._correlation_id()
        self.send(f.ConsumerUpdate(cid, subscription_id, active))
        return cid

    def close(self, code: int, reason: str) -> None:
        """Close from the server side: before open the socket just closes; after it the client
        is sent a close and its answer awaited."""
        if self.state in (CLOSE_SENT, CLOSED):
            return
        self.close_reason = (code, reason)
        if self.state != OPEN:
            self.state = CLOSED
            return
        self.send(f.Close(self._correlation_id(), code, reason))
        self.state = CLOSE_SENT

    # ------------------------------------------------------------ the broker's answers

    def accept_auth(self) -> None:
        assert self.state == CHECKING_CREDENTIALS or self._reauthenticating, self.state
        self.send(f.SaslAuthenticateResponse(self._pending_correlation_id, f.OK))
        if self._reauthenticating:
            self._reauthenticating = False
            return
        self.send(f.Tune(self.frame_max, self.heartbeat_s))
        self.state = AWAIT_TUNE

    def reject_auth(self, code: int = f.AUTHENTICATION_FAILURE) -> None:
        """The credentials are refused: the client gets `code`, then the socket closes (an
        open connection that re-authenticated stays open, as in RabbitMQ)."""
        assert self.state == CHECKING_CREDENTIALS or self._reauthenticating, self.state
        self.send(f.SaslAuthenticateResponse(self._pending_correlation_id, code))
        if self._reauthenticating:
            self._reauthenticating = False
            return
        self.close_reason = (code, "authentication failed")
        self.state = CLOSED

    def open_ok(self, connection_properties: dict[str, str]) -> None:
        """The vhost may be used. `connection_properties` are what the client is told, at
        least advertised_host and advertised_port (rstream connects again until they match)."""
        assert self.state == OPENING, self.state
        self.send(f.OpenResponse(self._pending_correlation_id, f.OK, connection_properties))
        self.state = OPEN
        self._decoder.frame_max = self.frame_max

    def open_refused(self, code: int = f.VIRTUAL_HOST_ACCESS_FAILURE) -> None:
        assert self.state == OPENING, self.state
        self.send(f.OpenResponse(self._pending_correlation_id, code))
        self.close_reason = (code, f"access to vhost '{self.vhost}' refused")
        self.state = CLOSED

    # ------------------------------------------------------------ timers

    def tick(self, now_s: float) -> list[Event]:
        """Called every `tick_interval_s` by the runtime. Queues a heartbeat when nothing went
        out for half a heartbeat interval; reports the peer gone after two intervals of
        silence, and a handshake step (or a close) left unanswered for the negotiation timeout."""
        if self.state == CLOSED:
            return []
        if self._reads != self._tick_reads:
            self._tick_reads = self._reads
            self._heard_at = now_s
        if self._flushes != self._tick_flushes or self._out:
            self._tick_flushes = self._flushes
            self._spoke_at = now_s
        if self.state != self._tick_state:
            self._tick_state = self.state
            self._state_since = now_s
        waiting_on_client = self.state != OPEN and self.state not in _PAUSED
        if waiting_on_client and now_s - self._state_since >= self.negotiation_timeout_s:
            return [self._time_out(f"Closing connection because of timeout in state '{self.state}' "
                                   "likely due to lack of client action.")]
        if not (self._tuned and self.heartbeat_s):
            return []
        # the heartbeat first: a tick that comes late (a busy loop) still sends the one that was
        # due, as a timer of its own would have, before it finds the client silent too long
        if now_s - self._spoke_at >= self.heartbeat_s / 2:
            self._out.append(_HEARTBEAT)
            self._spoke_at = now_s
        if now_s - self._heard_at >= 2 * self.heartbeat_s:
            return [self._time_out(f"missed heartbeats from client, timeout: {self.heartbeat_s}s")]
        return []

    def _time_out(self, reason: str) -> Event:
        ev = ConnectionTimedOut(self.state, reason)
        self.close_reason = (f.INTERNAL_ERROR, reason)
        self.state = CLOSED
        return ev

    # ------------------------------------------------------------ input

    def receive_data(self, data: bytes) -> Iterator[Event]:
        """Feed bytes; yields events as frames decode. Stops while the broker decides on
        credentials or a vhost: `receive_data(b"")` resumes once it has answered."""
        if self.state == CLOSED:
            return
        if data:
            self._reads += 1
            self._decoder.feed(data)
        decoder = self._decoder
        while self.state not in _PAUSED and self.state != CLOSED:
            try:
                cmd = next(decoder)
            except StopIteration:
                return
            except f.FrameError as e:
                yield from self._frame_error(e.code, e.detail)
                continue
            if self.state == OPEN:
                if type(cmd) in BROKER_COMMANDS:
                    yield cmd
                else:
                    yield from self._open_command(cmd)
            elif self.state == CLOSE_SENT:
                if type(cmd) is f.CloseResponse:
                    code, reason = self.close_reason or (f.OK, "")
                    self.state = CLOSED
                    yield ConnectionClosed(code, reason, by_client=False)
            else:
                yield from self._handshake(cmd)

    def _handshake(self, cmd: f.Command) -> Iterator[Event]:
        handler = _HANDSHAKE[self.state].get(type(cmd))
        if handler is not None:
            ev = getattr(self, handler)(cmd)
            if ev is not None:
                yield ev
        elif type(cmd) is not f.Heartbeat:
            yield from self._frame_error(f.UNKNOWN_FRAME, f"unknown command {type(cmd).__name__} "
                                         f"in state '{self.state}', closing connection.")

    def _open_command(self, cmd: f.Command) -> Iterator[Event]:
        t = type(cmd)
        if t is f.Heartbeat:
            return
        if t is f.ExchangeCommandVersions:
            self.send(f.ExchangeCommandVersionsResponse(cmd.correlation_id, f.OK, f.SERVER_COMMAND_VERSIONS))
            for key, _low, high in cmd.versions:
                if key == f.KEY_DELIVER and high == 2:  # as RabbitMQ matches it
                    self.deliver_version = 2
        elif t is f.Close:
            self.respond(cmd, f.OK)
            self.close_reason = (cmd.code, cmd.reason)
            self.state = CLOSED
            yield ConnectionClosed(cmd.code, cmd.reason, by_client=True)
        elif t is f.SaslAuthenticate:
            yield from self._reauthenticate(cmd)
        else:
            yield from self._frame_error(f.UNKNOWN_FRAME, f"unknown command {t.__name__}, sending close command.")

    def _frame_error(self, code: int, detail: str) -> Iterator[Event]:
        if self.state == CLOSE_SENT:
            return  # RabbitMQ ignores what comes while it waits for the close's answer
        yield ProtocolError(code, detail)
        if self.state == OPEN:
            self.close(code, _CLOSE_REASONS.get(code, detail))
        else:
            self.close_reason = (code, detail)
            self.state = CLOSED
            yield ConnectionClosed(code, detail, by_client=False)

    # ------------------------------------------------------------ the handshake's steps

    def _on_peer_properties(self, cmd: f.PeerProperties) -> None:
        self.client_properties = cmd.properties
        self.send(f.PeerPropertiesResponse(cmd.correlation_id, f.OK, self.server_properties))
        self.state = AWAIT_SASL_HANDSHAKE

    def _on_sasl_handshake(self, cmd: f.SaslHandshake) -> None:
        self.send(f.SaslHandshakeResponse(cmd.correlation_id, f.OK, list(self.mechanisms)))
        self.state = AWAIT_SASL_AUTHENTICATE

    def _credentials(self, cmd: f.SaslAuthenticate) -> tuple[str, str] | int:
        """(username, password), or the response code that refuses them."""
        if cmd.mechanism not in self.mechanisms:
            return f.SASL_MECHANISM_NOT_SUPPORTED
        creds = _PARSERS[cmd.mechanism](cmd.data or b"")
        return f.SASL_ERROR if creds is None else creds

    def _on_sasl_authenticate(self, cmd: f.SaslAuthenticate) -> Event | None:
        creds = self._credentials(cmd)
        if isinstance(creds, int):
            self.send(f.SaslAuthenticateResponse(cmd.correlation_id, creds))
            self.close_reason = (creds, f"SASL {cmd.mechanism!r} refused")
            self.state = CLOSED
            return ConnectionClosed(creds, f"SASL {cmd.mechanism!r} refused", by_client=False)
        self.mechanism = cmd.mechanism
        self.username = creds[0]
        self._pending_correlation_id = cmd.correlation_id
        self.state = CHECKING_CREDENTIALS
        return Authenticate(cmd.mechanism, creds[0], creds[1])

    def _reauthenticate(self, cmd: f.SaslAuthenticate) -> Iterator[Event]:
        if cmd.mechanism != self.mechanism:
            self.send(f.SaslAuthenticateResponse(cmd.correlation_id, f.SASL_CANNOT_CHANGE_MECHANISM))
            return
        creds = self._credentials(cmd)
        if isinstance(creds, int) or creds[0] != self.username:
            code = creds if isinstance(creds, int) else f.SASL_CANNOT_CHANGE_USERNAME
            self.send(f.SaslAuthenticateResponse(cmd.correlation_id, code))
            return
        self._pending_correlation_id = cmd.correlation_id
        self._reauthenticating = True
        yield Authenticate(cmd.mechanism, creds[0], creds[1], update=True)

    def _on_tune(self, cmd: f.Tune) -> None:
        self.frame_max = negotiate(self.frame_max, cmd.frame_max)
        # a client that answers 0 sends no heartbeats and must not be timed out for it: RabbitMQ
        # takes the client's heartbeat as it comes, so 0 turns them off here too
        self.heartbeat_s = negotiate(self.heartbeat_s, cmd.heartbeat) if cmd.heartbeat else 0
        self._tuned = True
        self.state = AWAIT_OPEN

    def _on_open(self, cmd: f.Open) -> Event:
        self.vhost = cmd.vhost
        self._pending_correlation_id = cmd.correlation_id
        self.state = OPENING
        return OpenVhost(cmd.vhost)

    def _correlation_id(self) -> int:
        cid = self._next_correlation_id
        self._next_correlation_id = cid % 0xFFFFFFFF + 1
        return cid
