"""The lab: a local hutch cluster on loopback whose network and processes break on command.

A lab of N nodes lives in one directory. Node i (0-based) is ``hutch-{i+1}@localhost`` with
AMQP port ``P+i``, management (HTTP) port ``P+10000+i`` and peer port ``P+20000+i`` (P = 5672
by default, so 5672/15672/25672 as RabbitMQ), its data under ``DIR/hutch-{i+1}``. All nodes
share a secret file, ``DIR/cluster-secret`` (random, mode 0600), as Erlang nodes share a cookie.

Every directed peer link X->Y passes through a `FaultProxy`: X is started with
``--peer-address Y=127.0.0.1:<proxy port>`` and the proxy forwards to Y's peer port. A node
pair's single surviving connection is dialled by one of the two, so a pair is cut by breaking
both of its directed proxies.

One background process, the lab *controller*, owns the proxies and the node processes (it is
their parent, so it reaps them and sees them exit). It runs in a session of its own and
outlives the ``hutch lab`` command that started it. It answers a small JSON-over-HTTP control
interface on a loopback port, guarded by a bearer token; both are recorded, with its pid, the
proxy ports and every node's pid and command line, in ``DIR/lab.json`` (mode 0600). It holds
an exclusive lock on ``DIR/lab.lock`` while it runs: one lab per directory.

Faults are carried out only by the controller, which appends one JSON line per fault to
``DIR/faults.jsonl`` — kill, stop, start, suspend, resume, partition, cut, heal, delay — with the
wall-clock time (``time_ms``, and ``ts_ns`` as histories have it) and the fault windows it
opens or closes, written as `hutch.pipeline.history` writes a ``fault`` row's detail
(``start NAME ...`` / ``end NAME ...``). `fault_history_rows` turns the file into history rows.

`Lab` is the Python API (tests and benchmarks use it; ``hutch lab`` is a thin layer over it).
It talks to nodes only as a user does, over HTTP, and never imports a node's insides.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hutch.lab.proxy import MODES as PARTITION_MODES
from hutch.lab.proxy import FaultProxy

log = logging.getLogger("hutch.lab")

NODE_HOST = "localhost"
LOOPBACK = "127.0.0.1"
BASE_PORT_DEFAULT = 5672
MGMT_PORT_OFFSET = 10000
PROMETHEUS_PORT_OFFSET = 10020  # 5672 -> 15692, as RabbitMQ's rabbitmq_prometheus
PEER_PORT_OFFSET = 20000
STREAM_PORT_OFFSET = -120  # 5672 -> 5552, RabbitMQ's stream protocol port
NODES_MAX = 16
LAB_DIR_DEFAULT = "./var/lab"
NET_TICKTIME_S_DEFAULT = 4.0
METADATA_TIMEOUT_MS_DEFAULT = 5000
PARTITION_MODE_DEFAULT = "blackhole"
DELAY_MS_MAX = 600_000
UP_TIMEOUT_S_DEFAULT = 60.0
NODE_START_TIMEOUT_S_DEFAULT = 30.0
STOP_TIMEOUT_S_DEFAULT = 15.0
CONTROLLER_START_TIMEOUT_S = 15.0
CONTROL_TIMEOUT_S = 60.0  # one control request (a stop waits for the node to exit)
HTTP_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.1
GUEST = ("guest", "guest")

LAB_JSON = "lab.json"
LAB_LOCK = "lab.lock"
FAULTS_JSONL = "faults.jsonl"
SECRET_FILE = "cluster-secret"
CONTROLLER_LOG = "controller.log"
CONSOLE_LOG = "console.log"

NODE_ACTIONS = ("kill", "stop", "start", "suspend", "resume")


class LabError(Exception):
    """A lab command could not be carried out; the message says why and what to do."""


# ---------------------------------------------------------------------------------------------
# The plan: names, ports, directories and command lines (pure functions)


@dataclass(frozen=True)
class NodeSpec:
    index: int  # 0-based
    name: str  # hutch-1@localhost
    amqp_port: int
    mgmt_port: int
    peer_port: int
    data_dir: str
    prometheus_port: int = 0  # 0: none (labs made before the metrics listener)
    stream_port: int = 0  # 0: none (labs made before streams)

    @property
    def short_name(self) -> str:
        return self.name.split("@", 1)[0]

    @property
    def amqp_url(self) -> str:
        return f"amqp://guest:guest@{LOOPBACK}:{self.amqp_port}/%2F"

    @property
    def http_url(self) -> str:
        return f"http://{LOOPBACK}:{self.mgmt_port}"

    @property
    def console_log(self) -> str:
        return str(Path(self.data_dir) / CONSOLE_LOG)

    @property
    def node_log(self) -> str:
        """The node's own log file (the server writes DATA_DIR/log/NODE.log)."""
        return str(Path(self.data_dir) / "log" / f"{self.name}.log")

    def ports(self) -> dict[str, int]:
        ports = {"AMQP": self.amqp_port, "HTTP": self.mgmt_port, "peer": self.peer_port}
        if self.prometheus_port:
            ports["Prometheus"] = self.prometheus_port
        if self.stream_port:
            ports["stream"] = self.stream_port
        return ports

    @classmethod
    def from_record(cls, record: dict) -> NodeSpec:
        """A spec from its lab.json record (fields a record lacks take their defaults)."""
        return cls(**{k: record[k] for k in cls.__dataclass_fields__ if k in record})


def plan_nodes(count: int, base_port: int, lab_dir: str | os.PathLike) -> list[NodeSpec]:
    if not 1 <= count <= NODES_MAX:
        raise LabError(f"a lab has 1 to {NODES_MAX} nodes, not {count}")
    if base_port + STREAM_PORT_OFFSET < 1 or base_port + PEER_PORT_OFFSET + count - 1 > 65535:
        raise LabError(f"base port {base_port}: P{STREAM_PORT_OFFSET} must be a port and P+{PEER_PORT_OFFSET}+"
                       f"{count - 1} must stay below 65536")
    root = Path(lab_dir).resolve()
    return [NodeSpec(i, f"hutch-{i + 1}@{NODE_HOST}", base_port + i, base_port + MGMT_PORT_OFFSET + i,
                     base_port + PEER_PORT_OFFSET + i, str(root / f"hutch-{i + 1}"),
                     base_port + PROMETHEUS_PORT_OFFSET + i, base_port + STREAM_PORT_OFFSET + i)
            for i in range(count)]


def directed_links(nodes: Iterable[NodeSpec]) -> list[tuple[str, str]]:
    """Every ordered pair (X, Y) of distinct nodes: X dials Y through the proxy of this link."""
    names = [n.name for n in nodes]
    return [(x, y) for x in names for y in names if x != y]


def links_across(links: Iterable[tuple[str, str]], isolated: Iterable[str]) -> list[tuple[str, str]]:
    """The links a partition of `isolated` from the rest breaks: those with one end on each side."""
    side = set(isolated)
    return [(x, y) for x, y in links if (x in side) != (y in side)]


@dataclass(frozen=True)
class ClockSkew:
    """Another host's clock for one lab node (hutch.server.clock's fault switches): a wall clock
    `wall_offset_ms` ahead (negative: behind) and a boot `boot_offset_s` earlier. A node's time
    is read from the wall clock once, at start, so the skew holds from the node's next start."""

    wall_offset_ms: float = 0.0
    boot_offset_s: float = 0.0

    def env(self) -> dict[str, str]:
        return {"HUTCH_FAULT_WALL_OFFSET_MS": repr(float(self.wall_offset_ms)),
                "HUTCH_FAULT_BOOT_OFFSET_S": repr(float(self.boot_offset_s))}


def resolve_node(nodes: list[NodeSpec], ref: str | int) -> NodeSpec:
    """The node named by `ref`: ``hutch-2``, ``hutch-2@localhost`` or the 1-based index ``2``."""
    text = str(ref).strip()
    for n in nodes:
        if text in (n.name, n.short_name, str(n.index + 1)):
            return n
    known = ", ".join(n.short_name for n in nodes)
    raise LabError(f"no node {text!r} in this lab (nodes: {known}; or 1..{len(nodes)})")


def node_command(spec: NodeSpec, nodes: list[NodeSpec], proxy_ports: dict[tuple[str, str], int],
                 secret_file: str, net_ticktime_s: float, metadata_timeout_ms: int,
                 log_level: str = "info", python: str | None = None) -> list[str]:
    """The `hutch server` command line of one lab node, its peers reached through its proxies."""
    cmd = [python or sys.executable, "-m", "hutch", "server",
           "--node-name", spec.name, "--amqp-host", LOOPBACK, "--amqp-port", str(spec.amqp_port),
           "--mgmt-port", str(spec.mgmt_port), "--peer-port", str(spec.peer_port),
           "--prometheus-port", str(spec.prometheus_port), "--stream-port", str(spec.stream_port),
           "--data-dir", spec.data_dir, "--log-level", log_level,
           "--cluster-nodes", ",".join(f"{n.name}:{n.peer_port}" for n in nodes),
           "--cluster-secret-file", secret_file,
           "--net-ticktime", f"{net_ticktime_s:g}", "--metadata-timeout", str(metadata_timeout_ms)]
    for peer in nodes:
        if peer.name != spec.name:
            cmd += ["--peer-address", f"{peer.name}={LOOPBACK}:{proxy_ports[(spec.name, peer.name)]}"]
    return cmd


def size_mismatch(lab_dir: str | os.PathLike, specs: list[NodeSpec]) -> str | None:
    """Why a lab of `specs` cannot start on the data left in `lab_dir`, or None.

    A node's data holds its cluster's membership: the nodes of a 3-node lab, started again as a
    1-node lab, would wait forever for peers that no longer exist (no catalogue majority)."""
    root = Path(lab_dir)
    planned = {Path(s.data_dir).name for s in specs}
    found = sorted((p.name for p in root.glob("hutch-*") if p.is_dir() and (p / "raft").exists()),
                   key=lambda n: int(n.rsplit("-", 1)[1]) if n.rsplit("-", 1)[1].isdigit() else 0)
    if not found or set(found) == planned:
        return None
    return (f"{root} holds the data of a {len(found)}-node lab ({', '.join(found)}), not of a "
            f"{len(specs)}-node one; its nodes would wait for members that are not there. "
            f"Delete it with `hutch lab down --wipe --dir {root}`, or start this lab in another --dir")


def port_in_use(port: int) -> bool:
    """True when something listens on `port` (on any address): a node could not bind it."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the node's listeners do
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def process_state(pid: int | None) -> str:
    """``running``, ``suspended`` (stopped by a signal, /proc state T) or ``stopped`` (gone or a zombie)."""
    if not pid:
        return "stopped"
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return "stopped"
    state = stat.rsplit(")", 1)[1].split()[0]  # the comm field may hold spaces and parentheses
    if state in ("Z", "X"):
        return "stopped"
    if state in ("T", "t"):
        return "suspended"
    return "running"


def _is_lab_node(pid: int, name: str) -> bool:
    """The process `pid` is still the lab node `name` (not a later process that reused the pid)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return name.encode() in argv and process_state(pid) != "stopped"


