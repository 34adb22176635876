"""Raft benchmark harness: real processes, loopback TCP, a real append-and-fsync log.

This is a bench harness, not the hutch runtime: each node is a process with one asyncio
loop driving a `MultiRaft`, peers talk over one TCP connection per direction with 4-byte
length-prefixed msgpack envelopes, and the log is one append-only file per node, fsynced
once per batch of all groups' writes. Measures commits/s with 1 KiB commands for one
3-member group and for 100 groups, and election time after `kill -9` of the leader.

    python bench/raft/bench.py all            # everything, prints a summary
    python bench/raft/bench.py commits --groups 100 --seconds 5
    python bench/raft/bench.py elections --kills 50
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import msgspec

from hutch.raft import MultiRaft, NotLeader, ProposalRejected, RaftConfig, decode_envelope, encode_envelope
from hutch.raft.messages import Entry, HardState
from hutch.raft.storage import MemoryStorage, bootstrap_log

TICK_S = 0.01
FRAME_MAX_BYTES = 64 << 20


# ---- node process -------------------------------------------------------------------------


class FileLog:
    """One append-only file: records (group, hard state, entries), replayed at start."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.f = open(path, "ab")  # noqa: SIM115 - lives as long as the process
        self.enc = msgspec.msgpack.Encoder()

    def replay(self) -> dict:
        groups: dict = {}
        dec = msgspec.msgpack.Decoder(tuple[int, HardState | None, list[Entry]])
        with open(self.path, "rb") as f:
            data = f.read()
        off = 0
        while off + 4 <= len(data):
            n = int.from_bytes(data[off:off + 4], "big")
            if off + 4 + n > len(data):
                break  # a torn tail write
            gid, hs, entries = dec.decode(data[off + 4:off + 4 + n])
            st = groups.setdefault(gid, MemoryStorage())
            if entries:
                st.append(entries)
            if hs is not None:
                st.set_hard_state(hs)
            off += 4 + n
        return groups

    def write(self, records: list) -> None:
        buf = bytearray()
        for rec in records:
            b = self.enc.encode(rec)
            buf += len(b).to_bytes(4, "big") + b
        self.f.write(buf)
        self.f.flush()
        os.fsync(self.f.fileno())


