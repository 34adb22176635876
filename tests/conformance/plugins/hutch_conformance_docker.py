"""pytest plugin for aiormq's and aio-pika's suites: the broker fixtures upstream gets from docker.

Upstream, `rabbitmq_container` starts a RabbitMQ image and `amqp_direct_url` points at
it (aiormq's sdist does not even ship them). Here they describe the broker the runner
started: HUTCH_CONFORMANCE_AMQP_URL, and HUTCH_CONFORMANCE_AMQPS_PORT when the broker has
a TLS listener. Without one, "5671/tcp" maps to a port nobody listens on, so a TLS test
that is run anyway fails by connection refused rather than by a missing key.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import pytest
from yarl import URL


@dataclass
class BrokerInfo:
    """The subset of upstream's ContainerInfo the suites read."""

    host: str
    ports: dict[str, int] = field(default_factory=dict)
    id: str = "hutch-conformance"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _broker_url() -> str:
    url = os.environ.get("HUTCH_CONFORMANCE_AMQP_URL")
    if not url:
        raise pytest.UsageError("HUTCH_CONFORMANCE_AMQP_URL is not set: run through tests.conformance.run")
    return url


@pytest.fixture(scope="session")
def rabbitmq_container() -> BrokerInfo:
    parts = urlsplit(_broker_url())
    tls_port = int(os.environ.get("HUTCH_CONFORMANCE_AMQPS_PORT") or _closed_port())
    return BrokerInfo(host=parts.hostname or "127.0.0.1",
                      ports={"5672/tcp": parts.port or 5672, "5671/tcp": tls_port})


@pytest.fixture(scope="session")
def amqp_direct_url() -> URL:
    parts = urlsplit(_broker_url())
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return URL.build(scheme="amqp", user=unquote(parts.username or "guest"),
                     password=unquote(parts.password or "guest"), host=parts.hostname or "127.0.0.1",
                     port=parts.port or 5672, path="/" + vhost)
