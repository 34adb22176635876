"""The consumer timeout's bookkeeping (Channel.oldest_unacked) and its configuration keys.

A delivery's time is what the node's coarse timer saw: the first visit after it was handed out.
So a delivery is never taken as older than it is (a channel is never closed early), and the
marks a channel keeps stay bounded however long a delivery is held."""

from __future__ import annotations

import pytest
from tests.unit.test_channel_tx_limit import Output  # the connection side a channel writes through

from hutch.broker import channel as channel_mod
from hutch.broker.broker import Config
from hutch.broker.channel import Channel
from hutch.server.config import ConfigError, apply_file


def deliver(ch: Channel, queue: str = "q") -> int:
    """What a delivery leaves on the channel: the next tag, held unacknowledged."""
    ch.delivery_tag += 1
    ch.unacked[ch.delivery_tag] = (queue, None, None)
    return ch.delivery_tag


def test_a_delivery_is_dated_by_the_first_visit_after_it():
    ch = Channel(Output(), 1)
    assert ch.oldest_unacked(0) is None
    deliver(ch)
    deliver(ch)
    assert ch.oldest_unacked(1000) == (1, "q", None, 1000)
    deliver(ch)  # between the visits at 1000 and 2000
    assert ch.oldest_unacked(2000) == (1, "q", None, 1000)
    del ch.unacked[1], ch.unacked[2]  # acknowledged: tag 3 is the oldest, seen first at 2000
    assert ch.oldest_unacked(3000) == (3, "q", None, 2000)
    del ch.unacked[3]
    assert ch.oldest_unacked(4000) is None and not ch.delivery_marks


def test_the_marks_stay_bounded_and_only_ever_date_deliveries_later(monkeypatch):
    monkeypatch.setattr(channel_mod, "DELIVERY_MARKS_MAX", 4)
    ch = Channel(Output(), 1)
    deliver(ch)  # held throughout
    for visit in range(1, 20):
        deliver(ch)
        ch.oldest_unacked(visit * 1000)
    assert len(ch.delivery_marks) == 4
    assert ch.oldest_unacked(20_000)[3] == 1000  # the held one keeps its time
    for tag in range(1, 19):
        del ch.unacked[tag]
    # tag 19 was delivered before the visit at 19000; merged marks date it no earlier than that
    assert ch.oldest_unacked(21_000)[3] >= 19_000


def conf(tmp_path, text: str) -> Config:
    path = tmp_path / "hutch.conf"
    path.write_text(text + "\n")
    return apply_file(Config(), path)


def test_consumer_timeout_defaults_to_30_minutes_and_false_disables_it(tmp_path):
    assert Config().consumer_timeout_ms == 1_800_000
    assert conf(tmp_path, "consumer_timeout = 3600000").consumer_timeout_ms == 3_600_000
    assert conf(tmp_path, "consumer_timeout = false").consumer_timeout_ms is None
    with pytest.raises(ConfigError, match="consumer_timeout"):
        conf(tmp_path, "consumer_timeout = 0")


def test_the_default_delivery_limit_key(tmp_path):
    assert Config().quorum_queue_default_delivery_limit == 20
    assert conf(tmp_path, "quorum_queue.default_delivery_limit = 5").quorum_queue_default_delivery_limit == 5
    assert conf(tmp_path, "quorum_queue.default_delivery_limit = unlimited").quorum_queue_default_delivery_limit is None
    assert conf(tmp_path, "quorum_queue.default_delivery_limit = -1").quorum_queue_default_delivery_limit is None
    with pytest.raises(ConfigError, match="default_delivery_limit"):
        conf(tmp_path, "quorum_queue.default_delivery_limit = -2")
