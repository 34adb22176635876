"""The cluster catalogue (`hutch.cluster.catalogue`): each command's effect and its errors with
RabbitMQ's reply codes and texts, the equivalence rules of redeclares, determinism across
replicas, snapshots and the definitions document."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hutch.cluster import catalogue as c
from hutch.cluster.catalogue import (
    ABSENT,
    CREATED,
    DELETED,
    EXISTED,
    UPDATED,
    AddVhost,
    Bind,
    Catalogue,
    CatalogueError,
    CheckQueueLeader,
    ClearGlobalParameter,
    ClearParameter,
    ClearPermissions,
    ClearPolicy,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    DeleteUser,
    DeleteVhost,
    PutUser,
    SetGlobalParameter,
    SetParameter,
    SetPermissions,
    SetPolicy,
    SetQueueNodes,
    Unbind,
)


def cat(*cmds) -> Catalogue:
    k = Catalogue()
    k.apply(AddVhost("/"))
    for cmd in cmds:
        r = k.apply(cmd)
        assert r.ok, r
    return k


# ---- vhosts, users, permissions --------------------------------------------------------------


def test_a_new_vhost_has_the_default_exchanges():
    k = cat()
    assert {x.name for x in k.exchanges.values()} == {"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers",
                                                      "amq.match"}
    assert k.exchange("/", "amq.topic").type == "topic" and k.exchange("/", "amq.topic").durable


def test_adding_a_vhost_twice_reports_it_existed():
    k = cat()
    assert k.apply(AddVhost("/")).status == EXISTED
    assert k.apply(AddVhost("/", description="main")).status == UPDATED


def test_deleting_a_vhost_deletes_everything_in_it():
    k = cat(AddVhost("other"), PutUser("bob", "h"), SetPermissions("bob", "/", ".*", ".*", ".*"),
            DeclareExchange("/", "x", "fanout"), DeclareQueue("/", "q"), Bind("/", "x", "queue", "q"),
            SetPolicy("/", "p", ".*", definition={"ha-mode": "all"}), SetParameter("shovel", "/", "s", {"a": 1}),
            DeclareQueue("other", "q"))
    r = k.apply(DeleteVhost("/"))
    assert (r.status, r.bindings_deleted) == (DELETED, 1)
    assert "/" not in k.vhosts and not k.permissions and not k.policies and not k.parameters
    assert list(k.queues) == [("other", "q")] and all(v == "other" for v, _ in k.exchanges)
    assert k.apply(DeleteVhost("/")).status == ABSENT


def test_users_are_put_and_deleted_with_their_permissions():
    k = cat()
    assert k.apply(PutUser("bob", "h1", ("administrator",))).status == CREATED
    assert k.apply(PutUser("bob", "h1", ("administrator",))).status == EXISTED
    assert k.apply(PutUser("bob", "h2", ())).status == UPDATED
    assert k.apply(SetPermissions("bob", "/", "^amq", "", ".*")).status == CREATED
    assert k.apply(DeleteUser("bob")).status == DELETED
    assert not k.permissions and k.apply(DeleteUser("bob")).status == ABSENT


def test_permissions_need_a_user_a_vhost_and_valid_regular_expressions():
    k = cat(PutUser("bob", "h"))
    r = k.apply(SetPermissions("alice", "/", ".*", ".*", ".*"))
    assert (r.code, r.text) == (404, "user 'alice' not found")
    r = k.apply(SetPermissions("bob", "nope", ".*", ".*", ".*"))
    assert (r.code, r.text) == (404, "vhost 'nope' not found")
    r = k.apply(SetPermissions("bob", "/", "(", ".*", ".*"))
    assert r.code == 406 and r.text.startswith("configure permission '(' is not a valid regular expression")
    assert k.apply(SetPermissions("bob", "/", ".*", ".*", ".*")).ok
    assert k.apply(ClearPermissions("bob", "/")).status == DELETED
    assert k.apply(ClearPermissions("bob", "/")).status == ABSENT


# ---- exchanges --------------------------------------------------------------------------------


def test_redeclaring_an_exchange_with_another_type_is_406_with_rabbitmqs_text():
    k = cat(DeclareExchange("/", "x", "direct"))
    r = k.apply(DeclareExchange("/", "x", "fanout"))
    assert (r.status, r.code) == (c.ERROR, 406)
    assert r.text == "inequivalent arg 'type' for exchange 'x' in vhost '/': received 'fanout' but current is 'direct'"


@pytest.mark.parametrize("field,text", [
    ({"durable": False}, "inequivalent arg 'durable' for exchange 'x' in vhost '/': received 'false' but current "
                         "is 'true'"),
    ({"auto_delete": True}, "inequivalent arg 'auto_delete' for exchange 'x' in vhost '/': received 'true' but "
                            "current is 'false'"),
    ({"internal": True}, "inequivalent arg 'internal' for exchange 'x' in vhost '/': received 'true' but current "
                         "is 'false'"),
    ({"arguments": {"alternate-exchange": "ae2"}}, "inequivalent arg 'alternate-exchange' for exchange 'x' in "
                                                   "vhost '/': received 'ae2' but current is 'ae'"),
    ({"arguments": {}}, "inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': received none but "
                        "current is the value 'ae' of type 'longstr'"),
])
def test_redeclaring_an_exchange_checks_durable_auto_delete_internal_and_alternate_exchange(field, text):
    k = cat(DeclareExchange("/", "x", "direct", arguments={"alternate-exchange": "ae"}))
    args = {"vhost": "/", "name": "x", "type": "direct", "arguments": {"alternate-exchange": "ae"}} | field
    r = k.apply(DeclareExchange(**args))
    assert (r.code, r.text) == (406, text)


def test_an_equivalent_redeclare_reports_existed_and_other_arguments_are_not_compared():
    k = cat(DeclareExchange("/", "x", "topic", arguments={"x-custom": 1}))
    r = k.apply(DeclareExchange("/", "x", "topic", arguments={"x-custom": 2}))
    assert (r.status, r.code) == (EXISTED, 200)
    assert k.exchange("/", "x").arguments == {"x-custom": 1}


def test_the_default_exchange_cannot_be_declared_deleted_or_bound():
    k = cat(DeclareQueue("/", "q"))
    for cmd in (DeclareExchange("/", "", "direct"), DeleteExchange("/", ""), Bind("/", "", "queue", "q")):
        r = k.apply(cmd)
        assert (r.code, r.text) == (403, "operation not permitted on the default exchange")


def test_declaring_in_a_missing_vhost_is_404():
    r = Catalogue().apply(DeclareExchange("nope", "x", "direct"))
    assert (r.code, r.text) == (404, "vhost 'nope' not found")


def test_deleting_an_exchange_in_use_with_if_unused_is_406_and_otherwise_takes_its_bindings():
    k = cat(DeclareExchange("/", "x", "direct"), DeclareQueue("/", "q"), Bind("/", "x", "queue", "q", "k"),
            DeclareExchange("/", "y", "fanout"), Bind("/", "y", "exchange", "x"))
    r = k.apply(DeleteExchange("/", "x", if_unused=True))
    assert (r.code, r.text) == (406, "exchange 'x' in vhost '/' in use")
    r = k.apply(DeleteExchange("/", "x"))
    assert (r.status, r.bindings_deleted) == (DELETED, 2)  # x -> q, and y -> x
    assert not k.bindings and k.apply(DeleteExchange("/", "x")).status == ABSENT


# ---- bindings ---------------------------------------------------------------------------------


def test_binding_needs_both_ends_and_is_idempotent():
    k = cat(DeclareExchange("/", "x", "topic"), DeclareQueue("/", "q"))
    assert k.apply(Bind("/", "x", "queue", "nope", "k")).text == "no queue 'nope' in vhost '/'"
    assert k.apply(Bind("/", "nope", "queue", "q", "k")).text == "no exchange 'nope' in vhost '/'"
    assert k.apply(Bind("/", "x", "exchange", "nope")).code == 404
    assert k.apply(Bind("/", "x", "queue", "q", "a.#", {"b": 1, "a": 2})).status == CREATED
    assert k.apply(Bind("/", "x", "queue", "q", "a.#", {"a": 2, "b": 1})).status == EXISTED  # same table
    assert k.apply(Bind("/", "x", "queue", "q", "a.#", {"a": 3})).status == CREATED  # other arguments
    assert len(k.bindings_from("/", "x")) == 2 and len(k.bindings_to("/", "queue", "q")) == 2
    assert k.apply(Unbind("/", "x", "queue", "q", "a.#", {"a": 3})).status == DELETED
    assert k.apply(Unbind("/", "x", "queue", "q", "a.#", {"a": 3})).status == ABSENT


def test_an_auto_delete_exchange_goes_with_its_last_binding_and_the_deletion_cascades():
    k = cat(DeclareExchange("/", "outer", "fanout", auto_delete=True),
            DeclareExchange("/", "inner", "fanout", auto_delete=True),
            DeclareQueue("/", "q"), Bind("/", "outer", "exchange", "inner"), Bind("/", "inner", "queue", "q"))
    r = k.apply(DeleteQueue("/", "q"))
    assert r.exchanges_deleted == ("inner", "outer") and r.bindings_deleted == 1
    assert k.exchange("/", "inner") is None and k.exchange("/", "outer") is None and not k.bindings


def test_unbinding_the_last_binding_of_an_auto_delete_exchange_deletes_it():
    k = cat(DeclareExchange("/", "x", "direct", auto_delete=True), DeclareQueue("/", "q"),
            Bind("/", "x", "queue", "q", "a"), Bind("/", "x", "queue", "q", "b"))
    assert k.apply(Unbind("/", "x", "queue", "q", "a")).exchanges_deleted == ()
    assert k.apply(Unbind("/", "x", "queue", "q", "b")).exchanges_deleted == ("x",)


# ---- queues -----------------------------------------------------------------------------------


def test_declaring_a_queue_records_its_type_nodes_and_journal_id():
    k = cat()
    r = k.apply(DeclareQueue("/", "qq", "quorum", arguments={"x-queue-type": "quorum"}, leader_node="n1",
                             member_nodes=("n1", "n2", "n3"), journal_id=42))
    assert r.status == CREATED and r.queue == k.queue("/", "qq")
    assert (r.queue.type, r.queue.leader_node, r.queue.member_nodes, r.queue.journal_id) == (
        "quorum", "n1", ("n1", "n2", "n3"), 42)
    again = k.apply(DeclareQueue("/", "qq", "quorum", arguments={"x-queue-type": "quorum"}, journal_id=43))
    assert again.status == EXISTED and again.queue.journal_id == 42  # the existing record wins


@pytest.mark.parametrize("redeclare,text", [
    ({"durable": False}, "inequivalent arg 'durable' for queue 'q' in vhost '/': received 'false' but current is "
                         "'true'"),
    ({"auto_delete": True}, "inequivalent arg 'auto_delete' for queue 'q' in vhost '/': received 'true' but "
                            "current is 'false'"),
    ({"arguments": {"x-max-length": 20}}, "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received "
                                          "'20' but current is '10'"),
    ({"arguments": {}}, "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received none but current is "
                        "the value '10' of type 'signedint'"),
    # RabbitMQ 3.10.8 shows both values bare when both are present, whatever their types
    ({"arguments": {"x-max-length": "10"}}, "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received "
                                            "'10' but current is '10'"),
    ({"arguments": {"x-max-length": 10, "x-queue-type": "quorum"}, "type": "quorum"},
     "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received the value 'quorum' of type 'longstr' "
     "but current is none"),
])
def test_redeclaring_a_queue_checks_durable_auto_delete_and_the_compared_arguments(redeclare, text):
    k = cat(DeclareQueue("/", "q", arguments={"x-max-length": 10}))
    r = k.apply(DeclareQueue(**({"vhost": "/", "name": "q", "arguments": {"x-max-length": 10}} | redeclare)))
    assert (r.code, r.text) == (406, text)


def test_uncompared_queue_arguments_may_differ_on_redeclare():
    k = cat(DeclareQueue("/", "q", arguments={"x-custom": 1}))
    assert k.apply(DeclareQueue("/", "q", arguments={"x-custom": 2})).status == EXISTED


def test_an_exclusive_queue_of_another_owner_is_405_resource_locked():
    k = cat(DeclareQueue("/", "q", durable=False, exclusive_owner="n1/conn-7"))
    text = ("cannot obtain exclusive access to locked queue 'q' in vhost '/'. It could be originally declared on "
            "another connection or the exclusive property value does not match that of the original declaration.")
    for owner in ("n2/conn-1", None):
        r = k.apply(DeclareQueue("/", "q", durable=False, exclusive_owner=owner))
        assert (r.code, r.text) == (405, text)
    assert k.apply(DeclareQueue("/", "q", durable=False, exclusive_owner="n1/conn-7")).status == EXISTED
    k2 = cat(DeclareQueue("/", "shared"))
    assert k2.apply(DeclareQueue("/", "shared", exclusive_owner="n1/conn-1")).code == 405


def test_deleting_a_queue_deletes_its_bindings():
    k = cat(DeclareExchange("/", "x", "direct"), DeclareQueue("/", "q"), DeclareQueue("/", "r"),
            Bind("/", "x", "queue", "q", "a"), Bind("/", "amq.topic", "queue", "q", "#"), Bind("/", "x", "queue", "r"))
    r = k.apply(DeleteQueue("/", "q"))
    assert (r.status, r.bindings_deleted) == (DELETED, 2)
    assert [b.destination for b in k.bindings.values()] == ["r"]
    assert k.apply(DeleteQueue("/", "q")).status == ABSENT


def test_queue_nodes_move_on_promotion():
    k = cat(DeclareQueue("/", "q", leader_node="n1", member_nodes=("n2", "n3")))
    r = k.apply(SetQueueNodes("/", "q", "n2", ("n3",)))
    assert r.status == UPDATED and (k.queue("/", "q").leader_node, k.queue("/", "q").member_nodes) == ("n2", ("n3",))
    assert k.apply(SetQueueNodes("/", "nope", "n2")).code == 404


def test_check_queue_leader_changes_nothing_and_succeeds_only_for_the_leader():
    k = cat(DeclareQueue("/", "q", leader_node="n1", member_nodes=("n2",)))
    before = k.snapshot()
    assert k.apply(CheckQueueLeader("/", "q", "n1")).ok
    r = k.apply(CheckQueueLeader("/", "q", "n2"))
    assert r.code == 406 and "led by n1, not n2" in r.text
    assert k.apply(CheckQueueLeader("/", "nope", "n1")).code == 404
    assert k.snapshot() == before
    assert c.decode_command(c.encode_command(CheckQueueLeader("/", "q", "n1"))) == CheckQueueLeader("/", "q", "n1")


def test_a_leader_fences_a_dead_synchronised_mirror_so_that_it_cannot_be_promoted_as_synchronised():
    """A mirror the leader declared dead still takes itself for synchronised (its last view says
    so) while the leader confirms what it lacks: once fenced, its promotion is refused where only
    a synchronised mirror may take over, until a leader sees a mirror there synchronised again."""
    k = cat(DeclareQueue("/", "q", leader_node="n1", member_nodes=("n2", "n3")))
    assert k.apply(CheckQueueLeader("/", "q", "n2", fence=("n2",))).code == 406  # only the leader fences
    assert k.queue("/", "q").fenced_nodes == ()
    r = k.apply(CheckQueueLeader("/", "q", "n1", fence=("n2",)))
    assert r.status == UPDATED and k.queue("/", "q").fenced_nodes == ("n2",)
    refused = k.apply(SetQueueNodes("/", "q", "n2", ("n3",), expect_leader="n1", promotion=True,
                                    synchronised_only=True))
    assert refused.code == 406 and "the mirror on n2 is not synchronised" in refused.text
    assert k.queue("/", "q").leader_node == "n1"
    # an unfenced mirror may take over, and the fence stays on the other node
    assert k.apply(SetQueueNodes("/", "q", "n3", ("n2",), expect_leader="n1", promotion=True,
                                 synchronised_only=True)).ok
    assert (k.queue("/", "q").leader_node, k.queue("/", "q").fenced_nodes) == ("n3", ("n2",))
    # the new leader sees n2's mirror synchronised again: unfenced
    assert k.apply(CheckQueueLeader("/", "q", "n3", unfence=("n2",))).ok
    assert k.queue("/", "q").fenced_nodes == ()
    cmd = CheckQueueLeader("/", "q", "n1", fence=("n2",), unfence=("n3",))
    assert c.decode_command(c.encode_command(cmd)) == cmd


def test_a_fenced_mirror_may_still_be_promoted_where_any_mirror_may_be():
    """ha-promote-on-failure: always: a fenced mirror takes over (what it lacks is lost, as
    RabbitMQ documents) and its node is no longer fenced: it leads."""
    k = cat(DeclareQueue("/", "q", leader_node="n1", member_nodes=("n2",)))
    k.apply(CheckQueueLeader("/", "q", "n1", fence=("n2",)))
    assert k.apply(SetQueueNodes("/", "q", "n2", (), expect_leader="n1", promotion=True)).ok
    assert (k.queue("/", "q").leader_node, k.queue("/", "q").fenced_nodes) == ("n2", ())


def test_unknown_queue_type_is_refused():
    r = cat().apply(DeclareQueue("/", "q", "nosuchtype"))
    assert r.code == 406 and "unknown queue type 'nosuchtype'" in r.text


# ---- policies and parameters ------------------------------------------------------------------


def test_policies_are_validated_and_the_highest_priority_match_applies():
    k = cat()
    assert k.apply(SetPolicy("/", "bad", "(", definition={"ha-mode": "all"})).code == 406
    assert k.apply(SetPolicy("/", "bad", ".*", apply_to="bogus", definition={"ha-mode": "all"})).code == 406
    assert k.apply(SetPolicy("/", "bad", ".*", definition={})).code == 406
    assert k.apply(SetPolicy("/", "all", ".*", "queues", 0, {"ha-mode": "all"})).status == CREATED
    assert k.apply(SetPolicy("/", "two", "^ha\\.", "queues", 5, {"ha-mode": "exactly", "ha-params": 2})).ok
    assert k.apply(SetPolicy("/", "xs", ".*", "exchanges", 9, {"alternate-exchange": "ae"})).ok
    assert k.policy_for("/", "ha.q1", c.QUEUE).name == "two"
    assert k.policy_for("/", "plain", c.QUEUE).name == "all"
    assert k.policy_for("/", "ha.x", c.EXCHANGE).name == "xs"
    assert k.apply(SetPolicy("/", "all", ".*", "queues", 0, {"ha-mode": "all"})).status == EXISTED
    assert k.apply(ClearPolicy("/", "two")).status == DELETED
    assert k.policy_for("/", "ha.q1", c.QUEUE).name == "all"
    assert k.apply(ClearPolicy("/", "two")).status == ABSENT


def test_runtime_and_global_parameters_are_set_and_cleared():
    k = cat()
    assert k.apply(SetParameter("federation-upstream", "/", "up", {"uri": "amqp://h"})).status == CREATED
    assert k.apply(SetParameter("federation-upstream", "/", "up", {"uri": "amqp://g"})).status == UPDATED
    assert k.apply(SetParameter("federation-upstream", "nope", "up", 1)).code == 404
    assert k.apply(ClearParameter("federation-upstream", "/", "up")).status == DELETED
    assert k.apply(SetGlobalParameter("cluster_name", "rabbit@a")).status == CREATED
    assert k.apply(ClearGlobalParameter("cluster_name")).status == DELETED
    assert k.apply(ClearGlobalParameter("cluster_name")).status == ABSENT


# ---- determinism, snapshots, definitions -------------------------------------------------------

SAMPLE = [
    AddVhost("/"), AddVhost("dev", "for developers", ("test",)), PutUser("bob", "hash==", ("monitoring",)),
    SetPermissions("bob", "dev", ".*", "^amq", ".*"), DeclareExchange("/", "logs", "topic"),
    DeclareExchange("/", "ae", "fanout", arguments={"x-x": [1, "a"]}),
    DeclareExchange("/", "tmp", "direct", durable=False),
    DeclareQueue("/", "q1", arguments={"x-max-length": 5, "x-dead-letter-exchange": "ae"}, leader_node="n1",
                 journal_id=1),
    DeclareQueue("/", "qq", "quorum", arguments={"x-queue-type": "quorum"}, leader_node="n2",
                 member_nodes=("n1", "n2", "n3"), journal_id=2),
    DeclareQueue("/", "transient", durable=False, journal_id=3),
    DeclareQueue("/", "mine", durable=False, exclusive_owner="n1/c1", journal_id=4),
    Bind("/", "logs", "queue", "q1", "*.error"), Bind("/", "logs", "exchange", "ae", "#", {"k": b"v"}),
    Bind("/", "ae", "queue", "qq"), Bind("/", "tmp", "queue", "q1"), Bind("/", "logs", "queue", "mine"),
    SetPolicy("/", "ha", "^q", "queues", 1, {"ha-mode": "exactly", "ha-params": 2}),
    SetParameter("shovel", "/", "s1", {"src-uri": "amqp://"}), SetGlobalParameter("cluster_name", "hutch@x"),
]


def sample() -> Catalogue:
    k = Catalogue()
    for cmd in SAMPLE:
        assert k.apply(cmd).ok, cmd
    return k


def test_commands_survive_their_msgpack_encoding():
    for cmd in SAMPLE:
        assert c.decode_command(c.encode_command(cmd)) == cmd


def test_snapshot_restore_round_trip_gives_the_same_state_and_bytes():
    k = sample()
    copy = Catalogue.from_snapshot(k.snapshot())
    assert copy.snapshot() == k.snapshot()
    assert copy.queues == k.queues and copy.bindings == k.bindings and copy.policies == k.policies
    # the restored copy keeps applying commands exactly like the original
    for cmd in (DeleteQueue("/", "q1"), DeleteExchange("/", "ae", if_unused=True), Unbind("/", "ae", "queue", "qq")):
        assert copy.apply(cmd) == k.apply(cmd)
    assert copy.snapshot() == k.snapshot()


def test_a_snapshot_that_is_not_one_is_refused():
    with pytest.raises(CatalogueError):
        Catalogue().restore(b"\x93\x01\x02\x03")


def test_definitions_export_has_rabbitmqs_shape_and_leaves_out_exclusive_and_system_things():
    doc = sample().to_definitions()
    json.dumps(doc)  # JSON-ready
    assert {"rabbit_version", "users", "vhosts", "permissions", "topic_permissions", "parameters",
            "global_parameters", "policies", "queues", "exchanges", "bindings"} <= set(doc)
    assert [q["name"] for q in doc["queues"]] == ["q1", "qq", "transient"]
    assert [x["name"] for x in doc["exchanges"]] == ["ae", "logs", "tmp"]
    assert all(b["destination"] != "mine" for b in doc["bindings"])
    assert doc["policies"] == [{"vhost": "/", "name": "ha", "pattern": "^q", "apply-to": "queues",
                                "definition": {"ha-mode": "exactly", "ha-params": 2}, "priority": 1}]
    assert doc["users"][0] == {"name": "bob", "password_hash": "hash==", "hashing_algorithm": c.HASHING_SHA256,
                               "tags": ["monitoring"], "limits": {}}
    durable = sample().to_definitions(durable_only=True)
    assert [q["name"] for q in durable["queues"]] == ["q1", "qq"]
    assert all(b["source"] != "tmp" for b in durable["bindings"])


def test_definitions_round_trip_through_the_import_commands():
    k = sample()
    doc = json.loads(json.dumps(k.to_definitions(internal=True)))
    commands = c.from_definitions(doc, home_node="n9")
    k2 = Catalogue()
    for cmd in commands:
        assert k2.apply(cmd).ok, cmd
    assert k2.to_definitions(internal=True) == doc
    assert k2.queue("/", "qq").type == "quorum" and k2.queue("/", "q1").journal_id == 1


def test_importing_definitions_checks_the_whole_document_first():
    with pytest.raises(CatalogueError):
        c.from_definitions({"queues": [{"vhost": "/"}]})
    with pytest.raises(CatalogueError):
        c.from_definitions({"users": [{"name": "u", "password": "p"}]})  # no hasher given
    cmds = c.from_definitions({"users": [{"name": "u", "password": "p", "tags": "a,b"}]},
                              hash_password=lambda p: "H" + p)
    assert cmds == [PutUser("u", "Hp", ("a", "b"))]
    queue_cmds = c.from_definitions({"queues": [{"vhost": "/", "name": "a"}, {"vhost": "/", "name": "b"}]},
                                    first_journal_id=100)
    assert [q.journal_id for q in queue_cmds] == [100, 101]


# ---- random command sequences ------------------------------------------------------------------

_names = st.sampled_from(["a", "b", "c"])
_vh = st.sampled_from(["/", "v"])
_args = st.dictionaries(st.sampled_from(["x-max-length", "x-custom", "alternate-exchange"]),
                        st.one_of(st.integers(0, 3), st.sampled_from(["s", "t"])), max_size=2)
_commands = st.one_of(
    st.builds(AddVhost, _vh), st.builds(DeleteVhost, _vh),
    st.builds(PutUser, _names, st.sampled_from(["h1", "h2"])), st.builds(DeleteUser, _names),
    st.builds(SetPermissions, _names, _vh, st.just(".*"), st.just(".*"), st.just(".*")),
    st.builds(ClearPermissions, _names, _vh),
    st.builds(DeclareExchange, _vh, _names, st.sampled_from(["direct", "fanout"]), st.booleans(), st.booleans(),
              st.booleans(), _args),
    st.builds(DeleteExchange, _vh, _names, st.booleans()),
    st.builds(Bind, _vh, _names, st.sampled_from(["queue", "exchange"]), _names, st.sampled_from(["", "k"]), _args),
    st.builds(Unbind, _vh, _names, st.sampled_from(["queue", "exchange"]), _names, st.sampled_from(["", "k"]),
              _args),
    st.builds(DeclareQueue, _vh, _names, st.sampled_from(["classic", "quorum"]), st.booleans(), st.booleans(),
              st.sampled_from([None, "n1/c1", "n2/c1"]), _args, st.sampled_from(["n1", "n2"]), st.just(()),
              st.integers(1, 9)),
    st.builds(DeleteQueue, _vh, _names),
    st.builds(SetPolicy, _vh, _names, st.sampled_from([".*", "^a", "("]), st.sampled_from(["all", "queues"]),
              st.integers(0, 2), st.just({"ha-mode": "all"})),
    st.builds(ClearPolicy, _vh, _names),
    st.builds(SetParameter, st.just("shovel"), _vh, _names, st.integers(0, 2)),
    st.builds(ClearParameter, st.just("shovel"), _vh, _names),
)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cmds=st.lists(_commands, max_size=40), cut=st.integers(0, 40))
def test_random_commands_give_equal_results_and_snapshots_on_every_replica(cmds, cut):
    a, b = Catalogue(), Catalogue()
    for cmd in cmds[:cut]:
        assert a.apply(cmd) == b.apply(c.decode_command(c.encode_command(cmd)))
    # A replica restored from a snapshot mid-way goes on exactly like the one that applied all.
    b = Catalogue.from_snapshot(b.snapshot())
    for cmd in cmds[cut:]:
        assert a.apply(cmd) == b.apply(cmd)
    assert a.snapshot() == b.snapshot()
    # Invariants: every binding joins existing ends; indexes agree with the bindings.
    for key, bnd in a.bindings.items():
        assert (bnd.vhost, bnd.source) in a.exchanges
        dest = a.queues if bnd.destination_type == "queue" else a.exchanges
        assert (bnd.vhost, bnd.destination) in dest
        assert key in a._by_source[(bnd.vhost, bnd.source)]
    assert sum(map(len, a._by_source.values())) == len(a.bindings) == sum(map(len, a._by_destination.values()))
    for (vhost, _name) in list(a.exchanges) + list(a.queues) + list(a.policies):
        assert vhost in a.vhosts
    # The export imports into an equal export.
    doc = a.to_definitions(internal=True)
    k = Catalogue()
    for cmd in c.from_definitions(json.loads(json.dumps(doc))):
        k.apply(cmd)
    assert k.to_definitions(internal=True) == doc


def test_policy_for_breaks_priority_ties_by_the_greatest_name_as_rabbitmq():
    k = c.Catalogue()
    k.apply(c.AddVhost("/"))
    k.apply(c.SetPolicy("/", "alpha", "^q", "queues", 1, {"max-length": 1}))
    k.apply(c.SetPolicy("/", "beta", "^q", "queues", 1, {"max-length": 2}))
    assert k.policy_for("/", "q1", c.QUEUE).name == "beta"
