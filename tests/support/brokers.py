"""Start real broker processes for tests and benchmarks: hutch nodes and the reference RabbitMQ.

Every process started here is owned by the object that started it and is stopped by it
(context managers); nothing is left running after a test. Ports come from the kernel
(bind to port 0), and readiness is a condition (the AMQP port accepts and answers a
protocol header), never a sleep.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the test process dies, however it dies, so a
    killed or timed-out test run never leaves broker processes behind (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


_handed_out: set[int] = set()
_rng = random.Random(os.getpid() ^ int(time.time() * 1000))


def free_port() -> int:
    """A port nothing listens on now, never the same one twice in this process (the kernel may
    hand a just-closed ephemeral port out again, and two nodes must not race for it).
    Ports come from below the kernel's ephemeral range (32768 and up on Linux), so an outgoing
    connection's source port can never take a port between its choice and the node's bind."""
    for _ in range(1000):
        port = _rng.randrange(20000, 32000)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port found")


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def amqp_ready(host: str, port: int) -> bool:
    """True when something on host:port speaks AMQP (answers a header with connection.start)."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            s.settimeout(2.0)
            data = s.recv(8)
            return len(data) >= 7 and data[0] == 1  # a method frame
    except OSError:
        return False


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def wait_until(cond, timeout_s: float, what: str, interval_s: float = 0.05, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode} before it was ready")
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not ready after {timeout_s}s")


class HutchNode:
    """A hutch server process on loopback.

    >>> with HutchNode() as node:
    ...     pika.BlockingConnection(pika.URLParameters(node.url))
    """

    def __init__(self, name: str = "hutch@localhost", amqp_port: int | None = None,
                 data_dir: str | os.PathLike | None = None, log_level: str = "info",
                 extra_args: list[str] | None = None, env: dict | None = None, mgmt_port: int | None = None):
        self.name = name
        self.amqp_port = amqp_port or free_port()
        self.mgmt_port = free_port() if mgmt_port is None else mgmt_port  # 0: no management HTTP API
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="hutch-test-")
            data_dir = self._tmp
        self.data_dir = Path(data_dir)
        self.log_level = log_level
        self.extra_args = list(extra_args or [])
        if "--peer-port" not in self.extra_args:  # every node listens for peers; keep clear of 25672
            self.extra_args += ["--peer-port", str(free_port())]
        if "--stream-port" not in self.extra_args:  # and for stream-protocol clients; keep clear of 5552
            self.extra_args += ["--stream-port", str(free_port())]
        self.stream_port = int(self.extra_args[self.extra_args.index("--stream-port") + 1])
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir / "node.log"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return self.amqp_port

    @property
    def http_port(self) -> int | None:
        return self.mgmt_port or None

    @property
    def mgmt_url(self) -> str | None:
        return f"http://127.0.0.1:{self.mgmt_port}" if self.mgmt_port else None

    def start(self, timeout_s: float = 20.0, wait: bool = True) -> HutchNode:
        """Start the node and wait until AMQP (and the HTTP API) answer; `wait=False` returns once
        the process is launched (then call `wait_ready`), for nodes that must boot together."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "hutch", "server", "--node-name", self.name,
               "--amqp-port", str(self.amqp_port), "--data-dir", str(self.data_dir),
               "--log-level", self.log_level, "--mgmt-port", str(self.mgmt_port), *self.extra_args]
        if "--prometheus-port" not in self.extra_args:
            cmd += ["--prometheus-port", "0"]  # no metrics listener unless the test asks for one
        # the node is configured by its arguments and `env` only: HUTCH_* variables of the shell
        # running the tests would change it (where it logs, its node name, its ports)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
        env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
        if self.env:
            env.update(self.env)
        logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        logf.close()
        if wait:
            self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        try:
            wait_until(lambda: amqp_ready("127.0.0.1", self.amqp_port), timeout_s,
                       f"hutch node {self.name} on {self.amqp_port}", proc=self.proc)
            if self.mgmt_port:
                wait_until(lambda: port_open("127.0.0.1", self.mgmt_port), timeout_s,
                           f"hutch node {self.name} HTTP API on {self.mgmt_port}", proc=self.proc)
        except (RuntimeError, TimeoutError) as e:  # say why: the end of the node's own output
            tail = "\n".join(self.log().splitlines()[-25:])
            raise type(e)(f"{e}\n--- last lines of {self.log_path}:\n{tail}") from None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Graceful stop (SIGTERM), then SIGKILL if it does not go."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def kill(self) -> None:
        """kill -9: no chance to flush anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> HutchNode:
        self.stop()
        return self.start()

    def cleanup(self) -> None:
        self.kill()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> HutchNode:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()


RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def ensure_rabbitmq_installed() -> None:
    """Install Debian's rabbitmq-server if it is missing (the reference broker)."""
    if Path(RABBITMQ_SERVER).exists():
        return
    subprocess.run("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                   "rabbitmq-server", shell=True, check=True, stdout=subprocess.DEVNULL)
    # Debian's package may start a node of its own; the reference nodes here are ours.
    subprocess.run(["pkill", "-f", "beam.smp.*rabbit@"], check=False)


class RabbitMQNode:
    """A private RabbitMQ node from Debian's package, on its own ports and in its own directory.

    Nothing is shared with a system RabbitMQ: its own node name, HOME (Erlang cookie),
    data and log directories, config and enabled-plugins files.
    """

    def __init__(self, amqp_port: int | None = None, mgmt_port: int | None = None,
                 management: bool = True, name: str | None = None, config_extra: str = "",
                 cookie: str | None = None, dist_port: int | None = None, env: dict | None = None):
        """`cookie`: the Erlang cookie (written to the node's own HOME), the same for nodes that are to
        form a cluster; `env`: extra environment for the node and its CLI tools (ERL_EPMD_PORT, ...)."""
        self.amqp_port = amqp_port or free_port()
        self.mgmt_port = mgmt_port or free_port()
        self.dist_port = dist_port or free_port()
        self.management = management
        self.nodename = name or f"hutchref{self.amqp_port}@localhost"
        self.config_extra = config_extra
        self.cookie = cookie
        self.extra_env = dict(env or {})
        self.dir = Path(tempfile.mkdtemp(prefix="rabbitref-"))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return self.amqp_port

    def _env(self) -> dict:
        env = dict(os.environ)
        env.update({
            "HOME": str(self.dir),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.dir / "rabbit.pid"),
            "RABBITMQ_ALLOW_INPUT": "",
        })
        env.update(self.extra_env)
        return env

    def start(self, timeout_s: float = 90.0, wait: bool = True) -> RabbitMQNode:
        """Start the node and wait until AMQP answers; `wait=False` returns once the process is
        launched (then call `wait_ready`), so several nodes can boot at once from one thread."""
        ensure_rabbitmq_installed()
        (self.dir / "mnesia").mkdir(parents=True, exist_ok=True)
        (self.dir / "log").mkdir(parents=True, exist_ok=True)
        if self.cookie is not None:
            cookie_path = self.dir / ".erlang.cookie"
            if cookie_path.exists():
                cookie_path.chmod(0o600)
            cookie_path.write_text(self.cookie)
            cookie_path.chmod(0o400)  # Erlang refuses a cookie file others can read
        conf = [f"listeners.tcp.default = {self.amqp_port}", "loopback_users = none"]
        if self.management:
            conf.append(f"management.tcp.port = {self.mgmt_port}")
            conf.append("management.tcp.ip = 127.0.0.1")
        if self.config_extra:
            conf.append(self.config_extra)
        (self.dir / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
        plugins = "[rabbitmq_management]." if self.management else "[]."
        (self.dir / "enabled_plugins").write_text(plugins + "\n")
        logf = open(self.dir / "server.out", "ab")
        self.proc = subprocess.Popen([RABBITMQ_SERVER], stdout=logf, stderr=subprocess.STDOUT,
                                     env=self._env(), start_new_session=True, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        logf.close()
        if wait:
            self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        wait_until(lambda: amqp_ready("127.0.0.1", self.amqp_port), timeout_s,
                   f"RabbitMQ {self.nodename} on {self.amqp_port}", interval_s=0.2, proc=self.proc)

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", self.nodename, *args],
                              env=self._env(), capture_output=True, text=True, check=check, timeout=60)

    def pids(self) -> list[int]:
        """The broker's OS processes (beam.smp and children), for CPU and RSS measurement."""
        if self.proc is None:
            return []
        return [self.proc.pid]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RabbitMQNode:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()
