"""The queue as a deterministic state machine (hutch.queues.state, ARCHITECTURE.md "One idea
carries the broker").

A hypothesis `RuleBasedStateMachine` applies random sequences of enqueue / checkout / take /
settle / return_ / discard / purge / expiry to two `QueueState`s with the same limits
(priorities, x-max-length, x-max-length-bytes, drop-head or reject-publish) and holds them
against a plain model: every enqueued message is, exactly once, settled, discarded, dropped,
purged, taken, or still present (ready or unacked); counts and byte totals match; delivery
order is priority first, then sequence order (so FIFO within a priority, and a returned
message comes back ahead of newer ones with `redelivered` set); and both copies end in the
same state (determinism: the property replication rests on).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hutch.queues.message import Message
from hutch.queues.state import (
    DROP_HEAD,
    REJECT_PUBLISH,
    REJECT_PUBLISH_DLX,
    NotCheckedOut,
    QueueLimits,
    QueueState,
    Refused,
)

READY, UNACKED = "ready", "unacked"
GONE = ("settled", "discarded", "dropped", "purged", "taken")


def message(n: int, size: int, priority: int = 0) -> Message:
    return Message("", "rk", b"\x00", b"\x00\x00", bytes(size), priority=priority, id=n)


def snapshot(q: QueueState):
    """Everything observable about a QueueState, comparable between copies."""
    return (q.next_seq, q.ready_count, q.ready_bytes, q.unacked_bytes,
            [(e.seq, e.message.id, e.delivery_count, e.expires_at_ms) for e in q.ready()],
            sorted((s, e.message.id, e.delivery_count) for s, e in q.unacked.items()))


class QueueMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.copies: list[QueueState] = []
        self.status: dict[int, str] = {}  # message id -> ready/unacked/settled/...
        self.seq_of: dict[int, int] = {}
        self.level: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.count: dict[int, int] = {}  # delivery count the model expects
        self.expires: dict[int, int | None] = {}
        self.next_id = 0
        self.next_seq = 1

    @initialize(max_priority=st.sampled_from([0, 0, 3]),
                max_length=st.sampled_from([None, None, 0, 1, 3, 6]),
                max_length_bytes=st.sampled_from([None, None, 0, 10, 40]),
                overflow=st.sampled_from([DROP_HEAD, REJECT_PUBLISH, REJECT_PUBLISH_DLX]))
    def setup(self, max_priority, max_length, max_length_bytes, overflow):
        self.limits = dict(max_length=max_length, max_length_bytes=max_length_bytes, overflow=overflow,
                           max_priority=max_priority)
        self.copies = [QueueState(QueueLimits(**self.limits)) for _ in range(2)]

    # -------------------------------------------------------------- the model

    def ids(self, status: str) -> list[int]:
        return [i for i, s in self.status.items() if s == status]

    def ready_order(self) -> list[int]:
        return sorted(self.ids(READY), key=lambda i: (-self.level[i], self.seq_of[i]))

    def over_limits(self, count: int, size: int) -> bool:
        lim = self.limits
        return ((lim["max_length"] is not None and count > lim["max_length"])
                or (lim["max_length_bytes"] is not None and size > lim["max_length_bytes"]))

    def apply(self, op, *args):
        """Apply one operation to every copy; all must answer alike."""
        results = []
        for q in self.copies:
            try:
                results.append(("ok", getattr(q, op)(*args)))
            except (Refused, KeyError) as e:
                results.append(("raised", type(e)))
        first = results[0]
        for other in results[1:]:
            assert _describe(other) == _describe(first)
        return first

    # -------------------------------------------------------------- rules

    @rule(priority=st.integers(0, 5), size=st.integers(0, 12), ttl=st.none() | st.integers(0, 100))
    def enqueue(self, priority, size, ttl):
        n = self.next_id
        self.next_id += 1
        ready_before = self.ready_order()
        count = len(ready_before) + 1
        total = sum(self.size[i] for i in ready_before) + size
        msgs = [message(n, size, priority) for _ in self.copies]  # each copy gets its own object
        results = [self._enqueue(q, m, ttl) for q, m in zip(self.copies, msgs, strict=True)]
        assert len({_describe(r) for r in results}) == 1
        kind, value = results[0]
        if self.limits["overflow"] != DROP_HEAD and self.over_limits(count, total):
            assert kind == "raised", "a full queue must refuse with reject-publish"
            return
        assert kind == "ok"
        entry, dropped = value
        assert entry.seq == self.next_seq and entry.message.id == n and not entry.redelivered
        self.next_seq += 1
        self.status[n], self.seq_of[n], self.size[n], self.count[n] = READY, entry.seq, size, 0
        self.level[n] = min(priority, self.limits["max_priority"])
        self.expires[n] = ttl
        if self.limits["overflow"] != DROP_HEAD:
            assert dropped == []
            return
        # drop-head: heads leave, in delivery order, until the queue is within its limits
        order = self.ready_order()
        expect = []
        while order and self.over_limits(len(order), sum(self.size[i] for i in order)):
            expect.append(order.pop(0))
        assert [e.message.id for e in dropped] == expect
        for i in expect:
            self.status[i] = "dropped"

    @staticmethod
    def _enqueue(q: QueueState, m: Message, ttl):
        try:
            return ("ok", q.enqueue(m, ttl))
        except Refused:
            return ("raised", Refused)

    @rule()
    def checkout(self):
        order = self.ready_order()
        kind, entry = self.apply("checkout")
        if not order:
            assert entry is None
            return
        n = order[0]
        assert entry.message.id == n and entry.seq == self.seq_of[n]
        self.count[n] += 1
        assert entry.delivery_count == self.count[n]  # basic.deliver's redelivered: count > 1
        self.status[n] = UNACKED

    @rule()
    def take(self):
        order = self.ready_order()
        kind, entry = self.apply("take")
        if not order:
            assert entry is None
            return
        assert entry.message.id == order[0]
        self.count[order[0]] += 1
        assert entry.delivery_count == self.count[order[0]]
        self.status[order[0]] = "taken"

    @precondition(lambda self: self.ids(UNACKED))
    @rule(data=st.data())
    def settle(self, data):
        n = data.draw(st.sampled_from(self.ids(UNACKED)))
        kind, entry = self.apply("settle", self.seq_of[n])
        assert entry.message.id == n
        self.status[n] = "settled"

    @precondition(lambda self: self.ids(UNACKED))
    @rule(data=st.data())
    def return_(self, data):
        n = data.draw(st.sampled_from(self.ids(UNACKED)))
        kind, entry = self.apply("return_", self.seq_of[n])
        assert entry.message.id == n and entry.redelivered
        self.status[n] = READY

    @precondition(lambda self: self.ids(UNACKED) or self.ids(READY))
    @rule(data=st.data())
    def discard(self, data):
        n = data.draw(st.sampled_from(self.ids(UNACKED) + self.ids(READY)))
        kind, entry = self.apply("discard", self.seq_of[n])
        assert entry.message.id == n
        self.status[n] = "discarded"

    @rule(seq=st.integers(-2, 3))
    def operations_on_unknown_seqs_change_nothing(self, seq):
        seq = self.next_seq + seq if seq >= 0 else seq  # never assigned, or not a sequence number
        before = [snapshot(q) for q in self.copies]
        for op in ("settle", "return_", "discard"):
            kind, value = self.apply(op, seq)
            assert kind == "raised" and issubclass(value, KeyError)  # NotCheckedOut for settle/return_
        assert [snapshot(q) for q in self.copies] == before

    @precondition(lambda self: self.ids(READY))
    @rule(data=st.data())
    def settle_of_a_ready_message_is_refused(self, data):
        n = data.draw(st.sampled_from(self.ids(READY)))
        before = [snapshot(q) for q in self.copies]
        assert self.apply("settle", self.seq_of[n]) == ("raised", NotCheckedOut)
        assert self.apply("return_", self.seq_of[n]) == ("raised", NotCheckedOut)
        assert [snapshot(q) for q in self.copies] == before

    @rule()
    def purge(self):
        order = self.ready_order()
        kind, removed = self.apply("purge")
        assert sorted(e.message.id for e in removed) == sorted(order)
        for n in order:
            self.status[n] = "purged"

    @rule(now_ms=st.integers(0, 120))
    def expire_head(self, now_ms):
        """The leader's decision made explicit: only an expired head is discarded."""
        order = self.ready_order()
        heads = [q.expired_head(now_ms) for q in self.copies]
        head_expired = bool(order) and self.expires[order[0]] is not None and self.expires[order[0]] <= now_ms
        if not head_expired:
            assert heads == [None] * len(self.copies)
            return
        assert [h.message.id for h in heads] == [order[0]] * len(self.copies)
        kind, entry = self.apply("discard", heads[0].seq)
        self.status[order[0]] = "discarded"

    # -------------------------------------------------------------- invariants

    @invariant()
    def every_message_is_in_exactly_one_place(self):
        assert len(self.status) == self.next_seq - 1  # accepted enqueues, each with one status
        assert set(self.status.values()) <= {READY, UNACKED, *GONE}
        for q in self.copies:
            ready_ids = [e.message.id for e in q.ready()]
            assert ready_ids == self.ready_order()  # delivery order: priority, then seq
            assert sorted(e.message.id for e in q.unacked.values()) == sorted(self.ids(UNACKED))
            assert all(q.unacked[s].seq == s for s in q.unacked)
            head = q.head()
            assert (head.message.id if head else None) == (ready_ids[0] if ready_ids else None)

    @invariant()
    def counts_and_bytes_match(self):
        ready, unacked = self.ids(READY), self.ids(UNACKED)
        for q in self.copies:
            assert len(q) == q.ready_count == len(ready)
            assert q.unacked_count == len(unacked)
            assert q.ready_bytes == sum(self.size[i] for i in ready)
            assert q.unacked_bytes == sum(self.size[i] for i in unacked)
            assert q.next_seq == self.next_seq

    @invariant()
    def the_state_checks_its_own_invariants(self):
        for q in self.copies:
            q.check_invariants()

    @invariant()
    def redelivered_is_set_exactly_on_returned_messages(self):
        for q in self.copies:
            for e in q.ready():
                assert e.delivery_count == self.count[e.message.id]
                assert e.redelivered == (self.count[e.message.id] > 0)

    @invariant()
    def never_delivered_messages_stay_within_the_limits(self):
        # a return may take a queue past its limits (as in RabbitMQ); a publish never does
        fresh = [i for i in self.ids(READY) if self.count[i] == 0]
        assert not self.over_limits(len(fresh), sum(self.size[i] for i in fresh))

    @invariant()
    def copies_are_identical(self):
        first = snapshot(self.copies[0]) if self.copies else None
        for q in self.copies[1:]:
            assert snapshot(q) == first


