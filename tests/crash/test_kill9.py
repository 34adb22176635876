"""kill -9 under load: no confirmed persistent message is ever lost.

A publisher process sends N persistent 1 KiB messages, numbered 0..N-1, to two durable
queues in confirm mode (window 1,000); a consumer process consumes the second queue with
manual acks meanwhile. The broker is killed with SIGKILL at several moments — when the
publisher's confirmed count passes points drawn from a seeded random generator, plus a
random few milliseconds so the kill lands mid-batch — and started again on the same data;
both clients reconnect and carry on, the publisher republishing what was never confirmed.
After a last kill at rest and a restart, a drain consumes whatever the queues hold.

It then checks what the seeds of durability promise (docs/durability.md):
- lost = 0: every confirmed sequence number was delivered, either to the consumer that ran
  during the test or by the final drain;
- every duplicate is explained: the message was published more than once (unconfirmed when
  the broker died, then republished) or delivered again after a delivery whose ack died
  with the broker. A message delivered twice without either is a broker bug.
It prints the seed and the counts (sent, confirmed, recovered, lost, duplicates).

HUTCH_CRASH_SEED, HUTCH_CRASH_MESSAGES and HUTCH_CRASH_KILLS change the run; run it alone
with `python -m tests.crash.test_kill9`.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

from tests.crash.clients import SEND_COUNT_MAX, read_receipts
from tests.support.brokers import ROOT, HutchNode

SEED_DEFAULT = 20261122
MESSAGES_DEFAULT = 100_000
KILLS_DEFAULT = 4
QUEUES = ("crash.0", "crash.1")
WINDOW = 1000
BODY_BYTES = 1024
KILL_JITTER_S_MAX = 0.03
RUN_TIMEOUT_S = 150


@dataclass
class CrashReport:
    seed: int
    messages: int
    kills: int
    sent: int
    confirmed: int
    consumed_during: int
    recovered: int  # delivered by the drain after the last restart
    lost: int
    duplicates: int
    duplicates_republished: int
    duplicates_redelivered: int
    duplicates_unexplained: int
    redelivered_flag_missing: int
    elapsed_s: float

    def lines(self) -> list[str]:
        return [
            f"crash test: seed {self.seed}, {self.messages} messages, {self.kills} kill -9 of the broker, "
            f"{self.elapsed_s:.1f} s",
            f"  sent {self.sent} (incl. republished), confirmed {self.confirmed}, consumed during the run "
            f"{self.consumed_during}, recovered after the last restart {self.recovered}",
            f"  lost {self.lost}, duplicates {self.duplicates} (republished {self.duplicates_republished}, "
            f"redelivered {self.duplicates_redelivered}, unexplained {self.duplicates_unexplained}), "
            f"redelivered flag missing on {self.redelivered_flag_missing}",
        ]


def _client(role: str, *args: str, stdout=subprocess.DEVNULL) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-m", "tests.crash.clients", role, *args], cwd=ROOT, env=env,
                            stdout=stdout, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def run_crash_test(seed: int, messages: int, kills: int, workdir: Path, log=print) -> CrashReport:
    rng = random.Random(seed)
    kill_points = sorted(int(messages * rng.uniform(0.1, 0.9)) for _ in range(kills))
    jitters = [rng.uniform(0, KILL_JITTER_S_MAX) for _ in range(kills)]
    log(f"crash test: seed {seed}: kill -9 when confirmed passes {kill_points}")
    t0 = time.monotonic()
    node = HutchNode(data_dir=workdir / "node", log_level="warning")
    procs: list[subprocess.Popen] = []
    try:
        node.start()
        c = pika.BlockingConnection(pika.URLParameters(node.url))
        for q in QUEUES:
            c.channel().queue_declare(q, durable=True)
        c.close()
        pub_out, con_out, drain_out = workdir / "published", workdir / "consumed", workdir / "drained"
        consumer = _client("consumer", "--uri", node.url, "--queue", QUEUES[1], "--qos", "100",
                           "--out", str(con_out))
        procs.append(consumer)
        qargs = [a for q in QUEUES for a in ("--queue", q)]
        publisher = _client("publisher", "--uri", node.url, *qargs, "--messages", str(messages),
                            "--window", str(WINDOW), "--size", str(BODY_BYTES), "--out", str(pub_out),
                            stdout=subprocess.PIPE)
        procs.append(publisher)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        done_kills = 0
        for line in publisher.stdout:
            if time.monotonic() > deadline:
                raise TimeoutError(f"publisher not done after {RUN_TIMEOUT_S}s")
            if line.startswith("done"):
                break
            confirmed = int(line.split()[1])
            if done_kills < kills and confirmed >= kill_points[done_kills]:
                time.sleep(jitters[done_kills])  # land somewhere inside a batch, not at a progress line
                node.kill()
                done_kills += 1
                log(f"  kill -9 #{done_kills} at {confirmed} confirmed")
                node.start()
        if publisher.wait(30) != 0:
            raise RuntimeError(f"publisher failed: {publisher.stderr.read()[-2000:]}")
        # a last crash with everything confirmed, then drain the restarted broker
        consumer.send_signal(signal.SIGTERM)
        if consumer.wait(30) != 0:
            raise RuntimeError(f"consumer failed: {consumer.stderr.read()[-2000:]}")
        node.kill()
        node.start()
        drainer = _client("drain", "--uri", node.url, *qargs, "--out", str(drain_out))
        procs.append(drainer)
        if drainer.wait(RUN_TIMEOUT_S) != 0:
            raise RuntimeError(f"drain failed: {drainer.stderr.read()[-2000:]}")
        state = pub_out.read_bytes()
        during = read_receipts(con_out.read_bytes())
        drained = read_receipts(drain_out.read_bytes())
    finally:
        for p in procs:
            _stop(p)
        node.cleanup()
    return analyse(seed, messages, done_kills, state, during, drained, time.monotonic() - t0)


def analyse(seed: int, messages: int, kills: int, state: bytes, during: list[tuple[int, bool]],
            drained: list[tuple[int, bool]], elapsed_s: float) -> CrashReport:
    sent_times = [b >> 1 for b in state]
    confirmed = {i for i, b in enumerate(state) if b & 1}
    receipts = during + drained
    seen = Counter(seq for seq, _ in receipts)
    lost = len(confirmed - seen.keys())
    dup_seqs = {s for s, k in seen.items() if k > 1}
    republished = {s for s in dup_seqs if sent_times[s] > 1}
    # a later copy of a message already delivered to a consumer is a redelivery; its flag should say so
    first_seen: set[int] = set()
    redelivered_dups: set[int] = set()
    flag_missing = 0
    for seq, redelivered in receipts:
        if seq in first_seen and seq not in republished:
            redelivered_dups.add(seq)
            if not redelivered:
                flag_missing += 1
        first_seen.add(seq)
    drained_first = Counter(seq for seq, _ in drained)
    # twice in the final drain, published once: the broker itself duplicated it
    unexplained = {s for s in dup_seqs - republished if drained_first[s] > 1}
    return CrashReport(
        seed=seed, messages=messages, kills=kills, sent=sum(min(t, SEND_COUNT_MAX) for t in sent_times),
        confirmed=len(confirmed), consumed_during=len(during), recovered=len(drained), lost=lost,
        duplicates=sum(k - 1 for k in seen.values() if k > 1),
        duplicates_republished=sum(seen[s] - 1 for s in republished),
        duplicates_redelivered=sum(seen[s] - 1 for s in redelivered_dups - unexplained),
        duplicates_unexplained=sum(seen[s] - 1 for s in unexplained),
        redelivered_flag_missing=flag_missing, elapsed_s=elapsed_s)


def settings() -> tuple[int, int, int]:
    return (int(os.environ.get("HUTCH_CRASH_SEED", SEED_DEFAULT)),
            int(os.environ.get("HUTCH_CRASH_MESSAGES", MESSAGES_DEFAULT)),
            int(os.environ.get("HUTCH_CRASH_KILLS", KILLS_DEFAULT)))


@pytest.mark.timeout(300)
def test_kill_9_under_confirmed_persistent_load_loses_no_confirmed_message(tmp_path, capsys):
    seed, messages, kills = settings()
    report = run_crash_test(seed, messages, kills, tmp_path)
    with capsys.disabled():
        print()
        for line in report.lines():
            print(line)
    assert report.kills == kills
    assert report.confirmed == messages  # the publisher got every message confirmed in the end
    assert report.lost == 0
    assert report.duplicates_unexplained == 0
    assert report.redelivered_flag_missing == 0  # after a crash every recovered message is flagged


if __name__ == "__main__":
    import tempfile

    s, m, k = settings()
    with tempfile.TemporaryDirectory(prefix="hutch-crash-") as d:
        for line in run_crash_test(s, m, k, Path(d)).lines():
            print(line)
