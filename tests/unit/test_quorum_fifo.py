"""The quorum queue's replicated state machine (hutch.quorum.fifo; ARCHITECTURE.md "Quorum
queues", seed 003 "Effects on Quorum Queues", research §2.2).

Each test applies commands as the Raft log would commit them and checks the effects the
leader would carry out. The expectations marked "3.10.8" were measured against RabbitMQ
3.10.8 (Debian's package): x-delivery-count on every delivery, delivery-limit N dead-letters
on the N+1th return, reject-publish as a soft limit with 80% hysteresis, round-robin order,
the argument refusals. The hypothesis test at the end applies random command sequences to a
state, to a copy that sees every command through the codec, and to a copy restored from a
mid-way snapshot: all give the same effects and the same snapshot bytes, and no accepted
message is ever lost or duplicated.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hutch.quorum.fifo import (
    AT_LEAST_ONCE,
    AT_MOST_ONCE,
    DELIVERIES_PER_APPLY_MAX,
    DELIVERY_LIMIT,
    EXPIRED,
    MAXLEN,
    MSG_IDS_PER_COMMAND_MAX,
    REJECTED,
    UNLIMITED_PREFETCH,
    Accepted,
    Cancel,
    Checkout,
    Configure,
    ConsumerActivated,
    ConsumerCancelled,
    DeadLetter,
    DeadLetterSettled,
    Delete,
    Deleted,
    Deliver,
    Discard,
    DispatchPending,
    Enqueue,
    Get,
    GetResult,
    NodeDown,
    NodeUp,
    PublisherGone,
    Purge,
    Purged,
    QueueExpired,
    QuorumArgumentError,
    QuorumConfig,
    QuorumQueueState,
    Rejected,
    Resend,
    Return,
    Settle,
    Tick,
    Touch,
    decode_command,
    encode_command,
    quorum_config,
)

PROPS = b"\x00\x00"


def enq(body: bytes | str, seq: int = 0, **kw) -> Enqueue:
    body = body.encode() if isinstance(body, str) else body
    return Enqueue("", "q", PROPS, body, publisher="n1/ch1" if seq else None, publisher_seq=seq, **kw)


def of(effects, kind):
    return [e for e in effects if isinstance(e, kind)]


def bodies(effects) -> list[bytes]:
    return [d.body for d in of(effects, Deliver)]


def queue(**cfg) -> QuorumQueueState:
    return QuorumQueueState(QuorumConfig(name="q", **cfg))


def fill(s: QuorumQueueState, n: int, start: int = 0, now_ms: int = 0) -> None:
    for i in range(start, start + n):
        s.apply(enq(f"m{i}", now_ms=now_ms))


# ---------------------------------------------------------------- publishing and confirms


def test_enqueue_is_confirmed_with_accepted_once_applied():
    s = queue()
    assert s.apply(enq("a", seq=1)) == [Accepted("n1/ch1", 1)]
    assert s.messages_ready == 1 and s.message_bytes == 1


def test_publish_without_confirms_has_no_confirm_effect():
    s = queue()
    assert s.apply(enq("a")) == []
    assert s.messages_ready == 1


def test_resent_publish_after_leader_change_is_confirmed_again_but_enqueued_once():
    s = queue()
    s.apply(enq("a", seq=1))
    s.apply(enq("b", seq=2))
    assert s.apply(enq("a", seq=1)) == [Accepted("n1/ch1", 1)]
    assert [e.message.body for e in s.ready_entries()] == [b"a", b"b"]


def test_resent_publish_that_was_refused_is_refused_again():
    s = queue(max_length=0, overflow="reject-publish")
    s.apply(enq("a", seq=1))  # accepted: the queue was not over its limit yet
    assert s.apply(enq("b", seq=2)) == [Rejected("n1/ch1", 2)]
    assert s.apply(enq("b", seq=2)) == [Rejected("n1/ch1", 2)]
    assert s.apply(enq("a", seq=1)) == [Accepted("n1/ch1", 1)]


def test_publishes_arriving_out_of_order_are_each_enqueued_once_and_none_is_taken_for_a_resend():
    """A publish can reach the leader before an earlier one (the earlier one was resent after a
    leader change, or went another way): every one is decided once, in whatever order."""
    s = queue()
    assert s.apply(enq("b", seq=2)) == [Accepted("n1/ch1", 2)]  # 1 is still on its way
    assert s.apply(enq("a", seq=1)) == [Accepted("n1/ch1", 1)]  # not a duplicate of anything
    assert s.apply(enq("b", seq=2)) == [Accepted("n1/ch1", 2)]  # a resend: answered, not enqueued again
    assert sorted(e.message.body for e in s.ready_entries()) == [b"a", b"b"]
    s2 = queue()
    outcomes = [s2.apply(enq(f"m{i}", seq=i)) for i in (1, 3, 2, 4, 5, 6)]
    assert all(o == [Accepted("n1/ch1", i)] for o, i in zip(outcomes, (1, 3, 2, 4, 5, 6), strict=True))
    assert s2.messages_ready == 6


def test_a_publish_too_far_past_a_gap_is_refused_and_decided_when_resent():
    s = queue()
    far = 1 + 1024 + 1  # beyond the window the queue remembers past a gap
    assert s.apply(enq("far", seq=far)) == [Rejected("n1/ch1", far)]
    for i in range(1, far):
        s.apply(enq(f"m{i}", seq=i))
    assert s.apply(enq("far", seq=far)) == [Accepted("n1/ch1", far)]
    assert s.messages_ready == far


def test_with_the_publishers_base_a_publish_past_a_gap_waits_for_the_missing_one():
    """A publish that reaches the leader ahead of an earlier one of its channel (the earlier
    one was sent before the leader was known, and sent again) is not decided: the channel's
    messages are enqueued in the order it published them."""
    s = queue()
    assert s.apply(Enqueue("", "q", b"", b"b", publisher="p", publisher_seq=2, publisher_base=1)) == []
    assert s.messages_ready == 0
    assert s.apply(Enqueue("", "q", b"", b"a", publisher="p", publisher_seq=1, publisher_base=1)) == \
        [Accepted("p", 1)]
    assert s.apply(Enqueue("", "q", b"", b"b", publisher="p", publisher_seq=2, publisher_base=1)) == \
        [Accepted("p", 2)]
    assert s.apply(Enqueue("", "q", b"", b"b", publisher="p", publisher_seq=2, publisher_base=1)) == \
        [Accepted("p", 2)]  # a resend of a decided one: answered, not enqueued again
    assert [e.message.body for e in s.ready_entries()] == [b"a", b"b"]


def test_a_publisher_unknown_to_the_queue_starts_at_its_base():
    """A publisher the queue forgot (or never saw) whose numbers below `base` are all answered:
    the next expected is `base`, not 1."""
    s = queue()
    assert s.apply(Enqueue("", "q", b"", b"x", publisher="p", publisher_seq=7, publisher_base=7)) == \
        [Accepted("p", 7)]
    assert s.apply(Enqueue("", "q", b"", b"z", publisher="p", publisher_seq=9, publisher_base=8)) == []
    assert s.apply(Enqueue("", "q", b"", b"y", publisher="p", publisher_seq=8, publisher_base=8)) == \
        [Accepted("p", 8)]
    # numbers below a later base were given up by the publisher: the queue moves past them
    assert s.apply(Enqueue("", "q", b"", b"w", publisher="p", publisher_seq=12, publisher_base=12)) == \
        [Accepted("p", 12)]
    assert [e.message.body for e in s.ready_entries()] == [b"x", b"y", b"w"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.permutations(list(range(1, 9))), st.lists(st.integers(1, 8), max_size=12))
def test_arrivals_in_any_order_with_resends_in_order_enqueue_in_publish_order(first, resends):
    """Whatever order the first sends arrive in, the publisher resending what is unanswered in
    number order leaves every message enqueued once, in publish order."""
    s = queue()
    answered: set[int] = set()

    def send(n: int) -> None:
        low = min([m for m in range(1, 9) if m not in answered] or [9])
        for e in s.apply(Enqueue("", "q", b"", b"m%d" % n, publisher="p", publisher_seq=n,
                                 publisher_base=min(low, n))):
            answered.add(e.publisher_seq)

    for n in first + resends:
        send(n)
    while len(answered) < 8:
        for n in range(1, 9):
            if n not in answered:
                send(n)
    assert [e.message.body for e in s.ready_entries()] == [b"m%d" % n for n in range(1, 9)]


def test_publisher_gone_forgets_its_sequence_numbers():
    s = queue()
    s.apply(enq("a", seq=5))
    s.apply(PublisherGone("n1/ch1"))
    s.apply(enq("b", seq=1))  # a new channel with the same name starts again from 1
    assert s.messages_ready == 2


# ---------------------------------------------------------------- dispatch


def test_checkout_delivers_ready_messages_in_fifo_order_with_x_delivery_count_zero():
    s = queue()
    fill(s, 3)
    eff = s.apply(Checkout("n1/c1", "t1"))
    assert bodies(eff) == [b"m0", b"m1", b"m2"]
    assert [(d.delivery_count, d.redelivered) for d in of(eff, Deliver)] == [(0, False)] * 3  # 3.10.8
    assert [d.msg_id for d in of(eff, Deliver)] == [1, 2, 3]
    assert s.messages_ready == 0 and s.messages_unacknowledged == 3


def test_consumers_of_equal_priority_are_served_round_robin_in_registration_order():
    s = queue()
    for c in ("a", "b", "c"):
        s.apply(Checkout(f"n1/{c}"))
    eff = []
    for i in range(6):
        eff += s.apply(enq(f"m{i}"))
    assert [d.consumer_id for d in of(eff, Deliver)] == ["n1/a", "n1/b", "n1/c"] * 2  # 3.10.8


def test_higher_priority_consumer_is_served_first_until_its_prefetch_is_full():
    s = queue()
    s.apply(Checkout("n1/low", prefetch=10, priority=0))
    s.apply(Checkout("n1/high", prefetch=2, priority=5))
    eff = []
    for i in range(4):
        eff += s.apply(enq(f"m{i}"))
    assert [d.consumer_id for d in of(eff, Deliver)] == ["n1/high", "n1/high", "n1/low", "n1/low"]


def test_prefetch_bounds_checked_out_messages_and_a_settle_frees_a_slot():
    s = queue()
    fill(s, 5)
    eff = s.apply(Checkout("n1/c1", prefetch=2))
    assert bodies(eff) == [b"m0", b"m1"]
    first = of(eff, Deliver)[0].msg_id
    assert bodies(s.apply(Settle("n1/c1", [first]))) == [b"m2"]
    assert s.messages_ready == 2 and s.messages_unacknowledged == 2


def test_a_consumer_alone_gets_its_ahead_beyond_its_prefetch_and_with_another_only_its_prefetch():
    s = queue()
    fill(s, 20)
    assert len(bodies(s.apply(Checkout("n1/busy", prefetch=1, ahead=4)))) == 5  # alone: 1 + 4 on their way
    eff = s.apply(Checkout("n2/idle", prefetch=1, ahead=4))
    assert len(bodies(eff)) == 1  # two consumers: each its prefetch, no ahead
    idle_id = of(eff, Deliver)[0].msg_id
    assert len(bodies(s.apply(Settle("n2/idle", [idle_id])))) == 1  # the busy one holds 5, gets no more
    snap = QuorumQueueState.restore(s.snapshot())
    assert snap.snapshot() == s.snapshot() and snap.consumers["n1/busy"].ahead == 4


def test_prefetch_zero_means_the_quorum_queue_limit_of_2000():
    s = queue()
    fill(s, UNLIMITED_PREFETCH + 5)
    eff = s.apply(Checkout("n1/c1", prefetch=0))
    assert len(of(eff, Deliver)) == UNLIMITED_PREFETCH
    assert s.messages_ready == 5


def test_no_ack_consumer_messages_leave_the_queue_at_delivery():
    s = queue()
    fill(s, 3)
    eff = s.apply(Checkout("n1/c1", no_ack=True))
    assert bodies(eff) == [b"m0", b"m1", b"m2"]
    assert s.messages == 0


def test_one_command_delivers_at_most_a_batch_then_asks_for_a_tick():
    s = queue()
    fill(s, DELIVERIES_PER_APPLY_MAX + 10)
    eff = s.apply(Checkout("n1/c1", no_ack=True))
    assert len(of(eff, Deliver)) == DELIVERIES_PER_APPLY_MAX and of(eff, DispatchPending)
    eff = s.apply(Tick(0))
    assert len(of(eff, Deliver)) == 10 and not of(eff, DispatchPending)


def test_settle_of_an_unknown_or_another_consumers_msg_id_is_ignored():
    s = queue()
    s.apply(Checkout("n1/a", prefetch=1))
    s.apply(Checkout("n1/b", prefetch=1))
    eff = s.apply(enq("x"))
    mid = of(eff, Deliver)[0].msg_id
    holder = of(eff, Deliver)[0].consumer_id
    other = "n1/b" if holder == "n1/a" else "n1/a"
    s.apply(Settle(other, [mid]))
    s.apply(Settle(holder, [mid + 100]))
    assert s.messages_unacknowledged == 1
    s.apply(Settle(holder, [mid]))
    assert s.messages == 0
    s.check_invariants()


# ---------------------------------------------------------------- returns, delivery count and delivery limit


def test_a_new_leader_can_send_again_every_delivery_still_checked_out_as_it_was_made():
    """The old leader may have stopped after a checkout was committed and before its delivery
    left: the new leader sends the checked-out messages again, with the same msg_ids (the
    consumer's node drops the ones it has) and the same delivery counts."""
    s = queue()
    fill(s, 4)
    first = of(s.apply(Checkout("n1/c1", "t1", prefetch=3)), Deliver)
    s.apply(Checkout("n2/c2", "t2", prefetch=5))
    s.apply(Settle("n1/c1", [first[0].msg_id]))  # settled: not sent again
    s.apply(Cancel("n2/c2", requeue=False, now_ms=0))  # a cancelled consumer gets nothing more
    [again] = s.resends()
    assert again.consumer_id == "n1/c1" and again.upto_msg_id == s.next_msg_id - 1  # the last delivery made
    assert [(d.consumer_id, d.msg_id, d.body, d.delivery_count, d.redelivered) for d in again.deliveries] == [
        (d.consumer_id, d.msg_id, d.body, d.delivery_count, d.redelivered) for d in first[1:]]


def test_a_consumers_deliveries_form_a_chain_and_resend_answers_past_the_last_one_it_had():
    """Each delivery names the one made to the same consumer before it (RabbitMQ's consecutive
    message ids per consumer): its node sees a gap, and Resend answers with what is checked out
    past the id it asks from. The chain survives a snapshot."""
    s = queue()
    fill(s, 4)
    a = of(s.apply(Checkout("n1/a", "ta", prefetch=2)), Deliver)
    b = of(s.apply(Checkout("n2/b", "tb", prefetch=2)), Deliver)
    assert [d.prev_msg_id for d in a] == [0, a[0].msg_id]
    assert [d.prev_msg_id for d in b] == [0, b[0].msg_id]
    fill(s, 1)  # both are full: it waits
    s = QuorumQueueState.restore(s.snapshot())
    [a3] = of(s.apply(Settle("n1/a", [a[0].msg_id])), Deliver)
    assert (a3.consumer_id, a3.prev_msg_id) == ("n1/a", a[1].msg_id)
    [answer] = s.apply(Resend("n1/a", a[0].msg_id))
    assert [d.msg_id for d in answer.deliveries] == [a[1].msg_id, a3.msg_id] and answer.upto_msg_id == a3.msg_id
    [answer] = s.apply(Resend("n2/b", 0))
    assert [d.msg_id for d in answer.deliveries] == [d.msg_id for d in b]
    s.apply(NodeDown("n2", 0))
    [answer] = s.apply(Resend("n2/b", 0))  # what it held came back to the queue: nothing is its own
    assert answer.deliveries == ()
    s.check_invariants()


def test_return_requeues_with_delivery_count_raised_and_redelivered_set():
    s = queue()
    s.apply(enq("a"))
    d1 = of(s.apply(Checkout("n1/c1", prefetch=1)), Deliver)[0]
    d2 = of(s.apply(Return("n1/c1", [d1.msg_id])), Deliver)[0]
    assert (d2.body, d2.delivery_count, d2.redelivered) == (b"a", 1, True)  # 3.10.8: x-delivery-count 1
    assert d2.msg_id != d1.msg_id and d2.seq == d1.seq


def test_returned_message_goes_back_ahead_of_newer_ones():
    s = queue()
    fill(s, 3)
    d = of(s.apply(Get("n1/get", no_ack=False)), GetResult)[0].message
    s.apply(Return("n1/get", [d.msg_id]))
    assert [e.message.body for e in s.ready_entries()] == [b"m0", b"m1", b"m2"]


def test_delivery_limit_dead_letters_a_message_on_the_return_after_the_limit():
    s = queue(delivery_limit=2, dead_letter_exchange="dlx")
    s.apply(enq("poison"))
    d = of(s.apply(Checkout("n1/c1", prefetch=1)), Deliver)[0]
    counts = [d.delivery_count]
    for _ in range(2):
        d = of(s.apply(Return("n1/c1", [d.msg_id])), Deliver)[0]
        counts.append(d.delivery_count)
    assert counts == [0, 1, 2]  # delivered limit + 1 times (3.10.8)
    eff = s.apply(Return("n1/c1", [d.msg_id]))
    assert not of(eff, Deliver)
    (dl,) = of(eff, DeadLetter)
    assert (dl.reason, dl.exchange, dl.strategy) == (DELIVERY_LIMIT, "dlx", AT_MOST_ONCE)
    assert [m.body for m in dl.messages] == [b"poison"]
    assert s.messages == 0


@pytest.mark.parametrize("limit", [0, -1])
def test_delivery_limit_zero_or_negative_drops_on_the_first_return(limit):
    s = queue(delivery_limit=limit)  # 3.10.8: both deliver once, then the message is gone
    s.apply(enq("a"))
    d = of(s.apply(Get("n1/get")), GetResult)[0].message
    eff = s.apply(Return("n1/get", [d.msg_id]))
    (dl,) = of(eff, DeadLetter)
    assert dl.reason == DELIVERY_LIMIT and dl.exchange is None  # no DLX: dropped
    assert s.messages == 0


# ---------------------------------------------------------------- dead-lettering


def test_discard_dead_letters_with_reason_rejected_to_the_configured_exchange_and_key():
    s = queue(dead_letter_exchange="dlx", dead_letter_routing_key="dead")
    s.apply(enq("a", now_ms=7))
    d = of(s.apply(Checkout("n1/c1")), Deliver)[0]
    (dl,) = of(s.apply(Discard("n1/c1", [d.msg_id])), DeadLetter)
    assert (dl.reason, dl.exchange, dl.routing_key, dl.time_ms) == (REJECTED, "dlx", "dead", 7)
    assert (dl.messages[0].exchange, dl.messages[0].routing_key) == ("", "q")  # for x-death
    assert s.messages == 0


def test_at_most_once_dead_letters_have_left_the_queue_when_the_effect_is_emitted():
    s = queue(dead_letter_exchange="dlx", dead_letter_strategy=AT_MOST_ONCE)
    s.apply(enq("a"))
    d = of(s.apply(Get("n1/get")), GetResult)[0].message
    s.apply(Discard("n1/get", [d.msg_id]))
    assert s.dead_letters_pending() is None and s.figures()["messages_dlx"] == 0


def test_at_least_once_dead_letters_stay_owed_until_settled_and_count_toward_the_limit():
    cfg, warnings = quorum_config({"x-dead-letter-exchange": "dlx", "x-dead-letter-strategy": "at-least-once",
                                   "x-overflow": "reject-publish", "x-max-length": 2}, "q", "/")
    assert cfg.dead_letter_strategy == AT_LEAST_ONCE and not warnings
    s = QuorumQueueState(cfg)
    s.apply(enq("a", seq=1))
    s.apply(enq("b", seq=2))
    s.apply(enq("c", seq=3))  # over the limit now: further publishes are refused
    ds = of(s.apply(Checkout("n1/c1", prefetch=3)), Deliver)
    (dl,) = of(s.apply(Discard("n1/c1", [d.msg_id for d in ds])), DeadLetter)
    assert dl.strategy == AT_LEAST_ONCE and len(dl.messages) == 3
    assert s.messages == 0 and s.figures()["messages_dlx"] == 3
    assert s.apply(enq("d", seq=4)) == [Rejected("n1/ch1", 4)]  # owed dead letters keep the queue full
    pending = s.dead_letters_pending()  # what a new leader republishes
    assert [m.body for m in pending.messages] == [b"a", b"b", b"c"]
    s.apply(DeadLetterSettled([m.seq for m in pending.messages]))
    assert s.dead_letters_pending() is None
    assert of(s.apply(enq("e", seq=5)), Accepted) == [Accepted("n1/ch1", 5)]


def test_at_least_once_without_reject_publish_falls_back_to_at_most_once_with_rabbitmqs_warning():
    cfg, warnings = quorum_config({"x-dead-letter-exchange": "dlx", "x-dead-letter-strategy": "at-least-once"},
                                  "q", "/")
    assert cfg.dead_letter_strategy == AT_MOST_ONCE
    assert warnings == ["Falling back to dead-letter-strategy at-most-once for queue 'q' in vhost '/' because "
                        "configured dead-letter-strategy at-least-once is incompatible with effective overflow "
                        "strategy drop-head. To enable dead-letter-strategy at-least-once, set overflow strategy "
                        "to reject-publish."]


# ---------------------------------------------------------------- overflow


def test_drop_head_overflow_dead_letters_the_oldest_with_reason_maxlen():
    s = queue(max_length=2, dead_letter_exchange="dlx")
    s.apply(enq("a", seq=1))
    s.apply(enq("b", seq=2))
    eff = s.apply(enq("c", seq=3))
    assert of(eff, Accepted) == [Accepted("n1/ch1", 3)]
    (dl,) = of(eff, DeadLetter)
    assert dl.reason == MAXLEN and [m.body for m in dl.messages] == [b"a"]
    assert [e.message.body for e in s.ready_entries()] == [b"b", b"c"]


def test_drop_head_by_bytes():
    s = queue(max_length_bytes=5)
    s.apply(enq("abc"))
    (dl,) = of(s.apply(enq("def")), DeadLetter)
    assert [m.body for m in dl.messages] == [b"abc"] and s.message_bytes == 3


def test_reject_publish_is_a_soft_limit_that_reopens_at_80_percent():
    # 3.10.8, x-max-length 10: eleven publishes confirmed, the twelfth nacked; publishes stay
    # refused at 10 and 9 messages and are confirmed again from 8.
    s = queue(max_length=10, overflow="reject-publish")
    confirms = [type(s.apply(enq(f"x{i}", seq=i + 1))[0]) for i in range(12)]
    assert confirms == [Accepted] * 11 + [Rejected]
    seq = 12
    outcomes = []
    for _ in range(3):
        s.apply(Get("n1/get", no_ack=True))
        seq += 1
        outcomes.append((s.messages_ready, type(s.apply(enq("y", seq=seq))[0])))
        if outcomes[-1][1] is Accepted:
            break
    assert outcomes == [(10, Rejected), (9, Rejected), (8, Accepted)]


def test_reject_publish_by_bytes():
    s = queue(max_length_bytes=4, overflow="reject-publish")
    assert of(s.apply(enq("abcde", seq=1)), Accepted)  # the queue was under the limit
    assert of(s.apply(enq("f", seq=2)), Rejected)


def test_configure_lowering_max_length_drops_heads_at_once():
    s = queue()
    fill(s, 5)
    eff = s.apply(Configure(QuorumConfig(max_length=2)))
    (dl,) = of(eff, DeadLetter)
    assert [m.body for m in dl.messages] == [b"m0", b"m1", b"m2"] and dl.reason == MAXLEN
    assert s.config.name == "q"


# ---------------------------------------------------------------- TTL


def test_message_ttl_expires_the_head_on_tick():
    s = queue(message_ttl_ms=100, dead_letter_exchange="dlx")
    s.apply(enq("a", now_ms=1000))
    s.apply(enq("b", now_ms=1050))
    assert s.apply(Tick(1099)) == []
    (dl,) = of(s.apply(Tick(1100)), DeadLetter)
    assert (dl.reason, [m.body for m in dl.messages], dl.time_ms) == (EXPIRED, [b"a"], 1100)
    assert [m.body for m in of(s.apply(Tick(1200)), DeadLetter)[0].messages] == [b"b"]


def test_per_message_expiration_and_queue_ttl_take_the_smaller():
    s = queue(message_ttl_ms=100)
    s.apply(enq("a", expiration_ms=10, now_ms=0))
    assert of(s.apply(Tick(10)), DeadLetter)


def test_only_the_head_expires_a_later_message_waits_behind_a_live_head():
    s = queue()
    s.apply(enq("long", expiration_ms=1000, now_ms=0))
    s.apply(enq("short", expiration_ms=10, now_ms=0))
    assert s.apply(Tick(500)) == [] and s.messages_ready == 2


def test_an_expired_message_is_not_delivered_to_a_new_consumer():
    s = queue(message_ttl_ms=50)
    s.apply(enq("old", now_ms=0))
    s.apply(enq("new", now_ms=40))
    eff = s.apply(Checkout("n1/c1", now_ms=60))
    assert bodies(eff) == [b"new"] and of(eff, DeadLetter)[0].messages[0].body == b"old"


def test_times_kept_from_boot_clocks_are_moved_when_epoch_time_arrives_so_nothing_runs_out():
    """An upgrade: the state was built by nodes counting from their host's boot (older hutch);
    the first command from a node counting from the epoch moves every time by the same amount."""
    s = queue(message_ttl_ms=60_000, expires_ms=120_000)
    s.apply(enq("a", now_ms=5_000))  # expires at 65 s of that clock
    s.apply(enq("b", now_ms=35_000))  # 95 s
    epoch = 1_800_000_000_000
    assert s.apply(Tick(epoch)) == [] and s.messages_ready == 2  # 35 s in: nothing expired, queue in use
    assert s.apply(Tick(epoch + 29_999)) == []
    (dl,) = of(s.apply(Tick(epoch + 30_000)), DeadLetter)  # "a" had 30 s left
    assert [m.body for m in dl.messages] == [b"a"] and s.messages_ready == 1
    # unused since its first command at 5 s (publishes do not count): 120 s from then
    assert QueueExpired() not in s.apply(Tick(epoch + 89_999))
    assert QueueExpired() in s.apply(Tick(epoch + 90_000))


def test_a_clock_already_counting_from_the_epoch_is_never_moved():
    s = queue(message_ttl_ms=1000)
    s.apply(enq("a", now_ms=1_800_000_000_000))
    assert of(s.apply(Tick(1_800_000_001_000)), DeadLetter)


def test_get_does_not_return_an_expired_message():
    s = queue(message_ttl_ms=50)
    s.apply(enq("old", now_ms=0))
    (r,) = of(s.apply(Get("n1/get", now_ms=100)), GetResult)
    assert r.message is None


def test_time_never_goes_back_a_late_command_with_an_old_clock_uses_the_newest_time():
    s = queue(message_ttl_ms=50)
    s.apply(enq("a", now_ms=0))
    s.apply(Tick(10))
    s.apply(enq("b", now_ms=5))  # proposed earlier, committed later: expires from 10, not 5
    assert s.ready_entries()[1].expires_at_ms == 60


# ---------------------------------------------------------------- single active consumer


def test_single_active_consumer_gets_everything_and_the_next_takes_over_on_cancel():
    s = queue(single_active=True)
    assert s.apply(Checkout("n1/a")) == [ConsumerActivated("n1/a")]
    assert s.apply(Checkout("n2/b")) == []
    eff = []
    for i in range(4):
        eff += s.apply(enq(f"m{i}"))
    assert {d.consumer_id for d in of(eff, Deliver)} == {"n1/a"}
    s.apply(enq("later"))
    eff = s.apply(Cancel("n1/a"))
    assert of(eff, ConsumerActivated) == [ConsumerActivated("n2/b")]
    assert s.single_active_consumer() == "n2/b"
    assert s.messages_unacknowledged == 5  # a's unacked stay with a until it settles them


def test_single_active_consumer_hands_over_when_its_node_goes_down_and_it_waits_when_back():
    s = queue(single_active=True)
    s.apply(Checkout("n1/a"))
    s.apply(Checkout("n2/b"))
    s.apply(enq("x"))
    eff = s.apply(NodeDown("n1"))
    assert of(eff, ConsumerActivated) == [ConsumerActivated("n2/b")]
    (d,) = of(eff, Deliver)
    assert (d.consumer_id, d.body, d.redelivered) == ("n2/b", b"x", True)
    s.apply(NodeUp("n1"))
    assert s.single_active_consumer() == "n2/b"
    s.apply(Cancel("n2/b"))
    assert s.single_active_consumer() == "n1/a"


# ---------------------------------------------------------------- node down / up, cancel


def test_node_down_returns_checked_out_messages_which_are_redelivered_to_others():
    s = queue()
    s.apply(Checkout("n1/c1", prefetch=2))
    fill(s, 2)
    s.apply(Checkout("n2/c1", prefetch=5))
    eff = s.apply(NodeDown("n1"))
    ds = of(eff, Deliver)
    assert [(d.consumer_id, d.body, d.redelivered, d.delivery_count) for d in ds] == [
        ("n2/c1", b"m0", True, 1), ("n2/c1", b"m1", True, 1)]
    assert s.consumer_count == 2  # the suspended consumer is still registered


def test_node_down_does_not_touch_consumers_of_a_node_with_a_longer_name():
    s = queue()
    s.apply(Checkout("n10/c1"))
    s.apply(enq("a"))
    s.apply(NodeDown("n1"))
    assert s.messages_unacknowledged == 1


def test_node_up_reactivates_suspended_consumers():
    s = queue()
    s.apply(Checkout("n1/c1"))
    s.apply(NodeDown("n1"))
    assert s.apply(enq("a")) == [] and s.messages_ready == 1
    assert bodies(s.apply(NodeUp("n1"))) == [b"a"]


def test_cancel_keeps_unacked_messages_with_the_consumer_until_settled():
    s = queue()
    s.apply(Checkout("n1/c1"))
    d = of(s.apply(enq("a")), Deliver)[0]
    s.apply(Cancel("n1/c1"))
    assert s.consumer_count == 0 and s.messages_unacknowledged == 1
    assert s.apply(enq("b")) == [] and s.messages_ready == 1
    s.apply(Settle("n1/c1", [d.msg_id]))
    assert s.messages == 1 and "n1/c1" not in s.consumers


def test_cancel_with_requeue_returns_its_messages_as_when_a_channel_closes():
    s = queue()
    s.apply(Checkout("n1/c1"))
    s.apply(enq("a"))
    s.apply(Cancel("n1/c1", requeue=True))
    (e,) = s.ready_entries()
    assert e.redelivered and s.messages_unacknowledged == 0
    # 3.10.8: the next delivery carries x-delivery-count 1 and redelivered
    d = of(s.apply(Get("n2/get", no_ack=True)), GetResult)[0].message
    assert (d.delivery_count, d.redelivered) == (1, True)


def test_a_resent_checkout_is_applied_once():
    s = queue()
    s.apply(Checkout("n1/c1", prefetch=1))
    s.apply(Checkout("n1/c1", prefetch=1))
    fill(s, 2)
    assert s.consumer_count == 1 and s.messages_unacknowledged == 1


def test_consumers_beyond_the_limit_are_cancelled(monkeypatch):
    import hutch.quorum.fifo as fifo
    monkeypatch.setattr(fifo, "CONSUMERS_MAX", 2)
    s = queue()
    s.apply(Checkout("n1/a"))
    s.apply(Checkout("n1/b"))
    assert s.apply(Checkout("n1/c")) == [ConsumerCancelled("n1/c", "consumers_max")]


# ---------------------------------------------------------------- basic.get, purge, delete, x-expires


def test_get_returns_the_head_and_the_count_still_ready():
    s = queue()
    fill(s, 3)
    (r,) = of(s.apply(Get("n1/get")), GetResult)
    assert (r.message.body, r.message_count) == (b"m0", 2)  # 3.10.8: message-count after the take
    assert s.messages_unacknowledged == 1
    s.apply(Settle("n1/get", [r.message.msg_id]))
    assert s.messages == 2 and "n1/get" not in s.consumers


def test_get_no_ack_takes_the_message_and_get_on_empty_is_empty():
    s = queue()
    s.apply(enq("a"))
    (r,) = of(s.apply(Get("n1/get", no_ack=True)), GetResult)
    assert r.message.body == b"a" and s.messages == 0
    assert s.apply(Get("n1/get", no_ack=True)) == [GetResult("n1/get", None, 0)]


def test_node_down_returns_messages_held_by_basic_get():
    s = queue()
    s.apply(enq("a"))
    s.apply(Get("n1/ch2/get"))
    s.apply(NodeDown("n1"))
    assert s.messages_ready == 1 and s.ready_entries()[0].redelivered


def test_purge_removes_ready_messages_only():
    s = queue()
    s.apply(Checkout("n1/c1", prefetch=1))
    fill(s, 3)
    assert s.apply(Purge()) == [Purged(2)]
    assert s.messages_ready == 0 and s.messages_unacknowledged == 1


def test_delete_cancels_consumers_and_refuses_later_publishes():
    s = queue()
    s.apply(Checkout("n1/c1", prefetch=1))
    fill(s, 3)
    eff = s.apply(Delete())
    assert eff == [ConsumerCancelled("n1/c1", "deleted"), Deleted(2)]
    assert s.apply(enq("z", seq=9)) == [Rejected("n1/ch1", 9)]
    assert s.messages == 0


def test_x_expires_reports_a_queue_unused_that_long_once():
    s = queue(expires_ms=1000)
    s.apply(Tick(0))
    s.apply(Checkout("n1/c1"))
    assert s.apply(Tick(5000)) == []  # a consumer: in use
    s.apply(Cancel("n1/c1", now_ms=5000))
    s.apply(Touch(5500))  # redeclared
    assert s.apply(Tick(6499)) == []
    assert s.apply(Tick(6500)) == [QueueExpired()]
    assert s.apply(Tick(9000)) == []


# ---------------------------------------------------------------- declare arguments (3.10.8 texts)


@pytest.mark.parametrize("key", ["x-max-priority", "x-queue-mode", "x-queue-master-locator", "x-queue-version",
                                 "x-max-age", "x-initial-cluster-size"])
def test_arguments_of_other_queue_types_are_refused(key):
    with pytest.raises(QuorumArgumentError) as err:
        quorum_config({key: 1}, "q0", "/")
    assert err.value.text == f"invalid arg '{key}' for queue 'q0' in vhost '/' of queue type rabbit_quorum_queue"


@pytest.mark.parametrize("props,prop", [({"durable": False}, "non-durable"), ({"exclusive": True}, "exclusive-owner"),
                                        ({"auto_delete": True}, "auto-delete")])
def test_non_durable_exclusive_and_auto_delete_quorum_queues_are_refused(props, prop):
    with pytest.raises(QuorumArgumentError) as err:
        quorum_config({}, "qz", "/", **props)
    assert err.value.text == f"invalid property '{prop}' for queue 'qz' in vhost '/'"


def test_unknown_dead_letter_strategy_is_refused():
    with pytest.raises(QuorumArgumentError) as err:
        quorum_config({"x-dead-letter-strategy": "bogus"}, "q4", "/")
    assert err.value.text == "invalid arg 'x-dead-letter-strategy' for queue 'q4' in vhost '/': invalid_dlx_strategy"


def test_reject_publish_dlx_is_accepted_with_a_warning_and_acts_as_drop_head():
    # 3.10.8 accepts the declare and logs this line; the queue then drops heads.
    cfg, warnings = quorum_config({"x-overflow": "reject-publish-dlx", "x-max-length": 1}, "al", "/")
    assert cfg.overflow == "drop-head"
    assert warnings == ["Invalid overflow strategy <<\"reject-publish-dlx\">> for quorum queue: queue 'al' in vhost '/'"]


def test_quorum_config_reads_the_supported_arguments():
    cfg, _ = quorum_config({"x-max-length": 5, "x-max-length-bytes": 100, "x-overflow": b"reject-publish",
                            "x-delivery-limit": 3, "x-dead-letter-exchange": "dlx",
                            "x-dead-letter-routing-key": "k", "x-message-ttl": 60000,
                            "x-single-active-consumer": True, "x-expires": 1000, "x-unknown": 1}, "q", "v")
    assert cfg == QuorumConfig("q", "v", 5, 100, "reject-publish", 3, "dlx", "k", AT_MOST_ONCE, 60000, True, 1000)
    assert quorum_config({"x-delivery-limit": "x"}, "q", "/")[0].delivery_limit is None  # 3.10.8: ignored


# ---------------------------------------------------------------- codec and snapshots


ALL_COMMANDS = [enq("a", seq=3, expiration_ms=5, now_ms=9), Checkout("n/c", "t", 10, 2, True, 4),
                Cancel("n/c", True, 1), Settle("n/c", [1, 2]), Return("n/c", [3]), Discard("n/c", [4]),
                NodeDown("n", 1), NodeUp("n", 2), Purge(3), Tick(4), Get("n/g", True, 5),
                Configure(QuorumConfig(max_length=3)), DeadLetterSettled([1]), PublisherGone("p"), Touch(6),
                Delete(7)]


@pytest.mark.parametrize("cmd", ALL_COMMANDS, ids=lambda c: type(c).__name__)
def test_every_command_survives_the_codec(cmd):
    assert decode_command(encode_command(cmd)) == cmd


def test_a_command_with_too_many_ids_is_refused_at_encoding():
    with pytest.raises(ValueError):
        encode_command(Settle("n/c", list(range(MSG_IDS_PER_COMMAND_MAX + 1))))


def test_snapshot_round_trips_to_the_same_bytes_and_the_same_behaviour():
    s = queue(max_length=10, delivery_limit=3, dead_letter_exchange="dlx", message_ttl_ms=1000)
    s.apply(Checkout("n1/a", prefetch=2))
    s.apply(Checkout("n2/b", prefetch=1, priority=3))
    fill(s, 6, now_ms=5)
    d = of(s.apply(Get("n1/g")), GetResult)[0].message
    s.apply(Return("n1/g", [d.msg_id]))
    s.apply(NodeDown("n2"))
    r = QuorumQueueState.restore(s.snapshot())
    assert r.snapshot() == s.snapshot()
    for cmd in [NodeUp("n2"), Cancel("n1/a", requeue=True), enq("z", now_ms=20), Tick(2000)]:
        assert r.apply(cmd) == s.apply(cmd)
    assert r.snapshot() == s.snapshot()


def test_states_reached_by_different_histories_have_the_same_snapshot_when_equal():
    a, b = queue(), queue()
    a.apply(enq("x", now_ms=1))
    b.apply(enq("x", now_ms=1))
    b.apply(Checkout("n1/c", now_ms=1))
    b.apply(Cancel("n1/c", requeue=True, now_ms=1))  # x comes back with its count raised ...
    a.apply(Get("n1/c", now_ms=1))
    a.apply(Return("n1/c", [1]))  # ... as here; both used msg id 1
    assert a.snapshot() == b.snapshot()


# ---------------------------------------------------------------- property: determinism and conservation


NODES = ("n1", "n2")
CONSUMER_IDS = ("n1/a", "n1/b", "n2/a", "n2/b")
GETTERS = ("n1/get", "n2/get")


@st.composite
def configs(draw):
    args = {}
    if draw(st.booleans()):
        args["x-max-length"] = draw(st.sampled_from([0, 2, 5]))
    if draw(st.booleans()):
        args["x-max-length-bytes"] = draw(st.sampled_from([4, 20]))
    args["x-overflow"] = draw(st.sampled_from(["drop-head", "reject-publish"]))
    if draw(st.booleans()):
        args["x-delivery-limit"] = draw(st.sampled_from([0, 1, 3]))
    if draw(st.booleans()):
        args["x-dead-letter-exchange"] = "dlx"
        args["x-dead-letter-strategy"] = draw(st.sampled_from([AT_MOST_ONCE, AT_LEAST_ONCE]))
    if draw(st.booleans()):
        args["x-message-ttl"] = draw(st.sampled_from([0, 30, 200]))
    args["x-single-active-consumer"] = draw(st.booleans())
    if draw(st.booleans()):
        args["x-expires"] = 300
    return quorum_config(args, "q", "/")[0]


def draw_command(data, s: QuorumQueueState, now_ms: int, pub: list):
    kind = data.draw(st.sampled_from(["enq"] * 6 + ["checkout", "cancel", "settle", "settle", "return", "discard",
                                                     "down", "up", "tick", "tick", "get", "get", "purge",
                                                     "configure", "dlx", "gone", "delete"]))
    held = s.checked_out()
    if kind == "enq":
        name, sent = pub  # a resend repeats one of this publisher's earlier publishes exactly
        if sent and data.draw(st.integers(0, 9)) == 0:
            seq = data.draw(st.integers(1, sent))
        else:
            seq = pub[1] = sent + 1
        return Enqueue("", "q", PROPS, f"{name}:{seq}".encode() + b"." * (seq % 7), publisher=name,
                       publisher_seq=seq, expiration_ms=(None, None, 0, 40)[seq % 4], now_ms=now_ms)
    if kind == "checkout":
        return Checkout(data.draw(st.sampled_from(CONSUMER_IDS)), prefetch=data.draw(st.sampled_from([0, 1, 2])),
                        priority=data.draw(st.sampled_from([0, 1])), no_ack=data.draw(st.integers(0, 4)) == 0,
                        now_ms=now_ms)
    if kind == "cancel":
        return Cancel(data.draw(st.sampled_from(CONSUMER_IDS + GETTERS)), data.draw(st.booleans()), now_ms)
    if kind in ("settle", "return", "discard"):
        if held and data.draw(st.booleans()):
            cid = data.draw(st.sampled_from(sorted({h[0] for h in held})))
            mine = [m for c, m, _e in held if c == cid]
            ids = data.draw(st.lists(st.sampled_from(mine), max_size=3, unique=True))
        else:
            cid, ids = data.draw(st.sampled_from(CONSUMER_IDS)), [data.draw(st.integers(0, 50))]
        return {"settle": Settle, "return": Return, "discard": Discard}[kind](cid, ids)
    if kind == "down":
        return NodeDown(data.draw(st.sampled_from(NODES)), now_ms)
    if kind == "up":
        return NodeUp(data.draw(st.sampled_from(NODES)), now_ms)
    if kind == "tick":
        return Tick(now_ms)
    if kind == "get":
        return Get(data.draw(st.sampled_from(GETTERS + CONSUMER_IDS[:1])), data.draw(st.booleans()), now_ms)
    if kind == "purge":
        return Purge(now_ms)
    if kind == "configure":
        return Configure(data.draw(configs()))
    if kind == "dlx":
        pending = s.dead_letters_pending()
        seqs = [m.seq for m in pending.messages] if pending else []
        return DeadLetterSettled(data.draw(st.lists(st.sampled_from(seqs), max_size=3, unique=True)) if seqs else [])
    if kind == "gone":
        return PublisherGone(pub[0])
    if data.draw(st.integers(0, 3)) == 0:
        return Delete(now_ms)
    return Tick(now_ms)


class Ledger:
    """Where every accepted message is, checked against the state after each command."""

    def __init__(self):
        self.accepted: set[bytes] = set()
        self.rejected: set[bytes] = set()
        self.gone: Counter[bytes] = Counter()
        self.body_of_seq: dict[int, bytes] = {}

    def before(self, s: QuorumQueueState, cmd) -> list[bytes]:
        """Messages this command will take out of the queue for good, known from the state."""
        if isinstance(cmd, Settle):
            ids = set(cmd.msg_ids)
            return [e.message.body for c, m, e in s.checked_out() if c == cmd.consumer_id and m in ids]
        if isinstance(cmd, Purge):
            return [e.message.body for e in s.ready_entries()]
        if isinstance(cmd, DeadLetterSettled):
            pending = s.dead_letters_pending()
            seqs = set(cmd.seqs)
            return [m.body for m in pending.messages if m.seq in seqs] if pending else []
        if isinstance(cmd, Delete) and not s.deleted:
            pending = s.dead_letters_pending()
            return ([e.message.body for e in s.ready_entries()] + [e.message.body for _c, _m, e in s.checked_out()]
                    + ([m.body for m in pending.messages] if pending else []))
        return []

    def after(self, s: QuorumQueueState, cmd, effects, leaving: list[bytes]) -> None:
        self.gone.update(leaving)
        held_ids = {m for _c, m, _e in s.checked_out()}
        for e in effects:
            if isinstance(e, Accepted):
                assert cmd.body not in self.rejected, "a publish both refused and confirmed"
                self.accepted.add(cmd.body)
            elif isinstance(e, Rejected):
                assert cmd.body not in self.accepted, "a publish both confirmed and refused"
                self.rejected.add(cmd.body)
            elif isinstance(e, Deliver):
                if e.msg_id not in held_ids:
                    self.gone[e.body] += 1  # a no-ack delivery: consumed
            elif isinstance(e, GetResult):
                if e.message is not None and e.message.msg_id not in held_ids:
                    self.gone[e.message.body] += 1
            elif isinstance(e, DeadLetter) and e.strategy == AT_MOST_ONCE:
                self.gone.update(m.body for m in e.messages)
        present = Counter(e.message.body for e in s.ready_entries())
        present.update(e.message.body for _c, _m, e in s.checked_out())
        pending = s.dead_letters_pending()
        if pending:
            present.update(m.body for m in pending.messages)
        total = present + self.gone
        assert set(total) == self.accepted, "a message appeared from nowhere or was lost"
        assert all(n == 1 for n in total.values()), f"a message is in two places: {total.most_common(2)}"
        assert not (set(present) & self.rejected)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), config=configs(), steps=st.integers(5, 60))
