"""Durability: what survives a graceful restart and a kill -9, as RabbitMQ 3.10 promises it.

Persistent messages (delivery_mode 2) on durable queues survive, with their delivery state:
one that was delivered and not acknowledged comes back `redelivered`. Transient messages and
non-durable queues die with the node. Durable exchanges, durable queues with their arguments,
bindings whose both ends are durable, vhosts, users and permissions survive. A publisher's
confirm (`basic.ack`) and `tx.commit-ok` mean the message is on disk: a kill -9 right after
them loses nothing. Acknowledgements, purges and deletions are durable across a graceful
restart.

After a kill -9 both brokers mark every recovered message `redelivered`: neither can tell
which deliveries of the last milliseconds reached the consumer before their record reached
the disk, and a redelivery without the flag is the error to avoid.

Each test restarts (or kills) a node of its own kind (`HUTCH_TEST_BROKER`), shared by the
module, and uses names of its own.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import uuid

import pika
import pika.exceptions
import pytest
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.integration.helpers import channel_error, connect, drain
from tests.integration.rawamqp import RawClient
from tests.support.brokers import HutchNode, RabbitMQNode

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)
WINDOW = 1000  # publishes in flight in the confirm-window test


class RestartableNode:
    """A hutch or RabbitMQ node that a test may stop, kill -9 and start again on the same data."""

    def __init__(self, kind: str, definitions: dict | None = None):
        self.kind = kind
        if kind == "hutch":
            self.node = HutchNode()
            if definitions is not None:
                (self.node.data_dir / "definitions.json").write_text(json.dumps(definitions))
        else:
            self.node = RabbitMQNode(management=False)
            if definitions is not None:
                path = self.node.dir / "definitions.json"
                path.write_text(json.dumps(definitions))
                self.node.config_extra = f"load_definitions = {path}"

    @property
    def host(self) -> str:
        return self.node.host

    @property
    def port(self) -> int:
        return self.node.port

    def start(self) -> None:
        self.node.start()

    def stop(self) -> None:
        self.node.stop()

    def kill(self) -> None:
        """SIGKILL to the whole node (RabbitMQ: its process group, beam.smp included)."""
        if self.kind == "hutch":
            self.node.kill()
            return
        proc = self.node.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def crash_restart(self) -> None:
        self.kill()
        self.start()

    @property
    def running(self) -> bool:
        return self.node.proc is not None and self.node.proc.poll() is None

    def cleanup(self) -> None:
        self.node.cleanup()


@pytest.fixture(scope="module")
def node(kind):
    n = RestartableNode(kind)
    n.start()
    yield n
    n.cleanup()


@pytest.fixture
def rnode(node):
    """The module's node, running when the test starts whatever the last test left behind."""
    if not node.running:
        node.start()
    return node


@pytest.fixture
def qname():
    return f"dur.{uuid.uuid4().hex[:10]}"


def channel(node):
    return connect(node).channel()


def bodies(node, queue: str) -> list[tuple[bytes, bool]]:
    """Drain a queue with basic.get and autoack: (body, redelivered) in delivery order."""
    ch = channel(node)
    out = []
    try:
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            out.append((body, method.redelivered))
    finally:
        ch.connection.close()


def publish_committed(ch, queue: str, items: list[bytes], props=PERSISTENT, exchange: str = "") -> None:
    """Publish in one transaction on a channel of its own (ch's connection): tx.commit-ok means
    every one of them is on disk."""
    tx = ch.connection.channel()
    tx.tx_select()
    for b in items:
        tx.basic_publish(exchange, queue, b, props)
    tx.tx_commit()
    tx.close()


def message_count(node, queue: str) -> int:
    return channel(node).queue_declare(queue, passive=True).method.message_count


