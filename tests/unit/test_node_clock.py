"""The node's clock: epoch time that the host's boot time and wall-clock jumps do not move."""

from __future__ import annotations

import pytest

from hutch.server.clock import NodeClock


class Fake:
    def __init__(self, mono: float, wall: float):
        self.mono, self.wall = mono, wall


def test_it_reads_the_wall_clock_at_start_and_counts_on_the_monotonic_clock(monkeypatch):
    monkeypatch.delenv("HUTCH_FAULT_BOOT_OFFSET_S", raising=False)
    monkeypatch.delenv("HUTCH_FAULT_WALL_OFFSET_MS", raising=False)
    t = Fake(mono=1_000.0, wall=1_800_000_000.0)
    clock = NodeClock(monotonic=lambda: t.mono, wall=lambda: t.wall)
    assert clock.now_ms() == 1_800_000_000_000
    t.mono += 2.5
    t.wall -= 3600  # the wall clock is set back an hour: the node's time goes on
    assert clock.now_ms() == 1_800_000_002_500
    assert clock.now_s() == pytest.approx(1_800_000_002.5)


def test_two_hosts_booted_days_apart_agree(monkeypatch):
    monkeypatch.delenv("HUTCH_FAULT_WALL_OFFSET_MS", raising=False)
    monkeypatch.delenv("HUTCH_FAULT_BOOT_OFFSET_S", raising=False)
    wall = 1_800_000_000.0
    young = NodeClock(monotonic=lambda: 60.0, wall=lambda: wall)
    old = NodeClock(monotonic=lambda: 60.0 + 3 * 86400, wall=lambda: wall)
    assert young.now_ms() == old.now_ms()
    monkeypatch.setenv("HUTCH_FAULT_BOOT_OFFSET_S", str(3 * 86400))  # the switch the tests use
    assert NodeClock(monotonic=lambda: 60.0, wall=lambda: wall).now_ms() == young.now_ms()


def test_the_wall_offset_switch_puts_a_node_ahead(monkeypatch):
    monkeypatch.delenv("HUTCH_FAULT_BOOT_OFFSET_S", raising=False)
    monkeypatch.setenv("HUTCH_FAULT_WALL_OFFSET_MS", "1500")
    assert NodeClock(monotonic=lambda: 5.0, wall=lambda: 100.0).now_ms() == 101_500


def test_an_unreadable_switch_is_named(monkeypatch):
    monkeypatch.setenv("HUTCH_FAULT_BOOT_OFFSET_S", "three days")
    with pytest.raises(ValueError, match="HUTCH_FAULT_BOOT_OFFSET_S must be a number"):
        NodeClock()
