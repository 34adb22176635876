"""Access control as RabbitMQ 3.10 does it: authentication, loopback-only users, vhost access,
and per-vhost configure / write / read permissions (regular expressions).

Users, vhosts and permissions come from a definitions file in RabbitMQ's format, loaded by
the node at start-up (hutch: `DATA_DIR/definitions.json`; RabbitMQ: `load_definitions`).
The permission table checked here is RabbitMQ's:

    queue.declare (not passive), queue.delete        configure on the queue
    exchange.declare (not passive), exchange.delete  configure on the exchange
    queue.bind / queue.unbind                        write on the queue, read on the exchange
    exchange.bind / exchange.unbind                  write on the destination, read on the source
    basic.publish                                    write on the exchange ("" is amq.default)
    basic.get, basic.consume, queue.purge            read on the queue

A refusal closes the channel with 403 ACCESS_REFUSED "access to <kind> '<name>' in vhost
'<vhost>' refused for user '<user>'". A login that fails is refused with 403 to clients that
announce `authentication_failure_close`; `guest` may log in only over loopback.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket

import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.integration.helpers import channel_error
from tests.integration.rawamqp import AMQP_0_9_1_HEADER, PeerClosed, RawClient
from tests.support.brokers import HutchNode, RabbitMQNode

HASHING = "rabbit_password_hashing_sha256"
VHOST = "acl"
LOGIN_REFUSED = ("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
                 "For details see the broker logfile.")


def hashed(password: str) -> str:
    """RabbitMQ's rabbit_password_hashing_sha256: base64(salt + sha256(salt + password))."""
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def definitions() -> dict:
    def user(name, password, tags):
        return {"name": name, "password_hash": hashed(password), "hashing_algorithm": HASHING, "tags": tags}

    def perm(name, vhost, configure, write, read):
        return {"user": name, "vhost": vhost, "configure": configure, "write": write, "read": read}

    return {
        "users": [user("guest", "guest", ["administrator"]), user("ann", "ann-pw", []),
                  user("mon", "mon-pw", ["monitoring", "management"]), user("nobody", "nobody-pw", [])],
        "vhosts": [{"name": "/"}, {"name": VHOST}],
        "permissions": [perm("guest", "/", ".*", ".*", ".*"), perm("guest", VHOST, ".*", ".*", ".*"),
                        # regexes match anywhere unless anchored, as in RabbitMQ
                        perm("ann", VHOST, "^ann-", "^(ann-|amq\\.default$)", "^ann-"),
                        perm("mon", VHOST, "", "", "")],
    }


class RabbitMQWithLoopbackGuest(RabbitMQNode):
    """The reference node with RabbitMQ's default `loopback_users` ([guest]), which the shared
    test node turns off; advanced.config takes precedence over rabbitmq.conf."""

    def _env(self) -> dict:
        env = super()._env()
        advanced = self.dir / "advanced.config"
        advanced.write_text('[{rabbit, [{loopback_users, [<<"guest">>]}]}].\n')
        env["RABBITMQ_ADVANCED_CONFIG_FILE"] = str(advanced)
        return env


@pytest.fixture(scope="module")
def node(kind):
    """A node of its own, started with the definitions above."""
    doc = definitions()
    if kind == "hutch":
        n = HutchNode()
        (n.data_dir / "definitions.json").write_text(json.dumps(doc))
    else:
        n = RabbitMQWithLoopbackGuest(management=False)
        path = n.dir / "definitions.json"
        path.write_text(json.dumps(doc))
        n.config_extra = f"load_definitions = {path}"
    try:
        n.start()
        yield n
    finally:
        n.cleanup()


def connect(node, user: str, password: str, vhost: str = VHOST, host: str = "127.0.0.1"):
    return pika.BlockingConnection(pika.ConnectionParameters(
        host, node.port, vhost, pika.PlainCredentials(user, password), connection_attempts=1))


@pytest.fixture(scope="module")
def admin(node):
    """guest's channel in the test vhost, with a few things ann may not touch."""
    c = connect(node, "guest", "guest")
    ch = c.channel()
    ch.exchange_declare("other-x", "direct")
    ch.queue_declare("other-q")
    ch.exchange_declare("ann-x", "direct")
    ch.queue_declare("ann-q")
    yield ch
    c.close()


@pytest.fixture
def ann(node, admin):
    c = connect(node, "ann", "ann-pw")
    yield c
    if c.is_open:
        c.close()