def _die_with_parent(sig: int) -> None:
    """In a child before exec: receive `sig` when the parent dies, however it dies (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Talking to nodes (as a user does: their management HTTP API)


def http_get_json(url: str, timeout_s: float = HTTP_TIMEOUT_S, auth: tuple[str, str] = GUEST) -> Any:
    token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    req = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def http_answers(spec: NodeSpec) -> bool:
    """The node's management listener answers HTTP. Any answer counts: a clustered node only knows
    its users (guest included) once the catalogue has formed, and says 401 until then."""
    try:
        http_get_json(f"{spec.http_url}/api/overview")
        return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def cluster_view(spec: NodeSpec) -> dict | str:
    """GET /api/hutch/cluster on one node: its view of the cluster, or why there is none."""
    try:
        return http_get_json(f"{spec.http_url}/api/hutch/cluster")
    except urllib.error.HTTPError as e:
        return f"GET /api/hutch/cluster answers {e.code} {e.reason}"
    except (OSError, ValueError) as e:
        return f"its HTTP API does not answer ({e})"


def health_problem(members: list[str], view: dict | str) -> str | None:
    """Why a node with this view does not (yet) see a healthy cluster, or None when it does: every
    member running and a catalogue leader known."""
    if isinstance(view, str):
        return view
    running = set(view.get("running_nodes") or [])
    missing = [m for m in members if m not in running]
    if missing:
        return f"it does not see {', '.join(missing)} running"
    if not view.get("leader"):
        return "it knows no catalogue leader"
    return None


# ---------------------------------------------------------------------------------------------
# Fault records


def fault_history_rows(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(ts_ns, detail) of every fault-window event in a faults.jsonl, in the file's order, ready for
    ``HistoryWriter.record("fault", "", ts_ns=ts_ns, detail=detail)``. A fault that opens or closes
    no window (e.g. a heal with nothing to heal) is a point event whose detail is its summary."""
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            windows = rec.get("windows") or [rec.get("detail", rec.get("fault", "fault"))]
            for detail in windows:
                yield int(rec["ts_ns"]), detail


def _window(kind: str, name: str, text: str = "") -> str:
    # The detail format of hutch.pipeline.history's fault_start/fault_end, kept free of pyarrow here.
    assert kind in ("start", "end") and name and not any(c.isspace() for c in name), (kind, name)
    return f"{kind} {name} {text}".rstrip()


# ---------------------------------------------------------------------------------------------
# The controller (runs in its own process: ``python -m hutch.lab.cluster --dir DIR --config JSON``)


@dataclass
class _Node:
    spec: NodeSpec
    command: list[str]
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def state(self) -> str:
        return process_state(self.pid) if self.alive else "stopped"