def _describe(result):
    kind, value = result
    if kind == "raised":
        return result
    if value is None:
        return ("ok", None)
    if isinstance(value, tuple):  # (entry, dropped) from enqueue
        entry, dropped = value
        return ("ok", entry.seq, entry.message.id, tuple((e.seq, e.message.id) for e in dropped))
    if isinstance(value, list):  # purge
        return ("ok", tuple((e.seq, e.message.id) for e in value))
    return ("ok", value.seq, value.message.id, value.delivery_count)


QueueMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
test_queue_state_machine = QueueMachine.TestCase


# ------------------------------------------------------------------ worked examples


def test_returned_message_comes_back_ahead_of_newer_ones_with_redelivered_set():
    q = QueueState()
    for n in range(1, 5):
        q.enqueue(message(n, 1))
    first, second = q.checkout(), q.checkout()
    q.enqueue(message(5, 1))
    q.return_(second.seq)
    q.return_(first.seq)
    assert [e.message.id for e in q.ready()] == [1, 2, 3, 4, 5]
    assert [e.redelivered for e in q.ready()] == [True, True, False, False, False]
    again = q.checkout()
    assert again.message.id == 1 and again.delivery_count == 2
    again = q.checkout()
    assert again.message.id == 2 and again.delivery_count == 2
    third = q.checkout()
    assert third.message.id == 3 and third.delivery_count == 1  # a first delivery


