"""`hutch lab up N` in a directory that still holds the data of a lab of another size fails at
once and says what to do (its nodes would otherwise wait for members that are not there), and
works again once the directory is wiped."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hutch.lab.cluster import Lab
from tests.support.lab import free_base_port

pytestmark = pytest.mark.timeout(180)


def hutch_lab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hutch", "lab", *args], capture_output=True, text=True, timeout=90)


def test_up_refuses_at_once_a_directory_with_a_lab_of_another_size(tmp_path):
    lab_dir = tmp_path / "lab"
    lab = Lab.up(3, lab_dir, base_port=free_base_port(3), net_ticktime_s=2, tied_to_caller=True)
    lab.down()  # the data stays
    started = time.monotonic()
    refused = hutch_lab("up", "1", "--base-port", str(free_base_port(1)), "--dir", str(lab_dir))
    took_s = time.monotonic() - started
    assert refused.returncode != 0
    assert "3-node lab (hutch-1, hutch-2, hutch-3)" in refused.stderr
    assert f"hutch lab down --wipe --dir {lab_dir}" in refused.stderr and "another --dir" in refused.stderr
    assert took_s < 10, f"took {took_s:.1f} s to refuse"
    assert not Lab(lab_dir).controller_running()
    wiped = hutch_lab("down", "--wipe", "--dir", str(lab_dir))
    assert wiped.returncode == 0, wiped.stderr
    up = hutch_lab("up", "1", "--base-port", str(free_base_port(1)), "--dir", str(lab_dir))
    try:
        assert up.returncode == 0, up.stderr
        assert "healthy" in up.stdout
    finally:
        hutch_lab("down", "--wipe", "--dir", str(lab_dir))


def test_up_again_with_the_same_size_reuses_the_data(tmp_path):
    lab_dir = tmp_path / "lab"
    base = free_base_port(1)
    Lab.up(1, lab_dir, base_port=base, tied_to_caller=True).down()
    lab = Lab.up(1, lab_dir, base_port=base, tied_to_caller=True)
    lab.down(wipe=True)