class Controller:
    """Owns one lab's proxies and node processes and carries out faults on request."""

    def __init__(self, lab_dir: Path, config: dict):
        self.dir = lab_dir
        self.config = config
        self.specs = [NodeSpec.from_record(n) for n in config["nodes"]]
        self.secret_file = str(lab_dir / SECRET_FILE)
        self.token = config["token"]
        self.proxies: dict[tuple[str, str], FaultProxy] = {}
        self.nodes: dict[str, _Node] = {}
        self.open_windows: list[str] = []  # names of the fault windows opened and not yet closed
        self.control_port = 0
        self._stopping = asyncio.Event()
        self._lock = asyncio.Lock()  # one fault at a time, so faults.jsonl is in the order applied
        self._tg: asyncio.TaskGroup | None = None

    # -- lifecycle

    async def run(self) -> None:
        from aiohttp import web

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        avoid = {p for s in self.specs for p in s.ports().values()}
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            try:
                for x, y in directed_links(self.specs):
                    target = next(s for s in self.specs if s.name == y)
                    self.proxies[(x, y)] = await self._start_proxy(target.peer_port, avoid)
                ports = {k: p.listen_port for k, p in self.proxies.items()}
                for s in self.specs:
                    cmd = node_command(s, self.specs, ports, self.secret_file, self.config["net_ticktime_s"],
                                       self.config["metadata_timeout_ms"], self.config["log_level"])
                    cmd += self.config.get("node_args", [])
                    self.nodes[s.name] = _Node(s, cmd)

                @web.middleware
                async def serve(request, handler):
                    return await self._serve(request, handler)

                app = web.Application(middlewares=[serve])
                app.add_routes([web.get("/status", self._h_status),
                                web.post("/nodes/{node}/{action}", self._h_node),
                                web.post("/partition", self._h_partition),
                                web.post("/cut", self._h_cut),
                                web.post("/heal", self._h_heal),
                                web.post("/delay", self._h_delay),
                                web.post("/shutdown", self._h_shutdown)])
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                site = web.TCPSite(runner, LOOPBACK, 0)
                await site.start()
                self.control_port = runner.addresses[0][1]
                for node in self.nodes.values():
                    await self._spawn(node)
                self._save()
                log.info("lab of %d nodes running; control on %s:%d", len(self.specs), LOOPBACK,
                         self.control_port)
                await self._stopping.wait()
                await self._stop_all(self.config.get("stop_timeout_s", STOP_TIMEOUT_S_DEFAULT))
                await runner.cleanup()
            finally:
                for node in self.nodes.values():  # whatever went wrong, leave no node behind
                    if node.alive:
                        with contextlib.suppress(ProcessLookupError):
                            node.proc.kill()
                for proxy in self.proxies.values():
                    await proxy.close()
        self._save(state="stopped")
        log.info("lab stopped")

    async def _start_proxy(self, target_port: int, avoid: set[int]) -> FaultProxy:
        for _ in range(100):
            with socket.socket() as s:
                s.bind((LOOPBACK, 0))
                port = s.getsockname()[1]
            if port in avoid:
                continue
            proxy = FaultProxy(port, LOOPBACK, target_port)
            try:
                await proxy.start()
            except OSError:
                continue
            avoid.add(port)
            return proxy
        raise LabError("no free port for a fault proxy")

    def _save(self, state: str = "running") -> None:
        data = {
            "version": 1,
            "state": state,
            "dir": str(self.dir),
            "started_ms": self.config["started_ms"],
            "base_port": self.config["base_port"],
            "net_ticktime_s": self.config["net_ticktime_s"],
            "metadata_timeout_ms": self.config["metadata_timeout_ms"],
            "secret_file": self.secret_file,
            "controller": {"pid": os.getpid(), "control_url": f"http://{LOOPBACK}:{self.control_port}",
                           "token": self.token, "log": str(self.dir / CONTROLLER_LOG)},
            "nodes": [{**n.spec.__dict__, "pid": n.pid, "command": n.command} for n in self.nodes.values()],
            "links": [{"from": x, "to": y, "listen_port": p.listen_port, "target_port": p.target_port}
                      for (x, y), p in self.proxies.items()],
        }
        _write_json_atomic(self.dir / LAB_JSON, data)

    # -- nodes

    async def _spawn(self, node: _Node) -> None:
        Path(node.spec.data_dir).mkdir(parents=True, exist_ok=True)
        with open(node.spec.console_log, "ab") as out:
            tied = self.config.get("tied_to_caller", False)
            skew = self.config.get("clocks", {}).get(node.spec.name)
            node.proc = await asyncio.create_subprocess_exec(
                *node.command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, **skew} if skew else None,
                start_new_session=True, preexec_fn=(lambda: _die_with_parent(signal.SIGKILL)) if tied else None)
        node.starts += 1
        self._tg.create_task(self._watch(node, node.proc))
        log.info("started %s (pid %d)", node.spec.name, node.proc.pid)

    async def _watch(self, node: _Node, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        node.exits.append(code)
        log.info("%s (pid %d) exited with %s", node.spec.name, proc.pid, code)

    async def _signal_and_wait(self, node: _Node, sig: int, timeout_s: float) -> bool:
        """Send `sig` (waking a suspended node so it can act on it); True when it exited in time."""
        with contextlib.suppress(ProcessLookupError):
            node.proc.send_signal(sig)
            if sig != signal.SIGKILL:
                node.proc.send_signal(signal.SIGCONT)
        try:
            async with asyncio.timeout(timeout_s):
                await node.proc.wait()
            return True
        except TimeoutError:
            return False

    async def _stop_all(self, timeout_s: float) -> None:
        running = [n for n in self.nodes.values() if n.alive]
        done = await asyncio.gather(*(self._signal_and_wait(n, signal.SIGTERM, timeout_s) for n in running))
        for node, ok in zip(running, done, strict=True):
            if not ok:
                log.warning("%s did not stop in %.0f s; killing it", node.spec.name, timeout_s)
                await self._signal_and_wait(node, signal.SIGKILL, 10.0)

    # -- faults

    def _record(self, fault: str, nodes: list[str], windows: list[str], ts_ns: int | None = None,
                **extra: Any) -> dict:
        ts_ns = ts_ns or time.time_ns()
        rec = {"time_ms": ts_ns // 1_000_000, "ts_ns": ts_ns, "kind": "fault", "op": "fault", "fault": fault,
               "nodes": nodes, **extra, "windows": windows}
        line = (json.dumps(rec) + "\n").encode()
        fd = os.open(self.dir / FAULTS_JSONL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write per line: a reader never sees half a record
        finally:
            os.close(fd)
        log.info("fault %s %s %s", fault, " ".join(nodes), json.dumps(extra))
        return rec

    def _open(self, name: str, text: str = "") -> str:
        self.open_windows.append(name)
        return _window("start", name, text)

    def _close(self, name: str, text: str = "") -> list[str]:
        if name not in self.open_windows:
            return []
        self.open_windows.remove(name)
        return [_window("end", name, text)]

    async def node_action(self, name: str, action: str, timeout_s: float) -> dict:
        node = self.nodes[name]
        short = node.spec.short_name
        state = node.state()
        if action == "start":
            if state != "stopped":
                raise LabError(f"{name} is {state} (pid {node.pid}); stop or kill it first")
            await self._spawn(node)
            windows = self._close(f"kill-{short}", "started") + self._close(f"stop-{short}", "started")
            self._save()
            return self._record("start", [name], windows, pid=node.pid)
        if state == "stopped":
            raise LabError(f"{name} is not running")
        pid = node.pid
        if action == "kill":
            windows = self._close(f"suspend-{short}", "killed") + [self._open(f"kill-{short}", f"kill -9 {name}")]
            node.proc.kill()
            rec = self._record("kill", [name], windows, signal="SIGKILL", pid=pid)
            await node.proc.wait()
            return rec
        if action == "stop":
            windows = self._close(f"suspend-{short}", "stopped") + [self._open(f"stop-{short}", f"stop {name}")]
            rec_at_ns = time.time_ns()
            graceful = await self._signal_and_wait(node, signal.SIGTERM, timeout_s)
            if not graceful:
                await self._signal_and_wait(node, signal.SIGKILL, 10.0)
            rec = self._record("stop", [name], windows, ts_ns=rec_at_ns, signal="SIGTERM", pid=pid, graceful=graceful,
                               exit_code=node.proc.returncode,
                               stop_ms=(time.time_ns() - rec_at_ns) // 1_000_000)
            return rec
        if action == "suspend":
            if state == "suspended":
                raise LabError(f"{name} is already suspended")
            node.proc.send_signal(signal.SIGSTOP)
            await self._wait_state(node, "suspended")
            return self._record("suspend", [name], [self._open(f"suspend-{short}", f"SIGSTOP {name}")],
                                signal="SIGSTOP", pid=pid)
        if action == "resume":
            if state != "suspended":
                raise LabError(f"{name} is not suspended")
            node.proc.send_signal(signal.SIGCONT)
            await self._wait_state(node, "running")
            return self._record("resume", [name], self._close(f"suspend-{short}", "SIGCONT"),
                                signal="SIGCONT", pid=pid)
        raise LabError(f"unknown node action {action!r}")

    async def _wait_state(self, node: _Node, state: str, timeout_s: float = 5.0) -> None:
        """A signal is delivered asynchronously: wait until /proc shows its effect."""
        async with asyncio.timeout(timeout_s):
            while node.state() != state:
                await asyncio.sleep(0.005)

    def partition(self, isolated: list[str], mode: str) -> dict:
        if mode not in PARTITION_MODES:
            raise LabError(f"partition mode must be one of {', '.join(PARTITION_MODES)}")
        side = sorted(set(isolated), key=[s.name for s in self.specs].index)
        rest = [s.name for s in self.specs if s.name not in side]
        if not side or not rest:
            raise LabError("a partition isolates some nodes from the others: name at least one node, not all")
        cut = links_across(self.proxies, side)
        for link in cut:
            self.proxies[link].partition(mode)
        text = f"{' '.join(side)} | {' '.join(rest)} ({mode})"
        return self._record("partition", side, [self._open("partition", text)], rest=rest, mode=mode,
                            links=[list(link) for link in cut])

    def cut(self, a: str, b: str, mode: str) -> dict:
        """Cut the link between two nodes, both ways, and no other: a partial partition (each of
        the two still reaches the rest)."""
        if mode not in PARTITION_MODES:
            raise LabError(f"partition mode must be one of {', '.join(PARTITION_MODES)}")
        if a == b:
            raise LabError("a link joins two different nodes")
        links = [link for link in ((a, b), (b, a)) if link in self.proxies]
        for link in links:
            self.proxies[link].partition(mode)
        return self._record("cut", [a, b], [self._open("partition", f"{a} -/- {b} ({mode})")], mode=mode,
                            links=[list(link) for link in links])

    def heal(self) -> dict:
        delayed = [list(k) for k, p in self.proxies.items() if p.delay_ms]
        cut = [list(k) for k, p in self.proxies.items() if p.mode is not None]
        for proxy in self.proxies.values():
            if proxy.mode is not None:
                proxy.heal()
            proxy.delay(0)
        windows = []
        for name in [w for w in self.open_windows if w == "partition" or w.startswith("delay-")]:
            windows += self._close(name, "healed")
        return self._record("heal", [], windows, links=cut, delayed_links=delayed)

    def delay(self, a: str, b: str, ms: float) -> dict:
        if a == b:
            raise LabError("a delay is between two different nodes")
        if not 0 <= ms <= DELAY_MS_MAX:
            raise LabError(f"delay must be 0..{DELAY_MS_MAX} ms")
        pair = sorted((a, b), key=[s.name for s in self.specs].index)
        for link in ((a, b), (b, a)):
            self.proxies[link].delay(ms)
        name = "delay-" + "-".join(n.split("@", 1)[0] for n in pair)
        windows = self._close(name, f"changed to {ms:g} ms") if ms else self._close(name, "removed")
        if ms:
            windows.append(self._open(name, f"{ms:g} ms {pair[0]} <-> {pair[1]}"))
        return self._record("delay", pair, windows, delay_ms=ms)

    # -- control interface

    def status(self) -> dict:
        return {
            "pid": os.getpid(),
            "open_windows": list(self.open_windows),
            "nodes": [{"name": n.spec.name, "pid": n.pid, "state": n.state(), "starts": n.starts,
                       "exit_codes": n.exits} for n in self.nodes.values()],
            "links": [{"from": x, "to": y, "listen_port": p.listen_port, "target_port": p.target_port,
                       "partitioned": p.mode, "delay_ms": p.delay_ms, "connections_accepted": p.connections_accepted,
                       "connections_open": p.connections_open, "bytes_forwarded": p.bytes_forwarded}
                      for (x, y), p in self.proxies.items()],
        }

    def _node_name(self, ref: Any) -> str:
        return resolve_node(self.specs, str(ref)).name

    async def _serve(self, request, handler):
        """Every request: check the token, run the handler (faults one at a time), answer JSON."""
        from aiohttp import web

        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"error": "not authorised"}, status=401)
        try:
            if request.method == "GET":
                return web.json_response(await handler(request))
            async with self._lock:
                return web.json_response(await handler(request))
        except LabError as e:
            return web.json_response({"error": str(e)}, status=409)
        except (KeyError, TypeError, ValueError) as e:
            return web.json_response({"error": f"bad request: {e!r}"}, status=400)

    async def _h_status(self, request) -> dict:
        return self.status()

    async def _h_node(self, request) -> dict:
        action = request.match_info["action"]
        if action not in NODE_ACTIONS:
            raise LabError(f"unknown node action {action!r}; one of {', '.join(NODE_ACTIONS)}")
        body = await request.json() if request.can_read_body else {}
        return await self.node_action(self._node_name(request.match_info["node"]), action,
                                      float(body.get("timeout_s", STOP_TIMEOUT_S_DEFAULT)))

    async def _h_partition(self, request) -> dict:
        body = await request.json()
        return self.partition([self._node_name(r) for r in body["nodes"]], body.get("mode", PARTITION_MODE_DEFAULT))

    async def _h_cut(self, request) -> dict:
        body = await request.json()
        return self.cut(self._node_name(body["a"]), self._node_name(body["b"]), body.get("mode", PARTITION_MODE_DEFAULT))

    async def _h_heal(self, request) -> dict:
        return self.heal()

    async def _h_delay(self, request) -> dict:
        body = await request.json()
        return self.delay(self._node_name(body["a"]), self._node_name(body["b"]), float(body["ms"]))

    async def _h_shutdown(self, request) -> dict:
        self.config["stop_timeout_s"] = float((await request.json()).get("timeout_s", STOP_TIMEOUT_S_DEFAULT))
        self._stopping.set()
        return {"stopping": True}


def controller_main(argv: list[str] | None = None) -> int:
    """Entry point of the controller process."""
    import argparse

    parser = argparse.ArgumentParser(prog="hutch-lab-controller")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--config", required=True, help="the lab's plan as JSON")
    args = parser.parse_args(argv)
    lab_dir = Path(args.dir)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d [%(levelname)s] <%(name)s> %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the terminal that started the lab may go away
    lock = open(lab_dir / LAB_LOCK, "a")  # held (and the lock with it) until this process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.error("another lab controller holds %s", lab_dir / LAB_LOCK)
        return 1
    try:
        import uvloop
        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(Controller(lab_dir, json.loads(args.config)).run())
    return 0


# ---------------------------------------------------------------------------------------------
# The client API


class Lab:
    """A lab in a directory: start it with `Lab.up`, attach to a running one with `Lab(dir)`.

    >>> with Lab.up(3, "/tmp/lab", base_port=15000) as lab:
    ...     lab.partition("hutch-1"); lab.heal(); lab.kill(2); lab.start(2)
    """

    def __init__(self, lab_dir: str | os.PathLike = LAB_DIR_DEFAULT):
        self.dir = Path(lab_dir).resolve()
        self._controller_proc: subprocess.Popen | None = None  # set when this object started it

    # -- state on disk

    def info(self) -> dict:
        """The contents of lab.json; LabError when there is no lab here."""
        try:
            return json.loads((self.dir / LAB_JSON).read_text())
        except FileNotFoundError:
            raise LabError(f"no lab in {self.dir} (no {LAB_JSON}); start one with `hutch lab up N`") from None

    @property
    def nodes(self) -> list[NodeSpec]:
        return [NodeSpec.from_record(n) for n in self.info()["nodes"]]

    def node(self, ref: str | int) -> NodeSpec:
        return resolve_node(self.nodes, ref)

    def pid_of(self, ref: str | int) -> int | None:
        name = self.node(ref).name
        return next(n["pid"] for n in self.info()["nodes"] if n["name"] == name)

    def controller_running(self) -> bool:
        """Someone holds the lab's lock: its controller is alive."""
        path = self.dir / LAB_LOCK
        if not path.exists():
            return False
        with open(path, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
        return False

    def faults(self) -> list[dict]:
        """The fault records of faults.jsonl, oldest first."""
        try:
            lines = (self.dir / FAULTS_JSONL).read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    # -- starting

    @classmethod
    def up(cls, count: int, lab_dir: str | os.PathLike = LAB_DIR_DEFAULT, *, base_port: int = BASE_PORT_DEFAULT,
           net_ticktime_s: float = NET_TICKTIME_S_DEFAULT, secret: str | None = None,
           metadata_timeout_ms: int = METADATA_TIMEOUT_MS_DEFAULT, log_level: str = "info",
           wait: str = "healthy", timeout_s: float = UP_TIMEOUT_S_DEFAULT, tied_to_caller: bool = False,
           node_args: list[str] | None = None, clocks: dict[str | int, ClockSkew] | None = None,
           node_env: dict[str | int, dict[str, str]] | None = None) -> Lab:
        """Start a lab of `count` nodes and wait until it is `healthy` (every node sees every member
        running and a leader), until every node's HTTP API answers (`http`), or not at all (`none`).
        On failure everything started is stopped again and LabError says which node is not up and
        where its log is. `node_args` are added to every node's `hutch server` command line.
        `clocks` gives nodes (by name or number) another host's clock: see `ClockSkew`.
        `node_env` adds environment variables to nodes (by name or number), such as the fault
        switches of `hutch.server.faults`.

        The lab outlives the calling process unless `tied_to_caller` (for tests): then the
        controller is stopped when the caller dies, however it dies, and the nodes with it."""
        if wait not in ("healthy", "http", "none"):
            raise ValueError(f"wait must be healthy, http or none, not {wait!r}")
        if net_ticktime_s <= 0:
            raise LabError("net_ticktime must be positive")
        lab = cls(lab_dir)
        specs = plan_nodes(count, base_port, lab.dir)
        if lab.controller_running():
            pid = lab.info().get("controller", {}).get("pid", "?") if (lab.dir / LAB_JSON).exists() else "?"
            raise LabError(f"a lab is already running in {lab.dir} (controller pid {pid}); "
                           f"stop it with `hutch lab down --dir {lab_dir}`")
        skews = {resolve_node(specs, ref).name: skew.env() for ref, skew in (clocks or {}).items()}
        for ref, env in (node_env or {}).items():
            skews.setdefault(resolve_node(specs, ref).name, {}).update(env)
        problem = size_mismatch(lab.dir, specs)
        if problem:
            raise LabError(problem)
        for s in specs:
            for what, port in s.ports().items():
                if port_in_use(port):
                    raise LabError(f"port {port} ({what} port of {s.name}) is in use; "
                                   f"choose another --base-port")
        lab.dir.mkdir(parents=True, exist_ok=True)
        secret_path = lab.dir / SECRET_FILE
        with contextlib.suppress(FileNotFoundError):
            secret_path.unlink()
        fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret if secret is not None else secrets.token_urlsafe(32))
        with contextlib.suppress(FileNotFoundError):
            (lab.dir / LAB_JSON).unlink()
        config = {"nodes": [s.__dict__ for s in specs], "base_port": base_port, "net_ticktime_s": net_ticktime_s,
                  "metadata_timeout_ms": metadata_timeout_ms, "log_level": log_level,
                  "token": secrets.token_urlsafe(24), "started_ms": time.time_ns() // 1_000_000,
                  "tied_to_caller": tied_to_caller, "node_args": list(node_args or []), "clocks": skews}
        with open(lab.dir / CONTROLLER_LOG, "ab") as out:
            lab._controller_proc = subprocess.Popen(
                [sys.executable, "-m", "hutch.lab.cluster", "--dir", str(lab.dir), "--config", json.dumps(config)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=lab.dir, preexec_fn=(lambda: _die_with_parent(signal.SIGTERM)) if tied_to_caller else None)
        try:
            lab._wait_controller(config["token"])
            if wait != "none":
                for s in specs:
                    lab.wait_http(s, timeout_s)
            if wait == "healthy":
                lab.wait_healthy(timeout_s)
        except BaseException:
            with contextlib.suppress(Exception):
                lab.down()
            raise
        return lab

    def _wait_controller(self, token: str) -> None:
        deadline = time.monotonic() + CONTROLLER_START_TIMEOUT_S
        log_path = self.dir / CONTROLLER_LOG
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ValueError):
                info = json.loads((self.dir / LAB_JSON).read_text())
                if info.get("controller", {}).get("token") == token and info.get("state") == "running":
                    return
            if self._controller_proc.poll() is not None:
                raise LabError(f"the lab controller exited with {self._controller_proc.returncode}:\n"
                               f"{_tail(log_path)}\n(see {log_path})")
            time.sleep(POLL_INTERVAL_S / 2)
        raise LabError(f"the lab controller did not come up in {CONTROLLER_START_TIMEOUT_S:.0f} s (see {log_path})")

    def _node_gone_message(self, spec: NodeSpec) -> str | None:
        pid = self.pid_of(spec.name)
        if process_state(pid) == "stopped":
            return (f"{spec.name} (pid {pid}) exited; its console log {spec.console_log} ends with:\n"
                    f"{_tail(Path(spec.console_log))}")
        return None

    def wait_http(self, ref: str | int | NodeSpec, timeout_s: float = NODE_START_TIMEOUT_S_DEFAULT) -> None:
        spec = ref if isinstance(ref, NodeSpec) else self.node(ref)
        deadline = time.monotonic() + timeout_s
        while not http_answers(spec):
            gone = self._node_gone_message(spec)
            if gone:
                raise LabError(gone)
            if time.monotonic() > deadline:
                raise LabError(f"{spec.name} is not up: its HTTP API ({spec.http_url}) did not answer in "
                               f"{timeout_s:g} s; see its log {spec.console_log}")
            time.sleep(POLL_INTERVAL_S)

    def health(self) -> dict[str, str | None]:
        """Per node: None when it sees a healthy cluster, else what is wrong from its point of view."""
        specs = self.nodes
        members = [s.name for s in specs]
        return {s.name: health_problem(members, cluster_view(s)) for s in specs}

    def leader(self) -> str | None:
        """The catalogue leader as the first answering node reports it."""
        for s in self.nodes:
            view = cluster_view(s)
            if isinstance(view, dict) and view.get("leader"):
                return view["leader"]
        return None

    def wait_healthy(self, timeout_s: float = UP_TIMEOUT_S_DEFAULT) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            problems = {k: v for k, v in self.health().items() if v}
            if not problems:
                return
            for name in problems:
                gone = self._node_gone_message(self.node(name))
                if gone:
                    raise LabError(gone)
            if time.monotonic() > deadline:
                name, why = next(iter(problems.items()))
                spec = self.node(name)
                raise LabError(f"the cluster is not healthy after {timeout_s:g} s: {name} is not up ({why}); "
                               f"see its log {spec.console_log} and {spec.node_log}")
            time.sleep(POLL_INTERVAL_S * 2)

    # -- the control interface

    def _call(self, method: str, path: str, body: dict | None = None, timeout_s: float = CONTROL_TIMEOUT_S) -> dict:
        info = self.info()
        ctl = info.get("controller") or {}
        if info.get("state") != "running" or not self.controller_running():
            raise LabError(f"the lab in {self.dir} is not running (no controller); start it with `hutch lab up N`")
        data = json.dumps(body or {}).encode() if method == "POST" else None
        req = urllib.request.Request(ctl["control_url"] + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {ctl['token']}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read()).get("error", str(e))
            except ValueError:
                message = str(e)
            raise LabError(message) from None
        except OSError as e:
            raise LabError(f"the lab controller at {ctl.get('control_url')} does not answer: {e}") from None

    def control_status(self) -> dict:
        """The controller's view: node processes and every proxied link with its state and counters."""
        return self._call("GET", "/status")

    def links(self) -> list[dict]:
        return self.control_status()["links"]

    def status(self) -> list[dict]:
        """One row per node: name, pid, state (running/stopped/suspended), ports, whether HTTP answers.
        Works from lab.json and /proc alone when the controller is gone."""
        rows = []
        for n in self.info()["nodes"]:
            spec = NodeSpec.from_record(n)
            state = process_state(n["pid"]) if n["pid"] and _is_lab_node(n["pid"], spec.name) else "stopped"
            rows.append({"name": spec.name, "pid": n["pid"], "state": state, "amqp_port": spec.amqp_port,
                         "mgmt_port": spec.mgmt_port, "peer_port": spec.peer_port,
                         "http": state == "running" and http_answers(spec),
                         "amqp_url": spec.amqp_url, "http_url": spec.http_url})
        return rows

    def _node(self, action: str, ref: str | int, timeout_s: float = STOP_TIMEOUT_S_DEFAULT) -> dict:
        name = self.node(ref).name
        return self._call("POST", f"/nodes/{name}/{action}", {"timeout_s": timeout_s},
                          timeout_s=CONTROL_TIMEOUT_S + timeout_s)

    def kill(self, ref: str | int) -> dict:
        """SIGKILL the node (kill -9) and wait until it is gone."""
        return self._node("kill", ref)

    def stop(self, ref: str | int, timeout_s: float = STOP_TIMEOUT_S_DEFAULT) -> dict:
        """SIGTERM the node and wait for it to exit (SIGKILL after `timeout_s`)."""
        return self._node("stop", ref, timeout_s)

    def start(self, ref: str | int, timeout_s: float = NODE_START_TIMEOUT_S_DEFAULT, wait: bool = True) -> dict:
        """Start a stopped node again with its command line; wait until its HTTP API answers."""
        rec = self._node("start", ref)
        if wait:
            self.wait_http(ref, timeout_s)
        return rec

    def suspend(self, ref: str | int) -> dict:
        """SIGSTOP the node: it keeps its sockets but answers nothing, as a hung VM would."""
        return self._node("suspend", ref)

    def resume(self, ref: str | int) -> dict:
        return self._node("resume", ref)

    def partition(self, *refs: str | int, mode: str = PARTITION_MODE_DEFAULT) -> dict:
        """Cut every link between the named nodes and the others, both ways (links among the named
        nodes, and among the others, stay). Partitions add up until `heal`."""
        return self._call("POST", "/partition", {"nodes": [self.node(r).name for r in refs], "mode": mode})

    def cut(self, a: str | int, b: str | int, mode: str = PARTITION_MODE_DEFAULT) -> dict:
        """Cut only the link between nodes a and b, both ways: a partial partition (each still
        reaches the others). Adds up with other cuts and partitions until `heal`."""
        return self._call("POST", "/cut", {"a": self.node(a).name, "b": self.node(b).name, "mode": mode})

    def heal(self) -> dict:
        """Restore every link: no partition, no delay."""
        return self._call("POST", "/heal")

    def delay(self, a: str | int, b: str | int, ms: float) -> dict:
        """Hold every chunk on the links between a and b (both ways) for `ms` milliseconds; 0 removes it."""
        return self._call("POST", "/delay", {"a": self.node(a).name, "b": self.node(b).name, "ms": ms})

    # -- stopping

    def down(self, wipe: bool = False, timeout_s: float = STOP_TIMEOUT_S_DEFAULT) -> list[str]:
        """Stop every node (SIGTERM, then SIGKILL after `timeout_s`) and the controller; with `wipe`
        remove the lab directory. Returns what was done, one line each."""
        done: list[str] = []
        info = self.info() if (self.dir / LAB_JSON).exists() else {}
        ctl_pid = (info.get("controller") or {}).get("pid")
        if self.controller_running():
            with contextlib.suppress(LabError):
                self._call("POST", "/shutdown", {"timeout_s": timeout_s})
            deadline = time.monotonic() + timeout_s + 15.0
            # The lock goes with the controller's files, a moment before the process itself is gone.
            while ((self.controller_running() or (ctl_pid and process_state(ctl_pid) != "stopped"))
                   and time.monotonic() < deadline):
                if self._controller_proc is not None:
                    self._controller_proc.poll()
                time.sleep(POLL_INTERVAL_S / 2)
            if self.controller_running() and ctl_pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(ctl_pid, signal.SIGKILL)
                done.append(f"killed the lab controller (pid {ctl_pid}), which did not stop")
            else:
                done.append(f"stopped the lab controller (pid {ctl_pid}) and its nodes")
        if self._controller_proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._controller_proc.wait(10)
        # Nodes left behind by a controller that died: stop them by pid, if the pid is still theirs.
        stragglers = [(n["name"], n["pid"]) for n in info.get("nodes", [])
                      if n.get("pid") and _is_lab_node(n["pid"], n["name"])]
        for _name, pid in stragglers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + timeout_s
        for name, pid in stragglers:
            while _is_lab_node(pid, name) and time.monotonic() < deadline:
                time.sleep(POLL_INTERVAL_S / 2)
            if _is_lab_node(pid, name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                done.append(f"killed {name} (pid {pid})")
            else:
                done.append(f"stopped {name} (pid {pid})")
        if wipe and self.dir.is_dir():
            if not any((self.dir / f).exists() for f in (LAB_JSON, LAB_LOCK, SECRET_FILE)):
                raise LabError(f"{self.dir} does not look like a lab directory (no {LAB_JSON}); not wiping it")
            shutil.rmtree(self.dir, ignore_errors=True)
            done.append(f"removed {self.dir}")
        return done

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


if __name__ == "__main__":
    sys.exit(controller_main())
