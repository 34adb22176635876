"""Users without usable passwords, topic permissions, and user and vhost limits, on a real node.

What RabbitMQ 3.10 does and these tests hold hutch to:

- a blank password never logs in (AMQP PLAIN and AMQPLAIN, HTTP basic auth); `add_user` with no
  password at all (none given, stdin empty) fails with "Password is not provided via argument
  or stdin" and exit code 65; a user given the password "" has password login disabled;
- topic permissions (per user, vhost and exchange; `{username}` and `{vhost}` expanded) are
  checked on basic.publish to a topic exchange (write) and on bind/unbind (read), refusing with
  403 "access to topic 'KEY' in exchange 'X' in vhost 'V' refused for user 'U'";
- user limits (max-connections, max-channels) and vhost limits (max-connections, max-queues)
  refuse with RabbitMQ's reply codes and texts; -1 is no limit, 0 allows nothing;
- topic permissions and limits travel in the definitions export and import;
- changes are logged in RabbitMQ's words, never with a password or its hash.

Everything runs against one node started for the module; the CLI runs as a user runs it
(the hutchctl console script in a subprocess).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import kombu
import pika
import pika.exceptions
import pytest

from tests.integration.helpers import channel_error, wait_until
from tests.support.brokers import HutchNode

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def node():
    n = HutchNode()
    n.start()
    yield n
    n.cleanup()


@pytest.fixture
def name() -> str:
    return f"u{uuid.uuid4().hex[:8]}"


def http(node, method: str, path: str, body=None, user: str = "guest", password: str = "guest"):
    """(status, decoded JSON body or None)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(node.mgmt_url + path, data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw else None)


def ok(node, method: str, path: str, body=None):
    status, got = http(node, method, path, body)
    assert status in (200, 201, 204), (method, path, status, got)
    return got


def ctl(node, *args: str, input: str | None = None, stdin=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HUTCH_URL=node.mgmt_url)
    return subprocess.run([str(BIN / "hutchctl"), *args], capture_output=True, text=True, env=env, timeout=60,
                          input=input, stdin=stdin)


def ctl_ok(node, *args: str) -> str:
    r = ctl(node, *args)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def make_user(node, user: str, password: str = "pw-secret-1", vhost: str = "/", tags: str = "") -> None:
    ok(node, "PUT", f"/api/users/{q(user)}", {"password": password, "tags": tags})
    ok(node, "PUT", f"/api/permissions/{q(vhost)}/{q(user)}", {"configure": ".*", "write": ".*", "read": ".*"})


def amqp(node, user: str, password: str, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, vhost, pika.PlainCredentials(user, password), connection_attempts=1))


def refused_open(node, user: str, password: str, vhost: str = "/") -> tuple[int, str]:
    """Open a connection the broker must close while opening it; (reply code, reply text)."""
    with pytest.raises(pika.exceptions.AMQPConnectionError) as info:
        amqp(node, user, password, vhost).close()
    # pika reports the close it got inside a wrapper: "ConnectionClosedByBroker: (CODE) 'TEXT'"
    found = re.search(r"\((\d+)\) (['\"])(.*)\2", str(info.value), re.S)
    assert found is not None, repr(info.value)
    return int(found.group(1)), found.group(3).replace("\\'", "'")


def kombu_login(node, user: str, password: str, method: str) -> bool:
    conn = kombu.Connection(hostname="127.0.0.1", port=node.port, userid=user, password=password,
                            virtual_host="/", login_method=method, connect_timeout=5)
    try:
        conn.connect()
        return True
    except Exception:
        return False
    finally:
        conn.release()


# ---------------------------------------------------------------- passwords


