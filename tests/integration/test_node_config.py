"""A node started from a rabbitmq.conf-style file the way a RabbitMQ user writes one:
management.tcp.ip binds the HTTP API to one address, management.ssl.* serves it over TLS
(alone, or beside plain HTTP when management.tcp.* is set too, as rabbitmq_management picks its
listeners), legacy partition-handling keys load with a warning (seed 003), a value cut at '#'
is logged, and a node name without @HOST gets the short host name."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request

import pika
import pytest

from tests.support.brokers import HutchNode, free_port, port_open, wait_until
from tests.support.certs import make_pki

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def node_with(tmp_path, conf: str, *extra: str, **kw) -> HutchNode:
    path = tmp_path / "hutch.conf"
    path.write_text(conf)
    return HutchNode(data_dir=tmp_path / "data", mgmt_port=0, extra_args=["--config", str(path), *extra], **kw)


def get_json(url: str, context: ssl.SSLContext | None = None):
    req = urllib.request.Request(url)
    req.add_header("Authorization", AUTH)
    with urllib.request.urlopen(req, timeout=5, context=context) as r:
        return json.loads(r.read())


def test_management_tcp_ip_binds_the_http_api_to_that_address_only(tmp_path):
    port = free_port()
    with node_with(tmp_path, "management.tcp.ip = 127.0.0.2\n", "--mgmt-port", str(port)) as node:
        wait_until(lambda: port_open("127.0.0.2", port), 20, "the API on 127.0.0.2")
        overview = get_json(f"http://127.0.0.2:{port}/api/overview")
        http = [ln for ln in overview["listeners"] if ln["protocol"] == "http"]
        assert http == [{"node": node.name, "protocol": "http", "ip_address": "127.0.0.2", "port": port,
                         "socket_opts": {}}]
        assert not port_open("127.0.0.1", port)


def test_management_ssl_alone_serves_the_api_over_https_only(tmp_path, pki):
    tls_port = free_port()
    conf = (f"management.ssl.port = {tls_port}\nmanagement.ssl.certfile = {pki['server_cert']}\n"
            f"management.ssl.keyfile = {pki['server_key']}\nmanagement.ssl.cacertfile = {pki['ca']}\n")
    path = tmp_path / "hutch.conf"
    path.write_text(conf)
    node = HutchNode(data_dir=tmp_path / "data", mgmt_port=0, extra_args=["--config", str(path)])
    with node:
        wait_until(lambda: port_open("127.0.0.1", tls_port), 20, "the HTTPS API")
        ctx = ssl.create_default_context(cafile=str(pki["ca"]))
        overview = get_json(f"https://localhost:{tls_port}/api/overview", ctx)
        assert [ln["protocol"] for ln in overview["listeners"] if ln["protocol"].startswith("http")] == ["https"]
        assert "started HTTPS listener" in node.log()
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP on the TLS port is no API
            get_json(f"http://127.0.0.1:{tls_port}/api/overview")
        # the certificate served is the configured one: a client without the test CA rejects it
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            get_json(f"https://localhost:{tls_port}/api/overview", ssl.create_default_context())


def test_management_tcp_and_ssl_together_serve_both(tmp_path, pki):
    port, tls_port = free_port(), free_port()
    conf = (f"management.tcp.port = {port}\nmanagement.ssl.port = {tls_port}\n"
            f"management.ssl.certfile = {pki['server_cert']}\nmanagement.ssl.keyfile = {pki['server_key']}\n")
    path = tmp_path / "hutch.conf"
    path.write_text(conf)
    # HutchNode passes --mgmt-port 0; a later --mgmt-port restores the file's port
    with HutchNode(data_dir=tmp_path / "data", mgmt_port=0,
                   extra_args=["--config", str(path), "--mgmt-port", str(port)]):
        wait_until(lambda: port_open("127.0.0.1", tls_port) and port_open("127.0.0.1", port), 20, "both APIs")
        ctx = ssl.create_default_context(cafile=str(pki["ca"]))
        assert get_json(f"https://localhost:{tls_port}/api/whoami", ctx)["name"] == "guest"
        assert get_json(f"http://127.0.0.1:{port}/api/whoami")["name"] == "guest"


def test_management_ssl_verify_peer_asks_for_a_client_certificate(tmp_path):
    pki = make_pki(tmp_path / "pki", clients=("hutch-client",))
    tls_port = free_port()
    conf = (f"management.ssl.port = {tls_port}\nmanagement.ssl.certfile = {pki['server_cert']}\n"
            f"management.ssl.keyfile = {pki['server_key']}\nmanagement.ssl.cacertfile = {pki['ca']}\n"
            "management.ssl.verify = verify_peer\nmanagement.ssl.fail_if_no_peer_cert = true\n")
    path = tmp_path / "hutch.conf"
    path.write_text(conf)
    with HutchNode(data_dir=tmp_path / "data", mgmt_port=0, extra_args=["--config", str(path)]):
        wait_until(lambda: port_open("127.0.0.1", tls_port), 20, "the HTTPS API")
        anonymous = ssl.create_default_context(cafile=str(pki["ca"]))
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            get_json(f"https://localhost:{tls_port}/api/whoami", anonymous)
        client = ssl.create_default_context(cafile=str(pki["ca"]))
        client.load_cert_chain(str(pki["hutch-client_cert"]), str(pki["hutch-client_key"]))
        assert get_json(f"https://localhost:{tls_port}/api/whoami", client)["name"] == "guest"


def test_legacy_partition_keys_and_a_cut_value_start_the_node_with_warnings(tmp_path):
    conf = ("cluster_partition_handling = pause_minority\n"
            "cluster_partition_handling.pause_if_all_down.nodes.1 = hutch@elsewhere\n"
            "cluster_partition_handling.pause_if_all_down.recover = autoheal\n"
            "default_pass = guest#not-part-of-it\n")
    with node_with(tmp_path, conf) as node:
        pika.BlockingConnection(pika.URLParameters(node.url)).close()  # the password is "guest"
        log = node.log()
        assert "'cluster_partition_handling.pause_if_all_down.nodes.*' has no effect" in log
        assert "'cluster_partition_handling.pause_if_all_down.recover' has no effect" in log
        assert "the value of 'default_pass' ends at a '#'" in log


def test_an_unknown_key_stops_the_node_with_the_line_named(tmp_path):
    node = node_with(tmp_path, "heartbeat = 30\nmanagement.tcp.sparkle = 1\n")
    with pytest.raises(RuntimeError):
        node.start(timeout_s=20)
    node.cleanup()
    assert ":2: unknown configuration key 'management.tcp.sparkle'" in node.log()


def test_a_node_name_without_host_gets_the_short_host_name(tmp_path):
    short = socket.gethostname().split(".")[0]
    port = free_port()
    with HutchNode(name="rabbit", data_dir=tmp_path / "data", mgmt_port=port) as node:
        assert get_json(f"http://127.0.0.1:{port}/api/overview")["node"] == f"rabbit@{short}"
        pika.BlockingConnection(pika.URLParameters(node.url)).close()


def test_the_node_object_reports_the_configured_disk_limit_and_net_ticktime(tmp_path):
    port = free_port()
    conf = "disk_free_limit.absolute = 2GB\nnet_ticktime = 15\n"
    with node_with(tmp_path, conf, "--mgmt-port", str(port)) as node:
        wait_until(lambda: port_open("127.0.0.1", port), 20, "the API")
        me = get_json(f"http://127.0.0.1:{port}/api/nodes/{urllib.parse.quote(node.name)}")
        assert me["disk_free_limit"] == 2_000_000_000
        assert me["net_ticktime"] == 15
