"""A real RabbitMQ cluster on loopback, the reference that hutch's cluster behaviour is held against.

N private RabbitMQ 3.10 nodes (Debian's package, `RabbitMQNode`), each on its own free
AMQP and distribution ports and in its own directory, share one Erlang cookie and one
private epmd on a free port (so they never see, or clash with, any other Erlang node on
the machine). Node 1 boots alone; every other node boots, then joins it the documented
way: `rabbitmqctl stop_app`, `join_cluster rabbit-a@localhost`, `start_app`. Classic queues
use the client-local master locator, so a queue declared through a node lives on it
(`declare_queue(name, node=i)`).

Everything started here is stopped on exit: the nodes (their whole process groups) and
the epmd. Readiness is a condition (AMQP answers; `cluster_status` lists every node
running), never a sleep.

    with RabbitMQCluster(n=3) as cluster:
        cluster.declare_queue("q", node=0)
        pika.BlockingConnection(pika.URLParameters(cluster.nodes[1].url))
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import string
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.brokers import (
    RabbitMQNode,
    _die_with_parent,
    amqp_ready,
    ensure_rabbitmq_installed,
    free_port,
    port_open,
    wait_until,
)

EPMD = "epmd"
NODES_MAX = 26  # rabbit-a .. rabbit-z
BOOT_TIMEOUT_S = 120.0
JOIN_TIMEOUT_S = 90.0


def node_name(index: int) -> str:
    """rabbit-a@localhost, rabbit-b@localhost, ... (0-based index)."""
    return f"rabbit-{string.ascii_lowercase[index]}@localhost"


class RabbitMQCluster:
    """N clustered RabbitMQ nodes; `nodes[i]` is a `RabbitMQNode` (amqp_port, mgmt_port, url, ctl)."""

    def __init__(self, n: int = 3, management: bool = False, config_extra: str = ""):
        if not 1 <= n <= NODES_MAX:
            raise ValueError(f"n must be 1..{NODES_MAX}")
        self.n = n
        self.epmd_port = free_port()
        self.cookie = secrets.token_hex(16).upper()
        self.dir = Path(tempfile.mkdtemp(prefix="rabbitcluster-"))
        self.epmd: subprocess.Popen | None = None
        conf = "queue_master_locator = client-local"
        if config_extra:
            conf += "\n" + config_extra
        self.nodes = [RabbitMQNode(management=management, name=node_name(i), config_extra=conf,
                                   cookie=self.cookie, env={"ERL_EPMD_PORT": str(self.epmd_port)})
                      for i in range(n)]

    @property
    def names(self) -> list[str]:
        return [node.nodename for node in self.nodes]

    # -- life cycle -------------------------------------------------------------------------

    def start(self, i: int | None = None) -> RabbitMQCluster:
        """Start the cluster (boot, join, wait until every node runs in it); `start(i)`: start node i
        again after `stop(i)`."""
        if i is not None:
            self.start_node(i)
            return self
        ensure_rabbitmq_installed()
        try:
            self._start_epmd()
            # launched from this thread: a child's parent-death signal follows the thread that forked it
            for node in self.nodes:
                node.start(wait=False)
            for node in self.nodes:
                node.wait_ready(BOOT_TIMEOUT_S)
            for node in self.nodes[1:]:
                self._join(node)
            wait_until(lambda: self.running_nodes() == sorted(self.names), JOIN_TIMEOUT_S,
                       f"RabbitMQ cluster of {self.n}", interval_s=0.5)
        except BaseException:
            self.cleanup()
            raise
        return self

    def _start_epmd(self) -> None:
        log = open(self.dir / "epmd.out", "ab")
        self.epmd = subprocess.Popen([EPMD, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        log.close()
        wait_until(lambda: port_open("127.0.0.1", self.epmd_port), 10.0, f"epmd on {self.epmd_port}",
                   proc=self.epmd)

    def _join(self, node: RabbitMQNode) -> None:
        """Join `node` to the first node: stop_app, join_cluster, start_app (RabbitMQ's clustering guide)."""
        seed = self.nodes[0].nodename
        for args in (("stop_app",), ("join_cluster", seed), ("start_app",)):
            r = node.ctl(*args, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"rabbitmqctl -n {node.nodename} {' '.join(args)} failed "
                                   f"({r.returncode}): {(r.stderr or r.stdout)[-1500:]}")
        wait_until(lambda: amqp_ready("127.0.0.1", node.amqp_port), JOIN_TIMEOUT_S,
                   f"RabbitMQ {node.nodename} after joining", interval_s=0.2, proc=node.proc)

    def stop(self, i: int) -> None:
        """Stop node i gracefully (its cluster membership stays; `start(i)` brings it back)."""
        self.nodes[i].stop()

    def start_node(self, i: int) -> None:
        """Start node i again after `stop(i)`; it rejoins the cluster from its own data."""
        self.nodes[i].start(BOOT_TIMEOUT_S)
        wait_until(lambda: self.running_nodes(i) == sorted(self.names), JOIN_TIMEOUT_S,
                   f"RabbitMQ {self.nodes[i].nodename} back in the cluster", interval_s=0.5)

    def cleanup(self) -> None:
        with ThreadPoolExecutor(max(self.n, 1)) as pool:
            for f in [pool.submit(node.cleanup) for node in self.nodes]:
                with contextlib.suppress(Exception):
                    f.result()
        for node in self.nodes:  # whatever of a node's process group outlived its start script
            if node.proc is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(node.proc.pid, signal.SIGKILL)
        if self.epmd is not None and self.epmd.poll() is None:
            self.epmd.kill()
            self.epmd.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RabbitMQCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()

    # -- what the cluster says about itself --------------------------------------------------

    def cluster_status(self, i: int = 0) -> dict:
        """`rabbitmqctl cluster_status` on node i, as its JSON."""
        r = self.nodes[i].ctl("cluster_status", "--formatter", "json", check=False)
        if r.returncode != 0:
            raise RuntimeError(f"cluster_status on {self.nodes[i].nodename} failed: {r.stderr[-1000:]}")
        return json.loads(r.stdout)

    def running_nodes(self, i: int = 0) -> list[str]:
        try:
            return sorted(self.cluster_status(i).get("running_nodes", []))
        except (RuntimeError, json.JSONDecodeError, subprocess.TimeoutExpired):
            return []

    def queue_home(self, queue: str, vhost: str = "/") -> str:
        """The node a classic queue lives on: the one whose `list_queues --local` lists it."""
        for node in self.nodes:
            r = node.ctl("list_queues", "-p", vhost, "--local", "name", "--formatter", "json")
            if any(row["name"] == queue for row in json.loads(r.stdout or "[]")):
                return node.nodename
        raise KeyError(queue)

    # -- clients -----------------------------------------------------------------------------

    def declare_queue(self, name: str, node: int = 0, durable: bool = True, arguments: dict | None = None) -> None:
        """Declare a queue through node `node`; with the client-local locator it lives there."""
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(self.nodes[node].url))
        try:
            conn.channel().queue_declare(name, durable=durable, arguments=arguments)
        finally:
            conn.close()