def test_add_user_with_no_password_is_refused_as_rabbitmqctl_refuses_it(node, name):
    r = ctl(node, "add_user", name, stdin=subprocess.DEVNULL)
    assert r.returncode == 65, (r.stdout, r.stderr)
    assert "Password is not provided via argument or stdin" in r.stderr
    assert r.stdout.startswith(f'Adding user "{name}" ...')
    assert http(node, "GET", f"/api/users/{name}")[0] == 404
    r = ctl(node, "add_user", "", "x")
    assert r.returncode == 64 and "user cannot be an empty string" in r.stderr, (r.stdout, r.stderr)


def test_add_user_reads_the_password_from_stdin(node, name):
    r = ctl(node, "add_user", name, input="from-stdin-1\n")
    assert r.returncode == 0, r.stderr
    ok(node, "PUT", f"/api/permissions/%2F/{name}", {"configure": ".*", "write": ".*", "read": ".*"})
    amqp(node, name, "from-stdin-1").close()


def test_a_user_given_a_blank_password_cannot_log_in_anywhere(node, name):
    make_user(node, name, password="", tags="management")
    assert http(node, "GET", f"/api/users/{name}")[1]["password_hash"] == ""
    code, text = refused_open(node, name, "")
    assert code == 403 and text.startswith("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN")
    assert refused_open(node, name, "anything")[0] == 403
    assert not kombu_login(node, name, "", "AMQPLAIN")
    assert not kombu_login(node, name, "anything", "AMQPLAIN")
    assert http(node, "GET", "/api/whoami", user=name, password="")[0] == 401
    assert http(node, "GET", "/api/whoami", user=name, password="anything")[0] == 401
    assert f"user '{name}' attempted to log in with a blank password" in node.log()


def test_a_blank_password_is_refused_even_when_the_stored_hash_is_of_the_empty_string(node, name):
    """A definitions file may carry the hash of "" (RabbitMQ's own exports can): still no login."""
    salt = os.urandom(4)
    import hashlib
    ph = base64.b64encode(salt + hashlib.sha256(salt).digest()).decode()
    ok(node, "PUT", f"/api/users/{name}", {"password_hash": ph, "tags": "management"})
    ok(node, "PUT", f"/api/permissions/%2F/{name}", {"configure": ".*", "write": ".*", "read": ".*"})
    assert refused_open(node, name, "")[0] == 403
    assert not kombu_login(node, name, "", "AMQPLAIN")
    assert http(node, "GET", "/api/whoami", user=name, password="")[0] == 401


def test_wrong_passwords_are_refused_and_the_right_one_works(node, name):
    make_user(node, name, password="right-pw", tags="management")
    assert refused_open(node, name, "wrong-pw")[0] == 403
    assert refused_open(node, name, "right-pw ")[0] == 403
    assert not kombu_login(node, name, "wrong-pw", "AMQPLAIN")
    assert kombu_login(node, name, "right-pw", "AMQPLAIN")
    assert kombu_login(node, name, "right-pw", "PLAIN")
    amqp(node, name, "right-pw").close()
    assert http(node, "GET", "/api/whoami", user=name, password="wrong-pw")[0] == 401
    assert http(node, "GET", "/api/whoami", user=name, password="right-pw")[0] == 200


def test_change_and_clear_password(node, name):
    make_user(node, name, password="first-pw")
    ctl_ok(node, "change_password", name, "second-pw")
    assert refused_open(node, name, "first-pw")[0] == 403
    amqp(node, name, "second-pw").close()
    r = ctl(node, "change_password", name, stdin=subprocess.DEVNULL)
    assert r.returncode == 65 and "Password is not provided" in r.stderr
    out = ctl_ok(node, "clear_password", name)
    assert f'Clearing password for user "{name}" ...' in out
    assert refused_open(node, name, "second-pw")[0] == 403
    assert refused_open(node, name, "")[0] == 403


