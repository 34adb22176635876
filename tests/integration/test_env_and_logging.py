"""A node configured the way containers and service managers configure it: HUTCH_* environment
variables (RabbitMQ's RABBITMQ_* ones), log sinks from the log.* keys, and systemd's readiness
protocol through a real datagram socket standing in for $NOTIFY_SOCKET (docs/deployment.md).

Every node here is a real `hutch server` process started without command-line options unless the
test is about their precedence; each runs in its own temporary directory and is killed at the end.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pika
import pytest

from hutch.broker.broker import Config
from hutch.server import environment, logs
from tests.support.brokers import ROOT, _die_with_parent, amqp_ready, free_port, port_open, wait_until


class Proc:
    """`hutch server` with the given environment (and nothing else of ours) and arguments."""

    def __init__(self, tmp: Path, env: dict[str, str], args: list[str] | None = None):
        self.tmp = tmp
        self.out = tmp / "stdout.txt"
        self.err = tmp / "stderr.txt"
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_") and k != "NOTIFY_SOCKET"}
        child_env["PYTHONPATH"] = str(ROOT / "src")
        child_env.setdefault("HUTCH_CLUSTER_SECRET", "env-test-secret")
        child_env.update(env)
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "hutch", "server", *(args or [])], cwd=tmp,
                                         env=child_env, stdout=out, stderr=err, start_new_session=True,
                                         preexec_fn=_die_with_parent)

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_amqp(self, port: int, timeout_s: float = 60) -> None:
        try:
            wait_until(lambda: amqp_ready("127.0.0.1", port), timeout_s, f"AMQP on {port}", proc=self.proc)
        except RuntimeError as e:
            raise AssertionError(f"{e}\nstdout:\n{self.stdout()[-2000:]}\nstderr:\n{self.stderr()[-2000:]}") from None

    def wait_exit(self, timeout_s: float = 60) -> int:
        return self.proc.wait(timeout_s)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def procs():
    started: list[Proc] = []

    def start(tmp: Path, env: dict[str, str], args: list[str] | None = None) -> Proc:
        p = Proc(tmp, env, args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


def http_get(port: int, path: str, user: str, password: str):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def amqp(port: int, user: str, password: str, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, vhost, pika.PlainCredentials(user, password), connection_attempts=1, socket_timeout=5))


# ------------------------------------------------------------------ a container-like start


def test_node_configured_by_environment_alone(tmp_path, procs):
    amqp_port, dist_port, mgmt_port = free_port(), free_port(), free_port()
    conf = tmp_path / "etc" / "hutch.conf"
    conf.parent.mkdir()
    # the file's values lose to the environment's; management.tcp.port has no variable
    conf.write_text(f"listeners.tcp.default = {free_port()}\ndefault_user = from-file\n"
                    f"management.tcp.port = {mgmt_port}\nnode_name = file@localhost\n")
    log_file = tmp_path / "logs" / "custom.log"
    p = procs(tmp_path, {
        "HUTCH_NODENAME": "envnode@localhost", "HUTCH_NODE_PORT": str(amqp_port), "HUTCH_DIST_PORT": str(dist_port),
        "HUTCH_DEFAULT_USER": "alice", "HUTCH_DEFAULT_PASS": "s3cret#pass", "HUTCH_DEFAULT_VHOST": "orders",
        "HUTCH_CONFIG_FILE": str(conf), "HUTCH_DATA_DIR": str(tmp_path / "data"), "HUTCH_LOGS": str(log_file),
    })
    p.wait_amqp(amqp_port)
    assert port_open("127.0.0.1", dist_port)
    wait_until(lambda: port_open("127.0.0.1", mgmt_port), 30, "HTTP API", proc=p.proc)

    # the default user, password and vhost: alice may publish and get in 'orders'
    conn = amqp(amqp_port, "alice", "s3cret#pass", "orders")
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"hello")
    assert ch.basic_get(q, auto_ack=True)[2] == b"hello"
    conn.close()
    with pytest.raises((pika.exceptions.ProbableAuthenticationError, pika.exceptions.AuthenticationError)):
        amqp(amqp_port, "guest", "guest")  # no guest: the default user is alice

    overview = http_get(mgmt_port, "/api/overview", "alice", "s3cret#pass")
    assert overview["node"] == "envnode@localhost"
    assert {"protocol": "amqp", "port": amqp_port} in [{"protocol": x["protocol"], "port": x["port"]}
                                                        for x in overview["listeners"]]

    # data and log where the environment said; the log file only, nothing under DATA_DIR/log
    assert (tmp_path / "data" / "raft").is_dir()
    assert not (tmp_path / "data" / "log").exists()
    assert not (tmp_path / "var").exists()
    assert "Server startup complete; node envnode@localhost is ready" in log_file.read_text()
    assert "s3cret" not in log_file.read_text() + p.stderr()
    assert p.stop() == 0
    assert "Successfully stopped hutch node envnode@localhost" in log_file.read_text()


def test_options_beat_environment_and_data_base_takes_the_node_name(tmp_path, procs):
    env_port, opt_port = free_port(), free_port()
    p = procs(tmp_path, {"HUTCH_NODENAME": "ignored@localhost", "HUTCH_NODE_PORT": str(env_port),
                         "HUTCH_DATA_BASE": str(tmp_path / "mnesia"), "HUTCH_DIST_PORT": str(free_port()),
                         "HUTCH_LOG": "warning"},
              ["--node-name", "opt@localhost", "--amqp-port", str(opt_port), "--mgmt-port", "0",
               "--log-level", "info"])
    p.wait_amqp(opt_port)
    assert not port_open("127.0.0.1", env_port)
    assert p.stop() == 0
    # HUTCH_DATA_BASE/NODENAME with the name the option gave; --log-level beat HUTCH_LOG
    node_log = tmp_path / "mnesia" / "opt@localhost" / "log" / "opt@localhost.log"
    assert "started TCP listener" in node_log.read_text()
    assert "started TCP listener" in p.stderr()


@pytest.mark.parametrize("env, message", [
    ({"HUTCH_NODE_PORT": "five"}, "HUTCH_NODE_PORT='five': expected a port number"),
    ({"HUTCH_DIST_PORT": "70000"}, "HUTCH_DIST_PORT='70000': expected a port number"),
    ({"HUTCH_CONFIG_FILE": "/nonexistent/hutch.conf"}, "HUTCH_CONFIG_FILE='/nonexistent/hutch.conf': no such file"),
    ({"HUTCH_LOG": "chatty"}, "HUTCH_LOG='chatty': expected one of"),
])
def test_unusable_variable_is_a_clear_error(tmp_path, procs, env, message):
    p = procs(tmp_path, {**env, "HUTCH_DATA_DIR": str(tmp_path / "data")}, ["--mgmt-port", "0"])
    assert p.wait_exit() == 1
    assert message in p.stderr()


# ------------------------------------------------------------------ log sinks


def test_logs_dash_sends_everything_to_stdout_only(tmp_path, procs):
    port = free_port()
    p = procs(tmp_path, {"HUTCH_LOGS": "-", "HUTCH_NODE_PORT": str(port), "HUTCH_DIST_PORT": str(free_port()),
                         "HUTCH_NODENAME": "dash@localhost", "HUTCH_DATA_DIR": str(tmp_path / "data")},
              ["--mgmt-port", "0"])
    p.wait_amqp(port)
    assert p.stop() == 0
    out = p.stdout()
    assert "[info] <hutch.node> Server startup complete; node dash@localhost" in out
    assert "Successfully stopped hutch node dash@localhost" in out
    assert p.stderr() == ""
    assert not (tmp_path / "data" / "log").exists()


def test_file_rotation_json_and_levels_per_sink(tmp_path, procs):
    port = free_port()
    conf = tmp_path / "hutch.conf"
    conf.write_text("log.console.level = warning\n"
                    "log.file = rotating.log\n"
                    "log.file.level = info\n"
                    "log.file.formatter = json\n"
                    "log.file.rotation.size = 2500\n"
                    "log.file.rotation.count = 2\n"
                    "log.file.rotation.date = $D0\n")
    p = procs(tmp_path, {"HUTCH_CONFIG_FILE": str(conf), "HUTCH_NODE_PORT": str(port),
                         "HUTCH_DIST_PORT": str(free_port()), "HUTCH_LOG_BASE": str(tmp_path / "logdir"),
                         "HUTCH_DATA_DIR": str(tmp_path / "data")}, ["--mgmt-port", "0"])
    p.wait_amqp(port)
    logdir = tmp_path / "logdir"
    # each connection logs a line or two at info: enough of them fill the file several times over
    for _ in range(100):
        amqp(port, "guest", "guest").close()
    wait_until(lambda: (logdir / "rotating.log.2").exists(), 30, "two rotations", proc=p.proc)
    assert p.stop() == 0
    files = sorted(f.name for f in logdir.iterdir())
    assert files == ["rotating.log", "rotating.log.1", "rotating.log.2"]  # count = 2: no .3
    for name in files:
        text = (logdir / name).read_text()
        assert len(text.encode()) <= 2500
        for line in text.splitlines():
            entry = json.loads(line)
            assert set(entry) >= {"time", "level", "msg", "pid"}
            assert entry["level"] in ("info", "warning", "error", "critical")
            assert entry["time"].endswith("+00:00")
    newest = [json.loads(x) for x in (logdir / "rotating.log").read_text().splitlines()]
    assert any(e["msg"] == "Successfully stopped hutch node hutch@localhost" for e in newest)
    # the console (stderr, warning and above) has no info lines, only the warning about the
    # date-based rotation hutch does not implement
    err = p.stderr()
    assert "[info]" not in err and "accepting AMQP connection" not in err
    assert "[warning] <hutch.node> 'log.file.rotation.date = $D0' is accepted but hutch does not implement it" in err


def test_console_json_and_file_off(tmp_path, procs):
    port = free_port()
    conf = tmp_path / "hutch.conf"
    conf.write_text("log.console = true\nlog.console.formatter = json\nlog.console.level = info\nlog.file = false\n")
    p = procs(tmp_path, {"HUTCH_CONFIG_FILE": str(conf), "HUTCH_NODE_PORT": str(port),
                         "HUTCH_DIST_PORT": str(free_port()), "HUTCH_DATA_DIR": str(tmp_path / "data")},
              ["--mgmt-port", "0"])
    p.wait_amqp(port)
    assert p.stop() == 0
    entries = [json.loads(line) for line in p.stdout().splitlines()]  # log.console = true: stdout
    assert any(e["msg"].startswith("started TCP listener on") and e["component"] == "hutch.node" for e in entries)
    assert p.stderr() == ""
    assert not (tmp_path / "data" / "log").exists()


def test_bad_log_setting_stops_the_start(tmp_path, procs):
    conf = tmp_path / "hutch.conf"
    conf.write_text("log.console.stdio = printer\n")
    p = procs(tmp_path, {"HUTCH_CONFIG_FILE": str(conf), "HUTCH_DATA_DIR": str(tmp_path / "data")},
              ["--mgmt-port", "0"])
    assert p.wait_exit() == 1
    assert "log.console.stdio: expected stdout or stderr, got 'printer'" in p.stderr()


# ------------------------------------------------------------------ systemd Type=notify


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_sd_notify_ready_then_stopping(tmp_path, procs, abstract):
    port = free_port()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"hutch-notify-{os.getpid()}-{time.monotonic_ns()}"
        sock.bind("\0" + name)
        notify = "@" + name
    else:
        notify = str(tmp_path / "notify.sock")
        sock.bind(notify)
    sock.settimeout(60)
    try:
        p = procs(tmp_path, {"NOTIFY_SOCKET": notify, "HUTCH_NODE_PORT": str(port),
                             "HUTCH_DIST_PORT": str(free_port()), "HUTCH_DATA_DIR": str(tmp_path / "data")},
                  ["--mgmt-port", "0"])
        first = sock.recv(4096).decode().split("\n")
        # READY=1 comes only once the node is fully booted: AMQP answers at that moment
        assert amqp_ready("127.0.0.1", port)
        assert "READY=1" in first
        assert f"MAINPID={p.proc.pid}" in first
        assert any(x.startswith("STATUS=") for x in first)
        p.proc.send_signal(signal.SIGTERM)
        second = sock.recv(4096).decode().split("\n")
        assert "STOPPING=1" in second
        assert p.wait_exit() == 0
    finally:
        sock.close()


def test_without_notify_socket_nothing_is_sent(tmp_path):
    from hutch.server import sdnotify

    assert sdnotify.notify("READY=1", environ={}) is False
    # a socket path nobody listens on: a warning, never an exception
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": str(tmp_path / "nobody")}) is False


# ------------------------------------------------------------------ the rules, without processes


def test_environment_precedence_rules():
    cfg = Config()
    environment.apply(cfg, environment.read({"HUTCH_NODE_PORT": "6000", "HUTCH_DEFAULT_VHOST": "",
                                             "HUTCH_LOGS": "-"}))
    assert cfg.amqp_port == 6000
    assert cfg.peer_port == 26000  # RabbitMQ: the distribution port follows NODE_PORT + 20000
    assert cfg.default_vhost == "/"  # empty means unset
    assert cfg.log_settings["log.file"] == "false" and cfg.log_settings["log.console.stdio"] == "stdout"

    cfg = Config()
    environment.apply(cfg, environment.read({"HUTCH_LOGS": "relative/n.log"}))
    assert cfg.log_settings["log.file"] == os.path.abspath("relative/n.log")

    cfg = Config()
    cfg.peer_port = 4369  # set by the configuration file: a derived default does not override it
    environment.apply(cfg, environment.read({"HUTCH_NODE_PORT": "6000"}))
    assert cfg.peer_port == 4369

    cfg = Config()
    environment.apply(cfg, environment.read({"HUTCH_DATA_BASE": "/srv/hutch", "HUTCH_NODENAME": "a@b"}))
    environment.finish(cfg, environment.read({"HUTCH_DATA_BASE": "/srv/hutch"}), data_dir_option=None)
    assert cfg.data_dir == "/srv/hutch/a@b"


def test_log_plan_defaults_are_hutchs_usual_sinks():
    plan = logs.plan({}, "info", "/d", "n@h")
    assert [(s.kind, s.path, s.level, s.formatter) for s in plan.sinks] == [
        ("console", None, "info", "plaintext"), ("file", "/d/log/n@h.log", "info", "plaintext")]
    assert plan.sinks[0].stream == "stderr" and plan.sinks[1].rotation_size == 0
    plan = logs.plan({"log.file.level": "none", "log.console.level": "debug"}, "debug", "/d", "n@h")
    assert [s.kind for s in plan.sinks] == ["console"]
    plan = logs.plan({"log.file": "/abs/x.log", "log.dir": "/ignored"}, "info", "/d", "n@h")
    assert plan.sinks[1].path == "/abs/x.log"


def test_sigterm_during_the_boot_is_a_graceful_stop(tmp_path, procs):
    """A node waiting for its cluster at boot (the other member is not there) is stopped by
    SIGTERM: it says STOPPING=1, never READY=1, and exits 0 rather than dying of the signal."""
    notify = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify)
    sock.settimeout(60)
    peer, absent = free_port(), free_port()
    try:
        p = procs(tmp_path, {"NOTIFY_SOCKET": notify, "HUTCH_DATA_DIR": str(tmp_path / "data")},
                  ["--node-name", "a@localhost", "--amqp-port", str(free_port()), "--mgmt-port", "0",
                   "--peer-port", str(peer), "--cluster-nodes", f"a@localhost:{peer},b@localhost:{absent}",
                   "--metadata-timeout", "120000"])
        wait_until(lambda: "started peer listener" in p.stderr(), 60, "the peer listener", proc=p.proc)
        assert "Server startup complete" not in p.stderr()  # still booting: b is not there
        p.proc.send_signal(signal.SIGTERM)
        assert p.wait_exit(30) == 0
        assert sock.recv(4096).decode().split("\n")[0] == "STOPPING=1"
        assert "hutch was asked to stop while booting" in p.stderr()
        assert "Successfully stopped hutch node a@localhost" in p.stderr()
    finally:
        sock.close()
