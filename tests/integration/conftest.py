"""Fixtures for the single-node integration suite: one broker per session, real clients.

The suite is written against RabbitMQ 3.10 first, so that every assertion records what
RabbitMQ really does (reply codes and texts, flags, ordering), and then holds hutch to it.
`HUTCH_TEST_BROKER` picks the broker: `hutch` (default) or `rabbitmq`. When
`HUTCH_TEST_AMQP_URL` is set, the suite uses the broker already listening there instead of
starting one (handy while developing; tests that need their own node still start it).

Tests never depend on each other: each gets a unique name prefix (`names`), and whatever
it declares through `names` is deleted after it, whether it passed or not.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from dataclasses import dataclass

import pytest

from tests.integration.helpers import Names, connect
from tests.support.brokers import HutchNode, RabbitMQNode

BROKER_KINDS = ("hutch", "rabbitmq")


def broker_kind() -> str:
    kind = os.environ.get("HUTCH_TEST_BROKER", "hutch").lower()
    if kind not in BROKER_KINDS:
        raise pytest.UsageError(f"HUTCH_TEST_BROKER must be one of {BROKER_KINDS}, not {kind!r}")
    return kind


def start_node(kind: str, **kwargs):
    """A fresh node of the given kind, started; the caller cleans it up."""
    node = HutchNode(**kwargs) if kind == "hutch" else RabbitMQNode(management=False, **kwargs)
    try:
        node.start()
    except BaseException:
        node.cleanup()
        raise
    return node


@dataclass(frozen=True)
class ExistingBroker:
    """A broker someone else runs, known by its URL only."""

    url: str

    @property
    def host(self) -> str:
        return urllib.parse.urlparse(self.url).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        return urllib.parse.urlparse(self.url).port or 5672


@pytest.fixture(scope="session")
def kind() -> str:
    """`hutch` or `rabbitmq`: which broker the session runs against."""
    return broker_kind()


@pytest.fixture(scope="session")
def broker(kind):
    url = os.environ.get("HUTCH_TEST_AMQP_URL")
    if url:
        yield ExistingBroker(url)
        return
    node = start_node(kind)
    try:
        yield node
    finally:
        node.cleanup()


@pytest.fixture
def names(request, broker):
    test = request.node.name.split("[")[0].removeprefix("test_")[:40]
    n = Names(f"t.{test}.{uuid.uuid4().hex[:8]}")
    yield n
    n.cleanup(broker)


@pytest.fixture
def conn(broker):
    c = connect(broker)
    yield c
    if c.is_open:
        c.close()


@pytest.fixture
def ch(conn):
    return conn.channel()