def test_changes_are_logged_in_rabbitmqs_words_without_passwords(node, name):
    secret = f"s3cret-{uuid.uuid4().hex}"
    ctl_ok(node, "add_user", name, secret)
    ctl_ok(node, "set_permissions", name, ".*", "^w", "^r")
    ctl_ok(node, "set_topic_permissions", name, "amq.topic", "^a", "^b")
    ctl_ok(node, "change_password", name, secret + "-2")
    password_hash = ok(node, "GET", f"/api/users/{name}")["password_hash"]
    ctl_ok(node, "clear_permissions", name)
    ctl_ok(node, "delete_user", name)
    ctl_ok(node, "add_vhost", f"v-{name}")
    ctl_ok(node, "set_policy", "-p", f"v-{name}", "--apply-to", "queues", "p1", "^q\\.", '{"max-length": 5}')
    ctl_ok(node, "delete_vhost", f"v-{name}")
    log = node.log()
    for line in (f"Created user '{name}'",
                 f"Successfully set permissions for '{name}' in virtual host '/' to '.*', '^w', '^r'",
                 f"Successfully set topic permissions on exchange 'amq.topic' for '{name}' in virtual host '/' "
                 "to '^a', '^b'",
                 f"Successfully changed password for user '{name}'",
                 f"Successfully cleared permissions for '{name}' in virtual host '/'",
                 f"Deleted user '{name}'",
                 f"Adding vhost 'v-{name}' without a description",
                 f"Successfully set policy 'p1' matching queues names in virtual host 'v-{name}' using pattern '^q\\.'",
                 f"Deleting vhost 'v-{name}'"):
        assert line in log, line
    assert secret not in log and password_hash not in log


# ---------------------------------------------------------------- topic permissions


def test_topic_permissions_allow_and_refuse_publish_by_routing_key(node, name):
    make_user(node, name)
    ctl_ok(node, "set_topic_permissions", name, "amq.topic", "^{username}\\.", "^{username}\\.")
    conn = amqp(node, name, "pw-secret-1")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        qname = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(qname, "amq.topic", f"{name}.#")
        ch.basic_publish("amq.topic", f"{name}.orders", b"mine")
        assert ch.basic_get(qname, auto_ack=True)[2] == b"mine"
        ch.basic_publish("amq.direct", "other.orders", b"not a topic exchange: not checked")
        code, text = channel_error(ch.basic_publish, "amq.topic", "other.orders", b"theirs")
        assert code == 403
        assert text == (f"ACCESS_REFUSED - access to topic 'other.orders' in exchange 'amq.topic' in vhost '/' "
                        f"refused for user '{name}'")
        ch = conn.channel()
        code, text = channel_error(ch.queue_bind, qname, "amq.topic", "other.#")
        assert (code, text) == (403, f"ACCESS_REFUSED - access to topic 'other.#' in exchange 'amq.topic' in "
                                     f"vhost '/' refused for user '{name}'")
        ch = conn.channel()
        code, _ = channel_error(ch.queue_unbind, qname, "amq.topic", "other.#")
        assert code == 403
    finally:
        conn.close()
    listed = ctl_ok(node, "list_user_topic_permissions", name).splitlines()
    assert listed == [f'Listing topic permissions for user "{name}" ...',  # no column header, as in rabbitmqctl
                      "/\tamq.topic\t^{username}\\.\t^{username}\\."]
    assert http(node, "GET", f"/api/topic-permissions/%2F/{name}")[1] == [
        {"user": name, "vhost": "/", "exchange": "amq.topic", "write": "^{username}\\.", "read": "^{username}\\."}]
    rows = [r for r in ok(node, "GET", "/api/vhosts/%2F/topic-permissions") if r["user"] == name]
    assert rows and rows == ok(node, "GET", f"/api/users/{name}/topic-permissions")
    ctl_ok(node, "clear_topic_permissions", name)
    assert http(node, "GET", f"/api/topic-permissions/%2F/{name}")[0] == 404
    conn = amqp(node, name, "pw-secret-1")
    try:  # with no topic permissions left, everything is allowed again
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "other.orders", b"ok now")
    finally:
        conn.close()


