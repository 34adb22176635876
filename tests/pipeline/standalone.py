"""A Spark standalone cluster (one master, one worker) on loopback, from the installed PySpark.

Both daemons are started with `spark-class` from the pyspark package, bound to 127.0.0.1 on
free ports, with their logs and work directories under a private temporary directory.
Each runs in its own process group, so stopping the cluster also stops the executors the
worker launched. Readiness is a condition: the master's JSON status lists the worker ALIVE.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from hutch.pipeline.spark import SPARK_CONF_DIR
from tests.support.brokers import free_ports, wait_until


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class SparkStandalone:
    def __init__(self, worker_cores: int = 2, worker_memory: str = "1g"):
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.dir = Path(tempfile.mkdtemp(prefix="hutch-spark-standalone-"))
        self.port, self.ui_port, self.worker_port, self.worker_ui_port = free_ports(4)
        self.procs: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(SPARK_CONF_DIR),
                    "SPARK_DAEMON_MEMORY": "256m", "SPARK_WORKER_DIR": str(self.dir / "work"),
                    "SPARK_LOG_DIR": str(self.dir / "logs"), "SPARK_PID_DIR": str(self.dir)})
        return env

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=self.env(), stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        p.log_file = log  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def workers_alive(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                status = json.load(r)
        except OSError:
            return 0
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def start(self, timeout_s: float = 90.0) -> SparkStandalone:
        master = self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                             "--port", str(self.port), "--webui-port", str(self.ui_port))
        worker = self._spawn("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                             "--port", str(self.worker_port), "--webui-port", str(self.worker_ui_port),
                             "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                             "--work-dir", str(self.dir / "work"), self.master_url)
        wait_until(lambda: self.workers_alive() >= 1, timeout_s, "Spark standalone worker", interval_s=0.5, proc=master)
        assert worker.poll() is None
        return self

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def stop(self, timeout_s: float = 30.0) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout_s)
            p.log_file.close()
        for p in self.procs:  # executors the worker started share its process group
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
