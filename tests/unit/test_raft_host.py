"""Raft group hosting (hutch.server.raft_host) on a real RaftHostStorage: a group of one elects
itself, committed entries reach the group's application in order, and an application that
raises makes the host stop and ask the node to stop (its copy of the state has left the other
members'), as does a failed fsync of the log."""

from __future__ import annotations

import logging

import pytest

from hutch.cluster.raftlog import RaftHostStorage
from hutch.raft.group import LEADER, RaftConfig
from hutch.server.raft_host import QueueGroups, RaftHost
from hutch.store import StoreFailed

ME = "a@h"
MY_ID = 7
GID = 42


class App:
    def __init__(self):
        self.applied: list[bytes] = []

    def apply(self, data: bytes, index: int) -> None:
        if data.startswith(b"bad"):
            raise ValueError(f"cannot apply {data!r}")
        self.applied.append(data)

    def restore(self, data: bytes) -> None:
        raise AssertionError("a new group has no snapshot")

    def snapshot(self) -> bytes:
        return b""

    def snapshot_due(self, entries_kept: int) -> bool:
        return False


@pytest.fixture
def hosted(tmp_path):
    storage = RaftHostStorage(tmp_path / "raft")
    leaders: list[tuple[int, bool]] = []
    fatal: list[str] = []
    host = RaftHost(MY_ID, ME, storage, RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1, seed=1),
                    {MY_ID: ME}, 0, send=lambda *a: None, schedule=lambda: None,
                    on_leader_known=lambda gid: None, on_leadership=lambda gid, leading: leaders.append((gid, leading)),
                    fatal=fatal.append)
    host.fatal_reasons = fatal
    groups = QueueGroups(host, lambda name: MY_ID)
    app = App()
    groups.ensure_group(GID, (ME,), app, leader_hint=ME)
    host.drain()  # the bootstrap entry makes this node the group's one voter
    for _ in range(40):  # alone, it wins the first election it stands in
        if host.multi.groups[GID].role == LEADER:
            break
        host.multi.tick()
        host.drain()
    yield host, groups, app, leaders
    storage.close()


def test_a_group_of_one_elects_itself_and_tells_its_owner(hosted):
    host, groups, _app, leaders = hosted
    assert host.multi.groups[GID].role == LEADER
    assert groups.leader(GID) == ME
    assert leaders == [(GID, True)]


def test_committed_entries_reach_the_application_in_order(hosted):
    host, groups, app, _ = hosted
    for data in (b"one", b"two", b"three"):
        assert groups.propose(GID, data) is True
    host.drain()
    assert app.applied == [b"one", b"two", b"three"]


def test_a_failing_entry_stops_the_host_and_asks_the_node_to_stop(hosted, caplog):
    host, groups, app, _ = hosted
    with caplog.at_level(logging.ERROR, logger="hutch.cluster"):
        for data in (b"ok1", b"bad1", b"ok2"):
            groups.propose(GID, data)
        host.drain()
    assert app.applied == [b"ok1"]  # nothing after the entry that failed
    assert host.failed
    assert len(host.fatal_reasons) == 1 and "applying committed entry" in host.fatal_reasons[0]
    failures = [r for r in caplog.records if "applying committed entry" in r.getMessage()]
    assert len(failures) == 1 and isinstance(failures[0].exc_info[1], ValueError)
    groups.propose(GID, b"ok3")
    host.drain()  # a failed host does nothing more
    assert app.applied == [b"ok1"]


def test_a_failed_log_fsync_stops_the_host(hosted, monkeypatch):
    host, groups, app, _ = hosted

    def failing_sync():
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(host.storage, "sync", failing_sync)
    groups.propose(GID, b"never")
    host.drain()
    assert host.failed and app.applied == []  # not applied on the strength of an unsynced write
    assert "Raft log fsync failed" in host.fatal_reasons[0]


def test_a_log_that_refuses_writes_stops_the_host_instead_of_failing_the_peer_message(hosted, monkeypatch):
    """After a failed fsync the segment log refuses writes until it is reopened; a peer's message
    or a proposal that meets it stops the node (the log failed, not the message), rather than
    raising into the transport, which would close the link and call the peer faulty."""
    host, groups, _app, _ = hosted

    def refused(*_a, **_k):
        raise StoreFailed("Segment log raft: failed earlier ([Errno 5] Input/output error); reopen it")
    monkeypatch.setattr(host.storage.log, "append", refused)
    assert groups.propose(GID, b"never") is False
    assert host.failed and "Raft log failed" in host.fatal_reasons[0]


def test_dropping_a_group_forgets_its_bookkeeping(hosted):
    host, groups, _app, _ = hosted
    groups.drop_group(GID)
    assert GID not in host.multi.groups and GID not in host.apps
    assert groups.leader(GID) is None and groups.status(GID) is None


def test_a_snapshot_too_large_for_one_log_record_is_refused_with_a_warning(hosted, caplog):
    host, groups, app, _ = hosted
    host._snapshot_bytes_max = 10
    app.snapshot_due = lambda kept: True
    app.snapshot = lambda: b"x" * 11
    host.multi.groups[GID].cfg = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1, seed=1,
                                            snapshot_after_entries=1)
    with caplog.at_level(logging.WARNING, logger="hutch.cluster"):
        for i in range(4):
            groups.propose(GID, b"e%d" % i)
            host.drain()
    assert not host.failed and app.applied == [b"e0", b"e1", b"e2", b"e3"]
    assert host.storage.group(GID).first_index() == 1  # the log is kept whole
    warnings = [r for r in caplog.records if "over the Raft log's record limit" in r.getMessage()]
    assert len(warnings) == 1
