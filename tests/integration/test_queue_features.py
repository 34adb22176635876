"""Queue features as RabbitMQ 3.10 has them: TTL, queue expiry, length limits and overflow,
dead-lettering with x-death, priority queues, single active consumer, argument validation.

Every assertion records what RabbitMQ 3.10 does (run with HUTCH_TEST_BROKER=rabbitmq) and
holds hutch to it: which message goes, where it goes, which headers it carries, and the
reply code and text of every refusal.
"""

from __future__ import annotations

import datetime

import pika
import pika.exceptions
import pytest

from tests.integration.helpers import channel_error, connect, drain, wait_until


@pytest.fixture
def ch(conn):
    """A channel in confirm mode: basic_publish returns once the queues have the message."""
    c = conn.channel()
    c.confirm_delivery()
    return c


def get(ch, queue: str, timeout_s: float = 5.0):
    """The next message of a queue (basic.get with autoack), waiting for one to arrive."""
    return drain(ch.connection, lambda: (r := ch.basic_get(queue, auto_ack=True))[0] and r, timeout_s=timeout_s,
                 what=f"a message on {queue}")


def get_all(ch, queue: str) -> list[bytes]:
    out = []
    while True:
        method, _p, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def queue_exists(broker, name: str) -> bool:
    c = connect(broker)
    try:
        c.channel().queue_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404
        return False
    finally:
        if c.is_open:
            c.close()


def dlx_setup(ch, names, **work_args):
    """A work queue dead-lettering through the default exchange into a dead-letter queue."""
    work, dead = names.queue("work"), names.queue("dead")
    ch.queue_declare(dead)
    ch.queue_declare(work, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
                                      **work_args})
    return work, dead


# -- message TTL ---------------------------------------------------------------------------------

def test_queue_message_ttl_expires_messages_that_are_never_delivered(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-message-ttl": 100})
    ch.basic_publish("", q, b"gone")
    drain(ch.connection, lambda: count(ch, q) == 0, what="message expired")
    assert ch.basic_get(q)[0] is None


def test_message_ttl_zero_delivers_only_to_a_waiting_consumer(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-message-ttl": 0})
    ch.basic_publish("", q, b"nobody-waits")
    drain(ch.connection, lambda: count(ch, q) == 0, what="expired at once")
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", q, b"taken")
    drain(ch.connection, lambda: got, what="delivery to the waiting consumer")
    assert got == [b"taken"]


def test_per_message_expiration_acts_only_at_the_head_of_the_queue(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"long", pika.BasicProperties(expiration="60000"))
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="1"))
    ch.connection.sleep(0.05)  # the short one expires meanwhile, but it waits behind the long one
    assert count(ch, q) == 2
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert (body, props.expiration) == (b"long", "60000")
    assert ch.basic_get(q)[0] is None  # now at the head, the short one expires instead of being delivered


def test_the_lower_of_queue_ttl_and_message_expiration_applies(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-message-ttl": 60000})
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="50"))
    drain(ch.connection, lambda: count(ch, q) == 0, what="message expired by its own expiration")


def test_invalid_expiration_property_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    code, text = channel_error(ch.basic_publish, "", q, b"m", pika.BasicProperties(expiration="soon"))
    assert (code, text) == (406, "PRECONDITION_FAILED - invalid expiration 'soon': no_integer")


def test_negative_expiration_property_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    code, text = channel_error(ch.basic_publish, "", q, b"m", pika.BasicProperties(expiration="-5"))
    assert (code, text) == (406, "PRECONDITION_FAILED - invalid expiration '-5': {value_negative,-5}")


def test_expired_message_is_dead_lettered_with_reason_expired_and_its_original_expiration(ch, names):
    work, dead = dlx_setup(ch, names)
    ch.basic_publish("", work, b"late", pika.BasicProperties(expiration="30", headers={"app": "x"}))
    method, props, body = get(ch, dead)
    assert body == b"late"
    assert props.expiration is None  # removed: a dead letter does not inherit the expiry
    (death,) = props.headers["x-death"]
    assert {k: v for k, v in death.items() if k != "time"} == {
        "count": 1, "reason": "expired", "queue": work, "exchange": "", "routing-keys": [work],
        "original-expiration": "30"}
    assert isinstance(death["time"], datetime.datetime)
    assert props.headers["app"] == "x"
    assert (props.headers["x-first-death-reason"], props.headers["x-first-death-queue"],
            props.headers["x-first-death-exchange"]) == ("expired", work, "")
    assert (method.exchange, method.routing_key) == ("", dead)


