"""A virtualenv for stream clients that need a newer Python than hutch's own.

rbfly 0.11 needs Python 3.12; hutch and its test suite run on the machine's Python 3.11. The
scenarios in rbfly_scenarios.py therefore run in their own interpreter, from a virtualenv made
here on first use (tests/streamclients/cache/, git-ignored) with only rbfly installed, pinned.
Python 3.12 is looked for as HUTCH_PYTHON312, `python3.12` on PATH, then under pyenv's
versions; without one the caller fails with this module's message, naming what to install.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

from tests.support.cachelock import cache_lock

HERE = Path(__file__).resolve().parent
CACHE = HERE / "cache"
RBFLY = "rbfly==0.11.1"
SCENARIOS = HERE / "rbfly_scenarios.py"
PIP_TIMEOUT_S = 600


class ToolchainError(RuntimeError):
    pass


def _is_312(python: str) -> bool:
    try:
        out = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == "True"


def find_python312() -> str:
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [os.environ.get("HUTCH_PYTHON312"), shutil.which("python3.12"),
                  *sorted(glob.glob(f"{root}/versions/3.12*/bin/python3.12"), reverse=True), "/usr/bin/python3.12"]
    for c in candidates:
        if c and _is_312(c):
            return c
    raise ToolchainError("rbfly 0.11 needs Python 3.12, and none was found (HUTCH_PYTHON312, python3.12 on PATH, "
                         f"{root}/versions/3.12*): install one, or point HUTCH_PYTHON312 at it")


def ensure_rbfly() -> Path:
    """The interpreter of a virtualenv holding rbfly 0.11.1 (made once, then reused)."""
    venv = CACHE / ("venv-" + RBFLY.replace("==", "-"))
    python = venv / "bin" / "python"
    stamp = venv / ".complete"
    with cache_lock(CACHE):
        if stamp.exists() and python.exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([find_python312(), "-m", "venv", str(venv)], check=True, timeout=120)
        out = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", RBFLY],
                             capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        if out.returncode != 0:
            raise ToolchainError(f"pip install {RBFLY} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
        stamp.touch()
    return python
