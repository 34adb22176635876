"""The Raft log's fsync off the event loop (hutch.server.raft_host, `sync_in_background`): a
Ready's messages and its own entries wait for its sync, while committed entries an earlier sync
made durable are applied at once; proposals made meanwhile are written and wait for the next
sync (one in flight at a time); a failed sync stops the host. The test
plays the worker thread: it runs the log's sync when it chooses and calls the host back."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hutch.cluster.raftlog import RaftHostStorage
from hutch.raft.group import LEADER, RaftConfig
from hutch.server.raft_host import QueueGroups, RaftHost

ME = "a@h"
MY_ID = 7
GID = 42


class App:
    def __init__(self):
        self.applied: list[bytes] = []

    def apply(self, data: bytes, index: int) -> None:
        self.applied.append(data)

    def restore(self, data: bytes) -> None:
        raise AssertionError("a new group has no snapshot")

    def snapshot(self) -> bytes:
        return b""

    def snapshot_due(self, entries_kept: int) -> bool:
        return False


class Worker:
    """The syncs the host asked for, run when the test says."""

    def __init__(self, storage: RaftHostStorage):
        self.storage = storage
        self.waiting: list[Callable] = []

    def start(self, done: Callable) -> None:
        self.waiting.append(done)

    def finish(self, error: BaseException | None = None) -> None:
        done = self.waiting.pop(0)
        done(error, 0 if error is not None else self.storage.log.sync())


@pytest.fixture
def hosted(tmp_path):
    storage = RaftHostStorage(tmp_path / "raft")
    worker = Worker(storage)
    fatal: list[str] = []
    host = RaftHost(MY_ID, ME, storage, RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1, seed=1),
                    {MY_ID: ME}, 0, send=lambda *a: None, schedule=lambda: None,
                    on_leader_known=lambda gid: None, on_leadership=lambda gid, leading: None,
                    fatal=fatal.append, sync_in_background=worker.start)
    groups = QueueGroups(host, lambda name: MY_ID)
    app = App()
    groups.ensure_group(GID, (ME,), app, leader_hint=ME)
    host.drain(initial=True)  # at start the sync runs in place
    for _ in range(40):
        if host.multi.groups[GID].role == LEADER:
            break
        host.multi.tick()
        host.drain()
        while worker.waiting:
            worker.finish()
    assert host.multi.groups[GID].role == LEADER
    yield host, groups, app, worker, fatal
    storage.close()


def test_nothing_is_applied_before_its_sync_returns_and_what_came_meanwhile_waits_for_the_next(hosted):
    host, groups, app, worker, _ = hosted
    groups.propose(GID, b"one")
    host.drain()
    assert len(worker.waiting) == 1 and app.applied == []
    groups.propose(GID, b"two")  # written to the log while the sync runs
    host.drain()
    assert len(worker.waiting) == 1  # one sync in flight at a time
    worker.finish()
    # "one" is durable: applied at once, while the next sync (for "two" and the commit) runs
    assert app.applied == [b"one"] and len(worker.waiting) == 1
    for _ in range(10):  # each sync returning lets the next Ready out, which may need one again
        if not worker.waiting:
            break
        worker.finish()
        assert len(worker.waiting) <= 1
    assert app.applied == [b"one", b"two"]
    assert worker.waiting == []


def test_a_failed_background_sync_stops_the_host_with_nothing_applied(hosted):
    host, groups, app, worker, fatal = hosted
    groups.propose(GID, b"never")
    host.drain()
    worker.finish(OSError(5, "Input/output error"))
    assert host.failed and app.applied == []
    assert "Raft log fsync failed" in fatal[0]
    groups.propose(GID, b"after")
    host.drain()
    assert worker.waiting == [] and app.applied == []
