"""The simulated disk (hutch.simkernel.disk) under hutch's real segment log: a power failure
loses what was not fsynced and may tear the last write; the store's recovery cuts a torn tail
without calling it corruption and refuses to pass off damage to what it had synced; a full disk
and a failing one surface as the errors the store handles (docs/design/simulation.md, "The
crash model")."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from random import Random

import pytest

from hutch.simkernel.disk import SimDisk
from hutch.store import segment_log
from hutch.store.segment_log import SegmentLog, StoreFailed

BOUND = ((segment_log, "_fdatasync"),)


class _AlwaysTear(Random):
    """A seed whose power failures always keep part of the unsynced writes."""

    def random(self) -> float:
        return 0.99


@pytest.fixture
def host_dir(tmp_path):
    return tmp_path / "n1"


@contextlib.contextmanager
def _log_on_a_simulated_disk(host_dir, rng: Random):
    """(disk, log): a segment log in host n1's directory, on a simulated disk installed meanwhile."""
    disk = SimDisk(rng)
    disk.mount("n1", host_dir)
    with disk.installed(BOUND):
        yield disk, SegmentLog(host_dir)


def _crash(disk: SimDisk, log: SegmentLog) -> None:
    """The process dies: its descriptors close, the log object is never used again."""
    disk.close_all("n1")
    log._closed = True  # noqa: SLF001 - what a dead process leaves behind is never closed cleanly


def _records(directory) -> list[bytes]:
    with SegmentLog(directory) as log:
        out = []
        seq = 1
        while seq < log._next_seq:  # noqa: SLF001
            if log.contains(seq):
                out.append(log.read(seq).payload)
            seq += 1
        return out, log.recovery


def test_a_power_failure_loses_every_write_not_fsynced(host_dir):
    with _log_on_a_simulated_disk(host_dir, Random(1)) as (disk, log):
        for i in range(5):
            log.append(b"synced-%d" % i)
        log.sync()
        for i in range(5):
            log.append(b"unsynced-%d" % i)
        log.flush()  # in the page cache, not on the disk
        assert disk.unsynced_bytes("n1") > 0
        _crash(disk, log)
        lost = disk.power_loss("n1")
    assert lost.files == 1 and lost.bytes_lost > 0 and lost.torn == 0
    records, report = _records(host_dir)
    assert records == [b"synced-%d" % i for i in range(5)]
    assert report.corrupt == []


def test_a_crash_without_power_loss_keeps_what_was_written(host_dir):
    with _log_on_a_simulated_disk(host_dir, Random(1)) as (disk, log):
        log.append(b"a")
        log.sync()
        log.append(b"b")
        log.flush()
        _crash(disk, log)
    records, _ = _records(host_dir)
    assert records == [b"a", b"b"]


def test_a_torn_tail_is_cut_at_recovery_not_reported_as_corruption(host_dir):
    with _log_on_a_simulated_disk(host_dir, _AlwaysTear(3)) as (disk, log):
        log.append(b"durable")
        log.sync()
        log.append(b"x" * 4000)
        log.flush()
        _crash(disk, log)
        lost = disk.power_loss("n1")
    assert lost.torn == 1
    records, report = _records(host_dir)
    assert records == [b"durable"]
    assert report.torn_tail is not None and report.corrupt == []


def test_damage_below_the_synced_mark_is_refused_not_taken_for_a_torn_write(host_dir):
    with _log_on_a_simulated_disk(host_dir, Random(1)) as (disk, log):
        log.append(b"first")
        log.append(b"second")
        log.sync()
        log._synced_at = -1e9  # noqa: SLF001 - make the next sync record the synced mark
        log.sync()
        log.close()
    seg = next(p for p in host_dir.iterdir() if p.suffix == ".hseg")
    size = seg.stat().st_size
    with open(seg, "r+b") as f:  # the disk damages a synced record: the last bytes of the file
        f.seek(size - 3)
        f.write(b"\0\0\0")
    records, report = _records(host_dir)
    assert records == [b"first"]
    assert report.torn_tail is None and len(report.corrupt) == 1


