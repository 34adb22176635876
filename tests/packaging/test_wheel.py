"""The wheel a user installs: lean runtime dependencies, extras for the lab and the checker, and a
node that starts from a fresh virtualenv and answers AMQP (tests/packaging/wheel_check.py)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import zipfile
from email.parser import Parser

import pika
import pytest

from tests.packaging import wheel_check
from tests.support.brokers import _die_with_parent, amqp_ready, free_port, port_open, wait_until


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return wheel_check.check(tmp_path_factory.mktemp("wheel"))


def test_fresh_install_runs_a_node(result):
    log = result["log"]
    assert "started TCP listener" in log
    assert "Server startup complete; node wheel@localhost is ready" in log
    assert "Successfully stopped hutch node wheel@localhost" in log
    # the runtime dependencies came at the pinned versions
    pins = {}
    for line in (wheel_check.ROOT / "constraints.txt").read_text().splitlines():
        spec = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in spec:
            name, version = spec.split("==")
            pins[name.lower()] = version
    for name in ("aiohttp", "click", "msgspec", "pamqp", "psutil", "rich", "prometheus-client"):
        assert result["packages"].get(name) == pins[name], name


def test_wheel_metadata_declares_ranges_and_extras(result):
    with zipfile.ZipFile(result["wheel_path"]) as z:
        names = z.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(z.read(meta_name).decode())
        assert any(n.endswith("licenses/LICENSE") or n.endswith("/LICENSE") for n in names)
        assert "hutch/pipeline/spark_conf/" in "".join(names)
    requires = meta.get_all("Requires-Dist")
    assert set(meta.get_all("Provides-Extra")) >= {"lab", "pipeline", "dev"}
    runtime = [r for r in requires if "extra ==" not in r]
    # ranges, never exact pins (those live in constraints.txt)
    assert runtime and all("==" not in r.split(";")[0] and "<" in r.split(";")[0] for r in requires), requires
    assert not any(r.startswith(("pyarrow", "aiormq", "pyspark")) for r in runtime), runtime
    assert any(r.startswith("pyarrow") and 'extra == "lab"' in r for r in requires)
    assert any(r.startswith("pyspark") and 'extra == "pipeline"' in r for r in requires)
    assert meta["License-Expression"] == "Apache-2.0"


def _dockerfile_env() -> dict[str, str]:
    """The ENV instruction of the Dockerfile, as NAME -> value."""
    text = (wheel_check.ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    block = re.search(r"^ENV (.+)$", text, re.M).group(1)
    return dict(pair.split("=", 1) for pair in block.split())


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def test_the_images_environment_starts_a_node(result, tmp_path):
    """What `docker run hutch:latest` runs, without Docker: the wheel's `hutch server` with the
    image's ENV and its configuration file (ports moved to free ones, paths into tmp_path)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HUTCH_", "PYTHON"))}
    env.update(_dockerfile_env())
    assert env["HUTCH_NODENAME"] == "hutch" and env["HUTCH_LOGS"] == "-"
    amqp_port, mgmt_port, prom_port = free_port(), free_port(), free_port()
    conf = (wheel_check.ROOT / "packaging" / "container.conf").read_text()
    conf = (conf.replace("= 5672", f"= {amqp_port}").replace("= 15672", f"= {mgmt_port}")
            .replace("= 15692", f"= {prom_port}"))
    (tmp_path / "hutch.conf").write_text(conf)
    env.update({"HUTCH_CONFIG_FILE": str(tmp_path / "hutch.conf"), "HUTCH_DATA_DIR": str(tmp_path / "data"),
                "HOME": str(tmp_path), "HUTCH_DIST_PORT": str(free_port())})
    env.pop("HUTCH_CLUSTER_SECRET", None)  # the image keeps the secret file in HOME, the volume
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen([str(result["venv"] / "bin" / "hutch"), "server"], cwd=tmp_path, env=env,
                                stdout=o, stderr=e, start_new_session=True, preexec_fn=_die_with_parent)
    try:
        wait_until(lambda: amqp_ready("127.0.0.1", amqp_port), 30, "the image's node", proc=proc)
        # loopback_users.guest = false: guest logs in from an address that is not loopback
        addr = _non_loopback_address() or "127.0.0.1"
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            addr, amqp_port, credentials=pika.PlainCredentials("guest", "guest"), connection_attempts=1))
        conn.close()
        wait_until(lambda: port_open("127.0.0.1", prom_port), 10, "Prometheus listener", proc=proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    host = socket.gethostname().split(".")[0]
    assert f"Server startup complete; node hutch@{host} is ready" in out.read_text()  # HUTCH_LOGS=-: stdout
    assert err.read_text() == ""
    assert (tmp_path / ".hutch.cookie").exists()  # the cluster secret, created in HOME
    assert not (tmp_path / "data" / "log").exists()
