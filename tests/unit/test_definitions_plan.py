"""The definitions plan (hutch.broker.definitions): every item of a document becomes catalogue
commands or is named with the reason it cannot be imported; the export is RabbitMQ's format.

Pure tests: no node, a catalogue in memory. The integration tests
(tests/integration/test_definitions_import.py) hold the same rules against real nodes and
RabbitMQ's own exports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hutch.broker import definitions as defs
from hutch.cluster import catalogue as cat

CTL_EXPORT = Path(__file__).resolve().parents[1] / "fixtures" / "definitions" / "rabbitmq-3.10.8-rabbitmqctl.json"


def test_every_item_hutch_cannot_honour_is_named_not_only_the_first():
    doc = {"queues": [{"name": "a", "vhost": "/", "arguments": {"x-queue-type": "jms"}},
                      {"name": "b", "vhost": "/", "arguments": {}}],
           "exchanges": [{"name": "d", "vhost": "/", "type": "x-delayed-message"},
                         {"name": "h", "vhost": "/", "type": "x-consistent-hash"}],
           "parameters": [{"component": "shovel", "vhost": "/", "name": "s", "value": {}}],
           "federation_upstreams": [{"name": "x"}]}
    p = defs.plan(doc)
    assert p.unsupported == [
        "'federation_upstreams': not a part of RabbitMQ's definitions format that hutch knows",
        "runtime parameter 's' of component 'shovel' in vhost '/': component 'shovel' is not supported "
        "(hutch has no shovel plugin)",
        "queue 'a' in vhost '/': queue type 'jms' is not supported",
        "exchange 'd' in vhost '/': exchange type 'x-delayed-message' is not supported",
        "exchange 'h' in vhost '/': exchange type 'x-consistent-hash' is not supported",
    ]
    assert [type(c).__name__ for c in p.commands] == ["DeclareQueue"]
    assert p.counts == {"queues": 1}


def test_items_that_depend_on_a_skipped_one_are_skipped_by_name():
    doc = {"users": [{"name": "old", "password_hash": "x", "hashing_algorithm": "rabbit_password_hashing_md5"}],
           "permissions": [{"user": "old", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
           "queues": [{"name": "s", "vhost": "/", "arguments": {"x-queue-type": "jms"}}],
           "bindings": [{"source": "amq.topic", "vhost": "/", "destination": "s", "destination_type": "queue"}]}
    p = defs.plan(doc)
    assert p.unsupported == [
        "user 'old': password hashing algorithm 'rabbit_password_hashing_md5' is not supported (hutch verifies "
        "rabbit_password_hashing_sha256 hashes)",
        "permissions of user 'old' in vhost '/': its user 'old' is not imported",
        "queue 's' in vhost '/': queue type 'jms' is not supported",
        "binding from exchange 'amq.topic' to queue 's' in vhost '/': its destination queue 's' is not imported",
    ]
    assert p.commands == []


def test_a_part_of_an_item_is_left_out_and_named_the_rest_imported():
    p = defs.plan({"vhosts": [{"name": "v", "metadata": {"description": "d", "default_queue_type": "jms"}}]})
    assert p.commands == [cat.AddVhost("v", "d", (), "")]
    assert p.unsupported == ["vhost 'v': default queue type 'jms' is not supported"]


def test_a_vhost_default_queue_type_may_be_classic_quorum_or_stream():
    types = ("classic", "quorum", "stream")
    p = defs.plan({"vhosts": [{"name": t, "metadata": {"default_queue_type": t}} for t in types]})
    assert p.commands == [cat.AddVhost(t, "", (), t) for t in types]
    assert p.problems == []


def test_a_stream_in_rabbitmqs_export_is_planned_as_a_stream_with_its_arguments():
    p = defs.plan(json.loads(CTL_EXPORT.read_text()))
    streams = [c for c in p.commands if isinstance(c, cat.DeclareQueue) and c.type == cat.STREAM]
    assert [(c.vhost, c.name, c.durable, c.auto_delete, c.arguments) for c in streams] == [
        ("shop", "events-log", True, False, {"x-max-age": "7D", "x-queue-type": "stream"})]
    assert ("shop", "events", "queue", "events-log") in {
        (c.vhost, c.source, c.destination_type, c.destination) for c in p.commands if isinstance(c, cat.Bind)}
    assert p.counts["queues"] == 7
    assert p.unsupported == ["runtime parameter 'origin' of component 'federation-upstream' in vhost 'shop': "
                             "component 'federation-upstream' is not supported (hutch has no federation-upstream "
                             "plugin)"]


def test_a_stream_a_declare_would_refuse_is_malformed_with_rabbitmqs_text():
    def stream(name, durable=True, **args):
        return {"name": name, "vhost": "/", "durable": durable, "arguments": {"x-queue-type": "stream", **args}}

    p = defs.plan({"queues": [stream("age", **{"x-max-age": "7X"}), stream("len", **{"x-max-length": 5}),
                              stream("transient", durable=False), stream("ok", **{"x-max-age": "1h"})]})
    assert p.malformed == [
        "queue 'age' in vhost '/': invalid arg 'x-max-age' for queue 'age' in vhost '/': invalid_max_age",
        "queue 'len' in vhost '/': invalid arg 'x-max-length' for queue 'len' in vhost '/' of queue type "
        "rabbit_stream_queue",
        "queue 'transient' in vhost '/': invalid property 'non-durable' for queue 'transient' in vhost '/'"]
    assert [(c.name, c.type) for c in p.commands] == [("ok", cat.STREAM)]


def test_a_limit_hutch_does_not_enforce_is_left_out_of_its_user_by_name():
    p = defs.plan({"users": [{"name": "u", "password_hash": "h", "limits": {"max-connections": 3, "max-bogus": 1}}],
                   "permissions": [{"user": "u", "vhost": "/", "configure": "", "write": "", "read": ""}]})
    assert p.commands == [cat.PutUser("u", "h", ()), cat.SetUserLimits("u", {"max-connections": 3}),
                          cat.SetPermissions("u", "/", "", "", "")]
    assert p.unsupported == ["user 'u': user limit 'max-bogus' is not supported (only max-channels, max-connections)"]


def test_malformed_items_are_listed_and_documents_that_are_not_definitions_raise():
    p = defs.plan({"queues": [{"vhost": "/"}, "q", {"name": "ok", "vhost": "/", "durable": "yes"}]})
    assert p.malformed == ["queue '?' in vhost '/': 'name' is missing",
                           "queue '?' in vhost '?': not a JSON object: 'q'",
                           "queue 'ok' in vhost '/': 'durable' has the wrong type: 'yes'"]
    with pytest.raises(defs.DefinitionsError):
        defs.plan([])
    with pytest.raises(defs.DefinitionsError):
        defs.plan({"queues": {}})


def test_rabbitmqctl_pairs_and_metadata_forms_are_read():
    doc = json.loads(CTL_EXPORT.read_text())
    p = defs.plan(doc)
    vhosts = {c.name: c for c in p.commands if isinstance(c, cat.AddVhost)}
    assert vhosts["billing"] == cat.AddVhost("billing", "invoices", ("finance",), "quorum")
    ops = [c for c in p.commands if type(c).__name__ == "SetOperatorPolicy"]
    assert [(c.name, c.definition) for c in ops] == [("cap-length", {"max-length": 100000})]
    # the vhost's limits are in the parameters too: planned once
    limits = [c for c in p.commands if isinstance(c, cat.SetParameter) and c.component == cat.VHOST_LIMITS]
    assert [(c.vhost, c.value) for c in limits] == [("shop", {"max-connections": 100, "max-queues": 500})]


def test_a_new_kind_plugs_in_before_the_queues():
    kinds = list(defs.KINDS)
    try:
        defs.register(defs.Kind("widgets", "widgets", lambda w: f"widget '{w.get('name')}'",
                                lambda w, ctx: [cat.SetGlobalParameter("widget-" + w["name"], 1)]))
        keys = [k.key for k in defs.KINDS]
        assert keys.index("widgets") == keys.index("queues") - 1
        p = defs.plan({"widgets": [{"name": "w"}]})
        assert p.commands == [cat.SetGlobalParameter("widget-w", 1)] and p.unsupported == []
    finally:
        defs.KINDS[:] = kinds


def test_export_is_rabbitmqs_format_and_plans_back_to_the_same_catalogue():
    c = cat.Catalogue()
    for cmd in (cat.AddVhost("/"), cat.AddVhost("v", "desc", ("a",), "quorum"),
                cat.PutUser("u", "hash", ("administrator",)),
                cat.SetPermissions("u", "v", ".*", "", "^r"),
                cat.SetGlobalParameter("cluster_name", "c1"), cat.SetGlobalParameter("hutch_initialised", True),
                cat.DeclareExchange("v", "x", "topic"), cat.DeclareQueue("v", "q", "quorum", arguments={}),
                cat.Bind("v", "x", cat.QUEUE, "q", "k.#"),
                cat.SetPolicy("v", "p", "^q$", "queues", 1, {"max-length": 5})):
        assert c.apply(cmd).code == cat.OK, cmd
    doc = defs.export(c, "9.9")
    assert list(doc) == ["rabbit_version", "rabbitmq_version", "product_name", "product_version", "users",
                         "vhosts", "permissions", "topic_permissions", "parameters", "global_parameters",
                         "policies", "queues", "exchanges", "bindings"]
    assert {"name": "v", "limits": [], "metadata": {"description": "desc", "tags": ["a"],
                                                   "default_queue_type": "quorum"}} in doc["vhosts"]
    assert doc["global_parameters"] == [{"name": "cluster_name", "value": "c1"}]  # not the cluster's own
    assert doc["queues"] == [{"name": "q", "vhost": "v", "durable": True, "auto_delete": False,
                              "arguments": {"x-queue-type": "quorum"}}]
    p = defs.plan(json.loads(json.dumps(doc)))
    assert p.problems == []
    again = cat.Catalogue()
    for cmd in p.commands:
        assert again.apply(cmd).code == cat.OK, cmd
    assert defs.export(again, "9.9") == doc


def test_a_per_vhost_document_gets_the_vhost_and_cannot_carry_users():
    doc = defs.scoped({"queues": [{"name": "a"}], "users": [{"name": "u"}], "rabbit_version": "3.10.8"}, "v")
    assert doc["queues"] == [{"name": "a", "vhost": "v"}]
    p = defs.plan(doc)
    assert p.unsupported == ["'users (in a definitions document for one vhost)': not a part of RabbitMQ's "
                             "definitions format that hutch knows"]
