"""Disk-first classic queues (hutch.queues.paging): the window, the paged tail and the read-back.

The queue here is a real `ClassicQueue` whose body store is a dict (what the broker does on
its journal and scratch log); consumers are recorders. The rules checked: past the window new
messages are paged and only their location stays; once the tail has started every later
message is paged (order); bodies come back in order, a batch at a time, when the in-memory part
falls below the low mark; counts include the paged messages; a lazy queue holds no more than a
read-ahead batch; an unreadable body is dropped, never delivered; expiry, purge, requeue and the
delivery count of a recovered message behave as without paging.
"""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.queues.classic import ClassicQueue
from hutch.queues.message import Message
from hutch.queues.paging import SCRATCH, PagedTail, PagingPolicy, is_scratch
from hutch.queues.state import QueueLimits


class DictStore:
    """The BodyStore protocol on a dict: location -> message; `bad` locations fail to read."""

    def __init__(self):
        self.bodies: dict[int, Message] = {}
        self.next = 1
        self.reads: list[int] = []
        self.dropped: list[int] = []
        self.bad: set[int] = set()
        self.lost: list[tuple[str, int, int]] = []

    def put(self, msg: Message) -> int:
        loc = SCRATCH + self.next
        self.next += 1
        self.bodies[loc] = msg
        return loc

    def read_paged(self, q, seq, loc):
        self.reads.append(loc)
        msg = self.bodies.pop(loc)
        if loc in self.bad:
            self.lost.append((q.name, seq, loc))
            return None
        return msg

    def read_paged_batch(self, q, items):
        return [self.read_paged(q, seq, loc) for seq, loc in items]

    def drop_paged(self, q, locs):
        for loc in locs:
            self.bodies.pop(loc)
        self.dropped.extend(locs)


class Recorder:
    def __init__(self, no_ack=True, limit=None):
        self.tag = "c"
        self.no_ack = no_ack
        self.priority = 0
        self.exclusive = False
        self.limit = limit
        self.got = []

    def can_take(self):
        return self.limit is None or len(self.got) < self.limit

    def deliver(self, queue, entry):
        self.got.append((entry.seq, entry.message.body, entry.delivery_count))


def msg(i: int, size: int = 10, expiration_ms=None) -> Message:
    body = str(i).encode().ljust(size, b".")
    return Message("", "q", b"\x00\x01q", b"\x00\x00", body, expiration_ms=expiration_ms)


def publish(q: ClassicQueue, store: DictStore, m: Message, now_ms: int = 0) -> None:
    """What the broker's _put does."""
    if q.pages_out():
        q.publish_paged(store.put(m), len(m.body), q.expiry_of(m, now_ms), 0, m.priority)
    else:
        entry, _dropped = q.publish(m, now_ms)
        assert entry is not None


def paged_queue(policy: PagingPolicy, **kw) -> tuple[ClassicQueue, DictStore]:
    store = DictStore()
    q = ClassicQueue("q", "/", **kw)
    q.set_paging(policy, store)
    return q, store


# ---------------------------------------------------------------- the policy


def test_messages_past_the_window_in_count_are_paged():
    p = PagingPolicy(window_messages=4, window_bytes=10**9)
    assert not p.pages_out(3, 0, 0)
    assert p.pages_out(4, 0, 0)


def test_messages_past_the_window_in_bytes_are_paged():
    p = PagingPolicy(window_messages=10**6, window_bytes=100)
    assert not p.pages_out(1, 99, 0)
    assert p.pages_out(1, 100, 0)


def test_once_the_tail_has_started_every_later_message_is_paged_to_keep_order():
    p = PagingPolicy(window_messages=4, window_bytes=10**9)
    assert p.pages_out(0, 0, 1)


def test_lazy_mode_pages_every_message():
    p = PagingPolicy.lazy()
    assert p.window_messages == 0 and p.pages_out(0, 0, 0)


def test_read_ahead_starts_below_the_low_mark_only():
    p = PagingPolicy(window_messages=100, window_bytes=10**9, batch_messages=8)
    assert p.wants_read_ahead(7, 1)
    assert not p.wants_read_ahead(8, 1)
    assert not p.wants_read_ahead(0, 0)


def test_bad_numbers_are_refused():
    with pytest.raises(ValueError):
        PagingPolicy(window_messages=-1)
    with pytest.raises(ValueError):
        PagingPolicy(batch_messages=0)


# ---------------------------------------------------------------- the tail