def test_topic_permissions_hold_for_the_http_api_too(node, name):
    make_user(node, name, tags="management")
    ok(node, "PUT", f"/api/topic-permissions/%2F/{name}", {"exchange": "amq.topic", "write": "^{username}\\.",
                                                           "read": "^{username}\\."})
    qname = f"{name}-q"
    ok(node, "PUT", f"/api/queues/%2F/{qname}", {"durable": False})
    try:
        def as_user(method, path, body):
            return http(node, method, path, body, user=name, password="pw-secret-1")
        status, got = as_user("POST", "/api/exchanges/%2F/amq.topic/publish",
                              {"routing_key": f"{name}.a", "payload": "x", "payload_encoding": "string",
                               "properties": {}})
        assert status == 200, got
        status, got = as_user("POST", "/api/exchanges/%2F/amq.topic/publish",
                              {"routing_key": "other.a", "payload": "x", "payload_encoding": "string",
                               "properties": {}})
        assert status in (401, 403) and "access to topic 'other.a' in exchange 'amq.topic'" in got["reason"], got
        status, got = as_user("POST", f"/api/bindings/%2F/e/amq.topic/q/{qname}", {"routing_key": "other.#"})
        assert status in (401, 403) and "access to topic 'other.#'" in got["reason"], got
        assert as_user("POST", f"/api/bindings/%2F/e/amq.topic/q/{qname}", {"routing_key": f"{name}.#"})[0] == 201
    finally:
        ok(node, "DELETE", f"/api/queues/%2F/{qname}")


def test_an_empty_topic_regex_allows_only_the_empty_routing_key(node, name):
    make_user(node, name)
    ok(node, "PUT", f"/api/topic-permissions/%2F/{name}", {"exchange": "amq.topic", "write": "", "read": ".*"})
    conn = amqp(node, name, "pw-secret-1")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "", b"empty key")
        assert channel_error(ch.basic_publish, "amq.topic", "a", b"x")[0] == 403
    finally:
        conn.close()


def test_topic_permission_http_errors(node, name):
    assert http(node, "PUT", f"/api/topic-permissions/%2F/{name}",
                {"exchange": "amq.topic", "write": ".*", "read": ".*"}) == (
        400, {"error": "bad_request", "reason": "vhost_or_user_not_found"})
    make_user(node, name)
    status, body = http(node, "PUT", f"/api/topic-permissions/%2F/{name}", {"exchange": "amq.topic", "write": ".*"})
    assert status == 400 and body["reason"] == "[{key_missing,read}]"
    status, body = http(node, "PUT", f"/api/topic-permissions/%2F/{name}",
                        {"exchange": "amq.topic", "write": "(", "read": ".*"})
    assert status == 400 and "write is not a valid regular expression" in body["reason"]


# ---------------------------------------------------------------- limits


def closed_with(conn_fn) -> tuple[int, str]:
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn_fn()
    return info.value.reply_code, info.value.reply_text


def test_user_connection_limit(node, name):
    make_user(node, name)
    out = ctl_ok(node, "set_user_limits", name, '{"max-connections": 2}')
    assert f'Setting user limits to "{{"max-connections": 2}}" for user "{name}" ...' in out
    assert ok(node, "GET", f"/api/user-limits/{name}") == [{"user": name, "value": {"max-connections": 2}}]
    listed = ctl_ok(node, "list_user_limits", "--global").splitlines()
    assert listed[:2] == ["Listing limits for all users ...", "user\tlimits"]
    assert f'{name}\t{{"max-connections":2}}' in listed
    conns = [amqp(node, name, "pw-secret-1") for _ in range(2)]
    try:
        code, text = refused_open(node, name, "pw-secret-1")
        assert (code, text) == (530, f"NOT_ALLOWED - connection refused for user '{name}': user connection limit "
                                     "(2) is reached")
        conns.pop().close()
        wait_until(lambda: _can_open(node, name), 5, "a connection once one was closed")
    finally:
        for c in conns:
            c.close()
    ctl_ok(node, "set_user_limits", name, '{"max-connections": -1}')
    many = [amqp(node, name, "pw-secret-1") for _ in range(3)]
    for c in many:
        c.close()
    ctl_ok(node, "set_user_limits", name, '{"max-connections": 0}')
    assert refused_open(node, name, "pw-secret-1")[0] == 530
    ctl_ok(node, "clear_user_limits", name, "all")
    assert ok(node, "GET", f"/api/user-limits/{name}") == []
    amqp(node, name, "pw-secret-1").close()


