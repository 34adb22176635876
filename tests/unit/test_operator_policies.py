"""Operator policies in the catalogue and in policy validation."""

import msgspec
import pytest

from hutch.cluster import catalogue as cat
from hutch.control.policy import PolicyError, validate_policy


def _catalogue() -> cat.Catalogue:
    c = cat.Catalogue()
    assert c.apply(cat.AddVhost("/")).ok
    return c


def test_operator_policies_are_kept_apart_from_policies():
    c = _catalogue()
    assert c.apply(cat.SetPolicy("/", "same", "^q", "queues", 0, {"max-length": 10})).status == cat.CREATED
    assert c.apply(cat.SetOperatorPolicy("/", "same", "^q", "queues", 0, {"max-length": 5})).status == cat.CREATED
    assert c.policy_for("/", "q1", cat.QUEUE).definition == {"max-length": 10}
    assert c.policy_for("/", "q1", cat.QUEUE, operator=True).definition == {"max-length": 5}
    assert c.apply(cat.ClearOperatorPolicy("/", "same")).status == cat.DELETED
    assert c.policy_for("/", "q1", cat.QUEUE, operator=True) is None
    assert c.policy_for("/", "q1", cat.QUEUE) is not None
    assert c.apply(cat.ClearOperatorPolicy("/", "same")).status == cat.ABSENT


def test_commands_and_snapshots_round_trip():
    c = _catalogue()
    cmd = cat.SetOperatorPolicy("/", "op", ".*", "all", 3, {"expires": 1000})
    assert cat.decode_command(cat.encode_command(cmd)) == cmd
    c.apply(cmd)
    again = cat.Catalogue.from_snapshot(c.snapshot())
    assert again.operator_policies == c.operator_policies
    assert again.snapshot() == c.snapshot()


def test_a_snapshot_from_before_operator_policies_loads():
    c = _catalogue()
    state = msgspec.msgpack.decode(c.snapshot())
    del state["operator_policies"]
    old = cat.Catalogue.from_snapshot(msgspec.msgpack.encode(state))
    assert old.operator_policies == {} and "/" in old.vhosts


def test_deleting_the_vhost_removes_its_operator_policies():
    c = _catalogue()
    c.apply(cat.SetOperatorPolicy("/", "op", ".*", "all", 0, {"expires": 1000}))
    c.apply(cat.DeleteVhost("/"))
    assert c.operator_policies == {}


def test_operator_policy_for_an_unknown_vhost_is_refused():
    c = _catalogue()
    assert c.apply(cat.SetOperatorPolicy("nope", "op", ".*", "all", 0, {"expires": 1000})).code == cat.NOT_FOUND


def test_validation_of_operator_policy_keys():
    ok = validate_policy("/", "op", {"pattern": ".", "definition": {"max-length": 1, "delivery-limit": 2,
                                                                    "expires": 5, "message-ttl": 0,
                                                                    "max-length-bytes": 9}}, operator=True)
    assert ok["definition"]["delivery-limit"] == 2
    for key, value in (("ha-mode", "all"), ("overflow", "drop-head"), ("dead-letter-exchange", "x")):
        with pytest.raises(PolicyError, match="not a recognised operator policy setting"):
            validate_policy("/", "op", {"pattern": ".", "definition": {key: value}}, operator=True)
    with pytest.raises(PolicyError, match="not a valid queue expiry"):
        validate_policy("/", "op", {"pattern": ".", "definition": {"expires": 0}}, operator=True)


def test_queue_leader_locator_is_a_policy_key():
    rec = validate_policy("/", "p", {"pattern": ".", "definition": {"queue-leader-locator": "client-local"}})
    assert rec["definition"] == {"queue-leader-locator": "client-local"}
    with pytest.raises(PolicyError, match="not a valid queue leader locator"):
        validate_policy("/", "p", {"pattern": ".", "definition": {"queue-leader-locator": "nearest"}})
