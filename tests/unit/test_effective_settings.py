"""The resolution of a queue's arguments, policy and operator policy (hutch.queues.effective)."""

from hutch.queues.effective import exchange_alternate, match, merge_definitions, resolve


def test_policy_alone_applies():
    e = resolve("classic", {}, {"message-ttl": 1000, "max-length": 2})
    assert e.message_ttl_ms == 1000
    assert e.max_length == 2
    assert e.definition == {"message-ttl": 1000, "max-length": 2}
    assert e.unsupported == ()


def test_numeric_keys_take_the_stricter_of_argument_and_policy():
    args = {"x-message-ttl": 500, "x-max-length": 10, "x-expires": 90_000, "x-max-length-bytes": 50}
    pol = {"message-ttl": 1000, "max-length": 3, "expires": 60_000, "max-length-bytes": 100}
    e = resolve("classic", args, pol)
    assert (e.message_ttl_ms, e.max_length, e.expires_ms, e.max_length_bytes) == (500, 3, 60_000, 50)


def test_argument_wins_for_overflow_and_dead_lettering():
    args = {"x-overflow": "reject-publish", "x-dead-letter-exchange": b"arg-dlx", "x-queue-mode": "default"}
    pol = {"overflow": "drop-head", "dead-letter-exchange": "pol-dlx", "dead-letter-routing-key": "pol-rk",
           "queue-mode": "lazy"}
    e = resolve("classic", args, pol)
    assert e.overflow == "reject-publish"
    assert e.dead_letter_exchange == "arg-dlx"
    assert e.dead_letter_routing_key == "pol-rk"  # no argument: the policy's
    assert e.queue_mode == "default"


def test_operator_policy_is_merged_by_the_smaller_value():
    merged = merge_definitions({"max-length": 10, "dead-letter-exchange": "d"}, {"max-length": 5, "expires": 100})
    assert merged == {"max-length": 5, "dead-letter-exchange": "d", "expires": 100}
    assert merge_definitions({"max-length": 3}, {"max-length": 5}) == {"max-length": 3}
    e = resolve("classic", {"x-max-length": 4}, {"max-length": 10}, {"max-length": 6})
    assert e.max_length == 4
    e = resolve("classic", {"x-max-length": 40}, {"max-length": 10}, {"max-length": 6})
    assert e.max_length == 6


def test_delivery_limit_only_for_quorum_queues():
    classic = resolve("classic", {}, {"delivery-limit": 2})
    assert classic.delivery_limit is None
    assert classic.unsupported == ("delivery-limit",)
    assert any("delivery-limit" in w for w in classic.warnings)
    quorum = resolve("quorum", {"x-delivery-limit": 5}, {"delivery-limit": 2})
    assert quorum.delivery_limit == 2
    assert quorum.unsupported == ()


def test_quorum_queues_report_classic_only_keys_and_reject_publish_dlx():
    e = resolve("quorum", {}, {"ha-mode": "all", "queue-mode": "lazy", "overflow": "reject-publish-dlx",
                               "max-length": 1}, name="q")
    assert e.unsupported == ("ha-mode", "queue-mode")
    assert e.overflow == "drop-head"
    assert any("reject-publish-dlx" in w for w in e.warnings)
    assert e.max_length == 1


def test_exchange_keys_are_not_reported_on_queues():
    e = resolve("classic", {}, {"alternate-exchange": "ae", "max-length": 1})
    assert e.unsupported == ()


def test_nothing_set():
    e = resolve("quorum", None, None, None)
    assert (e.message_ttl_ms, e.max_length, e.overflow, e.dead_letter_exchange) == (None, None, "drop-head", None)
    assert e.definition == {}


def test_alternate_exchange_argument_wins():
    assert exchange_alternate({"alternate-exchange": b"a"}, {"alternate-exchange": "b"}) == "a"
    assert exchange_alternate({}, {"alternate-exchange": "b"}) == "b"
    assert exchange_alternate({}, None) is None


def test_match_by_priority_name_and_apply_to():
    pols = [
        {"vhost": "/", "name": "a", "pattern": "^t", "apply-to": "queues", "priority": 0},
        {"vhost": "/", "name": "b", "pattern": "^t", "apply-to": "queues", "priority": 0},
        {"vhost": "/", "name": "c", "pattern": "^t", "apply-to": "quorum_queues", "priority": 5},
        {"vhost": "/", "name": "x", "pattern": "^t", "apply-to": "exchanges", "priority": 9},
        {"vhost": "v", "name": "z", "pattern": "^t", "apply-to": "all", "priority": 9},
    ]
    assert match(pols, "/", "tq", "queue", "classic")["name"] == "b"
    assert match(pols, "/", "tq", "queue", "quorum")["name"] == "c"
    assert match(pols, "/", "tq", "exchange")["name"] == "x"
    assert match(pols, "/", "other", "queue", "classic") is None
