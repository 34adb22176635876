"""hutch.server.worker.WorkerThread: the Raft host's fsync thread."""

from __future__ import annotations

import logging
import threading

import pytest

from hutch.server.worker import WorkerThread


def test_calls_run_in_order_in_one_thread_other_than_the_callers():
    w = WorkerThread("test-worker")
    seen: list[tuple[int, str]] = []
    done = threading.Event()
    for i in range(50):
        w.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    w.submit(done.set)
    assert done.wait(10)
    w.close()
    assert [i for i, _ in seen] == list(range(50))
    assert {name for _, name in seen} == {"test-worker"}
    assert threading.current_thread().name != "test-worker"


def test_a_call_that_raises_is_logged_and_the_next_ones_still_run(caplog):
    w = WorkerThread("test-worker")
    done = threading.Event()

    def boom() -> None:
        raise ValueError("disk on fire")

    with caplog.at_level(logging.ERROR, logger="hutch.cluster"):
        w.submit(boom)
        w.submit(done.set)
        assert done.wait(10)
        w.close()
    assert any("test-worker" in r.getMessage() and r.exc_info and r.exc_info[0] is ValueError
               for r in caplog.records)


def test_close_waits_for_what_was_handed_over_and_refuses_more():
    w = WorkerThread("test-worker")
    release = threading.Event()
    finished: list[str] = []

    def slow() -> None:
        release.wait(10)
        finished.append("slow")

    w.submit(slow)
    w.submit(lambda: finished.append("after"))
    threading.Timer(0.05, release.set).start()
    w.close()
    assert finished == ["slow", "after"]
    assert not w._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        w.submit(lambda: None)


def test_no_thread_until_the_first_call_and_close_without_one_is_quiet():
    w = WorkerThread("test-worker")
    assert w._thread is None
    w.close()
    w.close()
