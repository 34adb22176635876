"""The pure parts of operating streams: the stream registry the listings read, super stream
names and arguments, and hutch-streams' parsing of sizes and ISO 8601 durations."""

from __future__ import annotations

import pytest

from hutch.broker.streamreg import StreamRegistry, registry_of
from hutch.broker.superstreams import partition_names
from hutch.cli.http import CliError
from hutch.cli.streams import duration_s, information_unit, super_stream_arguments
from hutch.control.errors import ApiError
from hutch.control.streams import stream_arguments


def test_a_closed_connection_takes_its_publishers_and_consumers_with_it():
    reg = StreamRegistry()
    reg.add_connection("c1", {"vhost": "/", "user": "guest"})
    reg.add_connection("c2", {"vhost": "v", "user": "app"})
    pub = reg.add_publisher("c1", 1, {"stream": "s", "vhost": "/", "reference": "p"})
    pub["messages_published"] += 3  # the server updates its record in place
    reg.add_consumer("c1", 7, {"stream": "s", "vhost": "/"})
    reg.add_consumer("c2", 1, {"stream": "t", "vhost": "v"})
    assert [c["conn_name"] for c in reg.connection_list()] == ["c1", "c2"]
    assert [c["conn_name"] for c in reg.connection_list("v")] == ["c2"]
    (p,) = reg.publisher_list("/", "s")
    assert (p["publisher_id"], p["connection"], p["messages_published"], p["messages_confirmed"]) == (1, "c1", 3, 0)
    assert [c["subscription_id"] for c in reg.consumer_list(stream="s")] == [7]
    reg.remove_connection("c1")
    assert reg.publisher_list() == [] and [c["connection"] for c in reg.consumer_list()] == ["c2"]


def test_a_single_active_consumer_group_is_the_subscriptions_sharing_a_name():
    reg = StreamRegistry()
    sac = {"single-active-consumer": "true", "name": "app"}
    reg.add_consumer("c1", 0, {"stream": "s", "vhost": "/", "properties": sac, "active": True})
    reg.add_consumer("c2", 3, {"stream": "s", "vhost": "/", "properties": sac, "active": False})
    reg.add_consumer("c3", 0, {"stream": "s", "vhost": "/", "properties": {"name": "app"}})  # not in a group
    assert reg.group_consumers("/", "s", "app") == [
        {"subscription_id": 0, "connection_name": "c1", "state": "active"},
        {"subscription_id": 3, "connection_name": "c2", "state": "inactive"}]
    assert reg.group_consumers("/", "s", "other") is None


def test_the_registry_is_the_brokers_made_on_first_use():
    class Broker:
        pass
    b = Broker()
    assert registry_of(b) is registry_of(b) is b.stream_registry


def test_super_stream_partitions_from_a_number_or_binding_keys():
    assert partition_names("inv", 3, None) == (["inv-0", "inv-1", "inv-2"], ["0", "1", "2"])
    assert partition_names("geo", None, " amer, emea,,apac ") == (["geo-amer", "geo-emea", "geo-apac"],
                                                                   ["amer", "emea", "apac"])


def test_super_stream_arguments_become_the_partitions_x_arguments():
    assert stream_arguments({"max-age": "1h", "max-length-bytes": "1000"}) == {
        "x-queue-type": "stream", "x-max-age": "1h", "x-max-length-bytes": 1000,
        "x-queue-leader-locator": "balanced"}
    with pytest.raises(ApiError) as e:
        stream_arguments({"x-max-age": "1h"})
    assert e.value.status == 400 and "unknown stream argument 'x-max-age'" in e.value.reason
    with pytest.raises(ApiError):
        stream_arguments({"max-length-bytes": "lots"})


@pytest.mark.parametrize("text,n", [("1024", 1024), ("20gb", 20 * 1000 ** 3), ("50mb", 50 * 1000 ** 2),
                                    ("1GiB", 1024 ** 3), ("2k", 2048), ("7kb", 7000)])
def test_sizes_in_rabbitmq_information_units(text, n):
    assert information_unit(text) == n


@pytest.mark.parametrize("text", ["", "gb", "1.5gb", "10 zb", "-1"])
def test_what_is_not_a_size(text):
    assert information_unit(text) is None


@pytest.mark.parametrize("text,s", [("PT10M30S", 630), ("P5DT8H", 5 * 86400 + 8 * 3600), ("P1Y", 365 * 86400),
                                    ("P1M", 30 * 86400), ("PT1M", 60), ("pt45s", 45)])
def test_iso_8601_durations_in_seconds(text, s):
    assert duration_s(text) == s


@pytest.mark.parametrize("text", ["", "P", "PT", "P1DT", "10m", "PT1.5S"])
def test_what_is_not_a_duration(text):
    assert duration_s(text) is None


def test_the_options_of_add_super_stream_become_its_arguments():
    assert super_stream_arguments("1gb", "PT1H", "500mb", "random", 3) == {
        "max-length-bytes": 1000 ** 3, "max-age": "3600s", "stream-max-segment-size-bytes": 500 * 1000 ** 2,
        "queue-leader-locator": "balanced", "initial-cluster-size": 3}
    with pytest.raises(CliError) as e:
        super_stream_arguments(None, None, None, "nearest", None)
    assert e.value.exit_code == 64 and "--leader-locator" in e.value.message
