"""One client connection as the broker sees it: authentication, vhost, channels and methods.

The runtime feeds the protocol core's events to `Session.handle`; the session checks them
against the vhost's exchanges and queues and answers through the core. Errors are
`AMQPError`s with RabbitMQ's codes and texts: channel errors close the channel (its
consumers leave, its unacknowledged messages are requeued), connection errors close the
connection. Nothing here touches a socket: the runtime flushes `take_output()`.
"""

from __future__ import annotations

import base64
import logging
import os
from typing import TYPE_CHECKING, Any

from pamqp import commands

from hutch.amqp import codec, events, spec
from hutch.amqp.connection import Connection
from hutch.amqp.spec import AMQPError, access_refused, not_found, precondition_failed
from hutch.broker import arguments as qargs
from hutch.broker import msgstats
from hutch.broker import operations as ops
from hutch.broker.channel import Channel, ChannelConsumer
from hutch.broker.exchanges import EXCHANGE, QUEUE, Exchange
from hutch.broker.msgstats import (
    DROP_UNROUTABLE,
    PUBLISH,
    RETURN_UNROUTABLE,
    X_DROP_UNROUTABLE,
    X_PUBLISH_IN,
    X_PUBLISH_OUT,
    X_RETURN_UNROUTABLE,
)
from hutch.cluster import catalogue as cat
from hutch.queues.handle import PENDING, Got
from hutch.queues.message import Message

if TYPE_CHECKING:
    from hutch.broker.broker import Broker
    from hutch.broker.vhost import VHost

log = logging.getLogger("hutch.connection")

_NO_PROPS = b"\x00\x00"
CONSUMER_TIMEOUT_CHECK_S = 1.0  # how often the runtime calls check_consumer_timeouts
DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"
DIRECT_REPLY_PREFIX = "amq.rabbitmq.reply-to."


