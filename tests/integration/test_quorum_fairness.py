"""Fair dispatch on a quorum queue, as RabbitMQ's work-queue tutorial relies on it: a consumer
with prefetch 1 is given one message and no more until it acknowledges it, so a busy worker
holds one message and the others go to the idle ones. Runs against hutch and RabbitMQ."""

from __future__ import annotations

import time

import pytest

from tests.integration.helpers import connect

QUORUM = {"x-queue-type": "quorum"}
MESSAGES = 20


@pytest.mark.parametrize("prefetch", [1, 3])
def test_a_busy_worker_holds_only_its_prefetch_and_the_idle_one_gets_the_rest(conn, names, broker, prefetch):
    q = names.queue()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(q, durable=True, arguments=QUORUM)
    busy_conn = connect(broker)
    try:
        busy = busy_conn.channel()
        busy.basic_qos(prefetch_count=prefetch)
        held: list[bytes] = []
        busy.basic_consume(q, lambda _c, _m, _p, body: held.append(body))  # never acknowledges
        idle = conn.channel()
        idle.basic_qos(prefetch_count=prefetch)
        done: list[bytes] = []

        def work(c, m, _p, body):
            done.append(body)
            c.basic_ack(m.delivery_tag)
        idle.basic_consume(q, work)
        for i in range(MESSAGES):
            ch.basic_publish("", q, b"%d" % i)
        deadline = time.monotonic() + 20
        while len(done) + len(held) < MESSAGES and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
            busy_conn.process_data_events(time_limit=0.05)
        assert len(held) <= prefetch, held
        assert len(done) + len(held) == MESSAGES, (len(done), held)
    finally:
        busy_conn.close()
