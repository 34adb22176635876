"""The brokers a conformance run targets: a fresh hutch node, a fresh RabbitMQ node, or a URL.

Several suites use fixed queue and exchange names and leave durable queues behind, so
hutch and RabbitMQ targets give every suite a node of its own (started with
tests/support/brokers.py and removed afterwards). A URL target cannot be restarted; it
is cleaned instead, by deleting the queues a suite is known to leave. A node that does
not start is reported with the end of its log, never as a test failure of the suite.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.support.brokers import HutchNode, RabbitMQNode, free_port, port_open, wait_until

from .suites import Endpoint, Suite
from .toolchain import TlsFiles

LOG_TAIL_CHARS = 3000
HUTCH_START_TIMEOUT_S = 30.0
RABBITMQ_START_TIMEOUT_S = 120.0


class BrokerStartError(RuntimeError):
    pass


def server_properties(host: str, port: int, timeout_s: float = 5.0) -> dict:
    """The server-properties table of connection.start (product, version, capabilities)."""
    from pamqp import exceptions as pamqp_exceptions
    from pamqp import frame as pamqp_frame

    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"{host}:{port} closed the connection before connection.start")
            data += chunk
            try:
                _, _, method = pamqp_frame.unmarshal(data)
            except pamqp_exceptions.UnmarshalingException:
                if len(data) > 1 << 20:
                    raise
                continue  # not the whole frame yet
            props = getattr(method, "server_properties", {}) or {}
            return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in props.items()}


def describe(host: str, port: int) -> str:
    try:
        props = server_properties(host, port)
    except OSError as e:
        return f"unknown ({e})"
    return f"{props.get('product', '?')} {props.get('version', '?')}".strip()


def _keep_log(path: Path, dest: Path) -> None:
    """Keep a node's log beside the suite's reports: the node's own directory is removed."""
    with contextlib.suppress(OSError):
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)


class _Target:
    name = "?"
    isolated = True  # every fresh() is a broker of its own: a suite's shards may run side by side

    def __init__(self, tls: TlsFiles | None = None) -> None:
        self.tls = tls
        self.product = f"{self.name} (not started)"

    @property
    def results_name(self) -> str:
        """Where this target's results are kept: runs with TLS count other tests than runs without."""
        return f"{self.name}-tls" if self.tls else self.name


class HutchTarget(_Target):
    name = "hutch"

    @contextlib.contextmanager
    def fresh(self, suite: Suite, node_log: Path | None = None) -> Iterator[Endpoint]:
        tls_port = free_port() if self.tls else None
        extra = []
        if self.tls:
            extra = ["--amqps-port", str(tls_port), "--tls-cert", str(self.tls.cert), "--tls-key",
                     str(self.tls.key), "--tls-ca", str(self.tls.ca), "--tls-verify-peer",
                     "--no-tls-fail-if-no-peer-cert"]
        node = HutchNode(extra_args=extra)
        try:
            try:
                node.start(timeout_s=HUTCH_START_TIMEOUT_S)
            except (RuntimeError, TimeoutError, OSError) as e:
                tail = node.log()[-LOG_TAIL_CHARS:].strip() or "(the node wrote no log)"
                raise BrokerStartError(f"hutch node did not start: {e}\n--- {node.log_path} (end) ---\n{tail}") from e
            self.product = describe(node.host, node.port)
            http_port = getattr(node, "http_port", None)  # the management API, once hutch serves one
            yield Endpoint(host=node.host, port=node.port, tls_port=tls_port,
                           mgmt_url=f"http://{node.host}:{http_port}" if http_port else None)
        finally:
            node.stop()
            if node_log is not None:
                _keep_log(node.log_path, node_log)
            node.cleanup()


class RabbitMQTarget(_Target):
    name = "rabbitmq"

    @contextlib.contextmanager
    def fresh(self, suite: Suite, node_log: Path | None = None) -> Iterator[Endpoint]:
        tls_port = free_port() if self.tls else None
        conf = ""
        if self.tls:
            conf = "\n".join([
                f"listeners.ssl.default = {tls_port}",
                f"ssl_options.cacertfile = {self.tls.ca}",
                f"ssl_options.certfile = {self.tls.cert}",
                f"ssl_options.keyfile = {self.tls.key}",
                "ssl_options.verify = verify_peer",
                "ssl_options.fail_if_no_peer_cert = false",
            ])
        node = RabbitMQNode(management=True, config_extra=conf)
        try:
            try:
                node.start(timeout_s=RABBITMQ_START_TIMEOUT_S)
            except (RuntimeError, TimeoutError, OSError) as e:
                out = node.dir / "server.out"
                tail = out.read_text(errors="replace")[-LOG_TAIL_CHARS:] if out.exists() else ""
                raise BrokerStartError(f"RabbitMQ node did not start: {e}\n{tail}") from e
            self.product = describe(node.host, node.port)
            mgmt_url = f"http://127.0.0.1:{node.mgmt_port}"
            if suite.needs_mgmt:
                _wait_for_http(mgmt_url + "/api/overview", RABBITMQ_START_TIMEOUT_S)
            if tls_port:
                wait_until(lambda: port_open("127.0.0.1", tls_port), RABBITMQ_START_TIMEOUT_S,
                           f"RabbitMQ TLS listener on {tls_port}", interval_s=0.2)
            yield Endpoint(host=node.host, port=node.port, mgmt_url=mgmt_url, tls_port=tls_port)
        finally:
            node.cleanup()


class UrlTarget(_Target):
    """A broker someone else runs; queues that suites leave behind are deleted before each suite."""

    name = "url"
    isolated = False

    def __init__(self, url: str, mgmt_url: str | None = None) -> None:
        super().__init__(tls=None)
        parts = urlsplit(url)
        if parts.scheme != "amqp":
            raise ValueError(f"not an amqp:// URL: {url}")
        self.endpoint = Endpoint(
            host=parts.hostname or "127.0.0.1", port=parts.port or 5672,
            user=unquote(parts.username or "guest"), password=unquote(parts.password or "guest"),
            vhost=unquote(parts.path[1:]) if len(parts.path) > 1 else "/", mgmt_url=mgmt_url)
        self.product = describe(self.endpoint.host, self.endpoint.port)

    @contextlib.contextmanager
    def fresh(self, suite: Suite, node_log: Path | None = None) -> Iterator[Endpoint]:
        _delete_queues(self.endpoint, suite.leftover_queues)
        yield self.endpoint


def _delete_queues(ep: Endpoint, names: tuple[str, ...]) -> None:
    if not names:
        return
    import pika

    params = pika.URLParameters(ep.amqp_url)
    with contextlib.closing(pika.BlockingConnection(params)) as conn:
        for name in names:
            try:
                conn.channel().queue_delete(name)
            except pika.exceptions.ChannelClosedByBroker:
                pass  # already gone


def _wait_for_http(url: str, timeout_s: float) -> None:
    import urllib.error
    import urllib.request

    def ok() -> bool:
        req = urllib.request.Request(url)
        req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    wait_until(ok, timeout_s, f"management API {url}", interval_s=0.25)


def make_target(spec: str, mgmt_url: str | None = None, tls: TlsFiles | None = None):
    if spec == "hutch":
        return HutchTarget(tls)
    if spec == "rabbitmq":
        return RabbitMQTarget(tls)
    if spec.startswith("amqp://"):
        if tls:
            raise ValueError("--tls starts a TLS listener with the suites' certificates: hutch or rabbitmq only")
        return UrlTarget(spec, mgmt_url)
    raise ValueError(f"--broker must be hutch, rabbitmq or an amqp:// URL, not {spec!r}")