def test_tail_keeps_order_sizes_expiry_and_delivery_counts():
    t = PagedTail()
    t.append(5, 100, 10)
    t.append(6, SCRATCH + 1, 20, expires_at_ms=77, delivery_count=1)
    t.append(7, 102, 30)
    assert (t.count, t.bytes, t.first_seq, t.next_seq) == (3, 60, 5, 8)
    assert t.head_expires_at_ms() is None
    assert t.pop(2, 10**9) == [(5, 100, 10, None, 0), (6, SCRATCH + 1, 20, 77, 1)]
    assert (t.count, t.bytes, t.first_seq) == (1, 30, 7)
    assert t.take_all() == [102]
    assert (t.count, t.bytes) == (0, 0)
    assert is_scratch(SCRATCH + 1) and not is_scratch(100)


def test_tail_refuses_a_seq_out_of_order():
    t = PagedTail()
    t.append(1, 1, 1)
    with pytest.raises(ValueError):
        t.append(3, 2, 1)


def test_tail_pop_is_bounded_by_bytes_but_always_takes_one():
    t = PagedTail()
    for i in range(5):
        t.append(i + 1, i, 100)
    assert len(t.pop(10, 250)) == 2
    assert len(t.pop(10, 1)) == 1


def test_tail_compacts_its_arrays_as_the_head_moves():
    t = PagedTail()
    for i in range(20000):
        t.append(i + 1, i, 1)
    for _ in range(150):
        t.pop(100, 10**9)
    assert t.count == 5000
    assert t.memory_bytes() < 20000 * 13
    assert [x[0] for x in t.pop(3, 10**9)] == [15001, 15002, 15003]


def test_a_paged_message_costs_tens_of_bytes():
    """What one paged message keeps in memory (tracemalloc): its place in the tail's arrays."""
    n = 100_000
    tracemalloc.start()
    t = PagedTail()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        t.append(i + 1, 10**9 + i, 1024)
    per = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()
    print(f"paged message: {per:.1f} bytes in the queue's tail")
    assert per < 24


# ---------------------------------------------------------------- a classic queue that pages


def test_backlog_past_the_window_is_paged_and_delivered_complete_and_in_order():
    q, store = paged_queue(PagingPolicy(window_messages=10, window_bytes=10**9, batch_messages=4))
    for i in range(100):
        publish(q, store, msg(i))
    assert q.state.ready_count == 10 and q.paged_count == 90
    assert q.message_count == 100 and q.figures().ready == 100 and q.figures().ready_bytes == 1000
    c = Recorder()
    q.add_consumer(c)
    q.dispatch()
    assert [int(b.rstrip(b".")) for _s, b, _n in c.got] == list(range(100))
    assert [s for s, _b, _n in c.got] == list(range(1, 101))
    assert q.message_count == 0 and not store.bodies


def test_bodies_come_back_a_batch_at_a_time_when_memory_runs_low():
    q, store = paged_queue(PagingPolicy(window_messages=6, window_bytes=10**9, batch_messages=3))
    for i in range(20):
        publish(q, store, msg(i))
    c = Recorder(no_ack=True, limit=4)
    q.add_consumer(c)
    q.dispatch()
    assert len(c.got) == 4 and store.reads == [], "at or above the low mark: nothing read yet"
    assert q.state.ready_count == 2
    c.limit = 5
    q.dispatch()
    assert len(store.reads) == 3, "below the low mark: one batch read back, before the delivery"
    assert q.state.ready_count == 4 and q.paged_count == 11


def test_new_messages_stay_paged_behind_the_tail_until_it_is_empty():
    q, store = paged_queue(PagingPolicy(window_messages=2, window_bytes=10**9, batch_messages=1))
    for i in range(4):
        publish(q, store, msg(i))
    c = Recorder(no_ack=True, limit=1)
    q.add_consumer(c)
    q.dispatch()  # one in memory, two paged
    assert (q.state.ready_count, q.paged_count) == (1, 2)
    publish(q, store, msg(4))
    assert q.paged_count == 3, "the window has room, but the tail comes first"
    c.limit = None
    q.dispatch()
    assert [int(b.rstrip(b".")) for _s, b, _n in c.got] == [0, 1, 2, 3, 4]
    publish(q, store, msg(5))
    assert q.paged_count == 0 and q.state.ready_count == 1, "tail empty: back to memory"


