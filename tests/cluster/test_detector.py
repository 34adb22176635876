"""The phi-accrual failure detector under a simulated clock (seed 003: "the adaptive failure
detector ... can detect peer unavailability much earlier than a heartbeat-based mechanism can,
all while having lower sensitivity to latency spikes")."""

from __future__ import annotations

import random

import pytest

from hutch.cluster import FailureDetector

STEP_S = 0.01  # the simulated clock's resolution when scanning for suspicion


def feed(fd: FailureDetector, start_s: float, intervals_s: list[float]) -> float:
    """Heartbeats at start_s and then after each interval; returns the time of the last one.
    Checks the detector just before every heartbeat: an alive peer must never be suspected."""
    t = start_s
    fd.heartbeat(t)
    for dt in intervals_s:
        assert not fd.is_suspected(t + dt - 1e-6), f"suspected an alive peer at t={t + dt:.2f} (phi {fd.phi(t + dt):.2f})"
        t += dt
        fd.heartbeat(t)
    return t


def first_suspected_after(fd: FailureDetector, last_s: float, limit_s: float = 60.0) -> float:
    t = last_s
    while not fd.is_suspected(t):
        t += STEP_S
        assert t - last_s < limit_s, "silence never suspected"
    return t - last_s


def test_steady_heartbeats_are_never_suspected():
    fd = FailureDetector()
    feed(fd, 0.0, [0.1] * 3000)  # five minutes of 100 ms heartbeats
    assert fd.phi(300.0 + 0.1) < 1.0


def test_silence_is_suspected_within_the_bound_and_not_before_the_acceptable_pause():
    fd = FailureDetector(threshold=8.0, acceptable_pause_ms=1000.0, min_std_deviation_ms=100.0)
    last = feed(fd, 0.0, [0.1] * 600)
    bound_s = fd.suspicion_bound_s()
    took_s = first_suspected_after(fd, last)
    assert 1.0 < took_s <= bound_s, (took_s, bound_s)
    assert bound_s < 3.0  # "noticed in seconds", well inside a default net_ticktime of 60 s


def test_suspicion_grows_with_silence():
    fd = FailureDetector()
    last = feed(fd, 0.0, [0.1] * 100)
    phis = [fd.phi(last + k * 0.1) for k in range(40)]
    assert phis == sorted(phis)
    assert phis[0] < 0.5 and phis[-1] > 8.0


def test_a_jittery_but_alive_peer_is_not_suspected():
    rng = random.Random(3)
    intervals = []
    for _ in range(2000):
        # Mostly 50..350 ms, with a latency spike of 0.8..1.2 s one time in fifty.
        intervals.append(rng.uniform(0.8, 1.2) if rng.random() < 0.02 else rng.uniform(0.05, 0.35))
    fd = FailureDetector()
    feed(fd, 0.0, intervals)


def test_the_detector_learns_jitter_and_waits_longer_for_a_jittery_peer():
    steady, jittery = FailureDetector(), FailureDetector()
    last_steady = feed(steady, 0.0, [0.1] * 500)
    rng = random.Random(5)
    last_jittery = feed(jittery, 0.0, [rng.uniform(0.0, 0.6) for _ in range(500)])
    assert first_suspected_after(jittery, last_jittery) > first_suspected_after(steady, last_steady)


def test_a_lower_threshold_suspects_sooner():
    eager, patient = FailureDetector(threshold=3.0), FailureDetector(threshold=12.0)
    last = feed(eager, 0.0, [0.1] * 300)
    feed(patient, 0.0, [0.1] * 300)
    assert first_suspected_after(eager, last) < first_suspected_after(patient, last)


def test_the_history_window_is_bounded():
    fd = FailureDetector(window_size_max=50)
    feed(fd, 0.0, [0.1] * 40 + [0.5] * 100)
    # Only the last 50 intervals count: the early 100 ms ones have aged out.
    assert fd.mean_ms == pytest.approx(500.0)


def test_a_peer_never_heard_from_is_not_suspected_and_reset_forgets():
    fd = FailureDetector()
    assert fd.phi(1000.0) == 0.0
    fd.heartbeat(0.0)
    assert fd.is_suspected(100.0)
    fd.reset()
    assert not fd.is_suspected(200.0)
