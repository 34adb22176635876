"""AMQPS: the TLS listener, peer verification, and EXTERNAL (client-certificate) login."""

from __future__ import annotations

import json
import ssl

import pika
import pytest

from tests.support.brokers import HutchNode, free_port
from tests.support.certs import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"), clients=("hutch-client", "stranger"))


def _node(tmp_path, pki, *, verify: bool, fail_if_no_cert: bool, external: bool = False) -> HutchNode:
    data = tmp_path / "node"
    data.mkdir()
    conf = tmp_path / "hutch.conf"
    lines = ["auth_mechanisms.1 = PLAIN", "auth_mechanisms.2 = AMQPLAIN"]
    if external:
        lines += ["auth_mechanisms.3 = EXTERNAL", "ssl_cert_login_from = common_name"]
        (data / "definitions.json").write_text(json.dumps({
            "users": [{"name": "guest", "password": "guest", "tags": ["administrator"]},
                      {"name": "hutch-client", "password": "unused-x", "tags": []}],
            "vhosts": [{"name": "/"}],
            "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
                            {"user": "hutch-client", "vhost": "/", "configure": ".*", "write": ".*",
                             "read": ".*"}]}))
    conf.write_text("\n".join(lines) + "\n")
    port = free_port()
    args = ["--config", str(conf), "--amqps-port", str(port), "--tls-cert", str(pki["server_cert"]),
            "--tls-key", str(pki["server_key"]), "--tls-ca", str(pki["ca"])]
    if verify:
        args.append("--tls-verify-peer")
    if fail_if_no_cert:
        args.append("--tls-fail-if-no-peer-cert")
    node = HutchNode(data_dir=data, extra_args=args)
    node.amqps_port = port
    return node


def _tls_params(node, pki, cert: str | None = None, external: bool = False) -> pika.ConnectionParameters:
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if cert:
        ctx.load_cert_chain(str(pki[f"{cert}_cert"]), str(pki[f"{cert}_key"]))
    creds = pika.credentials.ExternalCredentials() if external else pika.PlainCredentials("guest", "guest")
    return pika.ConnectionParameters("127.0.0.1", node.amqps_port, "/", creds,
                                     ssl_options=pika.SSLOptions(ctx, "localhost"), connection_attempts=1)


def test_amqps_listener_serves_amqp_over_tls(tmp_path, pki):
    with _node(tmp_path, pki, verify=False, fail_if_no_cert=False) as node:
        assert "started TLS (SSL) listener" in node.log()
        conn = pika.BlockingConnection(_tls_params(node, pki))
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"over tls")
        assert ch.basic_get(q, auto_ack=True)[2] == b"over tls"
        conn.close()


def test_plain_listener_keeps_working_beside_tls(tmp_path, pki):
    with _node(tmp_path, pki, verify=False, fail_if_no_cert=False) as node:
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        assert conn.is_open
        conn.close()


def test_fail_if_no_peer_cert_refuses_clients_without_a_certificate(tmp_path, pki):
    with _node(tmp_path, pki, verify=True, fail_if_no_cert=True) as node:
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(_tls_params(node, pki))
        conn = pika.BlockingConnection(_tls_params(node, pki, cert="hutch-client"))
        assert conn.is_open
        conn.close()


def test_verify_peer_without_fail_if_no_peer_cert_accepts_clients_without_one(tmp_path, pki):
    with _node(tmp_path, pki, verify=True, fail_if_no_cert=False) as node:
        conn = pika.BlockingConnection(_tls_params(node, pki))
        assert conn.is_open
        conn.close()


def test_external_mechanism_logs_in_as_the_certificate_common_name(tmp_path, pki):
    with _node(tmp_path, pki, verify=True, fail_if_no_cert=True, external=True) as node:
        conn = pika.BlockingConnection(_tls_params(node, pki, cert="hutch-client", external=True))
        ch = conn.channel()
        ch.queue_declare("", exclusive=True)
        conn.close()
        assert "user 'hutch-client' authenticated" in node.log()


def test_external_mechanism_refuses_a_certificate_naming_no_user(tmp_path, pki):
    with _node(tmp_path, pki, verify=True, fail_if_no_cert=True, external=True) as node:
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(_tls_params(node, pki, cert="stranger", external=True))
        assert "EXTERNAL login refused: user 'stranger'" in node.log()


def test_external_is_not_offered_on_the_plain_listener(tmp_path, pki):
    with _node(tmp_path, pki, verify=True, fail_if_no_cert=True, external=True) as node:
        params = pika.ConnectionParameters("127.0.0.1", node.port, "/", pika.credentials.ExternalCredentials(),
                                           connection_attempts=1)
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(params)
