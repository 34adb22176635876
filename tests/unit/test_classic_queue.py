"""A classic queue's consumers and dispatch (hutch.queues.classic), as RabbitMQ 3.10 does it.

Round-robin among consumers of equal priority; consumers of a higher `x-priority` first,
lower ones only while every higher one is blocked; a consumer that cannot take more
(prefetch reached, flow stopped) is skipped; with single-active-consumer only the first
registered consumer receives, and the next registered one takes over when it goes.
Consumers here implement the queue's documented interface (`can_take`, `deliver`, `tag`,
`no_ack`, `priority`, `exclusive`) with a prefetch count, as the broker's channel does.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.queues.classic import ClassicQueue
from hutch.queues.message import Message
from hutch.queues.state import REJECT_PUBLISH, QueueLimits


class PrefetchConsumer:
    def __init__(self, tag: str, prefetch: int = 0, priority: int = 0, no_ack: bool = False,
                 exclusive: bool = False):
        self.tag = tag
        self.prefetch = prefetch  # 0: unlimited
        self.priority = priority
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.got: list[int] = []  # message ids in delivery order
        self.unacked: list = []

    def can_take(self) -> bool:
        return self.no_ack or not self.prefetch or len(self.unacked) < self.prefetch

    def deliver(self, queue: ClassicQueue, entry) -> None:
        self.got.append(entry.message.id)
        if not self.no_ack:
            self.unacked.append(entry)

    def ack_all(self, queue: ClassicQueue) -> None:
        for e in self.unacked:
            queue.settle(e.seq)
        self.unacked.clear()


def msg(n: int, size: int = 1) -> Message:
    return Message("", "q", b"\x00", b"\x00\x00", bytes(size), id=n)


def fill(q: ClassicQueue, ids) -> None:
    for n in ids:
        entry, dropped = q.publish(msg(n), now_ms=0)
        assert entry is not None and dropped == []


def test_round_robin_among_consumers_of_equal_priority():
    q = ClassicQueue("q", "/")
    a, b, c = PrefetchConsumer("a"), PrefetchConsumer("b"), PrefetchConsumer("c")
    for consumer in (a, b, c):
        q.add_consumer(consumer)
    fill(q, range(9))
    assert q.dispatch() == 9
    assert (a.got, b.got, c.got) == ([0, 3, 6], [1, 4, 7], [2, 5, 8])
    assert q.message_count == 0 and q.unacked_count == 9
    fill(q, range(9, 11))  # the rotation carries on where it stopped
    q.dispatch()
    assert (a.got[-1], b.got[-1]) == (9, 10)


def test_dispatch_skips_consumers_that_cannot_take_and_leaves_the_rest_ready():
    q = ClassicQueue("q", "/")
    a, b = PrefetchConsumer("a", prefetch=1), PrefetchConsumer("b", prefetch=2)
    q.add_consumer(a)
    q.add_consumer(b)
    fill(q, range(10))
    assert q.dispatch() == 3
    assert (a.got, b.got) == ([0], [1, 2])
    assert q.message_count == 7 and q.unacked_count == 3
    assert q.dispatch() == 0  # nobody can take: nothing moves
    a.ack_all(q)
    assert q.dispatch() == 1 and a.got == [0, 3]
    assert sum(q.mstats) == 0  # counters belong to the channels that deliver and ack (msgstats)


def test_higher_priority_consumers_get_messages_while_they_can_take():
    q = ClassicQueue("q", "/")
    low = PrefetchConsumer("low", prefetch=100, priority=0)
    high1 = PrefetchConsumer("high1", prefetch=2, priority=10)
    high2 = PrefetchConsumer("high2", prefetch=2, priority=10)
    mid = PrefetchConsumer("mid", prefetch=1, priority=5)
    for consumer in (low, high1, mid, high2):
        q.add_consumer(consumer)
    assert [c.tag for c in q.consumers()] == ["high1", "high2", "mid", "low"]
    fill(q, range(8))
    assert q.dispatch() == 8
    assert (high1.got, high2.got) == ([0, 2], [1, 3])  # round-robin within the top priority
    assert mid.got == [4]  # then the next priority, while every higher one is blocked
    assert low.got == [5, 6, 7]
    high1.ack_all(q)
    fill(q, [8, 9, 10])
    q.dispatch()
    assert high1.got[-2:] == [8, 9] and low.got[-1] == 10


def test_negative_priorities_come_after_the_default():
    q = ClassicQueue("q", "/")
    neg, default = PrefetchConsumer("neg", priority=-5), PrefetchConsumer("default")
    q.add_consumer(neg)
    q.add_consumer(default)
    fill(q, range(3))
    q.dispatch()
    assert (default.got, neg.got) == ([0, 1, 2], [])


def test_single_active_consumer_only_the_first_registered_receives():
    q = ClassicQueue("q", "/", single_active=True)
    first = PrefetchConsumer("first", prefetch=2)
    second = PrefetchConsumer("second", priority=10)  # priority does not pick the active one
    q.add_consumer(first)
    q.add_consumer(second)
    assert q.active_consumer() is first
    fill(q, range(5))
    assert q.dispatch() == 2
    assert (first.got, second.got) == ([0, 1], [])  # blocked active consumer: nobody else gets any
    # the active consumer goes: its unacked come back, the next registered one takes over
    for e in first.unacked:
        q.requeue(e.seq)
    assert q.remove_consumer(first)
    assert q.active_consumer() is second
    assert q.dispatch() == 5
    assert second.got == [0, 1, 2, 3, 4]


def test_no_ack_consumers_take_messages_for_good():
    q = ClassicQueue("q", "/")
    auto = PrefetchConsumer("auto", prefetch=1, no_ack=True)  # prefetch does not apply to no-ack
    q.add_consumer(auto)
    fill(q, range(4))
    assert q.dispatch() == 4 and auto.got == [0, 1, 2, 3]
    assert q.message_count == 0 and q.unacked_count == 0


def test_dispatch_does_nothing_while_blocked_or_without_consumers():
    q = ClassicQueue("q", "/")
    fill(q, range(2))
    assert q.dispatch() == 0
    c = PrefetchConsumer("c")
    q.add_consumer(c)
    q.dispatch_blocked = True  # e.g. while a mirror synchronises
    assert q.dispatch() == 0 and q.message_count == 2
    q.dispatch_blocked = False
    assert q.dispatch() == 2


def test_remove_consumer_and_counts():
    q = ClassicQueue("q", "/")
    a, b = PrefetchConsumer("a", priority=1, exclusive=True), PrefetchConsumer("b")
    q.add_consumer(a)
    q.add_consumer(b)
    assert q.consumer_count == 2 and q.ever_consumed and q.has_exclusive_consumer()
    assert q.remove_consumer(a) and not q.remove_consumer(a)
    assert q.consumer_count == 1 and q.consumers() == [b] and not q.has_exclusive_consumer()
    assert q.remove_consumer(b) and q.consumers() == [] and q.consumer_count == 0


def test_requeued_message_goes_to_the_next_consumer_redelivered():
    q = ClassicQueue("q", "/")
    a, b = PrefetchConsumer("a", prefetch=1), PrefetchConsumer("b", prefetch=1)
    q.add_consumer(a)
    q.add_consumer(b)
    fill(q, range(3))
    q.dispatch()
    entry = a.unacked.pop()
    q.requeue(entry.seq)
    assert [e.message.id for e in q.state.ready()] == [0, 2]  # back ahead of message 2
    q.dispatch()
    assert a.got == [0, 0] and a.unacked[0].delivery_count == 2


def test_get_checks_out_or_takes():
    q = ClassicQueue("q", "/")
    fill(q, range(2))
    e = q.take_head(no_ack=False)
    assert e.message.id == 0 and q.unacked_count == 1
    assert q.take_head(no_ack=True).message.id == 1 and q.unacked_count == 1
    assert q.take_head(no_ack=True) is None
    assert sum(q.mstats) == 0  # a basic.get is counted by the channel, not the queue


def test_publish_sets_expiry_from_the_smaller_ttl_and_expire_discards_heads():
    q = ClassicQueue("q", "/", message_ttl_ms=1000)
    short = Message("", "q", b"", b"\x00\x00", b"x", expiration_ms=10, id=1)
    plain = Message("", "q", b"", b"\x00\x00", b"x", id=2)
    long_ = Message("", "q", b"", b"\x00\x00", b"x", expiration_ms=5000, id=3)
    e1, _ = q.publish(short, now_ms=100)
    e2, _ = q.publish(plain, now_ms=100)
    e3, _ = q.publish(long_, now_ms=100)
    assert (e1.expires_at_ms, e2.expires_at_ms, e3.expires_at_ms) == (110, 1100, 1100)
    assert q.expire(now_ms=109) == []
    assert [e.message.id for e in q.expire(now_ms=1100)] == [1, 2, 3]
    assert q.message_count == 0


def test_publish_refused_by_reject_publish_overflow():
    q = ClassicQueue("q", "/", limits=QueueLimits(max_length=1, overflow=REJECT_PUBLISH))
    assert q.publish(msg(1), 0)[0] is not None
    assert q.publish(msg(2), 0) == (None, [])
    assert q.message_count == 1 and len(q.remove_ready()) == 1


@settings(max_examples=200, deadline=None)
@given(prefetches=st.lists(st.integers(0, 4), min_size=1, max_size=5), n=st.integers(0, 30),
       priorities=st.lists(st.integers(-1, 2), min_size=5, max_size=5))
def test_dispatch_never_exceeds_prefetch_and_delivers_each_message_once(prefetches, n, priorities):
    q = ClassicQueue("q", "/")
    consumers = [PrefetchConsumer(f"c{i}", prefetch=p, priority=priorities[i]) for i, p in enumerate(prefetches)]
    for c in consumers:
        q.add_consumer(c)
    fill(q, range(n))
    delivered = q.dispatch()
    got = [m for c in consumers for m in c.got]
    assert sorted(got) == list(range(delivered))  # in queue order, each once
    assert delivered == min(n, sum(p for p in prefetches) if all(prefetches) else n)
    for c in consumers:
        assert not c.prefetch or len(c.got) <= c.prefetch
    # a lower-priority consumer got something only if every higher one was full
    for c in consumers:
        if c.got:
            for h in consumers:
                if h.priority > c.priority:
                    assert h.prefetch and len(h.unacked) == h.prefetch


@pytest.mark.parametrize("n_consumers", [1, 2, 5])
def test_round_robin_is_even_over_many_messages(n_consumers):
    q = ClassicQueue("q", "/")
    consumers = [PrefetchConsumer(f"c{i}") for i in range(n_consumers)]
    for c in consumers:
        q.add_consumer(c)
    fill(q, range(100))
    q.dispatch()
    counts = [len(c.got) for c in consumers]
    assert max(counts) - min(counts) <= 1 and sum(counts) == 100