class Node:
    def __init__(self, args) -> None:
        self.id = args.id
        self.ports = [int(p) for p in args.ports.split(",")]
        self.members = tuple(range(1, len(self.ports) + 1))
        self.size = args.size
        self.window = args.window
        self.load = args.load
        self.log = FileLog(os.path.join(args.dir, f"n{self.id}.log"))
        self.mr = MultiRaft(self.id, RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1,
                                                seed=int(time.time() * 1000) + self.id))
        recovered = self.log.replay()
        for gid in range(args.groups):
            st = recovered.get(gid)
            if st is None:
                hs, entries = bootstrap_log(self.members)
                st = MemoryStorage.restore(hs, MemoryStorage().snapshot(), entries)
                self.log.write([(gid, hs, entries)])
            self.mr.add_group(gid, st)
        self.writers: dict[int, asyncio.StreamWriter] = {}
        self.outbox: dict[int, bytearray] = {}
        self.led: dict[int, int] = {}
        self.outstanding: dict[int, int] = {}
        self.commits = 0
        self.payload = os.urandom(self.size)

    def emit(self, line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                hdr = await reader.readexactly(4)
                n = int.from_bytes(hdr, "big")
                if n > FRAME_MAX_BYTES:
                    raise ValueError("frame too large")
                env = decode_envelope(await reader.readexactly(n))
                self.mr.step(env.group, env.msg)
                self.pump()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def connect(self, peer: int) -> None:
        while True:
            if peer not in self.writers:
                try:
                    _, w = await asyncio.open_connection("127.0.0.1", self.ports[peer - 1])
                    w.transport.set_write_buffer_limits(high=16 << 20)
                    self.writers[peer] = w
                except OSError:
                    pass
            await asyncio.sleep(0.05)

    def pump(self) -> None:
        while True:
            mr = self.mr.ready()
            if mr is None:
                break
            records = [(gid, rd.hard_state, rd.entries) for gid, rd in mr.groups
                       if rd.entries or rd.hard_state is not None]
            if records:
                self.log.write(records)  # one fsync for every group's writes
            for to, gid, m in mr.messages():
                b = encode_envelope(gid, m)
                self.outbox.setdefault(to, bytearray()).extend(len(b).to_bytes(4, "big") + b)
            for gid, rd in mr.groups:
                if self.led.get(gid) == self.mr.groups[gid].term:
                    for e in rd.committed_entries:
                        if len(e.data) == self.size and e.term == self.led[gid]:
                            self.commits += 1
                            self.outstanding[gid] = self.outstanding.get(gid, 1) - 1
            self.mr.advance(mr)
            self.check_leadership()
            self.propose_more()
        self.flush()

    def flush(self) -> None:
        for to, buf in self.outbox.items():
            w = self.writers.get(to)
            if w is not None and buf:
                if w.is_closing():
                    del self.writers[to]
                    continue
                w.write(bytes(buf))
        self.outbox.clear()

    def check_leadership(self) -> None:
        for gid, g in self.mr.groups.items():
            if g.is_leader and self.led.get(gid) != g.term:
                self.led[gid] = g.term
                self.outstanding[gid] = 0
                self.emit(f"LEADER {gid} {g.term} {time.time():.6f}")

    def propose_more(self) -> None:
        if not self.load:
            return
        for gid, term in self.led.items():
            g = self.mr.groups[gid]
            if not g.is_leader or g.term != term:
                continue
            while self.outstanding.get(gid, 0) < self.window:
                try:
                    self.mr.propose(gid, self.payload)
                except (NotLeader, ProposalRejected):
                    break
                self.outstanding[gid] = self.outstanding.get(gid, 0) + 1

    async def run(self) -> None:
        server = await asyncio.start_server(self.serve, "127.0.0.1", self.ports[self.id - 1])
        async with server, asyncio.TaskGroup() as tg:
            for p in self.members:
                if p != self.id:
                    tg.create_task(self.connect(p))
            tg.create_task(self.ticker())
            self.emit("UP")

    async def ticker(self) -> None:
        last_report = time.monotonic()
        while True:
            await asyncio.sleep(TICK_S)
            self.mr.tick()
            self.propose_more()
            self.pump()
            now = time.monotonic()
            if now - last_report >= 1.0:
                self.emit(f"STAT {self.commits} {now:.6f}")
                last_report = now


# ---- driver -------------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Cluster:
    def __init__(self, groups: int, load: bool, n: int = 3, window: int = 64) -> None:
        self.dir = tempfile.mkdtemp(prefix="hutch-raft-bench-")
        self.ports = free_ports(n)
        self.groups, self.load, self.window = groups, load, window
        self.procs: dict[int, subprocess.Popen] = {}
        for i in range(1, n + 1):
            self.start(i)

    def start(self, i: int) -> None:
        cmd = [sys.executable, __file__, "node", "--id", str(i), "--ports", ",".join(map(str, self.ports)),
               "--groups", str(self.groups), "--dir", self.dir, "--window", str(self.window)]
        if self.load:
            cmd.append("--load")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        os.set_blocking(p.stdout.fileno(), False)
        self.procs[i] = p

    def lines(self, i: int) -> list[str]:
        out = []
        p = self.procs[i]
        while True:
            line = p.stdout.readline()
            if not line:
                return out
            out.append(line.strip())

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def bench_commits(groups: int, seconds: float) -> float:
    c = Cluster(groups, load=True)
    try:
        stats: dict[int, list[tuple[int, float]]] = {i: [] for i in c.procs}
        end = time.monotonic() + seconds + 3
        while time.monotonic() < end:
            time.sleep(0.2)
            for i in c.procs:
                for line in c.lines(i):
                    if line.startswith("STAT"):
                        _, n, t = line.split()
                        stats[i].append((int(n), float(t)))
        rate = 0.0
        for samples in stats.values():
            if len(samples) >= 3:
                (n0, t0), (n1, t1) = samples[1], samples[-1]  # skip the first second (elections)
                rate += (n1 - n0) / (t1 - t0)
        return rate
    finally:
        c.stop()


def bench_elections(kills: int) -> list[float]:
    c = Cluster(1, load=False)
    times: list[float] = []
    try:
        leader, term = None, 0
        while len(times) < kills:
            deadline = time.time() + 10
            while leader is None and time.time() < deadline:
                time.sleep(0.01)
                for i in c.procs:
                    for line in c.lines(i):
                        if line.startswith("LEADER"):
                            _, _, t, _ = line.split()
                            if int(t) > term:
                                leader, term = i, int(t)
            if leader is None:
                raise RuntimeError("no leader within 10 s")
            time.sleep(0.3)  # let followers settle and hear heartbeats
            for i in c.procs:
                c.lines(i)
            killed = leader
            t0 = time.time()
            c.procs[killed].send_signal(signal.SIGKILL)
            c.procs[killed].wait()
            leader = None
            while leader is None and time.time() < t0 + 10:
                time.sleep(0.002)
                for i in c.procs:
                    if i == killed:
                        continue
                    for line in c.lines(i):
                        if line.startswith("LEADER"):
                            _, _, t, at = line.split()
                            if int(t) > term:
                                leader, term = i, int(t)
                                times.append(float(at) - t0)
            c.start(killed)
            time.sleep(0.5)
        return times
    finally:
        c.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("node")
    n.add_argument("--id", type=int, required=True)
    n.add_argument("--ports", required=True)
    n.add_argument("--groups", type=int, default=1)
    n.add_argument("--dir", required=True)
    n.add_argument("--size", type=int, default=1024)
    n.add_argument("--window", type=int, default=64)
    n.add_argument("--load", action="store_true")
    cm = sub.add_parser("commits")
    cm.add_argument("--groups", type=int, default=1)
    cm.add_argument("--seconds", type=float, default=5)
    el = sub.add_parser("elections")
    el.add_argument("--kills", type=int, default=50)
    al = sub.add_parser("all")
    al.add_argument("--kills", type=int, default=50)
    args = ap.parse_args()
    if args.cmd == "node":
        asyncio.run(Node(args).run())
    elif args.cmd == "commits":
        print(f"{args.groups} group(s): {bench_commits(args.groups, args.seconds):.0f} commits/s")
    elif args.cmd == "elections":
        _report_elections(bench_elections(args.kills))
    else:
        for g in (1, 100):
            print(f"{g} group(s), 3 members, 1 KiB commands, fsync per batch: "
                  f"{bench_commits(g, 5):.0f} commits/s", flush=True)
        _report_elections(bench_elections(args.kills))


def _report_elections(times: list[float]) -> None:
    ms = sorted(t * 1000 for t in times)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(f"election after kill -9 of the leader ({len(ms)} kills, election timeout 100-200 ms): "
          f"median {statistics.median(ms):.0f} ms, p99 {p99:.0f} ms, max {ms[-1]:.0f} ms")


if __name__ == "__main__":
    main()
