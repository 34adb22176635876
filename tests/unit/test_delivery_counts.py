"""A delivery's message counters (hutch.broker.msgstats) are added once per write, not per message.

A consumer of a classic queue counts its deliveries in one integer; the connection adds them to
the channel's and the queue's `deliver`/`deliver_no_ack` counters when it hands its frames to
the socket (`Session.take_output`), and a channel that closes adds its consumers' before its
counters move to the vhost's totals. What the HTTP API, the rates and Prometheus read is then
exact after every loop iteration, as the integration tests of message_stats check."""

from __future__ import annotations

from types import SimpleNamespace

from hutch.amqp import codec
from hutch.broker import msgstats
from hutch.broker.broker import Broker, Config
from hutch.broker.channel import Channel, ChannelConsumer
from hutch.broker.msgstats import DELIVER, DELIVER_NO_ACK
from hutch.broker.session import Session
from hutch.queues.classic import ClassicQueue
from hutch.queues.message import Message


def setup(no_ack: bool):
    broker = Broker(Config())
    s = Session(broker, "127.0.0.1:1", "127.0.0.1:5672")
    s.vhost = SimpleNamespace(name="/")
    ch = Channel(s, 1)
    q = ClassicQueue("q", "/")
    c = ChannelConsumer("ctag", q, ch, no_ack, False, 0, 0, {})
    ch.consumers[c.tag] = c
    return broker, s, ch, q, c


def deliver(q: ClassicQueue, c: ChannelConsumer, n: int) -> None:
    for _ in range(n):
        q.state.enqueue(Message("", "q", codec.route_encoding("", "q"), b"\x00\x00", b"body"))
        c.deliver(q, q.state.take() if c.no_ack else q.state.checkout())


def test_deliveries_are_counted_on_the_channel_and_the_queue_at_the_next_write():
    _broker, s, ch, q, c = setup(no_ack=True)
    deliver(q, c, 3)
    assert s.take_output()  # the deliver frames, and with them the count
    assert (ch.mstats[DELIVER_NO_ACK], q.mstats[DELIVER_NO_ACK], ch.mstats[DELIVER]) == (3, 3, 0)
    deliver(q, c, 2)
    s.take_output()
    assert (ch.mstats[DELIVER_NO_ACK], q.mstats[DELIVER_NO_ACK]) == (5, 5)


def test_a_closing_channel_counts_its_consumers_deliveries_before_they_go_to_the_vhost():
    broker, s, ch, q, c = setup(no_ack=False)
    deliver(q, c, 4)  # not written yet
    ch.close()
    assert q.mstats[DELIVER] == 4
    assert msgstats.node_totals(broker)[DELIVER] == 4
    s.take_output()  # the consumer's count was taken by the close: nothing is counted twice
    assert msgstats.node_totals(broker)[DELIVER] == 4 and q.mstats[DELIVER] == 4