def refused(kind: str, name: str, user: str = "ann", vhost: str = VHOST) -> tuple[int, str]:
    return 403, f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'"


def non_loopback_address() -> str | None:
    """An address of this machine that is not loopback (connections from it are not local)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


# -- authentication ------------------------------------------------------------------------------

def test_a_user_from_the_definitions_logs_in_with_its_password(node, admin):
    connect(node, "ann", "ann-pw").close()


@pytest.mark.parametrize("user,password", [("ann", "wrong"), ("nosuchuser", "x")], ids=["bad password",
                                                                                       "unknown user"])
def test_failed_login_is_403_access_refused(node, user, password):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        connect(node, user, password)
    assert str(info.value) == f"ConnectionClosedByBroker: (403) '{LOGIN_REFUSED}'"


def _start_ok(c: RawClient, user: str, password: str, capabilities: dict) -> None:
    c.send(AMQP_0_9_1_HEADER)
    c.expect(commands.Connection.Start)
    c.send_frame(commands.Connection.StartOk(client_properties={"capabilities": capabilities},
                                             mechanism="PLAIN", response=f"\x00{user}\x00{password}"))


def test_failed_login_closes_with_403_for_an_authentication_failure_close_client(node):
    with RawClient(node.host, node.port) as c:
        _start_ok(c, "ann", "wrong", {"authentication_failure_close": True})
        close = c.expect(commands.Connection.Close)
        assert (close.reply_code, close.reply_text) == (403, LOGIN_REFUSED)
        assert (close.class_id, close.method_id) == (0, 0)  # RabbitMQ names no method


def test_failed_login_just_drops_a_client_without_authentication_failure_close(node):
    with RawClient(node.host, node.port) as c:
        _start_ok(c, "ann", "wrong", {})
        with pytest.raises(PeerClosed):
            frame = c.read_frame()
            raise AssertionError(f"expected the socket to close, got {frame!r}")


def test_guest_logs_in_over_loopback(node):
    connect(node, "guest", "guest", "/").close()


def test_guest_may_not_log_in_from_a_non_loopback_address(node):
    addr = non_loopback_address()
    assert addr is not None, "this machine needs a non-loopback address for this test"
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        connect(node, "guest", "guest", "/", host=addr)
    assert str(info.value) == f"ConnectionClosedByBroker: (403) '{LOGIN_REFUSED}'"


def test_other_users_may_log_in_from_a_non_loopback_address(node, admin):
    addr = non_loopback_address()
    assert addr is not None
    connect(node, "ann", "ann-pw", host=addr).close()


# -- vhost access --------------------------------------------------------------------------------

def test_a_vhost_without_permissions_for_the_user_is_530(node):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(node, "ann", "ann-pw", vhost="/")
    assert str(info.value) == ("ConnectionClosedByBroker: (530) \"NOT_ALLOWED - access to vhost '/' refused "
                               "for user 'ann'\"")


def test_a_user_with_no_permissions_at_all_is_530(node):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(node, "nobody", "nobody-pw")
    assert str(info.value) == (f"ConnectionClosedByBroker: (530) \"NOT_ALLOWED - access to vhost '{VHOST}' "
                               "refused for user 'nobody'\"")


def test_a_missing_vhost_is_530_not_found(node):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(node, "ann", "ann-pw", vhost="no-such-vhost")
    assert str(info.value) == "ConnectionClosedByBroker: (530) 'NOT_ALLOWED - vhost no-such-vhost not found'"


def test_tags_do_not_matter_to_amqp_empty_permissions_allow_only_passive_use(node, admin):
    c = connect(node, "mon", "mon-pw")
    try:
        ch = c.channel()
        ch.queue_declare("other-q", passive=True)
        assert channel_error(c.channel().queue_declare, "mon-q") == refused("queue", "mon-q", "mon")
        assert channel_error(c.channel().basic_get, "other-q") == refused("queue", "other-q", "mon")
    finally:
        c.close()


# -- configure -----------------------------------------------------------------------------------

def test_queue_declare_needs_configure_on_the_queue(ann):
    ann.channel().queue_declare("ann-mine")
    assert channel_error(ann.channel().queue_declare, "theirs") == refused("queue", "theirs")


def test_server_named_queue_needs_configure_on_its_generated_name(ann):
    code, text = channel_error(ann.channel().queue_declare, "", exclusive=True)
    assert code == 403
    assert text.startswith("ACCESS_REFUSED - access to queue 'amq.gen-")
    assert text.endswith(f"' in vhost '{VHOST}' refused for user 'ann'")


def test_passive_declares_need_no_permission(ann):
    ann.channel().queue_declare("other-q", passive=True)
    ann.channel().exchange_declare("other-x", "direct", passive=True)


def test_exchange_declare_needs_configure_on_the_exchange(ann):
    ann.channel().exchange_declare("ann-fan", "fanout")
    assert channel_error(ann.channel().exchange_declare, "bx", "direct") == refused("exchange", "bx")


def test_deletes_need_configure(ann):
    assert channel_error(ann.channel().queue_delete, "other-q") == refused("queue", "other-q")
    assert channel_error(ann.channel().exchange_delete, "other-x") == refused("exchange", "other-x")
    ch = ann.channel()
    ch.queue_declare("ann-gone")
    ch.queue_delete("ann-gone")


def test_dead_letter_exchange_of_a_declared_queue_needs_write(ann):
    """RabbitMQ checks, at queue.declare, that the user may publish to the queue's DLX."""
    ann.channel().queue_declare("ann-dl-ok", arguments={"x-dead-letter-exchange": "ann-x"})
    code_text = channel_error(ann.channel().queue_declare, "ann-dl-no",
                              arguments={"x-dead-letter-exchange": "other-x"})
    assert code_text == refused("exchange", "other-x")


