"""A message with TTL 0 goes to a consumer that can take it at once, however busy the loop is.

The broker dispatches a publish in its next run (`Broker.run`), which a loaded event loop may
start some milliseconds later. Expiry in that run is judged by the time the run was asked for,
so a message that arrived with a consumer waiting is delivered, not expired by the loop's
delay; one that finds no consumer expires at once."""

from __future__ import annotations

from types import SimpleNamespace

from hutch.amqp import codec
from hutch.broker.broker import Broker, Config
from hutch.broker.channel import Channel, ChannelConsumer
from hutch.broker.msgstats import DELIVER_NO_ACK
from hutch.broker.session import Session
from hutch.queues.message import Message


def setup():
    clock = [1_000]
    broker = Broker(Config(), clock_ms=lambda: clock[0])
    vhost = broker.add_vhost("/")
    q = broker.declare_queue(vhost, "q", durable=False, exclusive=False, auto_delete=False,
                             arguments={"x-message-ttl": 0}, owner=None)
    s = Session(broker, "127.0.0.1:1", "127.0.0.1:5672")
    s.vhost = SimpleNamespace(name="/")
    ch = Channel(s, 1)
    return broker, clock, q, ch


def publish(broker, q, body: bytes) -> None:
    broker.enqueue((q,), Message("", "q", codec.route_encoding("", "q"), b"\x00\x00", body), None, 0)


def test_a_ttl_zero_message_reaches_a_waiting_consumer_when_the_run_comes_late():
    broker, clock, q, ch = setup()
    c = ChannelConsumer("ctag", q, ch, True, False, 0, 0, {})
    ch.consumers[c.tag] = c
    q.add_consumer(c)
    publish(broker, q, b"taken")
    clock[0] += 25  # the loop was busy for 25 ms before the broker's run
    broker.run()
    assert q.message_count == 0
    assert c.delivered + q.mstats[DELIVER_NO_ACK] == 1  # delivered, not expired


def test_a_timer_that_fires_before_the_run_leaves_the_message_to_it():
    """Under uvloop a due timer (the broker's tick) runs before a callback asked for with
    call_soon: the tick must not expire by the time it runs what the run, asked for earlier,
    would deliver (found by CI under heavy load:
    test_message_ttl_zero_delivers_only_to_a_waiting_consumer)."""
    broker, clock, q, ch = setup()
    c = ChannelConsumer("ctag", q, ch, True, False, 0, 0, {})
    ch.consumers[c.tag] = c
    q.add_consumer(c)
    publish(broker, q, b"taken")
    clock[0] += 25
    broker.tick()
    broker.run()
    assert q.message_count == 0
    assert c.delivered + q.mstats[DELIVER_NO_ACK] == 1  # delivered, not expired


def test_a_ttl_zero_message_with_no_consumer_expires():
    broker, clock, q, _ch = setup()
    publish(broker, q, b"nobody-waits")
    clock[0] += 1
    broker.run()
    broker.tick()
    assert q.message_count == 0
