"""The one "inequivalent arg" rule (`hutch.cluster.catalogue.args_difference`), as RabbitMQ
3.10's rabbit_misc:assert_args_equivalence compares: by type class (every integer width one
class, float and double another, bool its own), then by value; a missing x-queue-type equals
"classic". Texts were checked against RabbitMQ 3.10.8."""

from __future__ import annotations

from decimal import Decimal

import pytest

from hutch.cluster.catalogue import QUEUE_ARGS_COMPARED, args_difference


def diff(current: dict, received: dict) -> str | None:
    return args_difference("queue", "q", "/", current, received, QUEUE_ARGS_COMPARED)


@pytest.mark.parametrize("current,received", [
    ({}, {}),
    ({"x-max-length": 10}, {"x-max-length": 10}),
    ({"x-max-length": 3_000_000_000}, {"x-max-length": 3_000_000_000}),
    ({"x-message-ttl": 1.5}, {"x-message-ttl": 1.5}),
    ({"x-dead-letter-exchange": "dlx"}, {"x-dead-letter-exchange": b"dlx"}),  # longstr either way
    ({"x-single-active-consumer": True}, {"x-single-active-consumer": True}),
    ({}, {"x-queue-type": "classic"}),
    ({"x-queue-type": "classic"}, {}),
    ({"x-max-priority": Decimal("1.0")}, {"x-max-priority": Decimal("1.0")}),
    ({"x-unknown": 1}, {"x-unknown": 2}),  # only the compared keys count
])
def test_equivalent(current, received):
    assert diff(current, received) is None


@pytest.mark.parametrize("current,received,shown", [
    ({"x-max-length": 10}, {"x-max-length": 20}, "received '20' but current is '10'"),
    ({"x-max-length": 10}, {"x-max-length": "10"}, "received '10' but current is '10'"),
    ({"x-max-length": 10}, {"x-max-length": 10.0}, "received '10.0' but current is '10'"),
    ({"x-max-length": 10}, {"x-max-length": True}, "received 'true' but current is '10'"),
    ({"x-single-active-consumer": True}, {"x-single-active-consumer": 1}, "received '1' but current is 'true'"),
    ({"x-max-priority": Decimal("1.0")}, {"x-max-priority": Decimal("1.00")}, "received '1.00' but current is '1.0'"),
    ({"x-max-length": 10}, {}, "received none but current is the value '10' of type 'signedint'"),
    ({}, {"x-message-ttl": 2000}, "received the value '2000' of type 'signedint' but current is none"),
    ({}, {"x-queue-type": "quorum"}, "received the value 'quorum' of type 'longstr' but current is none"),
    ({"x-queue-type": "quorum"}, {"x-queue-type": "classic"}, "received 'classic' but current is 'quorum'"),
])
def test_inequivalent(current, received, shown):
    key = next(iter(current or received))
    assert diff(current, received) == f"inequivalent arg '{key}' for queue 'q' in vhost '/': {shown}"


def test_the_first_differing_compared_key_is_named():
    text = diff({"x-expires": 1000, "x-max-length": 1}, {"x-expires": 2000, "x-max-length": 2})
    assert text is not None and text.startswith("inequivalent arg 'x-expires'")