def queue_exists(node, queue: str) -> bool:
    ch = channel(node)
    try:
        ch.queue_declare(queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404
        return False
    finally:
        if ch.connection.is_open:
            ch.connection.close()


# -- messages ---------------------------------------------------------------------------------

def _delivered_and_undelivered(node, q: str) -> pika.BlockingConnection:
    """q gets d1, d2, u1, u2, all persistent; d1 and d2 are delivered and left unacknowledged
    on a connection that stays open until the node goes."""
    ch = channel(node)
    ch.queue_declare(q, durable=True)
    publish_committed(ch, q, [b"d1", b"d2", b"u1", b"u2"])
    ch.basic_qos(prefetch_count=2)
    got = []
    ch.basic_consume(q, lambda _c, m, _p, b: got.append(b))
    drain(ch.connection, lambda: len(got) == 2, what="two deliveries")
    assert got == [b"d1", b"d2"]
    return ch.connection


def test_persistent_messages_survive_a_graceful_restart_with_their_redelivered_flag(rnode, qname):
    _delivered_and_undelivered(rnode, qname)
    rnode.restart()  # the consumer's connection is still open: the node closes it as it stops
    assert bodies(rnode, qname) == [(b"d1", True), (b"d2", True), (b"u1", False), (b"u2", False)]


def test_persistent_messages_survive_kill_9_and_all_come_back_redelivered(rnode, qname):
    _delivered_and_undelivered(rnode, qname)
    rnode.crash_restart()
    # after a crash every recovered message "may have been delivered" (docs/durability.md)
    assert bodies(rnode, qname) == [(b"d1", True), (b"d2", True), (b"u1", True), (b"u2", True)]


def test_a_graceful_restart_after_a_kill_9_keeps_the_redelivered_flags(rnode, qname):
    """The mark a crash leaves outlives the restarts after it, graceful or not, until the
    message is gone."""
    _delivered_and_undelivered(rnode, qname)
    rnode.crash_restart()
    ch = channel(rnode)
    publish_committed(ch, qname, [b"n1"])  # after the crash: never delivered
    ch.connection.close()
    rnode.restart()
    assert bodies(rnode, qname) == [(b"d1", True), (b"d2", True), (b"u1", True), (b"u2", True), (b"n1", False)]


def test_transient_messages_on_a_durable_queue_do_not_survive(rnode, qname):
    ch = channel(rnode)
    ch.queue_declare(qname, durable=True)
    publish_committed(ch, qname, [b"p1"], PERSISTENT)
    publish_committed(ch, qname, [b"t1"], TRANSIENT)
    publish_committed(ch, qname, [b"t2"], pika.BasicProperties())
    publish_committed(ch, qname, [b"p2"], PERSISTENT)
    rnode.restart()
    assert bodies(rnode, qname) == [(b"p1", False), (b"p2", False)]


def test_non_durable_queue_and_its_persistent_messages_do_not_survive(rnode, qname):
    ch = channel(rnode)
    ch.queue_declare(qname, durable=False)
    publish_committed(ch, qname, [b"p1"], PERSISTENT)
    rnode.restart()
    assert not queue_exists(rnode, qname)


def test_confirmed_messages_survive_kill_9_right_after_the_ack(rnode, qname):
    """A window of 1,000 unconfirmed publishes; the node is killed the moment the last
    confirm arrives. Every confirmed message is there after the restart."""
    ch = channel(rnode)
    ch.queue_declare(qname, durable=True)
    ch.connection.close()
    with RawClient(rnode.host, rnode.port, timeout_s=30) as c:
        c.handshake()
        c.open_channel(1)
        c.send_frame(commands.Confirm.Select(), 1)
        c.expect(commands.Confirm.SelectOk)
        props = commands.Basic.Properties(delivery_mode=2)
        frames = []
        for i in range(WINDOW):
            body = b"%06d" % i
            frames.append(frame.marshal(commands.Basic.Publish(exchange="", routing_key=qname), 1))
            frames.append(frame.marshal(ContentHeader(0, len(body), props), 1))
            frames.append(frame.marshal(ContentBody(body), 1))
        c.send(b"".join(frames))
        acked = 0
        while acked < WINDOW:
            ack = c.expect((commands.Basic.Ack, commands.Basic.Nack))
            assert isinstance(ack, commands.Basic.Ack), ack
            acked = ack.delivery_tag
        rnode.kill()
    rnode.start()
    got = bodies(rnode, qname)
    assert [b for b, _ in got] == [b"%06d" % i for i in range(WINDOW)]


def test_blocking_confirmed_publishes_survive_kill_9(rnode, qname):
    ch = channel(rnode)
    ch.queue_declare(qname, durable=True)
    ch.confirm_delivery()
    for i in range(20):
        ch.basic_publish("", qname, b"c%d" % i, PERSISTENT)  # returns once basic.ack arrived
    rnode.crash_restart()
    assert [b for b, _ in bodies(rnode, qname)] == [b"c%d" % i for i in range(20)]


def test_tx_commit_ok_means_the_publishes_survive_kill_9(rnode, qname):
    ch = channel(rnode)
    ch.queue_declare(qname, durable=True)
    publish_committed(ch, qname, [b"t%d" % i for i in range(200)])
    rnode.crash_restart()
    assert [b for b, _ in bodies(rnode, qname)] == [b"t%d" % i for i in range(200)]


def test_acked_messages_do_not_come_back_after_a_graceful_restart(rnode, qname):
    ch = channel(rnode)
    ch.queue_declare(qname, durable=True)
    publish_committed(ch, qname, [b"m%d" % i for i in range(10)])
    ch.basic_qos(prefetch_count=10)
    got = []
    ch.basic_consume(qname, lambda c, m, _p, b: got.append((m.delivery_tag, b)))
    drain(ch.connection, lambda: len(got) == 10, what="ten deliveries")
    for tag, b in got:
        if int(b[1:]) % 2 == 0:
            ch.basic_ack(tag)
    ch.connection.close()  # the odd ones go back to the queue, redelivered
    rnode.restart()
    assert bodies(rnode, qname) == [(b"m%d" % i, True) for i in range(1, 10, 2)]


def test_many_settled_messages_stay_settled_and_the_rest_keep_their_order(rnode, qname):
    """Thousands of 1 KiB messages, most acknowledged: a restart brings back exactly the others."""
    n = 3000
    ch = channel(rnode)
    ch.queue_declare(qname, durable=True)
    publish_committed(ch, qname, [b"%05d" % i + b"x" * 1019 for i in range(n)])
    for i in range(n):
        method, _p, body = ch.basic_get(qname)
        assert int(body[:5]) == i
        if i % 7:
            ch.basic_ack(method.delivery_tag)
    ch.connection.close()  # every seventh goes back to the queue, redelivered
    rnode.restart()
    got = bodies(rnode, qname)
    assert [int(b[:5]) for b, _ in got] == list(range(0, n, 7))
    assert all(r for _, r in got)


def test_purge_is_durable(rnode, qname):
    ch = channel(rnode)
    ch.queue_declare(qname, durable=True)
    publish_committed(ch, qname, [b"old1", b"old2"])
    assert ch.queue_purge(qname).method.message_count == 2
    publish_committed(ch, qname, [b"new"])
    rnode.restart()
    assert bodies(rnode, qname) == [(b"new", False)]


def test_queue_delete_is_durable_and_a_new_queue_of_the_same_name_starts_empty(rnode, qname, kind):
    ch = channel(rnode)
    ch.queue_declare(qname, durable=True)
    publish_committed(ch, qname, [b"old1", b"old2"])
    ch.queue_delete(qname)
    rnode.restart()
    assert not queue_exists(rnode, qname)
    ch = channel(rnode)
    ch.queue_declare(qname, durable=True)
    publish_committed(ch, qname, [b"new"])
    rnode.crash_restart()
    assert bodies(rnode, qname) == [(b"new", True)]


def test_persistent_message_routed_to_two_durable_queues_survives_in_both(rnode, qname):
    ch = channel(rnode)
    x = qname + ".x"
    ch.exchange_declare(x, "fanout", durable=True)
    for s in ("a", "b"):
        ch.queue_declare(f"{qname}.{s}", durable=True)
        ch.queue_bind(f"{qname}.{s}", x)
    publish_committed(ch, "", [b"both"], exchange=x)
    method, _p, _b = ch.basic_get(f"{qname}.a", auto_ack=True)  # settled in a only
    assert method is not None
    rnode.restart()
    assert bodies(rnode, f"{qname}.a") == []
    assert bodies(rnode, f"{qname}.b") == [(b"both", False)]


# -- definitions --------------------------------------------------------------------------------

def test_durable_exchanges_and_bindings_between_durable_ends_survive(rnode, qname):
    ch = channel(rnode)
    dx, tx = qname + ".dx", qname + ".tx"
    dq, tq = qname + ".dq", qname + ".tq"
    ch.exchange_declare(dx, "topic", durable=True)
    ch.exchange_declare(tx, "fanout", durable=False)
    ch.queue_declare(dq, durable=True)
    ch.queue_declare(tq, durable=False)
    ch.queue_bind(dq, dx, "a.*")
    ch.queue_bind(tq, dx, "b.*")
    ch.exchange_bind(destination=tx, source=dx, routing_key="c.*")
    rnode.restart()
    ch = channel(rnode)
    ch.exchange_declare(dx, "topic", durable=True, passive=True)
    code, text = channel_error(ch.exchange_declare, tx, "fanout", passive=True)
    assert (code, text) == (404, f"NOT_FOUND - no exchange '{tx}' in vhost '/'")
    ch = channel(rnode)
    publish_committed(ch, "a.1", [b"routed"], exchange=dx)
    assert bodies(rnode, dq) == [(b"routed", False)]
    # the binding survived with its routing key: b.* leads nowhere now
    publish_committed(ch, "x.1", [b"unrouted"], exchange=dx)
    assert bodies(rnode, dq) == []


def test_durable_queue_keeps_its_arguments_across_a_restart(rnode, qname):
    args = {"x-max-length": 2, "x-message-ttl": 600000, "x-overflow": "reject-publish",
            "x-dead-letter-exchange": "amq.fanout"}
    ch = channel(rnode)
    ch.queue_declare(qname, durable=True, arguments=args)
    rnode.crash_restart()
    ch = channel(rnode)
    ch.queue_declare(qname, durable=True, arguments=args)  # equivalent: fine
    code, text = channel_error(ch.queue_declare, qname, durable=True, arguments={**args, "x-max-length": 3})
    assert code == 406
    assert text == (f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{qname}' in vhost '/': "
                    "received '3' but current is '2'")
    # and the limit still acts: the third message is refused
    ch = channel(rnode)
    ch.confirm_delivery()
    ch.basic_publish("", qname, b"1", PERSISTENT)
    ch.basic_publish("", qname, b"2", PERSISTENT)
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", qname, b"3", PERSISTENT)


def hashed(password: str) -> str:
    """RabbitMQ's rabbit_password_hashing_sha256: base64(salt + sha256(salt + password))."""
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def test_vhosts_users_and_permissions_survive_a_restart(kind, tmp_path):
    """Users, vhosts and permissions from a definitions file are kept by the node itself:
    they outlive a restart that follows a change to the node's other durable definitions."""
    defs = {
        "users": [{"name": "guest", "password_hash": hashed("guest"), "hashing_algorithm":
                   "rabbit_password_hashing_sha256", "tags": ["administrator"]},
                  {"name": "carol", "password_hash": hashed("s3cret"), "hashing_algorithm":
                   "rabbit_password_hashing_sha256", "tags": ["monitoring"]}],
        "vhosts": [{"name": "/"}, {"name": "dur-vh"}],
        "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
                        {"user": "carol", "vhost": "dur-vh", "configure": "^carol\\.", "write": ".*",
                         "read": ".*"}],
    }
    n = RestartableNode(kind, definitions=defs)
    try:
        n.start()
        carol = pika.PlainCredentials("carol", "s3cret")
        ch = connect(n, credentials=carol, virtual_host="dur-vh").channel()
        ch.queue_declare("carol.q", durable=True)  # a durable change: the node rewrites its definitions
        ch.connection.close()
        if kind == "rabbitmq":  # RabbitMQ would load the file again at boot: take it away
            n.node.config_extra = ""
        n.restart()
        ch = connect(n, credentials=carol, virtual_host="dur-vh").channel()
        ch.queue_declare("carol.q", durable=True, passive=True)
        code, text = channel_error(ch.queue_declare, "other.q")
        assert code == 403
        assert text == ("ACCESS_REFUSED - access to queue 'other.q' in vhost 'dur-vh' refused for user 'carol'")
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            connect(n, credentials=pika.PlainCredentials("carol", "wrong"), virtual_host="dur-vh")
    finally:
        n.cleanup()


def test_messages_of_a_queue_defined_in_a_definitions_file_survive_restarts(kind):
    """A definitions file written by hand or exported from RabbitMQ names durable queues but
    carries nothing of the node's own bookkeeping: their messages must survive all the same."""
    defs = {
        "users": [{"name": "guest", "password_hash": hashed("guest"), "hashing_algorithm":
                   "rabbit_password_hashing_sha256", "tags": ["administrator"]}],
        "vhosts": [{"name": "/"}],
        "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
        "queues": [{"name": "from-defs", "vhost": "/", "durable": True, "auto_delete": False,
                    "arguments": {"x-max-length": 100}}],
    }
    n = RestartableNode(kind, definitions=defs)
    try:
        n.start()
        publish_committed(channel(n), "from-defs", [b"a", b"b", b"c"])
        n.restart()
        assert message_count(n, "from-defs") == 3
        n.crash_restart()
        assert bodies(n, "from-defs") == [(b, True) for b in (b"a", b"b", b"c")]
    finally:
        n.cleanup()
