"""Everything a suite needs on disk: its pinned sdist, unpacked and prepared, and a virtualenv.

All of it lives under tests/conformance/cache/ (git-ignored) and is made on first use:
`pip download` of the exact sdist, unpacking, the few source patches a suite declares
(each must apply exactly once, so a changed sdist fails loudly instead of silently
running something else), and one virtualenv with requirements.txt installed, rebuilt
when that file changes. The project's own .venv is never touched.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.cachelock import cache_lock

from .suites import SUITES, Suite

HERE = Path(__file__).resolve().parent
CACHE = HERE / "cache"
SDISTS = CACHE / "sdists"
SRC = CACHE / "src"
VENV = CACHE / "venv"
REQUIREMENTS = HERE / "requirements.txt"
PLUGINS = HERE / "plugins"
PIP_TIMEOUT_S = 600

_PYTEST_CONFIG_MARKERS = (
    ("pytest.ini", None),
    ("pyproject.toml", "[tool.pytest.ini_options]"),
    ("tox.ini", "[pytest]"),
    ("setup.cfg", "[tool:pytest]"),
)


class ToolchainError(RuntimeError):
    pass


def venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv() -> Path:
    """The conformance virtualenv, (re)built when requirements.txt changed."""
    with cache_lock(CACHE):
        return _ensure_venv()


def _ensure_venv() -> Path:
    digest = hashlib.sha1(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    stamp = VENV / f".installed-{digest}"
    if stamp.exists() and venv_python().exists():
        return venv_python()
    if VENV.exists():
        shutil.rmtree(VENV)
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"conformance: building virtualenv {VENV}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    _pip(venv_python(), "install", "-q", "--disable-pip-version-check", "-r", str(REQUIREMENTS))
    stamp.touch()
    return venv_python()


def _pip(python: Path, *args: str) -> None:
    proc = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True,
                          timeout=PIP_TIMEOUT_S)
    if proc.returncode != 0:
        raise ToolchainError(f"pip {' '.join(args)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")


def _sdist_archive(suite: Suite) -> Path | None:
    stem = suite.unpacked  # e.g. aio_pika-10.2.1
    for ext in (".tar.gz", ".zip"):
        path = SDISTS / f"{stem}{ext}"
        if path.exists():
            return path
    return None


def fetch_sdist(suite: Suite) -> Path:
    """The suite's sdist archive, downloaded once with pip (source only for that package)."""
    archive = _sdist_archive(suite)
    if archive is not None:
        return archive
    SDISTS.mkdir(parents=True, exist_ok=True)
    print(f"conformance: downloading {suite.sdist}", flush=True)
    # --no-binary for the package itself only: its build backend may come as a wheel.
    _pip(Path(sys.executable), "download", "-q", "--disable-pip-version-check", "--no-deps",
         "--no-binary", suite.package, suite.sdist, "-d", str(SDISTS))
    archive = _sdist_archive(suite)
    if archive is None:
        raise ToolchainError(f"pip download {suite.sdist} left no {suite.unpacked}.tar.gz in {SDISTS}")
    return archive


def prepare(suite: Suite) -> Path:
    """The unpacked, patched sdist folder the suite runs in."""
    with cache_lock(CACHE):
        return _prepare(suite)


def _prepare(suite: Suite) -> Path:
    dest = SRC / suite.unpacked
    # The stamp names the patches, so that changing them prepares the folder anew.
    digest = hashlib.sha1(repr(suite.patches).encode()).hexdigest()[:12]
    stamp = dest / f".hutch-conformance-prepared-{digest}"
    if stamp.exists():
        return dest
    archive = fetch_sdist(suite)
    if dest.exists():
        shutil.rmtree(dest)
    SRC.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(SRC, filter="data")
    if not dest.is_dir():
        raise ToolchainError(f"{archive.name} did not unpack to {dest}")
    _apply_patches(suite, dest)
    _ensure_own_pytest_config(dest)
    stamp.touch()
    return dest


def _apply_patches(suite: Suite, dest: Path) -> None:
    # Several suites may share an sdist (amqpstorm, amqpstorm-mgmt); patches are idempotent.
    for patch in suite.patches:
        path = dest / patch.path
        text = path.read_text()
        if text.count(patch.new) == 1 and patch.old not in text:
            continue
        if text.count(patch.old) != 1:
            raise ToolchainError(f"{suite.sdist}: expected exactly one {patch.old!r} in {patch.path}")
        path.write_text(text.replace(patch.old, patch.new))


def _ensure_own_pytest_config(dest: Path) -> None:
    """Stop pytest from climbing to hutch's pyproject.toml when the sdist has no config."""
    for name, marker in _PYTEST_CONFIG_MARKERS:
        path = dest / name
        if path.exists() and (marker is None or marker in path.read_text(errors="replace")):
            return
    (dest / "pytest.ini").write_text("[pytest]\n")


@dataclass(frozen=True)
class TlsFiles:
    """A server certificate, its key and the CA that signed both it and the clients' certificates."""

    ca: Path
    cert: Path
    key: Path


def tls_files() -> TlsFiles:
    """aiormq's suite certificates: its amqps tests trust that CA and present its client certificate."""
    certs = prepare(SUITES["aiormq"]) / "tests" / "certs"
    files = TlsFiles(ca=certs / "ca.pem", cert=certs / "server.pem", key=certs / "server.key")
    for path in (files.ca, files.cert, files.key):
        if not path.exists():
            raise ToolchainError(f"{path} is missing from the aiormq sdist")
    return files
