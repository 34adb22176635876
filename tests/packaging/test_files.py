"""The deployment files hold together: the image, the systemd unit and the example configurations
name only files, variables and keys that exist (Docker itself cannot run on every machine that
runs the tests, so what can be checked without it is checked here)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from hutch.broker.broker import Config
from hutch.server import environment, logs
from hutch.server.config import apply_file
from tests.support.brokers import ROOT

PACKAGING = ROOT / "packaging"


@pytest.mark.parametrize("name", ["hutch.conf.example", "container.conf"])
def test_example_configurations_load_cleanly(name):
    cfg = apply_file(Config(), PACKAGING / name)
    assert cfg.config_warnings == []
    if name == "container.conf":
        assert cfg.loopback_users == []  # clients come from outside the container's loopback
        assert (cfg.amqp_port, cfg.mgmt_port, cfg.prometheus_port) == (5672, 15672, 15692)


def test_every_commented_key_in_the_example_loads_too(tmp_path):
    """Uncommenting any `# key = value` line of the example must give a configuration that loads
    and whose log settings make a valid plan."""
    lines = []
    for line in (PACKAGING / "hutch.conf.example").read_text().splitlines():
        m = re.fullmatch(r"# ([a-z_][a-z0-9_.]*) = (.+)", line)
        lines.append(f"{m.group(1)} = {m.group(2)}" if m else line)
    uncommented = sum(1 for a, b in zip(lines, (PACKAGING / "hutch.conf.example").read_text().splitlines(),
                                        strict=True) if a != b)
    assert uncommented >= 20
    conf = tmp_path / "all.conf"
    conf.write_text("\n".join(lines) + "\n")
    cfg = apply_file(Config(), conf)
    assert cfg.default_pass == "change me # not this"
    assert cfg.cluster_partition_handling == "pause_minority"
    assert len(cfg.cluster_nodes) == 3
    plan = logs.plan(cfg.log_settings, cfg.log_level, cfg.data_dir, cfg.node_name)
    assert plan.warnings == []
    assert [(s.kind, s.formatter) for s in plan.sinks] == [("console", "json"), ("file", "json")]
    assert plan.sinks[1].path == "/var/log/hutch/hutch.log" and plan.sinks[1].rotation_size == 10485760


def _dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def test_dockerfile_copies_only_what_the_build_context_holds():
    text = _dockerfile()
    allowed = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]
    sources = []
    for m in re.finditer(r"^COPY (?!--from)(.+)$", text, re.M):
        sources += m.group(1).split()[:-1]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), src
        assert src.rstrip("/") in allowed, f"{src} is excluded by .dockerignore"


def test_dockerfile_environment_and_ports():
    text = _dockerfile()
    names = set(re.findall(r"\b(HUTCH_[A-Z_]+)=", text))
    assert names and names <= set(environment.VARIABLES), names - set(environment.VARIABLES)
    expose = re.search(r"^EXPOSE (.+)$", text, re.M).group(1).split()
    assert expose == ["5672", "15672", "15692", "25672"]
    assert "VOLUME /var/lib/hutch" in text
    assert re.search(r"^USER hutch$", text, re.M)


def test_make_image_says_docker_is_required_when_it_cannot_build():
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True).returncode == 0:
        pytest.skip("a Docker daemon is running here: `make image` would build")
    r = subprocess.run(["make", "-s", "image"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "Docker is required" in r.stderr


def _unit() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in (PACKAGING / "hutch-server.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def test_systemd_unit_is_a_notify_service():
    unit = _unit()
    assert unit["Type"] == ["notify"]
    assert unit["NotifyAccess"] == ["main"]
    assert unit["ExecStart"] == ["/opt/hutch/bin/hutch server"]
    assert unit["KillSignal"] == ["SIGTERM"]
    for assignment in unit["Environment"]:
        name = assignment.split("=", 1)[0]
        assert name in environment.VARIABLES or name in ("HOME", "PYTHONUNBUFFERED"), name


def test_env_file_example_names_known_variables():
    names = re.findall(r"^#?(HUTCH_[A-Z_]+)=", (PACKAGING / "hutch-env.conf.example").read_text(), re.M)
    assert names and set(names) <= set(environment.VARIABLES)
    assert "EnvironmentFile=-/etc/hutch/hutch-env.conf" in (PACKAGING / "hutch-server.service").read_text()


def test_systemd_unit_passes_systemd_analyze(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # the unit as installed, with ExecStart pointing at a hutch script that exists here
    text = (PACKAGING / "hutch-server.service").read_text()
    hutch = ROOT / ".venv" / "bin" / "hutch"
    unit = tmp_path / "hutch-server.service"
    unit.write_text(text.replace("/opt/hutch/bin/hutch", str(hutch)))
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (r.stdout + r.stderr).splitlines() if "hutch-server.service" in line]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr
