"""The client libraries' live-broker test suites that hutch is measured against.

Each suite is the test folder of one pinned PyPI source distribution, run unchanged by
pytest against a broker we start. What a suite needs to find that broker (environment
variables, fixtures that upstream gets from docker, a port it never passes) is given
here and by the plugins in `plugins/`; what it cannot run here (TLS without its
certificates, hosts on the internet, docker) is deselected with a reason, so every test
that is not run is still counted and explained. The facts behind each entry were
gathered by running the suites against RabbitMQ 3.10 (see docs/compatibility.md).

This module only describes; `toolchain` fetches and prepares, `run` executes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote


@dataclass(frozen=True)
class Endpoint:
    """Where a suite finds its broker."""

    host: str
    port: int
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    mgmt_url: str | None = None  # http://host:port of a RabbitMQ-compatible management API
    tls_port: int | None = None

    @property
    def amqp_url(self) -> str:
        return (f"amqp://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
                f"@{self.host}:{self.port}/{quote(self.vhost, safe='')}")


@dataclass(frozen=True)
class Deselection:
    """Tests a suite does not run here. `pattern` is a pytest node id where `*` matches anything.

    `lifted_by_tls`: the tests do run when the broker has a TLS listener serving the
    certificates of aiormq's suite (`run --tls`).
    """

    pattern: str
    reason: str
    lifted_by_tls: bool = False


@dataclass(frozen=True)
class SourcePatch:
    """A textual edit to an unpacked sdist file; `old` must occur exactly once."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Suite:
    name: str
    package: str  # PyPI name
    version: str
    unpacked: str  # top folder of the sdist
    paths: tuple[str, ...]  # test files/folders, relative to `unpacked`
    summary: str
    deselect: tuple[Deselection, ...] = ()
    plugins: tuple[str, ...] = ()  # extra pytest plugins from plugins/ (-p NAME)
    patches: tuple[SourcePatch, ...] = ()
    needs_mgmt: bool = False
    # Durable queues the suite leaves behind, deleted before it runs on a reused broker.
    leftover_queues: tuple[str, ...] = ()
    test_timeout_s: int = 120
    suite_timeout_s: int = 1800
    in_make_test: bool = False  # run by tests/conformance/test_suites.py against hutch
    # pytest processes side by side, each with every n-th test and a broker of its own: for a suite
    # that spends its time waiting (heartbeat timeouts), not working
    shards: int = 1
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def deselections(self, tls: bool) -> tuple[Deselection, ...]:
        return tuple(d for d in self.deselect if not (tls and d.lifted_by_tls))

    @property
    def sdist(self) -> str:
        return f"{self.package}=={self.version}"

    def environment(self, ep: Endpoint) -> dict[str, str]:
        """The variables the suite's own code reads to find the broker."""
        env = {
            # py-amqp, kombu
            "RABBITMQ_HOST": ep.host,
            "RABBITMQ_5672_TCP": str(ep.port),
            # rabbitpy, and our fixtures for aiormq / aio-pika
            "RABBITMQ_URL": ep.amqp_url,
            "HUTCH_CONFORMANCE_AMQP_URL": ep.amqp_url,
            # amqpstorm
            "AMQP_HOST": ep.host,
            "AMQP_USERNAME": ep.user,
            "AMQP_PASSWORD": ep.password,
            "AMQP_URI": ep.amqp_url,
            "HUTCH_CONFORMANCE_AMQP_PORT": str(ep.port),
        }
        if ep.mgmt_url:
            env["AMQP_HTTP_URL"] = ep.mgmt_url
            env["MANAGEMENT_URL"] = ep.mgmt_url + "/%2f"
        if ep.tls_port:
            env["HUTCH_CONFORMANCE_AMQPS_PORT"] = str(ep.tls_port)
        env.update(self.env)
        return env


TLS = "needs a TLS listener and the suite's certificates"
DOCKER = "starts and kills its own broker container through docker"

# aio-pika's conftest gets the broker from a docker container; these edits turn its
# docker fixtures into unused ones so that plugins/hutch_conformance_docker.py provides them.
_AIO_PIKA_CONFTEST = "tests/conftest.py"
_AIO_PIKA_PATCHES = (
    SourcePatch(_AIO_PIKA_CONFTEST, "def pytest_configure(config: pytest.Config) -> None:",
                "def _upstream_pytest_configure(config: pytest.Config) -> None:"),
    SourcePatch(_AIO_PIKA_CONFTEST, "def rabbitmq_container(docker) -> ContainerInfo:",
                "def _upstream_rabbitmq_container(docker) -> ContainerInfo:"),
    SourcePatch(_AIO_PIKA_CONFTEST, "def amqp_direct_url(rabbitmq_container: ContainerInfo) -> URL:",
                "def _upstream_amqp_direct_url(rabbitmq_container: ContainerInfo) -> URL:"),
)

SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite(
        name="amqp", package="amqp", version="5.4.2", unpacked="amqp-5.4.2",
        paths=("t/integration/test_rmq.py",),
        summary="py-amqp: open/close, publish+consume x confirms x mandatory x immediate, basic.get, field tables",
        deselect=(
            Deselection("*[tls]", TLS + " (the sdist lacks t/certs)"),
            Deselection("*[tls-*", TLS + " (the sdist lacks t/certs)"),
            Deselection("t/integration/test_rmq.py::test_tls_*", TLS + " (and a host on the internet)"),
        ),
        suite_timeout_s=300,
        in_make_test=True,
    ),
    Suite(
        name="rabbitpy", package="rabbitpy", version="3.0.2", unpacked="rabbitpy-3.0.2",
        paths=("tests/test_integration.py", "tests/integration"),
        summary="rabbitpy: confirms, get, consume/cancel, exchanges, tx, multi-frame bodies, auth errors",
        in_make_test=True,
        suite_timeout_s=300,
    ),
    Suite(
        name="kombu", package="kombu", version="5.7.0", unpacked="kombu-5.7.0",
        paths=("t/integration/test_py_amqp.py",),
        summary="kombu over py-amqp: routing, TTL, priorities, requeue, SimpleQueue, failover, pools",
        leftover_queues=("priority_requeue_test",),
        in_make_test=True,
        suite_timeout_s=600,
    ),
    Suite(
        name="amqpstorm", package="amqpstorm", version="3.1.4", unpacked="amqpstorm-3.1.4",
        paths=("amqpstorm/tests/functional",),
        summary="amqpstorm: ack/nack/reject, get, qos, recover, confirms, bindings, tx, reliability loops",
        deselect=(
            Deselection("amqpstorm/tests/functional/ssl/*", TLS + " and the upstream test host"),
            Deselection("amqpstorm/tests/functional/management/*", "management HTTP API: suite amqpstorm-mgmt"),
            Deselection("amqpstorm/tests/functional/test_web_based.py::*",
                        "sets up through the management HTTP API: suite amqpstorm-mgmt"),
        ),
        suite_timeout_s=900,
        plugins=("hutch_conformance_amqpstorm",),
        env={"HUTCH_CONFORMANCE_AMQP_CLEANUP": "1"},
        in_make_test=True,
        shards=2,
    ),
    Suite(
        name="aiormq", package="aiormq", version="7.2.4", unpacked="aiormq-7.2.4",
        paths=("tests",),
        summary="aiormq: handshake, tune, frame sizes, auth, channels, confirms, returns, nowait, errors, heartbeats",
        deselect=(
            Deselection("*[*amqps*", TLS + " (the amqps and amqps-client URL variants)", lifted_by_tls=True),
            Deselection("tests/test_connection.py::test_ssl_context", TLS, lifted_by_tls=True),
            Deselection("tests/test_connection.py::test_ssl_verification_fails_without_trusted_ca", TLS,
                        lifted_by_tls=True),
        ),
        suite_timeout_s=1200,
        plugins=("hutch_conformance_docker",),
        in_make_test=True,
        shards=3,
    ),
    Suite(
        name="aio-pika", package="aio-pika", version="10.2.1", unpacked="aio_pika-10.2.1",
        paths=("tests",),
        summary="aio-pika: declare/bind, publish/consume/get, DLX, TTL, priorities, max-length, tx, robust reconnect",
        deselect=(
            Deselection("tests/test_amqps.py::*", TLS, lifted_by_tls=True),
            Deselection("tests/test_robust_recovery.py::*", DOCKER),
        ),
        suite_timeout_s=1800,
        plugins=("hutch_conformance_docker",),
        patches=_AIO_PIKA_PATCHES,
        extra_args=("-o", "log_cli=false"),
    ),
    Suite(
        name="amqpstorm-mgmt", package="amqpstorm", version="3.1.4", unpacked="amqpstorm-3.1.4",
        paths=("amqpstorm/tests/functional/management", "amqpstorm/tests/functional/test_web_based.py"),
        summary="amqpstorm's management HTTP API client: overview, queues, exchanges, users, vhosts, publish/get",
        deselect=(
            Deselection("amqpstorm/tests/functional/management/test_api.py::*::test_api_with_inaccessible",
                        "targets a private-range address that is not on this machine"),
            Deselection("amqpstorm/tests/functional/management/test_api.py::*::test_api_cluster_name",
                        "expects the upstream CI's cluster name"),
        ),
        suite_timeout_s=300,
        plugins=("hutch_conformance_amqpstorm",),
        needs_mgmt=True,
        in_make_test=True,
    ),
)}

ALL = tuple(SUITES)
MAKE_TEST = tuple(name for name, s in SUITES.items() if s.in_make_test)