def test_priorities_deliver_highest_first_and_fifo_within_one():
    q = QueueState(QueueLimits(max_priority=5))
    for n, p in [(1, 0), (2, 5), (3, 1), (4, 5), (5, 9), (6, 0)]:
        q.enqueue(message(n, 1, p))
    # priority 9 is above x-max-priority: it counts as 5, after the earlier priority-5 ones
    assert [q.take().message.id for _ in range(6)] == [2, 4, 5, 3, 1, 6]
    assert q.take() is None


def test_drop_head_drops_the_oldest_and_reports_them():
    q = QueueState(QueueLimits(max_length=2))
    q.enqueue(message(1, 1))
    q.enqueue(message(2, 1))
    entry, dropped = q.enqueue(message(3, 1))
    assert [e.message.id for e in dropped] == [1]
    assert [e.message.id for e in q.ready()] == [2, 3] and entry.message.id == 3


def test_drop_head_with_priorities_drops_the_head_even_when_it_is_the_new_message():
    # RabbitMQ publishes, then drops from the head; the highest priority is the head
    q = QueueState(QueueLimits(max_length=1, max_priority=5))
    q.enqueue(message(1, 1, 0))
    entry, dropped = q.enqueue(message(2, 1, 5))
    assert [e.message.id for e in dropped] == [2]
    assert [e.message.id for e in q.ready()] == [1]