def test_a_full_disk_fails_writes_with_enospc_and_reports_no_free_space(host_dir):
    with _log_on_a_simulated_disk(host_dir, Random(1)) as (disk, log):
        assert shutil.disk_usage(host_dir).free > 1 << 30
        disk.full.add("n1")
        assert shutil.disk_usage(host_dir).free == 0
        log.append(b"no room")
        with pytest.raises(StoreFailed) as e:
            log.sync()
        assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.ENOSPC
        _crash(disk, log)
        disk.full.discard("n1")
    records, report = _records(host_dir)
    assert records == [] and report.corrupt == []


def test_a_failing_disk_fails_fsync_with_eio(host_dir):
    with _log_on_a_simulated_disk(host_dir, Random(1)) as (disk, log):
        log.append(b"kept")
        log.sync()
        disk.fsync_failing.add("n1")
        log.append(b"never durable")
        with pytest.raises(StoreFailed) as e:
            log.sync()
        assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.EIO
        _crash(disk, log)
        disk.fsync_failing.discard("n1")
        disk.power_loss("n1")  # the page cache is not trusted after a failed fsync
    records, _ = _records(host_dir)
    assert records == [b"kept"]


def test_a_slow_disk_makes_its_hosts_fsyncs_take_time_and_other_hosts_none(tmp_path):
    disk = SimDisk(Random(1))
    disk.mount("n1", tmp_path / "n1")
    disk.mount("n2", tmp_path / "n2")
    disk.slow["n1"] = (0.1, 0.2)
    with disk.installed(BOUND):
        slow, fast = SegmentLog(tmp_path / "n1"), SegmentLog(tmp_path / "n2")
        took = disk.fsync_s
        fast.append(b"x")
        fast.sync()
        assert disk.fsync_s == took
        slow.append(b"x")
        slow.sync()  # one fdatasync of the segment, drawn from n1's range
        assert 0.1 <= disk.fsync_s - took <= 0.2
        took = disk.fsync_s
        del disk.slow["n1"]
        slow.append(b"y")
        slow.sync()
        assert disk.fsync_s == took
        slow.close()
        fast.close()


def test_files_outside_a_mounted_directory_are_left_alone(tmp_path):
    disk = SimDisk(Random(1))
    disk.mount("n1", tmp_path / "n1")
    other = tmp_path / "elsewhere"
    with disk.installed(BOUND):
        fd = os.open(other, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"untracked")
        os.close(fd)
        assert disk.unsynced_bytes("n1") == 0
        disk.power_loss("n1")
    assert other.read_bytes() == b"untracked"
    assert os.write is not None and segment_log._fdatasync in (os.fdatasync, os.fsync)  # noqa: SLF001 - restored


# -- the clocks and the nemesis in the whole-cluster simulation (hutch.sim.cluster)


def test_a_host_clock_drifts_and_its_wall_clock_jumps_reach_a_node_when_it_starts():
    from hutch.server.clock import NodeClock
    from hutch.sim.cluster import SIM_EPOCH_S, HostClock

    now = [10.0]
    c = HostClock(lambda: now[0], drift=200e-6, skew_s=0.01)
    node = NodeClock(c.monotonic, c.wall)
    started_ms = node.now_ms()
    assert started_ms == int((SIM_EPOCH_S + 0.01 + 10.0 * (1 + 200e-6)) * 1000)
    now[0] = 1010.0
    assert node.now_ms() - started_ms == pytest.approx(1000 * 1000 * (1 + 200e-6), abs=1)  # 200 ppm fast
    c.jumped_s -= 120
    assert node.now_ms() - started_ms == pytest.approx(1000 * 1000 * (1 + 200e-6), abs=1)  # a running node keeps its time
    restarted = NodeClock(c.monotonic, c.wall)
    assert restarted.now_ms() == pytest.approx(node.now_ms() - 120_000, abs=1)  # a restarted one reads the jump


def test_fault_kinds_are_named_on_the_command_line():
    import click

    from hutch.sim.cluster import FAULT_KINDS, parse_faults

    assert parse_faults("all") == frozenset(FAULT_KINDS)
    assert parse_faults("net, power") == {"net", "power"}
    with pytest.raises(click.BadParameter, match="unknown fault kind"):
        parse_faults("net,meteor")


