"""The package as a user installs it: wheel, fresh virtualenv, one node, one AMQP round trip.

What `make wheel-check` runs and tests/packaging/test_wheel.py drives (docs/deployment.md,
"Installing with pip"). The wheel is built from a copy of the source tree (so the shared checkout
gets no build/ or egg-info litter), installed with `pip install -c constraints.txt` into a new
virtualenv that has nothing else, and must then start a node with its own `hutch` script, answer
a publish and a get over AMQP, and stop cleanly on SIGTERM. It also checks the install stays lean:
the lab's and the checker's packages (pyarrow, aiormq, pyspark) are extras and must not be there.

It never installs anything into the development virtualenv and never leaves a process running.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXTRAS_ONLY = ("pyarrow", "aiormq", "pyspark", "pandas", "matplotlib")


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 600) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def build_wheel(workdir: Path) -> Path:
    """A wheel from a copy of the project's packaging inputs (pyproject, README, LICENSE, src)."""
    src = workdir / "src-copy"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = workdir / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)])
    wheels = sorted(out.glob("hutch-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one hutch wheel in {out}, found {wheels}")
    return wheels[0]


def make_venv(workdir: Path, wheel: Path) -> Path:
    """A fresh virtualenv holding the wheel and its runtime dependencies at the pinned versions."""
    venv = workdir / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
          "-c", str(ROOT / "constraints.txt"), str(wheel)])
    return venv


def installed(venv: Path) -> dict[str, str]:
    out = _run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze",
                "--disable-pip-version-check"])
    pkgs = {}
    for line in out.splitlines():
        name, _, version = line.partition("==")
        pkgs[name.lower().replace("_", "-")] = version
    return pkgs


def _support():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.support import brokers

    return brokers


def _free_port() -> int:
    return _support().free_port()


def run_node_and_check(venv: Path, workdir: Path, timeout_s: float = 30.0) -> str:
    """Start a node from the venv's own `hutch` script, publish and get one message, stop it.
    Returns the node's log."""
    import pika

    amqp, mgmt, peer = _free_port(), _free_port(), _free_port()
    data = workdir / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HUTCH_", "PYTHON"))}
    env["HUTCH_CLUSTER_SECRET"] = "wheel-check-secret"
    log_path = workdir / "node.out"
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen([str(venv / "bin" / "hutch"), "server", "--node-name", "wheel@localhost",
                                 "--amqp-port", str(amqp), "--mgmt-port", str(mgmt), "--peer-port", str(peer),
                                 "--data-dir", str(data)], cwd=workdir, env=env, stdout=logf,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_support()._die_with_parent)
    try:
        deadline = time.monotonic() + timeout_s
        conn = None
        while conn is None:
            if proc.poll() is not None:
                raise RuntimeError(f"the node exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                conn = pika.BlockingConnection(pika.ConnectionParameters(
                    "127.0.0.1", amqp, credentials=pika.PlainCredentials("guest", "guest"),
                    connection_attempts=1, socket_timeout=2))
            except pika.exceptions.AMQPConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no AMQP on port {amqp} after {timeout_s}s:\n"
                                       f"{log_path.read_text()[-3000:]}") from None
                time.sleep(0.1)
        try:
            ch = conn.channel()
            q = ch.queue_declare("wheel-check", exclusive=True).method.queue
            ch.basic_publish("", q, b"from the wheel")
            body = None
            while body is None and time.monotonic() < deadline:
                _, _, body = ch.basic_get(q, auto_ack=True)
            if body != b"from the wheel":
                raise RuntimeError(f"basic.get returned {body!r}")
        finally:
            conn.close()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(20)
        if rc != 0:
            raise RuntimeError(f"the node exited with {rc} on SIGTERM:\n{log_path.read_text()[-3000:]}")
        return log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def check(workdir: Path) -> dict:
    t0 = time.monotonic()
    wheel = build_wheel(workdir)
    t_build = time.monotonic()
    venv = make_venv(workdir, wheel)
    t_venv = time.monotonic()
    pkgs = installed(venv)
    extra = [p for p in EXTRAS_ONLY if p in pkgs]
    if extra:
        raise RuntimeError(f"a plain install pulled in {extra}: they belong in extras")
    origin = _run([str(venv / "bin" / "python"), "-c", "import hutch, sys; print(hutch.__file__)"], cwd=workdir)
    if not origin.strip().startswith(str(venv)):
        raise RuntimeError(f"hutch imported from {origin.strip()}, not from the virtualenv")
    # the checker's packages are an extra: asking for it says which one, without a traceback
    r = subprocess.run([str(venv / "bin" / "hutch"), "check", "--help"], capture_output=True, text=True, cwd=workdir)
    if r.returncode != 1 or "pip install 'hutch[pipeline]'" not in r.stderr or "Traceback" in r.stderr:
        raise RuntimeError(f"'hutch check' without the pipeline extra answered ({r.returncode}): {r.stderr[-1500:]}")
    log = run_node_and_check(venv, workdir)
    return {"wheel": wheel.name, "wheel_path": wheel, "venv": venv, "packages": pkgs, "log": log,
            "seconds": {"build": t_build - t0, "venv": t_venv - t_build, "node": time.monotonic() - t_venv}}


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="hutch-wheel-") as tmp:
        try:
            result = check(Path(tmp))
        except RuntimeError as e:
            print(f"wheel check FAILED: {e}", file=sys.stderr)
            return 1
    s = result["seconds"]
    print(f"wheel check passed: {result['wheel']} installs with {len(result['packages'])} packages "
          f"(no {', '.join(EXTRAS_ONLY)}), starts a node that answers AMQP and stops cleanly "
          f"(build {s['build']:.0f}s, venv {s['venv']:.0f}s, node {s['node']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