def test_lazy_queue_holds_no_more_than_a_read_ahead_batch():
    q, store = paged_queue(PagingPolicy.lazy(batch_messages=5))
    for i in range(50):
        publish(q, store, msg(i))
    assert q.state.ready_count == 0 and q.paged_count == 50
    c = Recorder(no_ack=False, limit=1)
    q.add_consumer(c)
    q.dispatch()
    assert q.state.ready_count <= 5 and len(c.got) == 1


def test_requeued_message_goes_back_ahead_of_the_paged_ones_redelivered():
    q, store = paged_queue(PagingPolicy(window_messages=1, window_bytes=10**9, batch_messages=2))
    for i in range(5):
        publish(q, store, msg(i))
    e = q.take_head(no_ack=False)
    assert e.seq == 1
    q.requeue(e.seq)
    c = Recorder()
    q.add_consumer(c)
    q.dispatch()
    assert [(s, n) for s, _b, n in c.got] == [(1, 2), (2, 1), (3, 1), (4, 1), (5, 1)]


def test_recovered_delivery_count_survives_paging():
    q, store = paged_queue(PagingPolicy.lazy())
    loc = store.put(msg(0))
    q.publish_paged(loc, 10, None, delivery_count=1)
    got = q.take_head(no_ack=True)
    assert got.delivery_count == 2  # delivered before the restart: this delivery is a redelivery


def test_unreadable_body_is_dropped_and_never_delivered():
    q, store = paged_queue(PagingPolicy(window_messages=0, window_bytes=0, batch_messages=10))
    for i in range(5):
        publish(q, store, msg(i))
    store.bad.add(SCRATCH + 3)  # the third message's record
    c = Recorder()
    q.add_consumer(c)
    q.dispatch()
    assert [int(b.rstrip(b".")) for _s, b, _n in c.got] == [0, 1, 3, 4]
    assert store.lost == [("q", 3, SCRATCH + 3)]
    assert q.message_count == 0


def test_expired_paged_head_is_read_back_and_expires():
    q, store = paged_queue(PagingPolicy.lazy(batch_messages=2), message_ttl_ms=100)
    for i in range(3):
        publish(q, store, msg(i), now_ms=0)
    assert q.expire(50) == []
    assert store.reads == [], "nothing read while the head has not expired"
    out = q.expire(100)
    assert [e.seq for e in out] == [1, 2, 3]
    assert q.message_count == 0


def test_purge_drops_paged_messages_unread():
    q, store = paged_queue(PagingPolicy(window_messages=2, window_bytes=10**9))
    for i in range(10):
        publish(q, store, msg(i))
    removed = q.remove_ready()
    assert len(removed) == 2 and len(store.dropped) == 8 and store.reads == []
    assert q.message_count == 0 and not store.bodies


def test_get_reads_back_when_memory_is_empty():
    q, store = paged_queue(PagingPolicy.lazy())
    publish(q, store, msg(7))
    e = q.take_head(no_ack=True)
    assert e.message.body.startswith(b"7")


def pmsg(i: int, priority: int) -> Message:
    m = msg(i)
    m.priority = priority
    return m


def test_a_priority_levels_tail_keeps_increasing_seqs_with_gaps():
    t = PagedTail(gaps=True)
    for seq in (3, 7, 8, 20):
        t.append(seq, seq * 10, 1)
    with pytest.raises(ValueError):
        t.append(20, 0, 1)
    assert [x[0] for x in t.pop(2, 10**9)] == [3, 7]
    assert (t.first_seq, t.next_seq) == (8, 21)
    assert [x[:2] for x in t.pop(5, 10**9)] == [(8, 80), (20, 200)]


def test_priority_queue_pages_per_level_and_delivers_in_priority_order():
    q, store = paged_queue(PagingPolicy(window_messages=4, window_bytes=10**9, batch_messages=3),
                           limits=QueueLimits(max_priority=5))
    # priorities 0,1,2,9 (9 is capped at 5) round and round: most of them paged, per level
    prios = [i % 3 if i % 7 else 9 for i in range(60)]
    for i, p in enumerate(prios):
        publish(q, store, pmsg(i, p))
    assert q.state.ready_count == 4 and q.paged_count == 56 and q.message_count == 60
    c = Recorder()
    q.add_consumer(c)
    q.dispatch()
    got = [int(b.rstrip(b".")) for _s, b, _n in c.got]
    expected = sorted(range(60), key=lambda i: (-min(prios[i], 5), i))
    assert got == expected
    assert q.message_count == 0 and not store.bodies