class Session:
    def __init__(self, broker: Broker, peer: str, local: str, tls: bool = False, peer_cert: dict | None = None):
        self.broker = broker
        self.peer = peer
        self.local = local
        self.name = f"{peer} -> {local}"
        self.tls = tls
        self.peer_cert = peer_cert
        cfg = broker.config
        mechanisms = tuple(m for m in cfg.auth_mechanisms if m != "EXTERNAL" or tls)
        self.proto = Connection(broker.server_properties(), channel_max=cfg.channel_max,
                                frame_max=cfg.frame_max, heartbeat_s=cfg.heartbeat_s,
                                message_bytes_max=cfg.max_message_size, mechanisms=mechanisms)
        self.user = None
        self.username = ""
        self.vhost: VHost | None = None
        self.channels: dict[int, Channel] = {}
        self.writable = True
        self.counting: list[ChannelConsumer] = []  # consumers whose deliveries are counted at the next write
        self.blocked = False  # connection.blocked sent
        self.flow_queues: set = set()  # flow-limited queues this session is held back by
        self.closed = False
        self.exclusive_queues: list = []
        self._confirm_channels: set[Channel] = set()
        self._write_ok: set[str] = set()  # exchanges this user may publish to (checked once)
        self._publish_ok: set[Exchange] = set()  # exchanges whose checks hold for every publish (not topic)
        self.output_pending = False
        self.transport_hooks: Any = None  # set by the runtime: pause/resume reading, close
        self.stats_recv_msgs = 0
        self.stats_send_msgs = 0
        self.recv_oct = 0  # bytes received and sent (the management API's recv_oct, send_oct;
        self.send_oct = 0  # the runtime counts what it writes)
        msgstats.node_counters(broker)[msgstats.CONNECTIONS_OPENED] += 1
        self.connected_at_ms = broker.now_ms()
        # In a cluster some methods wait for other nodes (a catalogue change, a queue elsewhere):
        # the session parks, keeping the rest of what the client sent for afterwards.
        self._events: Any = None  # the event stream being handled
        self._backlog: list[bytes] = []
        self._parked = False

    def __repr__(self) -> str:
        return f"Session({self.name})"

    # ---------------------------------------------------------------- output

    @property
    def frame_max(self) -> int:
        return self.proto.frame_max

    def send_frames(self, frames: list[bytes]) -> None:
        self.proto._out += frames
        if not self.output_pending:
            self.output_pending = True
            self.broker.output_due(self)

    def send_bytes(self, data: bytes) -> None:
        self.proto._out.append(data)
        if not self.output_pending:
            self.output_pending = True
            self.broker.output_due(self)

    def send_method(self, channel: int, method) -> None:
        self.send_bytes(codec.method_frame(channel, method))

    def take_output(self) -> list[bytes]:
        """The frames to write now. The deliveries among them are counted here, once per write."""
        self.output_pending = False
        counting = self.counting
        if counting:
            for c in counting:
                c.count_deliveries()
            counting.clear()
        return self.proto.take_output()

    def confirms_due(self, ch: Channel) -> None:
        self._confirm_channels.add(ch)
        if not self.output_pending:
            self.output_pending = True
            self.broker.output_due(self)

    def flush_confirms(self) -> None:
        if self._confirm_channels:
            for ch in self._confirm_channels:
                if not ch.closed:
                    ch.flush_confirms()
            self._confirm_channels.clear()

    def new_consumer_tag(self) -> str:
        return "amq.ctag-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")

    # ---------------------------------------------------------------- input

    def receive(self, data: bytes) -> None:
        """Feed bytes from the socket; handle every event they make. A fault in hutch itself
        closes this connection with 541 INTERNAL_ERROR and is logged; the node carries on."""
        self.recv_oct += len(data)
        if self._events is not None:
            self._backlog.append(data)  # parked: handled once the waiting method completes
            return
        self._events = self.proto.receive_data(data)
        self._pump()

    def _pump(self) -> None:
        handle = self.handle
        on_publish = self.on_publish
        channels = self.channels
        try:
            while self._events is not None:
                for ev in self._events:
                    if type(ev) is events.Publish:  # the one event per message: no dispatch by type
                        ch = channels.get(ev.channel)
                        if ch is not None:
                            try:
                                on_publish(ch, ev)
                            except AMQPError as err:
                                self.fail(ev.channel, err, ev)
                    else:
                        handle(ev)
                    if self._parked:
                        break
                if self._parked:
                    break
                self._events = self.proto.receive_data(self._backlog.pop(0)) if self._backlog else None
        except Exception:
            self._internal_error()
        if self.proto.has_output and not self.output_pending:
            self.output_pending = True
            self.broker.output_due(self)

    def _internal_error(self) -> None:
        """A fault in hutch itself: logged, and this connection closes with 541 INTERNAL_ERROR."""
        log.exception("Error on AMQP connection %s (%s): internal error; closing the connection",
                      id(self), self.name)
        self._events = None
        self._backlog.clear()
        self.proto.close(spec.INTERNAL_ERROR, "internal error")
        self.teardown()

    def park(self, ch: Channel, m) -> Any:
        """Stop handling this connection's input until the returned `resume(fn)` is called;
        fn then finishes the method (an AMQPError it raises fails the method as usual)."""
        self._parked = True
        if self.transport_hooks is not None:
            self.transport_hooks.pause_reading()

        def resume(fn, *args) -> None:
            if not self._parked:
                return
            self._parked = False
            if self.closed:
                return
            try:
                fn(*args)
            except AMQPError as err:
                if not err.class_id:
                    err.on(*divmod(m.index, 0x10000))
                self.fail(ch.number, err)
            except Exception:  # a fault in hutch: this connection closes, as in receive()
                self._internal_error()
                if not self.output_pending:
                    self.output_pending = True
                    self.broker.output_due(self)
            if self.closed:
                return
            if self.transport_hooks is not None and not self.flow_queues and not self.blocked:
                self.transport_hooks.resume_reading()
            self._pump()
        return resume

    def wait_for(self, ch: Channel, m, start, finish) -> None:
        """Park the connection, `start(reply)` something another node or the catalogue
        answers, then finish the method with `finish(answer)` (an AMQPError it raises fails the
        method)."""
        resume = self.park(ch, m)
        start(lambda answer: resume(finish, answer))

    def ask(self, ch: Channel, m, call, finish) -> None:
        """`call(reply)` one of a queue's client operations (hutch.queues.handle) and finish the
        method with `finish(answer)`: at once when the queue answers at once, else with the
        connection parked until it does. An answer that is an exception fails the method."""
        early: list = []
        resume = None

        def reply(answer) -> None:
            if resume is None:
                early.append(answer)
            else:
                resume(_finish, answer)

        def _finish(answer) -> None:
            if isinstance(answer, Exception):
                raise answer
            finish(answer)
        answer = call(reply)
        if answer is PENDING:
            if not early:
                resume = self.park(ch, m)
                return
            answer = early[0]
        _finish(answer)

    def catalogue_change(self, ch: Channel, m, cmd: cat.Command, done) -> None:
        """Propose a catalogue change; done(result) runs once this node has applied it."""
        def finish(res: cat.Result) -> None:
            if res.code != cat.OK:
                raise AMQPError(res.code, res.text)
            done(res)
        self.wait_for(ch, m, lambda reply: self.broker.cluster.submit(cmd, reply), finish)

    def handle(self, ev: events.Event) -> None:
        """Every event but `Publish`, which `_pump` hands to `on_publish` itself."""
        t = type(ev)
        try:
            if t is events.Ack:
                ch = self.channels.get(ev.channel)
                if ch is not None:
                    if ch.tx is not None:
                        ch.check_tag(ev.delivery_tag, ev.multiple)
                        ch.tx_hold(("ack", ev.delivery_tag, ev.multiple))
                    else:
                        ch.ack(ev.delivery_tag, ev.multiple)
            elif t is events.Method:
                self.on_method(ev.channel, ev.method)
            elif t is events.Nack or t is events.Reject:
                ch = self.channels.get(ev.channel)
                if ch is not None:
                    multiple = ev.multiple if t is events.Nack else False
                    if ch.tx is not None:
                        ch.check_tag(ev.delivery_tag, multiple)
                        ch.tx_hold(("reject", ev.delivery_tag, multiple, ev.requeue))
                    else:
                        ch.reject(ev.delivery_tag, multiple, ev.requeue)
            elif t is events.ChannelOpened:
                if self.vhost is not None:
                    self.channels[ev.channel] = Channel(self, ev.channel)
            elif t is events.ChannelClosed:
                ch = self.channels.pop(ev.channel, None)
                if ch is not None:
                    ch.close()
            elif t is events.ChannelFlow:
                ch = self.channels.get(ev.channel)
                if ch is not None:
                    ch.flow_active = ev.active
                    if ev.active:
                        self.broker.kick_consumers_of(ch)
            elif t is events.Authenticate:
                self.on_authenticate(ev)
            elif t is events.OpenVhost:
                self.on_open(ev.vhost)
            elif t is events.ConnectionClosed:
                self.on_closed(ev)
            elif t is events.HeartbeatTimeout:
                log.warning("closing AMQP connection (%s): missed heartbeats from client, timeout: %ss",
                            self.name, ev.timeout_s)
                self.teardown()
                if self.transport_hooks is not None:
                    self.transport_hooks.abort()
        except AMQPError as err:
            self.fail(getattr(ev, "channel", 0), err, ev)

    def fail(self, channel: int, err: AMQPError, ev: events.Event | None = None) -> None:
        if not err.class_id and ev is not None:
            if type(ev) is events.Method:
                err.on(*divmod(ev.method.index, 0x10000))
            elif type(ev) is events.Publish:
                err.on(60, 40)
            elif type(ev) is events.Ack:
                err.on(60, 80)
            elif type(ev) is events.Nack:
                err.on(60, 120)
            elif type(ev) is events.Reject:
                err.on(60, 90)
        if err.connection_level or channel == 0:
            log.error("Error on AMQP connection %s (%s, vhost: '%s', user: '%s', state: running), channel %s:\n"
                      " operation %s caused a connection exception %s: \"%s\"", id(self), self.name,
                      self.vhost.name if self.vhost else "", self.username, channel,
                      _method_name(err), spec.REPLY_NAMES.get(err.code), err.reply_text)
            self.proto.close(err.code, err.text, err.class_id, err.method_id)
            self.teardown()
        else:
            log.warning("Channel error on connection %s (%s, vhost: '%s', user: '%s'), channel %s:\n"
                        " operation %s caused a channel exception %s: %s", id(self), self.name,
                        self.vhost.name if self.vhost else "", self.username, channel,
                        _method_name(err), spec.REPLY_NAMES.get(err.code), err.reply_text)
            ch = self.channels.pop(channel, None)
            if ch is not None:
                ch.close()
            self.proto.close_channel(channel, err.code, err.text, err.class_id, err.method_id)
        if not self.output_pending:
            self.output_pending = True
            self.broker.output_due(self)

    def check_consumer_timeouts(self, now_ms: int, timeout_of) -> None:
        """Close each channel whose oldest unacknowledged delivery is older than its queue's
        consumer timeout (`timeout_of(queue)`, None: no timeout); see check_consumer_timeouts."""
        for ch in list(self.channels.values()):
            if not ch.unacked and not ch.delivery_marks:
                continue
            oldest = ch.oldest_unacked(now_ms)
            if oldest is None:
                continue
            tag, q, consumer, since_ms = oldest
            timeout = timeout_of(q)
            if timeout is None or now_ms - since_ms < timeout:
                continue
            log.warning("Consumer %s on channel %s and queue '%s' in vhost '%s' has timed out waiting for a "
                        "consumer acknowledgement of a delivery with delivery tag = %s. Timeout used: %s ms. "
                        "This timeout value can be configured, see consumers doc guide to learn more",
                        consumer.tag if consumer is not None else "basic.get", ch.number, q.name, q.vhost, tag,
                        timeout)
            self.fail(ch.number, precondition_failed(
                f"delivery acknowledgement on channel {ch.number} timed out. Timeout value used: {timeout} ms. "
                "This timeout value can be configured, see consumers doc guide to learn more"))

    # ---------------------------------------------------------------- connection level

    def on_authenticate(self, ev: events.Authenticate) -> None:
        if ev.mechanism == "EXTERNAL":
            ev.username, user = self.broker.authenticate_external(self.peer_cert)
        else:
            user = self.broker.authenticate(ev.username, ev.password, self.peer)
        if user is None:
            log.error("Error on AMQP connection %s (%s, state: starting):\n%s login refused: user '%s' - "
                      "invalid credentials", id(self), self.name, ev.mechanism, ev.username)
            self.proto.login_refused(f"Login was refused using authentication mechanism {ev.mechanism}. "
                                     "For details see the broker logfile.")
            return
        self.user = user
        self.username = ev.username
        self.proto.login_ok()

    def on_open(self, vhost_name: str) -> None:
        vhost = self.broker.vhosts.get(vhost_name)
        if vhost is None:
            log.error("Error on AMQP connection %s (%s, user: '%s', state: opening):\nvhost %s not found",
                      id(self), self.name, self.username, vhost_name)
            self.proto.close(spec.NOT_ALLOWED, f"vhost {vhost_name} not found", 10, 40)
            return
        refusal = self.broker.connection_refusal(self.username, vhost_name)
        if refusal is not None:  # a vhost or user connection limit, checked before access as RabbitMQ does
            log.error("Error on AMQP connection %s (%s, user: '%s', state: opening):\n%s",
                      id(self), self.name, self.username, refusal)
            self.proto.close(spec.NOT_ALLOWED, refusal, 10, 40)
            return
        if not self.broker.may_access_vhost(self.user, vhost_name):
            self.proto.close(spec.NOT_ALLOWED, f"access to vhost '{vhost_name}' refused for user "
                             f"'{self.username}'", 10, 40)
            return
        self.vhost = vhost
        # the user's max-channels, checked before channel.open-ok (a connection error 530)
        self.proto.channel_gate = lambda: self.broker.channel_refusal(self.username)
        self.proto.open_ok()
        log.info("connection %s (%s): user '%s' authenticated and granted access to vhost '%s'",
                 id(self), self.name, self.username, vhost_name)
        if self.broker.alarms and self.proto.capabilities.get("connection.blocked"):
            pass  # blocked is sent when this connection publishes (as RabbitMQ does)

    def on_closed(self, ev: events.ConnectionClosed) -> None:
        if ev.by_client:
            log.info("closing AMQP connection %s (%s, vhost: '%s', user: '%s')", id(self), self.name,
                     self.vhost.name if self.vhost else "", self.username)
        self.teardown()
        if self.transport_hooks is not None:
            self.transport_hooks.close_after_flush()

    def teardown(self) -> None:
        """The connection is gone or going: channels close, exclusive queues are deleted."""
        if self.closed:
            return
        self.closed = True
        for ch in list(self.channels.values()):
            ch.close()
        self.channels.clear()
        counters = msgstats.node_counters(self.broker)
        counters[msgstats.CONNECTIONS_CLOSED] += 1
        counters[msgstats.RECV_OCT_CLOSED] += self.recv_oct
        counters[msgstats.SEND_OCT_CLOSED] += self.send_oct
        for q in list(self.exclusive_queues):
            self.broker.delete_queue(q)
        self.exclusive_queues.clear()
        self.broker.session_gone(self)

    def connection_lost(self) -> None:
        if not self.closed:
            if self.proto.state == "open":
                log.warning("closing AMQP connection %s (%s, vhost: '%s', user: '%s'):\nclient unexpectedly "
                            "closed TCP connection", id(self), self.name,
                            self.vhost.name if self.vhost else "", self.username)
            self.teardown()

    # ---------------------------------------------------------------- publish

    def on_publish(self, ch: Channel, ev: events.Publish) -> None:
        if ev.immediate:
            raise AMQPError(spec.NOT_IMPLEMENTED, "immediate=true", 60, 40)
        x = self.vhost.exchanges.get(ev.exchange)
        if x not in self._publish_ok:
            self._check_publish(x, ev)
        self.stats_recv_msgs += 1
        broker = self.broker
        if broker.blocking and not self.blocked:
            broker.block_publisher(self)
        props = ev.props
        if props == _NO_PROPS:
            persistent = False
            priority = 0
            expiration_ms = None
            headers = None
        else:
            s = codec.summarize_properties(props)
            if s.user_id is not None and s.user_id != self.username:
                raise precondition_failed(f"user_id property set to '{s.user_id}' but authenticated user "
                                          f"was '{self.username}'")
            if s.reply_to == DIRECT_REPLY_TO:
                props = self._direct_reply_props(ch, props)
            persistent = s.delivery_mode == 2
            priority = s.priority
            expiration_ms = qargs.parse_expiration(s.expiration) if s.expiration is not None else None
            headers = codec.decode_headers(props, s.headers_span) if x.type == "headers" else None
        msg = Message(ev.exchange, ev.routing_key, ev.route_enc, props, ev.body, persistent, priority,
                      expiration_ms)
        if ch.tx is not None:
            ch.tx_hold(("publish", x, msg, headers, ev.mandatory), len(msg.body))
            return
        self.deliver_publish(ch, x, msg, headers, ev.mandatory)

    def _check_publish(self, x: Exchange | None, ev: events.Publish) -> None:
        """May this connection publish `ev` to `x`? The exchange exists and is not internal, the user
        may write to it (asked once per exchange), and to a topic exchange with this routing key
        (asked every time). Exchanges of other types, once passed, go into `_publish_ok`."""
        vhost = self.vhost
        if x is None:
            raise not_found(f"no exchange '{ev.exchange}' in vhost '{vhost.name}'")
        if x.internal:
            raise access_refused(f"cannot publish to internal exchange '{ev.exchange}' in vhost '{vhost.name}'")
        if ev.exchange not in self._write_ok:
            self.broker.check_permission(self.user, vhost.name, "write", "exchange", ev.exchange)
            self._write_ok.add(ev.exchange)
        if x.type == "topic":
            self.broker.check_topic_permission(self.user, vhost.name, x, "write", ev.routing_key)
        else:
            self._publish_ok.add(x)

    def deliver_publish(self, ch: Channel, x: Exchange, msg: Message, headers: dict | None,
                        mandatory: bool) -> list[Any]:
        """Route and enqueue one publish; the queues it was routed to."""
        if ch.confirm:
            ch.publish_seq += 1
            seq = ch.publish_seq
        else:
            seq = 0
        st = ch.mstats
        st[PUBLISH] += 1  # (publishes in confirm mode: the channel's publish_seq)
        xst = x.mstats
        xst[X_PUBLISH_IN] += 1
        queues = self.vhost.route(x, msg.routing_key, headers)
        if queues:
            xst[X_PUBLISH_OUT] += len(queues)
            refused = self.broker.enqueue(queues, msg, ch, seq)  # (counts each queue's publish)
            if refused and seq:
                ch.nack_publish(seq)
                return queues
        elif x.name == "" and msg.routing_key.startswith(DIRECT_REPLY_PREFIX):
            # direct reply-to: no queue can have such a name (amq.* is reserved), so routing found none
            if not self.broker.direct_reply(msg) and mandatory:
                st[RETURN_UNROUTABLE] += 1
                xst[X_RETURN_UNROUTABLE] += 1
                self.send_frames(codec.return_frames(ch.number, spec.NO_ROUTE, "NO_ROUTE", msg.route_enc,
                                                     msg.props, msg.body, self.frame_max))
        elif mandatory:
            st[RETURN_UNROUTABLE] += 1
            xst[X_RETURN_UNROUTABLE] += 1
            self.send_frames(codec.return_frames(ch.number, spec.NO_ROUTE, "NO_ROUTE", msg.route_enc, msg.props,
                                                 msg.body, self.frame_max))
        else:
            st[DROP_UNROUTABLE] += 1
            xst[X_DROP_UNROUTABLE] += 1
        if seq:
            self.confirms_due(ch)
        return queues

    # ---------------------------------------------------------------- methods

    def channel(self, number: int) -> Channel:
        ch = self.channels.get(number)
        if ch is None:
            raise AMQPError(spec.CHANNEL_ERROR, f"no channel {number}")
        return ch

    def on_method(self, channel: int, m) -> None:
        if channel == 0:
            self.on_connection_method(m)
            return
        ch = self.channels.get(channel)
        if ch is None:
            return  # closed by us; the core drops the rest
        handler = _HANDLERS.get(m.name)
        if handler is None:
            raise AMQPError(spec.NOT_IMPLEMENTED, f"{m.name} is not implemented")
        try:
            handler(self, ch, m)
        except AMQPError as err:
            if err.code != spec.NOT_FOUND or not self._may_catch_up(m):
                raise
            # made through another node a moment ago? Once this node has applied everything the
            # catalogue committed before now (a barrier), the method runs once more
            again = _AGAIN.get(m.name, handler)
            self.wait_for(ch, m, lambda reply: self.broker.cluster.submit(cat.Barrier(), reply),
                          lambda _res: again(self, ch, m))

    def _may_catch_up(self, m) -> bool:
        """Whether a method that found no such queue or exchange waits for the catalogue to catch
        up and runs again: one that names an object it does not make (a passive declare, a
        bind, consume, get or purge), on a node of a cluster that reaches a majority of its
        members (a node cut off answers from what it has at once, as RabbitMQ's would)."""
        cl = self.broker.cluster
        if cl is None or m.name not in _CATCHES_UP or (m.name.endswith(".Declare") and not m.passive):
            return False
        return cl.reaches_majority()

    def on_connection_method(self, m) -> None:
        name = m.name
        if name == "Connection.UpdateSecret":
            user = self.broker.authenticate(self.username, m.new_secret if isinstance(m.new_secret, str)
                                            else m.new_secret.decode(), self.peer)
            if user is None:
                raise AMQPError(spec.ACCESS_REFUSED, "new secret was refused")  # pragma: no cover
            self.send_method(0, commands.Connection.UpdateSecretOk())
            return
        if name in ("Connection.Blocked", "Connection.Unblocked"):
            return
        raise AMQPError(spec.COMMAND_INVALID, f"unexpected {name} on channel 0")

    # -- exchange

    def exchange_declare(self, ch: Channel, m) -> None:
        vhost = self.vhost
        name = m.exchange
        if m.passive:
            if name == "":
                raise access_refused(ops.DEFAULT_EXCHANGE_REFUSED)
            vhost.exchange(name)
            if not m.nowait:
                self.send_method(ch.number, commands.Exchange.DeclareOk())
            return
        cmd = ops.declare_exchange(self.broker, vhost, self.user, name, m.exchange_type, bool(m.durable),
                                   bool(m.auto_delete), bool(m.internal), m.arguments or {})
        if cmd is not None:
            self.catalogue_change(ch, m, cmd, lambda _r: m.nowait or self.send_method(
                ch.number, commands.Exchange.DeclareOk()))
            return
        if not m.nowait:
            self.send_method(ch.number, commands.Exchange.DeclareOk())

    def exchange_delete(self, ch: Channel, m) -> None:
        cmd = ops.delete_exchange(self.broker, self.vhost, self.user, m.exchange, bool(m.if_unused))
        if cmd is not None:
            self.catalogue_change(ch, m, cmd,
                                  lambda _r: m.nowait or self.send_method(ch.number, commands.Exchange.DeleteOk()))
            return
        if not m.nowait:
            self.send_method(ch.number, commands.Exchange.DeleteOk())

    def exchange_bind(self, ch: Channel, m) -> None:
        self._bind(ch, m, m.source, EXCHANGE, m.destination, m.routing_key, m.arguments, True,
                   commands.Exchange.BindOk)

    def exchange_unbind(self, ch: Channel, m) -> None:
        if m.source in self.vhost.exchanges and m.destination in self.vhost.exchanges:
            self._bind(ch, m, m.source, EXCHANGE, m.destination, m.routing_key, m.arguments, False,
                       commands.Exchange.UnbindOk)
        elif not m.nowait:
            self.send_method(ch.number, commands.Exchange.UnbindOk())

    def _bind(self, ch: Channel, m, source: str, kind: str, destination: str, routing_key: str,
              arguments: dict | None, bind: bool, ok) -> None:
        """Bind or unbind after the checks, then answer with `ok` (unless nowait)."""
        vhost = self.vhost
        ops.check_binding(self.broker, vhost, self.user, source, kind, destination, routing_key, self)
        nowait = getattr(m, "nowait", False)
        cmd = ops.binding_command(vhost, source, kind, destination, routing_key, arguments, bind)
        if cmd is not None:
            self.catalogue_change(ch, m, cmd, lambda _r: nowait or self.send_method(ch.number, ok()))
            return
        if not nowait:
            self.send_method(ch.number, ok())

    # -- queue

    def queue_declare(self, ch: Channel, m) -> None:
        msgstats.node_counters(self.broker)[msgstats.QUEUES_DECLARED] += 1
        self.queue_declare_again(ch, m)

    def queue_declare_again(self, ch: Channel, m) -> None:
        """queue.declare, not counted (again: after the catalogue caught up, `on_method`)."""
        vhost = self.vhost
        name = m.queue
        if m.passive:
            if name == DIRECT_REPLY_TO:
                if not m.nowait:
                    self.send_method(ch.number, commands.Queue.DeclareOk(queue=name, message_count=0,
                                                                         consumer_count=0))
                return
            if name == "":
                raise not_found(f"no queue '' in vhost '{vhost.name}'")
            q = vhost.queue(name, owner=self)
            ch.last_queue = name
            self.broker.queue_used(q)
            self._declare_ok(ch, m, q)
            return
        if name == "":
            name = ops.GENERATED_PREFIX + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        q, cmd = ops.declare_queue(self.broker, vhost, self.user, name, durable=bool(m.durable),
                                   exclusive=bool(m.exclusive), auto_delete=bool(m.auto_delete),
                                   args=m.arguments or {}, owner=self, server_named=not m.queue)
        if cmd is not None:
            self._declare_new(ch, m, name, cmd)
            return
        self.broker.queue_used(q)
        ch.last_queue = name
        self._declare_ok(ch, m, q)

    def _declare_ok(self, ch: Channel, m, q) -> None:
        """queue.declare-ok with the queue's counts (asked of its home node when that is another)."""
        self.ask(ch, m, q.stat, lambda r: m.nowait or self.send_method(
            ch.number, commands.Queue.DeclareOk(queue=q.name, message_count=r[0], consumer_count=r[1])))

    def _declare_new(self, ch: Channel, m, name: str, cmd: cat.DeclareQueue) -> None:
        """A new queue: its record goes through the catalogue (the home node chosen here)."""
        vhost = self.vhost

        def done(_res: cat.Result) -> None:
            q = vhost.queue(name, owner=self)
            ch.last_queue = name
            if not m.nowait:
                self.send_method(ch.number, commands.Queue.DeclareOk(queue=name, message_count=q.message_count,
                                                                     consumer_count=q.consumer_count))
        self.catalogue_change(ch, m, cmd, done)

    def queue_bind(self, ch: Channel, m) -> None:
        self._bind(ch, m, m.exchange, QUEUE, self._queue_name(ch, m.queue), m.routing_key, m.arguments, True,
                   commands.Queue.BindOk)

    def queue_unbind(self, ch: Channel, m) -> None:
        name = self._queue_name(ch, m.queue)
        # as RabbitMQ: unbinding from a queue or exchange that no longer exists succeeds
        if name in self.vhost.queues and m.exchange in self.vhost.exchanges:
            self._bind(ch, m, m.exchange, QUEUE, name, m.routing_key, m.arguments, False, commands.Queue.UnbindOk)
        else:
            self.send_method(ch.number, commands.Queue.UnbindOk())

    def queue_purge(self, ch: Channel, m) -> None:
        q = ops.queue_to_purge(self.broker, self.vhost, self.user, self._queue_name(ch, m.queue), self)
        self.ask(ch, m, q.purge, lambda count: m.nowait or self.send_method(
            ch.number, commands.Queue.PurgeOk(message_count=count)))

    def queue_delete(self, ch: Channel, m) -> None:
        vhost = self.vhost
        name = self._queue_name(ch, m.queue)
        q = ops.check_delete_queue(self.broker, vhost, self.user, name, self, bool(m.if_unused), bool(m.if_empty))
        count = q.message_count if q is not None else 0
        if q is not None and not q.local:
            self.catalogue_change(ch, m, cat.DeleteQueue(vhost.name, name), lambda _r: m.nowait or self.send_method(
                ch.number, commands.Queue.DeleteOk(message_count=count)))
            return
        # delete-ok first, then the basic.cancel notifications (as RabbitMQ orders them): a client
        # waiting for delete-ok on the channel that consumes must not meet the cancel first
        if not m.nowait:
            self.send_method(ch.number, commands.Queue.DeleteOk(message_count=count))
        if q is not None:
            self.broker.delete_queue(q)

    def _queue_name(self, ch: Channel, name: str) -> str:
        """An empty queue name means the channel's most recently declared queue (spec 1.7.2.x)."""
        if name:
            return name
        if ch.last_queue:
            return ch.last_queue
        raise not_found("no previously declared queue")

    # -- basic

    def basic_qos(self, ch: Channel, m) -> None:
        if m.prefetch_size:
            raise AMQPError(spec.NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})")
        if m.global_:
            ch.global_prefetch = m.prefetch_count
        else:
            ch.prefetch = m.prefetch_count
        self.send_method(ch.number, commands.Basic.QosOk())
        self.broker.kick_consumers_of(ch)

    def _direct_reply_props(self, ch: Channel, props: bytes) -> bytes:
        """Direct reply-to: the request's reply_to names this channel's reply consumer."""
        if ch.reply_token is None:
            raise precondition_failed("fast reply consumer does not exist")
        return codec.edit_properties(props, set_shortstr={"reply_to": ch.reply_token})

    def basic_consume(self, ch: Channel, m) -> None:
        vhost = self.vhost
        if m.queue == DIRECT_REPLY_TO:
            if not m.no_ack:
                raise precondition_failed("reply consumer cannot acknowledge")
            if ch.reply_token is not None:
                raise precondition_failed("reply consumer already set")
            tag = m.consumer_tag or self.new_consumer_tag()
            ch.reply_token = self.broker.register_direct_reply(ch, tag)
            ch.reply_tag = tag
            if not m.nowait:
                self.send_method(ch.number, commands.Basic.ConsumeOk(consumer_tag=tag))
            return
        q = vhost.queue(self._queue_name(ch, m.queue), owner=self)
        self.broker.check_permission(self.user, vhost.name, "read", "queue", q.name)
        tag = m.consumer_tag or self.new_consumer_tag()
        if tag in ch.consumers:
            raise AMQPError(spec.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        if q.has_exclusive_consumer() or (m.exclusive and q.consumer_count):
            raise access_refused(f"queue '{q.name}' in vhost '{vhost.name}' in exclusive use")
        args = dict(m.arguments or {})
        c = ChannelConsumer(tag, q, ch, bool(m.no_ack), bool(m.exclusive), qargs.consumer_priority(args), ch.prefetch,
                            args)

        def attached(_none) -> None:
            if ch.closed or q.deleted:
                q.remove_consumer(c)
                return
            if not m.nowait:
                self.send_method(ch.number, commands.Basic.ConsumeOk(consumer_tag=tag))
            ch.consumers[tag] = c
        self.ask(ch, m, lambda reply: q.consume(c, reply), attached)

    def basic_cancel(self, ch: Channel, m) -> None:
        if ch.reply_token is not None and m.consumer_tag == ch.reply_tag:
            self.broker.unregister_direct_reply(ch)
        c = ch.remove_consumer(m.consumer_tag)
        if not m.nowait:
            self.send_method(ch.number, commands.Basic.CancelOk(consumer_tag=m.consumer_tag))
        if c is not None:
            self.broker.consumer_gone(c.queue)

    def basic_get(self, ch: Channel, m) -> None:
        q = ops.queue_to_purge(self.broker, self.vhost, self.user, self._queue_name(ch, m.queue), self)
        no_ack = bool(m.no_ack)

        def get(reply) -> Any:
            def answered(got) -> None:
                if self.closed or ch.closed:
                    # The channel went while the queue (on another node, or a quorum queue's
                    # leader) looked: nobody will settle what it took, so it goes back at once.
                    if isinstance(got, Got) and not no_ack and not q.deleted:
                        q.requeue(got.entry.seq)
                        self.broker.dirty_queues.add(q)
                        self.broker.schedule()
                reply(got)
            return q.get(no_ack, answered)
        self.ask(ch, m, get, lambda got: None if ch.closed else self._get_ok(ch, q, no_ack, got))

    def _get_ok(self, ch: Channel, q, no_ack: bool, got: Got | None) -> None:
        """get-ok (or get-empty) for a basic.get's answer, whatever the queue's type."""
        if got is None:
            ch.mstats[msgstats.GET_EMPTY] += 1
            q.mstats[msgstats.GET_EMPTY] += 1
            self.send_method(ch.number, commands.Basic.GetEmpty())
            return
        msgstats.count_get(ch.mstats, q.mstats, no_ack, got.redelivered)
        ch.delivery_tag += 1
        tag = ch.delivery_tag
        if not no_ack:
            ch.unacked[tag] = (q, got.entry, None)
        self.send_frames(codec.get_ok_frames(ch.number, tag, got.redelivered, got.route, got.message_count,
                                             got.props, got.body, self.frame_max))

    def basic_recover(self, ch: Channel, m) -> None:
        if not m.requeue:
            raise AMQPError(spec.NOT_IMPLEMENTED, "requeue=false")
        ch.requeue_all()
        self.send_method(ch.number, commands.Basic.RecoverOk())
        self.broker.schedule()

    def basic_recover_async(self, ch: Channel, m) -> None:
        if not m.requeue:
            raise AMQPError(spec.NOT_IMPLEMENTED, "requeue=false")
        ch.requeue_all()
        self.broker.schedule()

    # -- confirm / tx

    def confirm_select(self, ch: Channel, m) -> None:
        if ch.tx is not None:
            raise precondition_failed("cannot switch from tx to confirm mode")
        ch.confirm = True
        if not m.nowait:
            self.send_method(ch.number, commands.Confirm.SelectOk())

    def tx_select(self, ch: Channel, m) -> None:
        if ch.confirm:
            raise precondition_failed("cannot switch from confirm to tx mode")
        if ch.tx is None:
            ch.tx = []
        self.send_method(ch.number, commands.Tx.SelectOk())

    def tx_commit(self, ch: Channel, m) -> None:
        if ch.tx is None:
            raise precondition_failed("channel is not transactional")
        ops, ch.tx = ch.tx, []
        ch.tx_bytes = 0
        touched: set[tuple[str, str]] | None = set()  # the queues whose mirrors must have it; None: all
        for op in ops:
            if op[0] == "publish":
                _, x, msg, headers, mandatory = op
                for q in self.deliver_publish(ch, x, msg, headers, mandatory):
                    touched.add((q.vhost, q.name))
            elif op[0] == "ack":
                if touched is not None:
                    touched.update((q.vhost, q.name) for q in ch.queues_of(op[1], op[2]))
                ch.ack(op[1], op[2])
            else:
                touched = None  # a rejected message may be dead-lettered anywhere
                ch.reject(op[1], op[2], op[3])
        # commit-ok once what the transaction journalled is on disk, every mirror of a mirrored
        # queue it touched has it, and every other node has accepted what went there
        cl = self.broker.cluster
        if cl is None:
            self.broker.after_sync(self._commit_ok, ch)
            return
        self.broker.after_sync(lambda c: cl.mirroring.after_all_stable(
            lambda c2: cl.after_forwarded(self, self._commit_ok, c2), c, touched), ch)

    def _commit_ok(self, ch: Channel) -> None:
        if not ch.closed and not self.closed:
            self.send_method(ch.number, commands.Tx.CommitOk())

    def tx_rollback(self, ch: Channel, m) -> None:
        if ch.tx is None:
            raise precondition_failed("channel is not transactional")
        ch.tx = []
        ch.tx_bytes = 0
        self.send_method(ch.number, commands.Tx.RollbackOk())

    def channel_flow_ok(self, ch: Channel, m) -> None:
        return None

    def access_request(self, ch: Channel, m) -> None:
        self.send_method(ch.number, commands.Access.RequestOk())


def check_consumer_timeouts(broker: Broker) -> None:
    """RabbitMQ's consumer (delivery acknowledgement) timeout, on the node's coarse timer (every
    CONSUMER_TIMEOUT_CHECK_S; RabbitMQ's channels look once a minute): each channel's oldest
    unacknowledged delivery is held against its queue's timeout — `x-consumer-timeout` or the
    policy key `consumer-timeout` (the smaller), else the node's `consumer_timeout` — and a
    channel past it is closed with 406 PRECONDITION_FAILED; its deliveries go back to their
    queues, redelivered. A delivery is caught between its timeout and about two checks later.
    Each queue's timeout is resolved once a pass."""
    now = broker.now_ms()
    default = broker.config.consumer_timeout_ms
    timeouts: dict[int, int | None] = {}

    def timeout_of(q) -> int | None:
        if id(q) not in timeouts:
            eff = broker.queue_settings(q.vhost, q.name, q.queue_type, q.arguments)
            timeouts[id(q)] = eff.consumer_timeout_ms if eff.consumer_timeout_ms is not None else default
        return timeouts[id(q)]

    for session in list(broker.sessions):
        if not session.closed:
            session.check_consumer_timeouts(now, timeout_of)


def _method_name(err: AMQPError) -> str:
    idx = (err.class_id << 16) | err.method_id
    cls = codec.METHODS.get(idx)
    if cls is None:
        return "none"
    cname, mname = cls.name.split(".")
    snake = "".join("_" + c.lower() if c.isupper() else c for c in mname).lstrip("_")
    return f"'{cname.lower()}.{snake}'"


# methods that name a queue or exchange they do not make: a 404 waits for the catalogue first
_CATCHES_UP = frozenset({"Queue.Declare", "Queue.Bind", "Queue.Purge", "Basic.Consume", "Basic.Get",
                         "Exchange.Declare", "Exchange.Bind"})

_AGAIN = {"Queue.Declare": Session.queue_declare_again}  # run again without counting twice

_HANDLERS = {
    "Exchange.Declare": Session.exchange_declare,
    "Exchange.Delete": Session.exchange_delete,
    "Exchange.Bind": Session.exchange_bind,
    "Exchange.Unbind": Session.exchange_unbind,
    "Queue.Declare": Session.queue_declare,
    "Queue.Bind": Session.queue_bind,
    "Queue.Unbind": Session.queue_unbind,
    "Queue.Purge": Session.queue_purge,
    "Queue.Delete": Session.queue_delete,
    "Basic.Qos": Session.basic_qos,
    "Basic.Consume": Session.basic_consume,
    "Basic.Cancel": Session.basic_cancel,
    "Basic.Get": Session.basic_get,
    "Basic.Recover": Session.basic_recover,
    "Basic.RecoverAsync": Session.basic_recover_async,
    "Confirm.Select": Session.confirm_select,
    "Tx.Select": Session.tx_select,
    "Tx.Commit": Session.tx_commit,
    "Tx.Rollback": Session.tx_rollback,
    "Channel.FlowOk": Session.channel_flow_ok,
    "Access.Request": Session.access_request,
}