def test_random_histories_are_deterministic_restorable_and_lose_or_duplicate_nothing(data, config, steps):
    a = QuorumQueueState(config)
    via_codec = QuorumQueueState(config)
    restored: QuorumQueueState | None = None
    cut = data.draw(st.integers(0, steps))
    ledger = Ledger()
    pub = ["n1/p0", 0]  # the publisher and how many it has sent
    now_ms = 0
    for step in range(1, steps + 1):
        if step == cut:
            restored = QuorumQueueState.restore(a.snapshot())
        now_ms += data.draw(st.sampled_from([0, 1, 10, 50]))
        cmd = draw_command(data, a, now_ms, pub)
        if isinstance(cmd, PublisherGone):  # the channel is gone: the next publisher is a new one
            pub = [f"n1/p{step}", 0]
        leaving = ledger.before(a, cmd)
        effects = a.apply(cmd)
        a.check_invariants()
        assert via_codec.apply_bytes(encode_command(cmd)) == effects
        if restored is not None:
            assert restored.apply(cmd) == effects
        ledger.after(a, cmd, effects, leaving)
    snap = a.snapshot()
    assert via_codec.snapshot() == snap
    if restored is not None:
        assert restored.snapshot() == snap
    assert QuorumQueueState.restore(snap).snapshot() == snap