def test_lazy_priority_queue_reads_a_high_priority_message_before_older_low_ones():
    q, store = paged_queue(PagingPolicy.lazy(batch_messages=8), limits=QueueLimits(max_priority=9))
    for i in range(100):
        publish(q, store, pmsg(i, 0))
    publish(q, store, pmsg(100, 7))
    assert q.state.ready_count == 0
    e = q.take_head(no_ack=True)
    assert e.message.body.startswith(b"100")
    assert q.state.ready_count <= 8  # one read-ahead batch of level 0 at most
    c = Recorder()
    q.add_consumer(c)
    q.dispatch()
    assert [int(b.rstrip(b".")) for _s, b, _n in c.got] == list(range(100))


def test_expired_paged_head_of_a_priority_level_is_read_back_and_expires():
    q, store = paged_queue(PagingPolicy.lazy(), limits=QueueLimits(max_priority=2))
    publish(q, store, pmsg(0, 2), now_ms=0)
    q.message_ttl_ms = 10
    publish(q, store, pmsg(1, 1), now_ms=0)
    assert q.expire(5) == []
    q.take_head(no_ack=True)  # 0 (no TTL) leaves; 1 (level 1) is the head now
    assert [e.message.body[:1] for e in q.expire(20)] == [b"1"]
    assert q.message_count == 0


def publish_limited(q: ClassicQueue, store: DictStore, m: Message) -> tuple[bool, list]:
    """What the broker's _put does for a queue with a length limit: (refused, dropped)."""
    if q.pages_out():
        if q.refuses(len(m.body)):
            return True, []
        q.publish_paged(store.put(m), len(m.body), None, 0, m.priority)
        return False, q.drop_over_limit()
    entry, dropped = q.publish(m, 0)
    return entry is None, dropped


def test_drop_head_over_paged_messages_reads_back_the_heads_it_dead_letters():
    q, store = paged_queue(PagingPolicy.lazy(), limits=QueueLimits(max_length=5))
    q.dead_letter_exchange = "dlx"
    dropped = []
    for i in range(12):
        refused, d = publish_limited(q, store, msg(i))
        assert not refused
        dropped += d
    assert [int(e.message.body.rstrip(b".")) for e in dropped] == list(range(7))
    assert q.message_count == 5 and q.paged_count == 5
    c = Recorder()
    q.add_consumer(c)
    q.dispatch()
    assert [int(b.rstrip(b".")) for _s, b, _n in c.got] == list(range(7, 12))


def test_drop_head_without_a_dead_letter_exchange_releases_paged_heads_unread():
    q, store = paged_queue(PagingPolicy(window_messages=2, window_bytes=10**9), limits=QueueLimits(max_length_bytes=40))
    for i in range(10):
        _refused, d = publish_limited(q, store, msg(i))  # 10 bytes each: 4 fit
    assert q.message_count == 4 and q.ready_bytes == 40
    assert not store.reads, "nothing was read back to be dropped"
    assert len(store.dropped) == 4  # 0 and 1 were in memory (the window), 2..5 paged
    c = Recorder()
    q.add_consumer(c)
    q.dispatch()
    assert [int(b.rstrip(b".")) for _s, b, _n in c.got] == [6, 7, 8, 9]


def test_reject_publish_counts_paged_messages():
    q, store = paged_queue(PagingPolicy.lazy(), limits=QueueLimits(max_length=3, overflow="reject-publish"))
    results = [publish_limited(q, store, msg(i))[0] for i in range(5)]
    assert results == [False, False, False, True, True]
    assert q.message_count == 3 and len(store.bodies) == 3


class MirrorRecorder:
    """What a mirrored queue's leader (hutch.mirror.leader.Leader) is told by its queue."""

    def __init__(self):
        self.ops: list[tuple] = []

    def enqueued(self, seq, m, expires_at_ms):
        self.ops.append(("enqueued", seq, m.body))

    def removed(self, seq):
        self.ops.append(("removed", seq))

    def checked_out(self, seq):
        self.ops.append(("checked_out", seq))

    def paged_in(self, entries):
        self.ops.append(("paged_in", *(e.seq for e in entries)))

    def kinds(self, kind: str) -> list[int]:
        return [op[1] for op in self.ops if op[0] == kind]


def mirrored_publish(q: ClassicQueue, store: DictStore, m: Message) -> None:
    """The broker's _put for a mirrored queue's leader: the message goes to the mirrors too."""
    if q.pages_out():
        q.publish_paged(store.put(m), len(m.body), None, 0, m.priority, m)
    else:
        q.publish(m, 0)