def _can_open(node, user: str) -> bool:
    try:
        amqp(node, user, "pw-secret-1").close()
        return True
    except pika.exceptions.AMQPConnectionError:
        return False


def test_user_channel_limit(node, name):
    make_user(node, name)
    ctl_ok(node, "set_user_limits", name, '{"max-channels": 2}')
    conn = amqp(node, name, "pw-secret-1")
    try:
        conn.channel()
        conn.channel()
        code, text = closed_with(conn.channel)  # refused before channel.open-ok, as RabbitMQ refuses it
        assert (code, text) == (530, f"NOT_ALLOWED - number of channels opened for user '{name}' has reached the "
                                     "maximum allowed user limit of (2)")
    finally:
        if conn.is_open:
            conn.close()
    listed = ctl_ok(node, "list_user_limits", "--user", name).splitlines()
    assert listed == [f'Listing limits for user "{name}" ...', '{"max-channels":2}']
    ctl_ok(node, "clear_user_limits", name, "max-channels")
    conn = amqp(node, name, "pw-secret-1")
    try:
        for _ in range(3):
            conn.channel()
    finally:
        conn.close()


def test_vhost_connection_and_queue_limits(node, name):
    vhost = f"v-{name}"
    ok(node, "PUT", f"/api/vhosts/{vhost}")
    ok(node, "PUT", f"/api/permissions/{vhost}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    try:
        ctl_ok(node, "set_vhost_limits", "-p", vhost, '{"max-connections": 1, "max-queues": 2}')
        assert ok(node, "GET", f"/api/vhost-limits/{vhost}") == [
            {"vhost": vhost, "value": {"max-connections": 1, "max-queues": 2}}]
        conn = amqp(node, "guest", "guest", vhost)
        try:
            code, text = refused_open(node, "guest", "guest", vhost)
            assert (code, text) == (530, f"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest': "
                                         "connection limit (1) is reached")
            ch = conn.channel()
            ch.queue_declare("q1")
            ch.queue_declare("q2")
            ch.queue_declare("q1")  # a redeclare is not a new queue
            code, text = channel_error(ch.queue_declare, "q3")
            assert (code, text) == (406, f"PRECONDITION_FAILED - cannot declare queue 'q3': queue limit in vhost "
                                         f"'{vhost}' (2) is reached")
            status, body = http(node, "PUT", f"/api/queues/{vhost}/q4", {"durable": False})
            assert (status, body["reason"]) == (400, f"PRECONDITION_FAILED - cannot declare queue 'q4': queue limit "
                                                     f"in vhost '{vhost}' (2) is reached")
            ch = conn.channel()
            ch.queue_delete("q2")
            ch.queue_declare("q3")
        finally:
            conn.close()
        ctl_ok(node, "set_vhost_limits", "-p", vhost, '{"max-queues": 0}')
        assert ok(node, "GET", f"/api/vhost-limits/{vhost}") == [{"vhost": vhost, "value": {"max-queues": 0}}]
        conns = [amqp(node, "guest", "guest", vhost) for _ in range(2)]  # max-connections went with the reset
        try:
            ch = conns[0].channel()
            assert channel_error(ch.queue_declare, "q9")[0] == 406
        finally:
            for c in conns:
                c.close()
        ctl_ok(node, "set_vhost_limits", "-p", vhost, '{"max-queues": -1, "max-connections": -1}')
        conn = amqp(node, "guest", "guest", vhost)
        try:
            ch = conn.channel()
            for i in range(3):
                ch.queue_declare(f"more{i}")
        finally:
            conn.close()
        listed = ctl_ok(node, "list_vhost_limits", "-p", vhost).splitlines()
        assert listed == [f'Listing limits for vhost "{vhost}" ...', '{"max-connections":-1,"max-queues":-1}']
        ctl_ok(node, "clear_vhost_limits", "-p", vhost)
        assert ok(node, "GET", f"/api/vhost-limits/{vhost}") == []
    finally:
        ok(node, "DELETE", f"/api/vhosts/{vhost}")


def test_limit_errors(node, name):
    make_user(node, name)
    status, body = http(node, "PUT", f"/api/user-limits/{name}/max-queues", {"value": 3})
    assert status == 400 and "max-queues" in body["reason"]
    status, body = http(node, "PUT", f"/api/user-limits/{name}/max-connections", {"value": "many"})
    assert status == 400
    assert http(node, "PUT", "/api/user-limits/nobody-here/max-connections", {"value": 3})[0] == 404
    assert http(node, "PUT", "/api/vhost-limits/no-such-vhost/max-queues", {"value": 3})[0] == 404
    r = ctl(node, "set_user_limits", name, "{not json")
    assert r.returncode == 65 and "JSON" in r.stderr
    r = ctl(node, "set_vhost_limits", '{"max-channels": 1}')
    assert r.returncode == 65 and "max-channels" in r.stderr


# ---------------------------------------------------------------- definitions


def test_definitions_round_trip_topic_permissions_and_limits(node, name):
    vhost = f"v-{name}"
    ok(node, "PUT", f"/api/vhosts/{vhost}")
    make_user(node, name, vhost=vhost)
    ok(node, "PUT", f"/api/topic-permissions/{vhost}/{name}", {"exchange": "amq.topic", "write": "^w", "read": "^r"})
    ok(node, "PUT", f"/api/user-limits/{name}/max-channels", {"value": 7})
    ok(node, "PUT", f"/api/vhost-limits/{vhost}/max-queues", {"value": 9})
    doc = ok(node, "GET", "/api/definitions")
    assert {"user": name, "vhost": vhost, "exchange": "amq.topic", "write": "^w", "read": "^r"} in \
        doc["topic_permissions"]
    assert next(u for u in doc["users"] if u["name"] == name)["limits"] == {"max-channels": 7}
    assert next(v for v in doc["vhosts"] if v["name"] == vhost)["limits"] == [["max-queues", 9]]
    assert {"vhost": vhost, "component": "vhost-limits", "name": "limits", "value": {"max-queues": 9}} in \
        doc["parameters"]
    mine = {
        "users": [u for u in doc["users"] if u["name"] == name],
        "vhosts": [v for v in doc["vhosts"] if v["name"] == vhost],
        "permissions": [p for p in doc["permissions"] if p["user"] == name],
        "topic_permissions": [p for p in doc["topic_permissions"] if p["user"] == name],
    }
    ok(node, "DELETE", f"/api/users/{name}")
    ok(node, "DELETE", f"/api/vhosts/{vhost}")
    try:
        ok(node, "POST", "/api/definitions", mine)
        assert ok(node, "GET", f"/api/topic-permissions/{vhost}/{name}") == mine["topic_permissions"]
        assert ok(node, "GET", f"/api/user-limits/{name}") == [{"user": name, "value": {"max-channels": 7}}]
        assert ok(node, "GET", f"/api/vhost-limits/{vhost}") == [{"vhost": vhost, "value": {"max-queues": 9}}]
    finally:
        http(node, "DELETE", f"/api/vhosts/{vhost}")
        http(node, "DELETE", f"/api/users/{name}")
