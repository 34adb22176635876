"""A hutch cluster on loopback for tests and benchmarks: N `hutch server` processes, one cluster.

Every node gets the same static membership (`--cluster-nodes hutch-1@localhost:P1,...`,
itself included), the same secret file (like the Erlang cookie), its own free AMQP, HTTP
and peer ports and its own data directory, and a small `--net-ticktime` so a dead peer is
noticed in seconds. All nodes are launched before any is waited for (a node may need a
majority before it serves). The cluster is healthy when `GET /api/hutch/cluster` on every
running node lists every member in `running_nodes` and names a leader; `start` returns
only then.

`kill(i)` (kill -9), `stop(i)` (SIGTERM) and `start(i)` (the same arguments again, the
same data directory) act on one node. Everything started here is stopped on exit.

    with HutchCluster(n=3) as cluster:
        pika.BlockingConnection(pika.URLParameters(cluster.nodes[1].url))
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tests.support.brokers import HutchNode, free_port, wait_until

NODES_MAX = 9
BOOT_TIMEOUT_S = 60.0
HEALTHY_TIMEOUT_S = 60.0
NET_TICKTIME_S = 4
METADATA_TIMEOUT_MS = 5000
HTTP_TIMEOUT_S = 2.0


class HutchClusterNode(HutchNode):
    """A `HutchNode` that also knows its peer port."""

    def __init__(self, name: str, peer_port: int, **kwargs):
        super().__init__(name=name, **kwargs)
        self.peer_port = peer_port


class HutchCluster:
    """N clustered hutch nodes; `nodes[i]` has `name`, `amqp_port`, `mgmt_port`, `peer_port`, `url`."""

    def __init__(self, n: int = 3, log_level: str = "info", extra_args: list[str] | None = None,
                 net_ticktime_s: float = NET_TICKTIME_S, metadata_timeout_ms: int = METADATA_TIMEOUT_MS):
        if not 1 <= n <= NODES_MAX:
            raise ValueError(f"n must be 1..{NODES_MAX}")
        self.n = n
        self.dir = Path(tempfile.mkdtemp(prefix="hutchcluster-"))
        self.secret_file = self.dir / "cluster.secret"
        self.secret_file.write_text(secrets.token_hex(16) + "\n")
        self.secret_file.chmod(0o400)
        names = [f"hutch-{i + 1}@localhost" for i in range(n)]
        peer_ports = [free_port() for _ in range(n)]
        members = ",".join(f"{name}:{port}" for name, port in zip(names, peer_ports, strict=True))
        self.nodes: list[HutchClusterNode] = []
        for i, (name, peer_port) in enumerate(zip(names, peer_ports, strict=True)):
            args = ["--peer-port", str(peer_port), "--cluster-nodes", members,
                    "--cluster-secret-file", str(self.secret_file),
                    "--net-ticktime", str(net_ticktime_s), "--metadata-timeout", str(metadata_timeout_ms),
                    *(extra_args or [])]
            self.nodes.append(HutchClusterNode(name, peer_port, data_dir=self.dir / f"node-{i + 1}",
                                               log_level=log_level, extra_args=args))

    @property
    def names(self) -> list[str]:
        return [node.name for node in self.nodes]

    # -- life cycle -------------------------------------------------------------------------

    def start(self, i: int | None = None, timeout_s: float = HEALTHY_TIMEOUT_S) -> HutchCluster:
        """Start every node and wait until the cluster is healthy; `start(i)`: start node i again
        (see `start_node`)."""
        if i is not None:
            self.start_node(i, timeout_s=timeout_s)
            return self
        try:
            for node in self.nodes:  # all launched first: a node may wait for a majority
                node.start(wait=False)
            for node in self.nodes:
                node.wait_ready(BOOT_TIMEOUT_S)
            self.wait_healthy(timeout_s)
        except BaseException:
            self.cleanup()
            raise
        return self

    def kill(self, i: int) -> None:
        """kill -9 node i."""
        self.nodes[i].kill()

    def stop(self, i: int) -> int | None:
        """Stop node i gracefully (SIGTERM); returns its exit code."""
        return self.nodes[i].stop()

    def start_node(self, i: int, wait_healthy: bool = True, timeout_s: float = HEALTHY_TIMEOUT_S) -> None:
        """Start node i again with the same arguments and data; by default wait until the whole
        cluster is healthy again."""
        node = self.nodes[i]
        if node.proc is not None and node.proc.poll() is None:
            raise RuntimeError(f"{node.name} is running")
        node.start(BOOT_TIMEOUT_S)
        if wait_healthy:
            self.wait_healthy(timeout_s)

    def running(self, i: int) -> bool:
        proc = self.nodes[i].proc
        return proc is not None and proc.poll() is None

    def cleanup(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> HutchCluster:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.print_log_tails()
        self.cleanup()

    def print_log_tails(self, lines: int = 80) -> None:
        """The end of every node's log on stderr, where pytest shows it beside a failure."""
        for node in self.nodes:
            tail = node.log().splitlines()[-lines:]
            print(f"--- last {len(tail)} lines of {node.name}'s log ---", *tail, sep="\n", file=sys.stderr)

    # -- what the cluster says about itself --------------------------------------------------

    def api(self, i: int, path: str):
        """GET an HTTP API path on node i (guest/guest); the decoded JSON."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.nodes[i].mgmt_port}{path}")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
            return json.loads(resp.read())

    def cluster_status(self, i: int) -> dict:
        """GET /api/hutch/cluster on node i."""
        return self.api(i, "/api/hutch/cluster")

    def queue_home(self, queue: str, vhost: str = "/", i: int = 0) -> str:
        """The node a queue lives on, as node i's HTTP API reports it (`node` of /api/queues/...)."""
        path = "/api/queues/" + urllib.parse.quote(vhost, safe="") + "/" + urllib.parse.quote(queue, safe="")
        return self.api(i, path)["node"]

    def healthy(self) -> bool:
        """Every running node sees all members running and a leader."""
        members = set(self.names)
        nodes = [i for i in range(self.n) if self.running(i)]
        if not nodes:
            return False
        for i in nodes:
            try:
                status = self.cluster_status(i)
            except (OSError, urllib.error.URLError, ValueError):
                return False
            if set(status.get("members", [])) != members or set(status.get("running_nodes", [])) != members:
                return False
            if not status.get("leader"):
                return False
        return True

    def wait_healthy(self, timeout_s: float = HEALTHY_TIMEOUT_S) -> None:
        try:
            wait_until(self.healthy, timeout_s, f"hutch cluster of {self.n}", interval_s=0.2)
        except TimeoutError as e:
            raise TimeoutError(f"{e}; last states: {self.describe()}") from None

    def describe(self) -> str:
        """Each node's view of the cluster (or why it has none), for failure messages."""
        parts = []
        for i, node in enumerate(self.nodes):
            if not self.running(i):
                parts.append(f"{node.name}: not running")
                continue
            try:
                parts.append(f"{node.name}: {json.dumps(self.cluster_status(i))}")
            except (OSError, urllib.error.URLError, ValueError) as e:
                parts.append(f"{node.name}: {e}")
        return "; ".join(parts)
