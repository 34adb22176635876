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

from tests.support.brokers import HutchNode, RabbitMQNode

from .suites import Endpoint, Suite

NODE_LOGS = Path(__file__).resolve().parent / "cache" / "reports"
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


def _keep_log(path: Path, name: str) -> None:
    """Keep a node's log beside the suite's reports: the node's own directory is removed."""
    with contextlib.suppress(OSError):
        NODE_LOGS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, NODE_LOGS / name)


class HutchTarget:
    name = "hutch"

    def __init__(self) -> None:
        self.product = "hutch (not started)"

    @contextlib.contextmanager
    def fresh(self, suite: Suite) -> Iterator[Endpoint]:
        node = HutchNode()
        try:
            try:
                node.start(timeout_s=HUTCH_START_TIMEOUT_S)
            except (RuntimeError, TimeoutError, OSError) as e:
                tail = node.log()[-LOG_TAIL_CHARS:].strip() or "(the node wrote no log)"
                raise BrokerStartError(f"hutch node did not start: {e}\n--- {node.log_path} (end) ---\n{tail}") from e
            self.product = describe(node.host, node.port)
            http_port = getattr(node, "http_port", None)  # the management API, once hutch serves one
            yield Endpoint(host=node.host, port=node.port,
                           mgmt_url=f"http://{node.host}:{http_port}" if http_port else None)
        finally:
            node.stop()
            _keep_log(node.log_path, f"hutch-{suite.name}.node.log")
            node.cleanup()


class RabbitMQTarget:
    name = "rabbitmq"

    def __init__(self) -> None:
        self.product = "RabbitMQ (not started)"

    @contextlib.contextmanager
    def fresh(self, suite: Suite) -> Iterator[Endpoint]:
        node = RabbitMQNode(management=True)
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
            yield Endpoint(host=node.host, port=node.port, mgmt_url=mgmt_url)
        finally:
            node.cleanup()


class UrlTarget:
    """A broker someone else runs; queues that suites leave behind are deleted before each suite."""

    name = "url"

    def __init__(self, url: str, mgmt_url: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "amqp":
            raise ValueError(f"not an amqp:// URL: {url}")
        self.endpoint = Endpoint(
            host=parts.hostname or "127.0.0.1", port=parts.port or 5672,
            user=unquote(parts.username or "guest"), password=unquote(parts.password or "guest"),
            vhost=unquote(parts.path[1:]) if len(parts.path) > 1 else "/", mgmt_url=mgmt_url)
        self.product = describe(self.endpoint.host, self.endpoint.port)

    @contextlib.contextmanager
    def fresh(self, suite: Suite) -> Iterator[Endpoint]:
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

    from tests.support.brokers import wait_until

    def ok() -> bool:
        req = urllib.request.Request(url)
        req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    wait_until(ok, timeout_s, f"management API {url}", interval_s=0.25)


def make_target(spec: str, mgmt_url: str | None = None):
    if spec == "hutch":
        return HutchTarget()
    if spec == "rabbitmq":
        return RabbitMQTarget()
    if spec.startswith("amqp://"):
        return UrlTarget(spec, mgmt_url)
    raise ValueError(f"--broker must be hutch, rabbitmq or an amqp:// URL, not {spec!r}")
