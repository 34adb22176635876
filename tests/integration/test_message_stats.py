"""Message counters, rates and sample histories in the management API, as RabbitMQ counts them.

RabbitMQ's channels count (rabbit_channel's fine stats): a publish once on the channel, vhost
and node however many queues it reaches, once per queue on each queue (the exchange's
publish_out adds those up); a delivery, get, ack or redelivery once per message on the
channel and on its queue; confirms and unroutable messages on the channel. One hutch node for
the module, sampling every 200 ms; each test works in its own vhost so its figures start at 0.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
import uuid

import pika
import pytest

from tests.integration.helpers import wait_until
from tests.support.brokers import HutchNode, free_port
from tests.support.http import Http

INTERVAL_MS = 200


@pytest.fixture(scope="module")
def node():
    n = HutchNode(extra_args=["--collect-statistics-interval", str(INTERVAL_MS),
                              "--prometheus-port", str(free_port())])
    n.start()
    yield n
    n.cleanup()


@pytest.fixture(scope="module")
def http(node) -> Http:
    return Http(node.mgmt_port)


@pytest.fixture
def vhost(http):
    """A fresh vhost (guest may use it): its counters start at 0."""
    name = f"stats-{uuid.uuid4().hex[:8]}"
    assert http("PUT", f"/api/vhosts/{name}")[0] in (201, 204)
    assert http("PUT", f"/api/permissions/{name}/guest", {"configure": ".*", "write": ".*", "read": ".*"})[0] \
        in (201, 204)
    yield name
    http("DELETE", f"/api/vhosts/{name}")


@pytest.fixture
def channel(node, vhost):
    params = pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{node.amqp_port}/{urllib.parse.quote(vhost, safe='')}")
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    yield ch
    if conn.is_open:
        conn.close()


def q(vhost: str) -> str:
    return urllib.parse.quote(vhost, safe="")


def stats_of(http: Http, path: str) -> dict:
    return http.get(path).get("message_stats", {})


def three_queue_fanout(ch) -> None:
    ch.exchange_declare("fan", "fanout")
    for name in ("q1", "q2", "q3"):
        ch.queue_declare(name)
        ch.queue_bind(name, "fan")


def test_message_routed_to_three_queues_counts_once_for_publish(http, vhost, channel):
    three_queue_fanout(channel)
    channel.confirm_delivery()
    before = stats_of(http, "/api/overview")
    for _ in range(25):
        channel.basic_publish("fan", "", b"m")
    v = stats_of(http, f"/api/vhosts/{q(vhost)}")
    assert v["publish"] == 25 and v["confirm"] == 25
    x = stats_of(http, f"/api/exchanges/{q(vhost)}/fan")
    assert (x["publish_in"], x["publish_out"]) == (25, 75)
    for name in ("q1", "q2", "q3"):
        assert stats_of(http, f"/api/queues/{q(vhost)}/{name}")["publish"] == 25
    after = stats_of(http, "/api/overview")
    assert after["publish"] - before.get("publish", 0) == 25
    assert after["confirm"] - before.get("confirm", 0) == 25
    chans = [c for c in http.get(f"/api/vhosts/{q(vhost)}/channels")]
    assert [c["message_stats"]["publish"] for c in chans] == [25]


def test_deliver_counts_each_delivery_and_ack_each_message(http, vhost, channel):
    three_queue_fanout(channel)
    for _ in range(10):
        channel.basic_publish("fan", "", b"m")
    got = []

    def on_message(ch, method, _props, _body):
        got.append(method.delivery_tag)
        ch.basic_ack(method.delivery_tag)
    for name in ("q1", "q2", "q3"):
        channel.basic_consume(name, on_message)

    def all_delivered() -> bool:
        channel.connection.process_data_events(time_limit=0.05)
        return len(got) == 30
    wait_until(all_delivered, 15, "30 deliveries")
    wait_until(lambda: stats_of(http, f"/api/vhosts/{q(vhost)}").get("ack") == 30, 10, "acks counted")
    v = stats_of(http, f"/api/vhosts/{q(vhost)}")
    assert (v["publish"], v["deliver"], v["deliver_no_ack"], v["deliver_get"], v["ack"]) == (10, 30, 0, 30, 30)
    for name in ("q1", "q2", "q3"):
        s = stats_of(http, f"/api/queues/{q(vhost)}/{name}")
        assert (s["deliver"], s["deliver_get"], s["ack"]) == (10, 10, 10)


def test_get_get_no_ack_get_empty_and_redeliver(http, vhost, channel):
    channel.queue_declare("g")
    for _ in range(3):
        channel.basic_publish("", "g", b"m")
    method, _p, _b = channel.basic_get("g")
    channel.basic_reject(method.delivery_tag, requeue=True)
    method, _p, _b = channel.basic_get("g")  # the same message again: redelivered
    assert method.redelivered
    channel.basic_ack(method.delivery_tag)
    channel.basic_get("g", auto_ack=True)
    channel.basic_get("g", auto_ack=True)
    assert channel.basic_get("g") == (None, None, None)
    s = stats_of(http, f"/api/queues/{q(vhost)}/g")
    assert (s["get"], s["get_no_ack"], s["get_empty"], s["redeliver"], s["ack"], s["deliver_get"]) == \
        (2, 2, 1, 1, 1, 4)
    v = stats_of(http, f"/api/vhosts/{q(vhost)}")
    assert (v["get"], v["get_no_ack"], v["get_empty"], v["redeliver"], v["ack"]) == (2, 2, 1, 1, 1)


def test_unroutable_messages_returned_or_dropped(http, vhost, channel):
    channel.exchange_declare("nowhere", "direct")
    returned = []
    channel.add_on_return_callback(lambda *a: returned.append(a))
    channel.basic_publish("nowhere", "k", b"m", mandatory=True)
    channel.basic_publish("nowhere", "k", b"m", mandatory=True)
    channel.basic_publish("nowhere", "k", b"m")

    def both_returned() -> bool:
        channel.connection.process_data_events(time_limit=0.05)  # pika hands returns over here
        return len(returned) == 2
    wait_until(both_returned, 10, "basic.return")
    v = stats_of(http, f"/api/vhosts/{q(vhost)}")
    assert (v["publish"], v["return_unroutable"], v["drop_unroutable"]) == (3, 2, 1)
    x = stats_of(http, f"/api/exchanges/{q(vhost)}/nowhere")
    assert (x["publish_in"], x["publish_out"]) == (3, 0)


def test_quorum_queue_publish_and_deliveries_are_counted(http, vhost, channel):
    channel.queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    for _ in range(7):
        channel.basic_publish("", "qq", b"m", properties=pika.BasicProperties(delivery_mode=2))
    method, _p, _b = channel.basic_get("qq")
    channel.basic_ack(method.delivery_tag)
    s = stats_of(http, f"/api/queues/{q(vhost)}/qq")
    assert (s["publish"], s["get"], s["ack"]) == (7, 1, 1)


def test_closed_channels_stay_counted_in_vhost_and_overview(http, node, vhost, channel):
    channel.queue_declare("c")
    for _ in range(4):
        channel.basic_publish("", "c", b"m")
    channel.connection.close()
    wait_until(lambda: not http.get(f"/api/vhosts/{q(vhost)}/channels"), 10, "channel gone")
    assert stats_of(http, f"/api/vhosts/{q(vhost)}")["publish"] == 4


def test_rates_appear_after_a_sample_interval(http, vhost, channel):
    channel.queue_declare("r")

    def publishing_rate() -> float:
        for _ in range(20):
            channel.basic_publish("", "r", b"m")
        channel.connection.process_data_events(time_limit=INTERVAL_MS / 1000)
        return stats_of(http, f"/api/vhosts/{q(vhost)}")["publish_details"]["rate"]
    wait_until(lambda: publishing_rate() > 0, 15, "a publish rate")
    for path in (f"/api/queues/{q(vhost)}/r", "/api/overview", f"/api/exchanges/{q(vhost)}/amq.default"):
        s = stats_of(http, path)
        key = "publish_in_details" if "exchanges" in path else "publish_details"
        assert isinstance(s[key]["rate"], float), (path, s)
    ov = http.get("/api/overview")
    assert ov["rates_mode"] == "basic"
    assert set(ov["queue_totals"]) >= {"messages_details", "messages_ready_details",
                                       "messages_unacknowledged_details"}


def test_sample_histories_with_lengths_and_msg_rates_age(http, vhost, channel):
    channel.queue_declare("h")
    for _ in range(5):
        channel.basic_publish("", "h", b"m")
    path = f"/api/queues/{q(vhost)}/h?lengths_age=2&lengths_incr=1&msg_rates_age=2&msg_rates_incr=1"

    def history_full() -> bool:  # three samples a second apart, all taken after the publishes
        return [s["sample"] for s in http.get(path)["messages_details"]["samples"]] == [5, 5, 5]
    wait_until(history_full, 10, "three samples one second apart")
    out = http.get(path)
    lengths = out["messages_details"]
    stamps = [s["timestamp"] for s in lengths["samples"]]
    assert stamps == sorted(stamps, reverse=True) and stamps[0] - stamps[1] == 1000 == stamps[1] - stamps[2]
    assert [s["sample"] for s in lengths["samples"]] == [5, 5, 5]
    assert lengths["avg"] == 5.0 and lengths["avg_rate"] == 0.0 and "rate" in lengths
    pub = out["message_stats"]["publish_details"]
    assert set(pub) == {"rate", "samples", "avg", "avg_rate"} and pub["samples"][0]["sample"] == 5
    ov = http.get("/api/overview?lengths_age=2&lengths_incr=1")
    assert "samples" in ov["queue_totals"]["messages_details"]


@pytest.mark.parametrize("query", ["msg_rates_age=x", "lengths_age=10&lengths_incr=0", "msg_rates_age=-5",
                                   "lengths_age=5&lengths_incr=60"])
def test_bad_history_parameters_are_a_400_with_a_reason(http, query):
    status, out = http("GET", f"/api/overview?{query}")
    assert status == 400 and out["error"] == "bad_request" and out["reason"], out


def test_churn_rates_and_node_resource_details(http, node, vhost, channel):
    before = http.get("/api/overview")["churn_rates"]
    channel.queue_declare("churn")
    extra = channel.connection.channel()
    extra.close()
    after = http.get("/api/overview")["churn_rates"]
    assert after["queue_declared"] - before["queue_declared"] == 1
    assert after["channel_created"] - before["channel_created"] == 1
    assert after["channel_closed"] - before["channel_closed"] == 1
    assert set(after) >= {"connection_created", "connection_closed", "queue_created", "queue_deleted",
                          "connection_created_details"}
    wait_until(lambda: http.get("/api/overview")["churn_rates"]["queue_created"] > before["queue_created"], 10,
               "the new queue seen by the sampler")
    [me] = http.get("/api/nodes")
    for name in ("mem_used", "fd_used", "sockets_used", "proc_used", "disk_free"):
        assert isinstance(me[name + "_details"]["rate"], float), name


def test_a_publish_through_the_api_is_counted(http, vhost, channel):
    channel.queue_declare("api")
    body = {"routing_key": "api", "payload": "m", "payload_encoding": "string", "properties": {}}
    assert http("POST", f"/api/exchanges/{q(vhost)}/amq.default/publish", body) == (200, {"routed": True})
    assert http("POST", f"/api/exchanges/{q(vhost)}/amq.direct/publish", {**body, "routing_key": "none"}) == \
        (200, {"routed": False})
    v = stats_of(http, f"/api/vhosts/{q(vhost)}")
    assert (v["publish"], v["drop_unroutable"]) == (2, 1)
    assert stats_of(http, f"/api/queues/{q(vhost)}/api")["publish"] == 1
    x = stats_of(http, f"/api/exchanges/{q(vhost)}/amq.direct")
    assert (x["publish_in"], x["publish_out"]) == (1, 0)