# -- bindings ---------------------------------------------------------------------------------------

def test_queue_bind_needs_write_on_the_queue_and_read_on_the_exchange(ann):
    ann.channel().queue_bind("ann-q", "ann-x", "k")
    ann.channel().queue_unbind("ann-q", "ann-x", "k")
    assert channel_error(ann.channel().queue_bind, "ann-q", "other-x", "k") == refused("exchange", "other-x")
    assert channel_error(ann.channel().queue_bind, "other-q", "ann-x", "k") == refused("queue", "other-q")


def test_exchange_bind_needs_write_on_the_destination_and_read_on_the_source(ann):
    ch = ann.channel()
    ch.exchange_declare("ann-dest", "fanout")
    ch.exchange_bind("ann-dest", "ann-x", "k")
    assert channel_error(ann.channel().exchange_bind, "other-x", "ann-x", "k") == refused("exchange", "other-x")
    assert channel_error(ann.channel().exchange_bind, "ann-dest", "other-x", "k") == refused("exchange",
                                                                                           "other-x")


# -- write ------------------------------------------------------------------------------------------

def confirming(conn):
    ch = conn.channel()
    ch.confirm_delivery()  # a refused publish then fails the publishing call itself
    return ch


def test_publish_needs_write_on_the_exchange(ann):
    confirming(ann).basic_publish("ann-x", "k", b"ok")
    assert channel_error(confirming(ann).basic_publish, "other-x", "k", b"m") == refused("exchange", "other-x")
    assert channel_error(confirming(ann).basic_publish, "amq.direct", "k", b"m") == refused("exchange",
                                                                                        "amq.direct")


def test_publish_to_the_default_exchange_is_write_on_amq_default_whatever_the_queue(ann, admin):
    ch = ann.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "other-q", b"via the default exchange")
    method, _p, body = admin.basic_get("other-q", auto_ack=True)
    assert body == b"via the default exchange"


def test_user_id_property_must_be_the_authenticated_user(ann):
    ch = ann.channel()
    ch.confirm_delivery()
    ch.basic_publish("ann-x", "k", b"m", pika.BasicProperties(user_id="ann"))
    code, text = channel_error(ch.basic_publish, "ann-x", "k", b"m", pika.BasicProperties(user_id="guest"))
    assert (code, text) == (406, "PRECONDITION_FAILED - user_id property set to 'guest' but authenticated "
                                 "user was 'ann'")


# -- read -------------------------------------------------------------------------------------------

def test_get_consume_and_purge_need_read_on_the_queue(ann):
    ch = ann.channel()
    ch.basic_get("ann-q", auto_ack=True)
    ch.queue_purge("ann-q")
    assert channel_error(ann.channel().basic_get, "other-q") == refused("queue", "other-q")
    assert channel_error(ann.channel().basic_consume, "other-q", lambda *a: None) == refused("queue", "other-q")
    assert channel_error(ann.channel().queue_purge, "other-q") == refused("queue", "other-q")


def test_permissions_are_per_vhost(node, admin):
    """guest has every permission in both vhosts; ann has none in '/'."""
    c = connect(node, "guest", "guest", "/")
    try:
        c.channel().queue_declare("", exclusive=True)
    finally:
        c.close()
