"""A stream member compacts its Raft log only to a snapshot whose chunks are durable in its own
chunk log, and that log's fsync runs in a worker thread, not on the event loop
(`hutch.streams.host._StreamApp.checkpoint`): a snapshot is taken at the applied index, the
log's fsync starts, and the snapshot is handed to the Raft host at the first call after the
fsync returned. A failed fsync is raised there (the host stops the node); a snapshot restored
from the leader meanwhile makes the one being synced worthless."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest

from hutch.store.stream_log import StreamLog, StreamLogError
from hutch.streams import host as streams_host
from hutch.streams import machine as sm
from hutch.streams.host import _StreamApp

WAIT_S = 10.0


class HeldLog(StreamLog):
    """A stream log whose fsyncs wait for `go`, and which records the thread each ran in."""

    __slots__ = ("go", "threads", "error")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.go = threading.Event()
        self.threads: list[int] = []
        self.error: BaseException | None = None

    def sync(self) -> int:
        self.threads.append(threading.get_ident())
        self.go.wait(WAIT_S)  # a failing test must not hold the executor for long
        if self.error is not None:
            raise self.error
        return super().sync()


class Host:
    def __init__(self):
        self.gaps = 0

    def written(self, q, w) -> None:
        pass

    def gap(self, q) -> None:
        self.gaps += 1


@pytest.fixture
def member(tmp_path):
    lg = HeldLog(tmp_path / "s")
    q = types.SimpleNamespace(log=lg, machine=sm.StreamMachine(lg))
    yield _StreamApp(Host(), q), q, lg
    lg.go.set()
    lg.error = None
    lg.close()


def write(app: _StreamApp, req: int) -> None:
    app.apply(sm.write_entry("n1", req, 0, 1000, "w", [req], [b"m%d" % req]), req)


async def until(cond, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def test_the_snapshot_is_handed_over_once_its_chunks_are_fsynced_in_a_worker_thread(member):
    app, q, lg = member

    async def run():
        write(app, 1)
        write(app, 2)
        taken = []

        def take():
            taken.append(app.snapshot())
            return taken[-1]

        assert app.checkpoint(2, "conf", take) is None  # the fsync started, and runs
        assert lg.threads and lg.threads[0] != threading.get_ident()
        assert lg.synced_offset < 2
        write(app, 3)
        assert app.checkpoint(3, "conf", take) is None  # still running: no second snapshot, no second fsync
        assert len(taken) == 1 and len(lg.threads) == 1
        lg.go.set()
        await until(lambda: app._synced is not None, "the fsync")
        assert lg.synced_offset >= 2  # the two chunks the snapshot stands for
        point = app.checkpoint(3, "conf", take)
        assert point == (2, "conf", taken[0])  # the snapshot taken before the fsync, at its index
        assert sm.StreamMachine(lg).restore(point[2]) is None  # numbers only: next offset 2
        await until(lambda: app._synced is not None, "the next fsync")  # one was started for index 3
        assert app.checkpoint(3, "conf", take)[0] == 3

    asyncio.run(run())


def test_a_failed_fsync_is_raised_at_the_next_checkpoint(member):
    app, q, lg = member

    async def run():
        write(app, 1)
        lg.error = StreamLogError("fsync failed: EIO")
        assert app.checkpoint(1, None, app.snapshot) is None
        lg.go.set()
        await until(lambda: app._sync_error is not None, "the failed fsync")
        with pytest.raises(StreamLogError, match="EIO"):
            app.checkpoint(1, None, app.snapshot)

    asyncio.run(run())


def test_a_snapshot_restored_while_the_fsync_runs_drops_the_one_taken_before(member, monkeypatch):
    app, q, lg = member
    called_back: list[BaseException | None] = []
    real = streams_host.in_worker_thread

    def in_worker_thread(work, done):
        real(work, lambda error: (done(error), called_back.append(error)))
    monkeypatch.setattr(streams_host, "in_worker_thread", in_worker_thread)

    async def run():
        write(app, 1)
        assert app.checkpoint(1, None, app.snapshot) is None
        leader = sm.StreamMachine(lg)
        leader.next_offset = 1  # the leader's state, at this member's log end
        app.restore(leader.snapshot())
        lg.go.set()
        await until(lambda: called_back, "the fsync and its callback")
        assert called_back == [None] and lg.synced_offset >= 1
        assert app._synced is None and app._sync_error is None  # the snapshot taken before is dropped

    asyncio.run(run())