def test_max_length_bytes_drop_head_and_a_message_larger_than_the_limit():
    q = QueueState(QueueLimits(max_length_bytes=10))
    q.enqueue(message(1, 4))
    q.enqueue(message(2, 4))
    _e, dropped = q.enqueue(message(3, 4))
    assert [e.message.id for e in dropped] == [1] and q.ready_bytes == 8
    _e, dropped = q.enqueue(message(4, 11))
    assert [e.message.id for e in dropped] == [2, 3, 4] and q.ready_count == 0 and q.ready_bytes == 0


@pytest.mark.parametrize("overflow", [REJECT_PUBLISH, REJECT_PUBLISH_DLX])
def test_reject_publish_refuses_without_consuming_a_sequence_number(overflow):
    q = QueueState(QueueLimits(max_length=1, overflow=overflow))
    q.enqueue(message(1, 1))
    with pytest.raises(Refused):
        q.enqueue(message(2, 1))
    e = q.checkout()  # unacked messages do not count towards the length (RabbitMQ: ready messages)
    entry, dropped = q.enqueue(message(3, 1))
    assert entry.seq == e.seq + 1 and dropped == []


def test_purge_leaves_unacked_messages_alone():
    q = QueueState()
    for n in range(3):
        q.enqueue(message(n, 2))
    out = q.checkout()
    assert len(q.purge()) == 2
    assert q.ready_count == 0 and q.unacked_count == 1
    assert q.settle(out.seq) is out and q.unacked_bytes == 0


def test_only_the_head_expires():
    q = QueueState()
    q.enqueue(message(1, 1), expires_at_ms=100)
    q.enqueue(message(2, 1), expires_at_ms=10)
    assert q.expired_head(50) is None  # message 2 is past its time but not at the head
    assert q.expired_head(100).message.id == 1


def test_unknown_overflow_mode_is_refused():
    with pytest.raises(ValueError):
        QueueLimits(overflow="drop-tail")


def test_settling_or_returning_what_is_not_checked_out_says_so():
    q = QueueState()
    entry, _ = q.enqueue(Message("", "q", b"", b"", b"x", False, 0, None))
    with pytest.raises(NotCheckedOut):
        q.settle(entry.seq)  # ready, not checked out
    q.checkout()
    q.settle(entry.seq)
    with pytest.raises(NotCheckedOut):
        q.return_(entry.seq)  # settled already
    q.check_invariants()
