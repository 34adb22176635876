"""The Spark connector's pure parts (hutch.pipeline.connector.offsets and .options, and how a row
becomes a stream message): what the options mean, how offsets are resolved, shared under a read
limit and cut into Spark partitions. No Spark, no node: the connector against a node is tests/pipeline/test_connector.py."""

from __future__ import annotations

import re

import pytest

from hutch.pipeline.connector.offsets import Partition, limit_ends, resolve_offsets, split_ranges
from hutch.pipeline.connector.options import (
    ConnectorError,
    Start,
    parse_offsets,
    sink_options,
    source_options,
)
from hutch.streamclient import StreamEndpoint


def test_stream_uris_and_amqp_uris_name_the_stream_port():
    assert StreamEndpoint.from_uri("hutch-stream://u:p@h:6000/v", amqp=True) == StreamEndpoint("h", 6000, "u", "p", "v")
    assert StreamEndpoint.from_uri("amqp://u:p@h:5672/%2F", amqp=True) == StreamEndpoint("h", 5552, "u", "p", "/")
    assert StreamEndpoint.from_uri("amqp://h:5672?stream_port=7000", amqp=True).port == 7000
    with pytest.raises(ValueError, match="rabbitmq-stream"):
        StreamEndpoint.from_uri("amqp://h")  # hutch perf's stream mode takes stream URIs only


def test_source_options_are_read_in_any_case_and_checked():
    o = source_options({"URI": "hutch-stream://h:1,hutch-stream://g:2", "stream": "s",
                        "MaxMessagesPerTrigger": "10"})
    assert [(e.host, e.port) for e in o.endpoints] == [("h", 1), ("g", 2)]
    assert (o.max_per_trigger, o.consumer_name, o.starting) == (10, "spark-s", None)
    with pytest.raises(ConnectorError, match="exactly one of the options stream"):
        source_options({"uri": "hutch-stream://h", "stream": "s", "queue": "q"})
    with pytest.raises(ConnectorError, match="give an amqp:// URI"):
        source_options({"uri": "hutch-stream://h", "queue": "q"})
    with pytest.raises(ConnectorError, match="option uri is required"):
        source_options({"stream": "s"})
    with pytest.raises(ConnectorError, match="not within 1..1024"):
        source_options({"uri": "hutch-stream://h", "stream": "s", "minPartitions": "0"})


def test_starting_offsets_are_words_timestamps_or_json_per_partition():
    allowed = ("earliest", "latest", "timestamp")
    assert parse_offsets("o", "earliest", allowed) == Start("earliest")
    assert parse_offsets("o", "2026-01-01T00:00:00Z", allowed) == Start("timestamp", 1767225600000)
    assert parse_offsets("o", '{"a": 5, "b": "latest"}', allowed) == {"a": Start("offset", 5), "b": Start("latest")}
    for bad, text in (("soonest", "'soonest' is not earliest | latest | an ISO-8601 timestamp"),
                      ('{"a": -1}', "not an offset"), ("{nope", "not valid JSON"), ("{}", "must map")):
        with pytest.raises(ConnectorError, match=re.escape(text)):
            parse_offsets("o", bad, allowed)


def test_the_sink_names_its_publishers_after_the_checkpoint():
    a = sink_options({"uri": "hutch-stream://h", "stream": "s", "checkpointLocation": "/cp/a"})
    b = sink_options({"uri": "hutch-stream://h", "stream": "s", "checkpointLocation": "/cp/b"})
    assert a.producer_name.startswith("spark-") and a.producer_name != b.producer_name
    assert sink_options({"uri": "hutch-stream://h", "stream": "s", "producerName": "p"}).producer_name == "p"
    with pytest.raises(ConnectorError, match="exactly one of the options stream and exchange"):
        sink_options({"uri": "amqp://h", "stream": "s", "exchange": "x"})


def test_offsets_resolve_per_partition_and_refuse_one_past_the_end():
    parts = [Partition("p-0", 0), Partition("p-1", 1)]
    bounds = {"p-0": (0, 10), "p-1": (5, 8)}
    assert resolve_offsets(Start("earliest"), parts, bounds, "startingOffsets") == {"p-0": 0, "p-1": 5}
    assert resolve_offsets(Start("latest"), parts, bounds, "startingOffsets") == {"p-0": 10, "p-1": 8}
    assert resolve_offsets({"p-1": Start("offset", 2)}, parts, bounds, "startingOffsets") == {"p-0": 0, "p-1": 5}
    with pytest.raises(ConnectorError, match="offset 9 of stream 'p-1' is past its end"):
        resolve_offsets({"p-1": Start("offset", 9)}, parts, bounds, "startingOffsets")
    with pytest.raises(ConnectorError, match="p-9 is not a stream this source reads"):
        resolve_offsets({"p-9": Start("offset", 0)}, parts, bounds, "startingOffsets")


def test_a_read_limit_is_shared_fairly_among_partitions():
    starts = {"a": 0, "b": 0, "c": 0}
    latest = {"a": 100, "b": 3, "c": 100}
    assert limit_ends(starts, latest, None) == latest
    ends = limit_ends(starts, latest, 50)
    assert sum(ends.values()) == 50 and ends["b"] == 3 and abs(ends["a"] - ends["c"]) <= 1
    assert limit_ends({"a": 7}, {"a": 5}, 10) == {"a": 7}  # never backwards


def test_ranges_are_cut_into_at_least_min_partitions():
    parts = [Partition("a", 0), Partition("b", 1)]
    assert split_ranges(parts, {"a": 0, "b": 4}, {"a": 10, "b": 4}, 1) == [("a", 0, 0, 10)]
    cut = split_ranges(parts, {"a": 0, "b": 0}, {"a": 10, "b": 1}, 4)
    assert [r for r in cut if r[0] == "a"] == [("a", 0, 0, 5), ("a", 0, 5, 10)]
    assert [r for r in cut if r[0] == "b"] == [("b", 1, 0, 1)]  # one record: one piece


def test_a_row_is_the_message_the_generic_encoder_makes_and_decodes_back():
    from hutch.pipeline.connector.streams import message_of
    from hutch.streamproto import amqp10

    ann = {amqp10.Symbol("x-exchange"): "", amqp10.Symbol("x-routing-key"): "k.é"}
    for body in (b"", b"x", b"y" * 255, b"z" * 256, b"w" * 70_000):
        assert message_of(body, None, None) == amqp10.Message(body).encode()
        row = message_of(body, "k.é", None)
        assert row == amqp10.Message(body, message_annotations=ann).encode()
        m = amqp10.Message.decode(row)
        assert m.body == body and m.message_annotations["x-routing-key"] == "k.é"
    m = amqp10.Message.decode(message_of(b"b", "k", {"a": "1"}))
    assert m.application_properties == {"a": "1"} and m.message_annotations["x-routing-key"] == "k"