def test_a_mirrored_leader_pages_and_tells_its_mirrors_every_message():
    q, store = paged_queue(PagingPolicy(window_messages=2, window_bytes=10**9))
    for i in range(3):
        publish(q, store, msg(i))
    rec = q.mirror = MirrorRecorder()
    assert q.paged_count == 1, "becoming a mirrored leader keeps the tail"
    for i in range(3, 6):
        mirrored_publish(q, store, msg(i))
    assert q.paged_count == 4 and len(store.bodies) == 4
    assert rec.ops == [("enqueued", s, msg(s - 1).body) for s in (4, 5, 6)]
    assert q.live_seqs() == set(range(1, 7))
    c = Recorder(no_ack=False)
    q.add_consumer(c)
    q.dispatch()
    assert [s for s, _b, _n in c.got] == list(range(1, 7))
    assert rec.kinds("checked_out") == list(range(1, 7)) and ("paged_in", 3, 4, 5, 6) in rec.ops
    assert rec.kinds("removed") == []


def test_what_leaves_a_mirrored_leaders_tail_unread_is_removed_from_its_mirrors():
    q, store = paged_queue(PagingPolicy(window_messages=2, window_bytes=10**9), limits=QueueLimits(max_length=4))
    rec = q.mirror = MirrorRecorder()
    for i in range(8):
        if q.pages_out():
            q.publish_paged(store.put(msg(i)), 10, None, 0, 0, msg(i))
            q.drop_over_limit()  # drop-head, no dead-letter exchange: paged heads released unread
        else:
            q.publish(msg(i), 0)
    assert q.message_count == 4 and rec.kinds("removed") == [1, 2, 3, 4]
    assert [s for s in sorted(q.live_seqs())] == [5, 6, 7, 8]
    store.bad.add(q.tail.find(7)[0])  # its body cannot be read back: gone, and gone from the mirrors
    q.page_in_all()
    assert rec.kinds("removed") == [1, 2, 3, 4, 7]
    publish(q, store, msg(8))
    publish(q, store, msg(9))
    q.remove_ready()  # purge: paged ones too
    assert sorted(rec.kinds("removed")[5:]) == [5, 6, 8, 9, 10] and q.paged_count == 0
    assert q.message_count == 0


def test_the_tail_finds_its_messages_by_seq_without_taking_them():
    t = PagedTail()
    for seq in range(5, 10):
        t.append(seq, 100 + seq, 10, 1000 if seq == 7 else None, seq % 3)
    assert t.head_seq == 5 and t.seqs() == [5, 6, 7, 8, 9]
    assert t.find(7) == (107, 1000, 1) and t.find(4) is None and t.find(10) is None
    t.pop(2, 10**9)
    assert t.find(5) is None and t.find(8) == (108, None, 2) and t.count == 3
    g = PagedTail(gaps=True)
    for seq in (3, 8, 20):
        g.append(seq, seq, 1)
    assert g.find(8) == (8, None, 0) and g.find(9) is None and g.seqs() == [3, 8, 20] and g.keeps_seqs


def test_losing_paging_reads_everything_back_in_order():
    q, store = paged_queue(PagingPolicy(window_messages=3, window_bytes=10**9))
    for i in range(10):
        publish(q, store, msg(i))
    q.set_paging(None)
    assert q.tail is None and [e.seq for e in q.state.ready()] == list(range(1, 11))


@settings(max_examples=150, deadline=None)
@given(st.booleans(), st.lists(st.tuples(st.integers(1, 3), st.integers(0, 2 ** 40), st.booleans(),
                                         st.integers(0, 300)), min_size=1, max_size=900),
       st.integers(0, 600), st.data())
def test_a_batch_of_lookups_finds_what_the_tail_holds(gaps, appends, popped, data):
    """find_many (a sync's batch) against a model of what was appended and not yet popped,
    across block boundaries of the columns, with and without seq gaps and expiry times."""
    t = PagedTail(gaps=gaps)
    model: dict[int, tuple[int, int | None, int]] = {}
    seq = 10
    for step, loc, expiring, count in appends:
        seq += step if gaps else 1
        expires = 5_000 + seq if expiring else None
        t.append(seq, loc | SCRATCH if count % 7 == 0 else loc, 100, expires, count)
        model[seq] = (loc | SCRATCH if count % 7 == 0 else loc, expires, min(count, 255))
    for s, *_ in t.pop(popped, 10 ** 12):
        del model[s]
    probe = data.draw(st.lists(st.integers(0, seq + 3), max_size=300).map(sorted))
    assert t.find_many(probe) == [model.get(s) for s in probe]