# a quorum seed whose run meets a failed fsync, a fail-stop, a full disk and a clock jump
DISK_SEED = 24


@pytest.fixture(scope="module")
def disk_seed():
    from hutch.sim.cluster import FAULT_KINDS, run_seed

    return run_seed(DISK_SEED, queue_type="quorum", faults=FAULT_KINDS, trace=True)


def test_a_seed_with_disk_power_and_clock_faults_replays_exactly(disk_seed):
    from hutch.sim.cluster import FAULT_KINDS, run_seed, trace_digest

    again = run_seed(DISK_SEED, queue_type="quorum", faults=FAULT_KINDS, trace=True)
    assert trace_digest(disk_seed) == trace_digest(again) and disk_seed.stats == again.stats
    assert disk_seed.ok, disk_seed.violation
    stats = disk_seed.stats
    assert stats.get("fsync") and stats.get("fail_stops") and stats.get("disk-full") and stats.get("clock_jumps")


def test_a_seed_with_disk_power_and_clock_faults_replays_in_another_process(disk_seed):
    """Inode numbers, descriptor numbers and hash seeds differ from process to process; the draws
    of power losses and torn writes must not depend on them."""
    import subprocess
    import sys

    from hutch.sim.cluster import trace_digest

    code = ("from hutch.sim.cluster import FAULT_KINDS, run_seed, trace_digest; "
            f"print(trace_digest(run_seed({DISK_SEED}, queue_type='quorum', faults=FAULT_KINDS, trace=True)))")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONHASHSEED="2"),
                         capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == trace_digest(disk_seed)
    assert disk_seed.stats.get("power_losses") or disk_seed.stats.get("fail_stops")


# Seeds that keep every promise under every fault kind (net, crash, power, fsync, disk-full,
# clock), per queue type: (queue type, first seed, seeds). hutch sim cluster runs more.
DISK_BATCHES = [("quorum", 2, 6), ("classic", 2, 6), ("mirrored", 2, 3)]


@pytest.mark.parametrize(("queue_type", "first", "count"), DISK_BATCHES)
def test_seeds_with_disk_power_and_clock_faults_keep_every_promise(queue_type, first, count):
    from hutch.sim.cluster import FAULT_KINDS, run_seed

    failed = []
    for seed in range(first, first + count):
        res = run_seed(seed, queue_type=queue_type, faults=FAULT_KINDS)
        if not res.ok:
            failed.append(f"seed {seed} {res.stats['failed']}: {res.violation} "
                          f"(replay: hutch sim cluster --seed {seed} --queue-type {queue_type} -v)")
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize(("queue_type", "seed"), [("classic", 51), ("classic", 62), ("classic", 104),
                                                 ("classic", 183), ("classic", 193), ("mirrored", 26)])
def test_a_message_delivered_before_a_power_loss_comes_back_redelivered(queue_type, seed):
    """In these seeds a message is delivered, then its node's fsync fails (or its power goes) and
    it restarts without the unsynced record of that delivery. The journal, opened without its
    clean-shutdown mark, counts every message it recovers as delivered, so the next delivery
    still carries `redelivered` (the check fails any redelivery without it)."""
    from hutch.sim.cluster import FAULT_KINDS, run_seed

    res = run_seed(seed, queue_type=queue_type, faults=FAULT_KINDS)
    assert res.ok, res.violation


def test_a_power_loss_right_after_a_new_log_is_opened_is_no_corruption(host_dir):
    """A segment log that opens an empty directory creates its first segment and records it as
    synced: the segment's header must be on disk first, or the next recovery takes the lost
    header for synced bytes that are gone (found by the whole-cluster simulation)."""
    with _log_on_a_simulated_disk(host_dir, Random(1)) as (disk, log):
        _crash(disk, log)
        disk.power_loss("n1")
    records, report = _records(host_dir)
    assert records == [] and report.corrupt == [] and report.damaged_headers == []