# -- queue expiry (x-expires) ------------------------------------------------------------------------

def test_unused_queue_is_deleted_after_x_expires(broker, ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-expires": 200})
    ch.basic_publish("", q, b"left behind")
    # a passive declare is a use that renews the lease: look less often than x-expires
    wait_until(lambda: not queue_exists(broker, q), timeout_s=10, interval_s=0.5, what="queue expired")


def test_queue_with_a_consumer_does_not_expire_until_the_consumer_leaves(broker, ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-expires": 200})
    tag = ch.basic_consume(q, lambda *a: None)
    ch.connection.sleep(0.6)  # three times x-expires: a watched window, the queue must stay
    assert queue_exists(broker, q)
    ch.basic_cancel(tag)
    wait_until(lambda: not queue_exists(broker, q), timeout_s=10, interval_s=0.5,
               what="queue expired after the cancel")


@pytest.mark.parametrize("use", ["passive declare", "redeclare", "basic.get"])
def test_a_declare_or_get_renews_the_x_expires_lease(broker, ch, names, use):
    q = names.queue()
    args = {"x-expires": 400}
    ch.queue_declare(q, arguments=args)
    for _ in range(8):  # 1.2 s of use, every 150 ms: three times x-expires
        if use == "passive declare":
            ch.queue_declare(q, passive=True)
        elif use == "redeclare":
            ch.queue_declare(q, arguments=args)
        else:
            ch.basic_get(q)
        ch.connection.sleep(0.15)
    assert queue_exists(broker, q)
    wait_until(lambda: not queue_exists(broker, q), timeout_s=10, interval_s=0.6, what="queue expired once unused")


# -- length limits and overflow -----------------------------------------------------------------------

def test_max_length_drop_head_dead_letters_the_oldest_with_reason_maxlen(ch, names):
    work, dead = dlx_setup(ch, names, **{"x-max-length": 2})
    for b in (b"1", b"2", b"3", b"4"):
        ch.basic_publish("", work, b)
    assert get_all(ch, work) == [b"3", b"4"]
    first = get(ch, dead)
    second = get(ch, dead)
    assert (first[2], second[2]) == (b"1", b"2")
    (death,) = first[1].headers["x-death"]
    assert (death["reason"], death["queue"], death["count"]) == ("maxlen", work, 1)
    assert first[1].headers["x-first-death-reason"] == "maxlen"


def test_max_length_bytes_drops_from_the_head_by_body_size(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length-bytes": 10})
    for b in (b"aaaa", b"bbbb", b"cccc"):  # 12 bytes: the oldest goes
        ch.basic_publish("", q, b)
    assert get_all(ch, q) == [b"bbbb", b"cccc"]


def test_max_length_zero_with_drop_head_dead_letters_every_message(ch, names):
    work, dead = dlx_setup(ch, names, **{"x-max-length": 0})
    ch.basic_publish("", work, b"straight-through")
    assert get(ch, dead)[2] == b"straight-through"
    assert count(ch, work) == 0


def test_reject_publish_nacks_a_confirming_publisher_and_keeps_the_queue(ch, names):
    work, dead = dlx_setup(ch, names, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", work, b"first")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", work, b"second")
    assert get_all(ch, work) == [b"first"]
    assert get_all(ch, dead) == []  # reject-publish does not dead-letter


def test_reject_publish_drops_silently_for_a_publisher_without_confirms(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"first")
    ch.basic_publish("", q, b"second")
    ch.basic_publish("", q, b"third")
    drain(conn, lambda: count(ch, q) == 1)
    assert get_all(ch, q) == [b"first"]


def test_reject_publish_dlx_nacks_and_dead_letters_the_refused_message(ch, names):
    work, dead = dlx_setup(ch, names, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    ch.basic_publish("", work, b"first")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", work, b"second")
    assert get_all(ch, work) == [b"first"]
    method, props, body = get(ch, dead)
    assert body == b"second"
    (death,) = props.headers["x-death"]
    assert (death["reason"], death["queue"]) == ("maxlen", work)


def test_a_freed_slot_accepts_publishes_again_under_reject_publish(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"a")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"b")
    assert get_all(ch, q) == [b"a"]
    ch.basic_publish("", q, b"c")
    assert get_all(ch, q) == [b"c"]


# -- dead-lettering ------------------------------------------------------------------------------------

def test_basic_reject_without_requeue_dead_letters_with_reason_rejected(ch, names):
    work, dead = dlx_setup(ch, names)
    ch.basic_publish("", work, b"poison", pika.BasicProperties(headers={"k": "v"}))
    method, _p, _b = ch.basic_get(work)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get(ch, dead)
    assert body == b"poison"
    (death,) = props.headers["x-death"]
    assert {k: v for k, v in death.items() if k != "time"} == {
        "count": 1, "reason": "rejected", "queue": work, "exchange": "", "routing-keys": [work]}
    assert set(props.headers) == {"k", "x-death", "x-first-death-reason", "x-first-death-queue",
                                  "x-first-death-exchange"}


def test_basic_nack_multiple_without_requeue_dead_letters_every_one_in_order(ch, names):
    work, dead = dlx_setup(ch, names)
    for b in (b"1", b"2", b"3"):
        ch.basic_publish("", work, b)
    tags = [ch.basic_get(work)[0].delivery_tag for _ in range(3)]
    ch.basic_nack(tags[-1], multiple=True, requeue=False)
    assert [get(ch, dead)[2] for _ in range(3)] == [b"1", b"2", b"3"]


def test_requeued_rejection_is_not_dead_lettered(ch, names):
    work, dead = dlx_setup(ch, names)
    ch.basic_publish("", work, b"again")
    method, _p, _b = ch.basic_get(work)
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _p, body = ch.basic_get(work, auto_ack=True)
    assert (body, method.redelivered) == (b"again", True)
    assert get_all(ch, dead) == []


def test_dead_letter_exchange_routes_with_the_original_routing_key_by_default(ch, names):
    dlx = names.exchange("dlx")
    work, dead = names.queue("work"), names.queue("dead")
    ch.exchange_declare(dlx, "direct")
    ch.queue_declare(dead)
    ch.queue_bind(dead, dlx, routing_key="orders.eu")
    ch.queue_declare(work, arguments={"x-dead-letter-exchange": dlx})
    ch.queue_bind(work, "amq.direct", routing_key="orders.eu")
    ch.basic_publish("amq.direct", "orders.eu", b"m")
    method, _p, _b = ch.basic_get(work)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, _b = get(ch, dead)
    assert (method.exchange, method.routing_key) == (dlx, "orders.eu")
    (death,) = props.headers["x-death"]
    assert (death["exchange"], death["routing-keys"]) == ("amq.direct", ["orders.eu"])


def test_message_dead_lettered_to_a_missing_exchange_is_dropped(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": names.exchange("missing")})
    ch.basic_publish("", q, b"m")
    method, _p, _b = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert count(ch, q) == 0


def test_x_death_count_grows_when_a_message_dies_again_the_same_way(ch, names):
    """A retry loop: work rejects into a delay queue whose TTL sends it back to work."""
    dlx = names.exchange("dlx")
    work, delay = names.queue("work"), names.queue("delay")
    ch.exchange_declare(dlx, "direct")
    ch.queue_declare(work, arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "retry"})
    ch.queue_declare(delay, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": work,
                                       "x-message-ttl": 20})
    ch.queue_bind(delay, dlx, "retry")
    ch.basic_publish("", work, b"job", pika.BasicProperties(expiration="100000"))
    for _ in range(2):
        method, _p, _b = drain(ch.connection, lambda: (r := ch.basic_get(work))[0] and r, what="job back")
        ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = drain(ch.connection, lambda: (r := ch.basic_get(work, auto_ack=True))[0] and r,
                                what="job back")
    deaths = props.headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [(delay, "expired", 2),
                                                                      (work, "rejected", 2)]
    assert deaths[0]["exchange"] == dlx and deaths[0]["routing-keys"] == ["retry"]
    assert deaths[1]["exchange"] == "" and deaths[1]["routing-keys"] == [work]
    assert deaths[1]["original-expiration"] == "100000" and "original-expiration" not in deaths[0]
    assert (props.headers["x-first-death-queue"], props.headers["x-first-death-reason"]) == (work, "rejected")
    assert props.expiration is None


def test_a_dead_letter_cycle_without_a_rejection_is_dropped(ch, names):
    """Two queues whose TTLs dead-letter into each other: the message goes round once, then
    RabbitMQ drops it rather than loop forever."""
    a, b = names.queue("a"), names.queue("b")
    ch.queue_declare(a, arguments={"x-message-ttl": 20, "x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": b})
    ch.queue_declare(b, arguments={"x-message-ttl": 20, "x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": a})
    ch.basic_publish("", a, b"ping")
    drain(ch.connection, lambda: (count(ch, a), count(ch, b)) == (0, 0), what="message dropped")
    ch.connection.sleep(0.2)  # ten TTLs: a looping message would show up again
    assert (count(ch, a), count(ch, b)) == (0, 0)


# -- priority queues -----------------------------------------------------------------------------------

def test_priority_queue_delivers_higher_priority_first_and_fifo_within_a_priority(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-priority": 5})
    for body, prio in ((b"low-1", 1), (b"none-1", None), (b"high-1", 5), (b"low-2", 1), (b"high-2", 5),
                       (b"mid", 3), (b"none-2", None)):
        ch.basic_publish("", q, body, pika.BasicProperties(priority=prio))
    assert get_all(ch, q) == [b"high-1", b"high-2", b"mid", b"low-1", b"low-2", b"none-1", b"none-2"]


def test_priority_above_the_maximum_counts_as_the_maximum(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-priority": 2})
    ch.basic_publish("", q, b"two", pika.BasicProperties(priority=2))
    ch.basic_publish("", q, b"nine", pika.BasicProperties(priority=9))
    ch.basic_publish("", q, b"one", pika.BasicProperties(priority=1))
    assert get_all(ch, q) == [b"two", b"nine", b"one"]


def test_priority_is_ignored_by_a_queue_without_x_max_priority(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"a", pika.BasicProperties(priority=1))
    ch.basic_publish("", q, b"b", pika.BasicProperties(priority=9))
    assert get_all(ch, q) == [b"a", b"b"]


def test_requeued_messages_go_back_to_their_place_within_their_priority(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-priority": 3})
    for body, prio in ((b"h1", 3), (b"h2", 3), (b"l1", 1), (b"l2", 1)):
        ch.basic_publish("", q, body, pika.BasicProperties(priority=prio))
    first = ch.basic_get(q)[0]   # h1
    ch.basic_get(q)              # h2
    ch.basic_reject(first.delivery_tag, requeue=True)
    ch.basic_publish("", q, b"h3", pika.BasicProperties(priority=3))
    method, _p, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"h1", True)
    assert get_all(ch, q) == [b"h3", b"l1", b"l2"]
    ch.basic_recover(requeue=True)  # h2 back, ahead of nothing else of its priority
    assert get_all(ch, q) == [b"h2"]


# -- single active consumer ------------------------------------------------------------------------------

def test_single_active_consumer_only_the_first_consumer_receives_until_it_cancels(conn, ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-single-active-consumer": True})
    got = {"first": [], "second": []}
    c1, c2 = conn.channel(), conn.channel()
    t1 = c1.basic_consume(q, lambda c, m, p, b: got["first"].append(b), auto_ack=True)
    c2.basic_consume(q, lambda c, m, p, b: got["second"].append(b), auto_ack=True)
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    drain(conn, lambda: len(got["first"]) == 5, what="five deliveries to the first consumer")
    assert got["second"] == []
    c1.basic_cancel(t1)
    for i in range(5, 8):
        ch.basic_publish("", q, b"%d" % i)
    drain(conn, lambda: len(got["second"]) == 3, what="the second consumer takes over")
    assert got == {"first": [b"0", b"1", b"2", b"3", b"4"], "second": [b"5", b"6", b"7"]}


def test_single_active_consumer_hands_over_unacked_messages_when_the_active_channel_closes(conn, ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-single-active-consumer": True})
    c1, c2 = conn.channel(), conn.channel()
    got1, got2 = [], []
    c1.basic_consume(q, lambda c, m, p, b: got1.append(b))
    c2.basic_consume(q, lambda c, m, p, b: got2.append((b, m.redelivered)), auto_ack=True)
    ch.basic_publish("", q, b"held")
    drain(conn, lambda: got1, what="delivery to the active consumer")
    c1.close()
    drain(conn, lambda: got2, what="the next consumer gets the unacked message")
    assert got2 == [(b"held", True)]


# -- argument validation ---------------------------------------------------------------------------------

INVALID = [
    ({"x-message-ttl": -1}, "invalid arg 'x-message-ttl' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
    ({"x-message-ttl": "10"},
     "invalid arg 'x-message-ttl' for queue '{q}' in vhost '/': \"expected integer, got longstr\""),
    ({"x-message-ttl": 315360000001},
     "invalid arg 'x-message-ttl' for queue '{q}' in vhost '/': {{value_too_large,315360000001}}"),
    ({"x-expires": 0}, "invalid arg 'x-expires' for queue '{q}' in vhost '/': {{value_zero,0}}"),
    ({"x-expires": -5}, "invalid arg 'x-expires' for queue '{q}' in vhost '/': {{value_negative,-5}}"),
    ({"x-max-length": -1}, "invalid arg 'x-max-length' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
    ({"x-max-length": True},
     "invalid arg 'x-max-length' for queue '{q}' in vhost '/': \"expected integer, got bool\""),
    ({"x-max-length-bytes": -1},
     "invalid arg 'x-max-length-bytes' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
    ({"x-overflow": "drop-tail"}, "invalid arg 'x-overflow' for queue '{q}' in vhost '/': invalid_overflow"),
    ({"x-overflow": 1}, "invalid arg 'x-overflow' for queue '{q}' in vhost '/': {{unacceptable_type,signedint}}"),
    ({"x-max-priority": 256},
     "invalid arg 'x-max-priority' for queue '{q}' in vhost '/': {{max_value_exceeded,256}}"),
    ({"x-max-priority": -1}, "invalid arg 'x-max-priority' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
    ({"x-dead-letter-routing-key": "k"},
     "invalid arg 'x-dead-letter-routing-key' for queue '{q}' in vhost '/': routing_key_but_no_dlx_defined"),
    ({"x-dead-letter-exchange": 5},
     "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue '{q}' in vhost '/'"),
    ({"x-dead-letter-exchange": "e", "x-dead-letter-routing-key": 5},
     "invalid arg 'x-dead-letter-routing-key' for queue '{q}' in vhost '/': {{unacceptable_type,signedint}}"),
    ({"x-single-active-consumer": "yes"},
     "invalid arg 'x-single-active-consumer' for queue '{q}' in vhost '/': {{unacceptable_type,longstr}}"),
    ({"x-queue-mode": "eager"},
     "invalid arg 'x-queue-mode' for queue '{q}' in vhost '/': \"unsupported queue mode 'eager'\""),
    ({"x-queue-type": "fifo"},
     "invalid arg 'x-queue-type' for queue '{q}' in vhost '/': \"unsupported queue type 'fifo'\""),
    # several bad arguments: the first in RabbitMQ's order of checks is reported
    ({"x-message-ttl": -1, "x-expires": 0}, "invalid arg 'x-expires' for queue '{q}' in vhost '/': {{value_zero,0}}"),
    ({"x-max-priority": -1, "x-max-length": -1},
     "invalid arg 'x-max-length' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
]


@pytest.mark.parametrize("args,text", INVALID, ids=[repr(a) for a, _ in INVALID])
def test_invalid_queue_argument_is_406_with_rabbitmqs_text(ch, names, args, text):
    q = names.queue()
    code, reply = channel_error(ch.queue_declare, q, arguments=args)
    assert (code, reply) == (406, "PRECONDITION_FAILED - " + text.format(q=q))


@pytest.mark.parametrize("args", [{"x-max-priority": 0}, {"x-max-priority": 255}, {"x-max-length": 0},
                                  {"x-message-ttl": 0}, {"x-overflow": "reject-publish-dlx"},
                                  {"x-queue-mode": "lazy"}, {"x-single-active-consumer": False},
                                  {"x-dead-letter-exchange": ""}, {"x-some-extension": "kept"}],
                         ids=repr)
def test_valid_queue_arguments_are_accepted(ch, names, args):
    q = names.queue()
    ch.queue_declare(q, arguments=args)
    ch.queue_declare(q, arguments=args)  # and the redeclare is equivalent
