"""A transaction holds a bounded number of publishes and acknowledgements (Channel.tx_hold)."""

from __future__ import annotations

import pytest

from hutch.amqp import spec
from hutch.amqp.spec import AMQPError
from hutch.broker import channel as channel_mod
from hutch.broker.broker import Broker, Config
from hutch.broker.channel import Channel


class Output:
    """The connection side a channel writes through (ChannelOutput), holding a real broker."""

    def __init__(self):
        self.broker = Broker(Config())
        self.vhost = None
        self.frame_max = 131072
        self.writable = True

    def send_frames(self, frames): ...
    def send_bytes(self, data): ...
    def confirms_due(self, channel): ...
    def new_consumer_tag(self): return "amq.ctag-1"


def test_a_transaction_past_its_op_limit_is_refused_with_406(monkeypatch):
    monkeypatch.setattr(channel_mod, "TX_HELD_MAX", 3)
    ch = Channel(Output(), 1)
    ch.tx = []
    for n in range(3):
        ch.tx_hold(("ack", n + 1, False))
    with pytest.raises(AMQPError) as e:
        ch.tx_hold(("ack", 4, False))
    assert e.value.code == spec.PRECONDITION_FAILED and "transaction too large" in e.value.text
    assert len(ch.tx) == 3  # the refused one is not held


def test_a_transaction_past_its_byte_limit_is_refused_with_406(monkeypatch):
    monkeypatch.setattr(channel_mod, "TX_HELD_BYTES_MAX", 1000)
    ch = Channel(Output(), 1)
    ch.tx = []
    ch.tx_hold(("publish",), 600)
    ch.tx_hold(("publish",), 400)
    assert ch.tx_bytes == 1000
    with pytest.raises(AMQPError) as e:
        ch.tx_hold(("publish",), 1)
    assert e.value.code == spec.PRECONDITION_FAILED and "1000 bytes" in e.value.text
