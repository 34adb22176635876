"""Deterministic simulation of Raft groups: one process, a simulated clock, disk and network.

Several `RaftGroup`s run as simulated nodes that tick at slightly different rates (clock
drift). Their messages travel over simulated links that lose, delay and duplicate them, keep
FIFO order within one connection, and deliver or drop leftovers of a broken connection out of
order after a reconnect. Partitions of any shape (every directed link may be cut on its own)
come and go. Nodes crash, losing every write whose fsync had not completed, and restart from
what their disk holds. Members are added as learners, promoted and removed; leadership is
transferred. Clients run read / write / compare-and-set operations on one register through
the leader (reads by read index), and the history they record is checked for
linearizability at the end. Every fault parameter is drawn from the seed ("swarm testing"),
so a seed names one run exactly and replays it.

Checked on every run, while it runs: election safety (one leader per term), leader
append-only (a leader never truncates its log), log matching (an (index, term) pair always
names the same entry with the same predecessor), leader completeness (a new leader holds
every entry applied anywhere), state machine safety (no two nodes apply different entries at
one index); and at the end: linearizability of the client history and liveness (once faults
heal, a leader is elected and a proposal to it commits within a bound).

`cli` is the `hutch sim` command group; `hutch sim raft --seed N` replays seed N.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import click
import msgspec

from hutch.raft.group import (
    LEADER,
    NotLeader,
    ProposalRejected,
    RaftConfig,
    RaftGroup,
    RaftInvariantError,
    Ready,
)
from hutch.raft.linearizability import CAS, READ, WRITE, Op, check_register
from hutch.raft.messages import (
    CONF_ADD_LEARNER,
    CONF_REMOVE,
    ENTRY_NORMAL,
    ConfChange,
    Entry,
    HardState,
    Message,
    Snapshot,
    SnapshotMeta,
)
from hutch.raft.storage import MemoryStorage, bootstrap_log
from hutch.simkernel import Kernel, Network, SimResult, Violation, draw_partition, run_seeds

_enc = msgspec.msgpack.encode
_dec = msgspec.msgpack.decode

# Event kinds in the simulator's queue.
_TICK, _DELIVER, _FSYNC, _CLIENT, _OP_DEADLINE, _FAULT, _PROBE, _RESTART = range(8)


@dataclass(slots=True)
class SimOptions:
    seed: int
    nodes: int = 3
    fault_ms: int = 2000  # how long faults are injected
    liveness_ms: int = 3000  # after healing, a proposal must commit within this
    clients: int = 3
    ops_per_client_max: int = 40
    tick_ms: int = 10
    election_timeout_ticks: int = 10
    heartbeat_interval_ticks: int = 2
    bugs: frozenset[str] = frozenset()
    profile: str = "swarm"  # "swarm": every fault mix; "churn": leaders crash and restart all the time
    check_linearizability: bool = True
    trace: bool = False


class Disk:
    """What survives a crash: the writes of every Ready whose fsync completed."""

    __slots__ = ("hs", "snap", "entries")

    def __init__(self, hs: HardState, snap: Snapshot, entries: list[Entry]) -> None:
        self.hs = hs
        self.snap = snap
        self.entries = entries

    def write(self, rd: Ready) -> None:
        if rd.snapshot is not None:
            self.snap = rd.snapshot
            self.entries = []
        if rd.entries:
            first = rd.entries[0].index
            offset = self.entries[0].index if self.entries else self.snap.meta.index + 1
            del self.entries[max(0, first - offset):]
            self.entries.extend(rd.entries)
        if rd.hard_state is not None:
            self.hs = rd.hard_state

    def save_snapshot(self, snap: Snapshot, keep_from: int) -> None:
        self.snap = snap
        self.entries = [e for e in self.entries if e.index >= keep_from]


class SimNode:
    __slots__ = ("id", "disk", "group", "alive", "incarnation", "tick_us", "fsync_rd", "value", "applied",
                 "pending_ops", "pending_reads", "waiting_reads", "led_term", "trunc_mark")

    def __init__(self, node_id: int, disk: Disk, tick_us: int) -> None:
        self.id = node_id
        self.disk = disk
        self.group: RaftGroup | None = None
        self.alive = False
        self.incarnation = 0
        self.tick_us = tick_us
        self.fsync_rd: Ready | None = None
        self.value = None
        self.applied = 0
        self.pending_ops: dict[int, Op] = {}
        self.pending_reads: dict[bytes, Op] = {}
        self.waiting_reads: list[tuple[int, Op]] = []
        self.led_term = -1
        self.trunc_mark = 0


class Client:
    __slots__ = ("id", "guess", "seq", "busy", "done", "last_seen")

    def __init__(self, cid: int, guess: int) -> None:
        self.id = cid
        self.guess = guess
        self.seq = 0
        self.busy: Op | None = None
        self.done = 0
        self.last_seen = None


class Simulation(Kernel):
    """One seeded run. `run()` returns a SimResult; the same options give the same run."""

    def __init__(self, opts: SimOptions) -> None:
        super().__init__(opts.seed, trace=opts.trace)
        self.o = opts
        r = self.rng
        # Swarm testing: each seed draws its own fault mix.
        self.loss_p = r.choice((0.0, 0.0, 0.01, 0.05, 0.2))
        self.dup_p = r.choice((0.0, 0.0, 0.01, 0.05))
        self.latency_us = (r.choice((200, 1000)), r.choice((2000, 5000, 20000)))
        self.slow_p = r.choice((0.0, 0.01, 0.05))
        self.fsync_us = r.choice((100, 1000, 5000))
        self.crash_p = r.choice((0.0, 0.3, 0.6))
        self.partition_p = r.choice((0.0, 0.4, 0.8))
        self.leader_crash_bias = r.choice((0.0, 0.5, 0.9))
        self.membership = r.random() < 0.5
        self.transfers = r.random() < 0.3
        self.fault_every_us = r.choice((50_000, 150_000, 400_000))
        entries_per_message_max = r.choice((1, 4, 64))
        inflight_messages_max = r.choice((1, 4, 64))
        self.crash_after_commit_p = 0.0
        self.restart_after_us: tuple[int, int] | None = None  # churn: every crash restarts soon
        if opts.profile == "churn":
            self.crash_p = 1.0
            self.crash_after_commit_p = r.choice((0.1, 0.3))  # crash a leader the moment it applies
            self.restart_after_us = (5_000, r.choice((50_000, 200_000)))
            self.loss_p = r.choice((0.0, 0.05, 0.2))
            self.leader_crash_bias = 0.9
            self.fault_every_us = r.choice((20_000, 40_000, 80_000))
            self.membership = self.transfers = False
            entries_per_message_max = inflight_messages_max = 1
        elif opts.profile != "swarm":
            raise ValueError(f"unknown profile {opts.profile!r}")
        self.cfg = RaftConfig(
            election_timeout_ticks=opts.election_timeout_ticks,
            heartbeat_interval_ticks=opts.heartbeat_interval_ticks,
            entries_per_message_max=entries_per_message_max,
            inflight_messages_max=inflight_messages_max,
            snapshot_after_entries=r.choice((8, 32, 10_000)),
            snapshot_trailing_entries=r.choice((0, 2, 16)),
            pre_vote=r.random() < 0.9,
            check_quorum=r.random() < 0.9,
            seed=opts.seed,
            _unsafe_bugs=opts.bugs,
        )
        members = tuple(range(1, opts.nodes + 1))
        hs, entries = bootstrap_log(members)
        empty = Snapshot(SnapshotMeta())
        n_all = opts.nodes + (1 if self.membership else 0)
        base_us = opts.tick_ms * 1000
        self.nodes: dict[int, SimNode] = {}
        for i in range(1, n_all + 1):
            disk = Disk(hs, empty, list(entries)) if i in members else Disk(HardState(), empty, [])
            self.nodes[i] = SimNode(i, disk, int(base_us * (1 + r.uniform(-0.05, 0.05))))
        self.net = Network(self.nodes)
        self.clients = [Client(c, r.choice(members)) for c in range(opts.clients)]
        self.history: list[Op] = []
        # Checker state.
        self.leaders_by_term: dict[int, int] = {}
        self.log_index: dict[tuple[int, int], tuple[bytes, int, int | None]] = {}
        self.applied_at: dict[int, tuple[int, bytes]] = {}
        self.healed = False
        self.probe_done_us: int | None = None
        self.probe_pending: tuple[int, int] | None = None  # (node, key)
        self.stats = {"messages": 0, "elections": 0, "crashes": 0, "snapshots_sent": 0, "applied": 0,
                      "partitions": 0, "conf_changes": 0, "transfers": 0}
        self.write_value = 0

    def run(self) -> SimResult:
        o = self.o
        try:
            for n in self.nodes.values():
                self._start(n)
                self.at(self.rng.randrange(n.tick_us), _TICK, n.id, n.incarnation)
            for c in self.clients:
                self.at(self.rng.randrange(20_000), _CLIENT, c.id)
            self.at(self.fault_every_us, _FAULT)
            heal_us = o.fault_ms * 1000
            end_us = heal_us + o.liveness_ms * 1000
            self.at(heal_us, _PROBE)
            handlers = {_DELIVER: self._deliver, _TICK: self._tick, _FSYNC: self._fsync_done,
                        _CLIENT: self._client_next, _OP_DEADLINE: self._op_deadline, _FAULT: self._fault,
                        _PROBE: self._probe, _RESTART: self._restart}
            while self.queue:
                if self.peek_us() > end_us:
                    break
                _, kind, args = self.next_event()
                if not self.healed and self.now >= heal_us:
                    self._heal()
                handlers[kind](*args)
                if self.probe_done_us is not None and all(cl.busy is None for cl in self.clients):
                    break
            if self.probe_done_us is None:
                raise Violation(f"liveness: no proposal committed within {o.liveness_ms} ms after faults healed"
                                f" ({self._roles()})")
            self._check_logs_match()
            if o.check_linearizability:
                self._check_history()
        except Violation as v:
            return self._result(str(v))
        except RaftInvariantError as e:
            return self._result(f"raft invariant: {e}")
        return self._result(None)

    def _result(self, violation: str | None) -> SimResult:
        self.stats["sim_ms"] = self.now // 1000
        self.stats["ops"] = len(self.history)
        if self.probe_done_us is not None:
            self.stats["recovery_ms"] = (self.probe_done_us - self.o.fault_ms * 1000) // 1000
        return self.result(violation, self.stats)

    def _roles(self) -> str:
        parts = []
        for n in self.nodes.values():
            g = n.group
            parts.append(f"n{n.id}:{g.role_name if n.alive else 'down'}/t{g.term}/c{g.commit}/l{g.last_index()}")
        return " ".join(parts)

    # ---- nodes ----------------------------------------------------------------------------

    def _start(self, n: SimNode) -> None:
        d = n.disk
        storage = MemoryStorage.restore(d.hs, d.snap, list(d.entries))
        n.incarnation += 1
        n.group = RaftGroup(n.id, storage, self.cfg, seed=n.id * 1000 + n.incarnation)
        n.alive = True
        n.fsync_rd = None
        n.value = _dec(d.snap.data) if d.snap.data else None
        n.applied = d.snap.meta.index
        n.led_term = -1
        self._pump(n)

    def _crash(self, n: SimNode) -> None:
        self.log(f"crash n{n.id} (unsynced ready lost: {n.fsync_rd is not None})")
        self.stats["crashes"] += 1
        n.alive = False
        n.incarnation += 1
        n.fsync_rd = None
        n.pending_ops.clear()
        n.pending_reads.clear()
        n.waiting_reads.clear()
        self._reset_links(n.id)
        if self.restart_after_us is not None:
            self.at(self.now + self.rng.randint(*self.restart_after_us), _RESTART, n.id, n.incarnation)

    def _restart(self, node_id: int, incarnation: int) -> None:
        n = self.nodes[node_id]
        if n.alive or n.incarnation != incarnation:
            return
        self.log(f"restart n{n.id}")
        self._start(n)
        self.at(self.now + self.rng.randrange(n.tick_us), _TICK, n.id, n.incarnation)

    def _reset_links(self, node_id: int) -> None:
        for (a, b), link in self.net.links.items():
            if a == node_id or b == node_id:
                link.epoch += 1

    def _tick(self, node_id: int, incarnation: int) -> None:
        n = self.nodes[node_id]
        if not n.alive or n.incarnation != incarnation:
            return
        n.group.tick()
        self._observe(n)
        self._pump(n)
        self.at(self.now + n.tick_us, _TICK, node_id, incarnation)

    def _pump(self, n: SimNode) -> None:
        g = n.group
        while n.alive and n.fsync_rd is None and g.has_ready():
            rd = g.ready()
            self._check_new_entries(n, rd)
            if rd.entries or rd.hard_state is not None or rd.snapshot is not None:
                n.fsync_rd = rd
                self.at(self.now + self.fsync_us, _FSYNC, n.id, n.incarnation)
                return
            self._complete(n, rd)

    def _fsync_done(self, node_id: int, incarnation: int) -> None:
        n = self.nodes[node_id]
        if not n.alive or n.incarnation != incarnation or n.fsync_rd is None:
            return
        rd = n.fsync_rd
        n.fsync_rd = None
        n.disk.write(rd)
        self._complete(n, rd)
        self._pump(n)

    def _complete(self, n: SimNode, rd: Ready) -> None:
        g = n.group
        for m in rd.messages:
            self._send(m)
        if rd.snapshot is not None:
            meta = rd.snapshot.meta
            if meta.index <= n.applied:
                raise Violation(f"n{n.id} installs snapshot {meta.index} at applied {n.applied}")
            n.value = _dec(rd.snapshot.data) if rd.snapshot.data else None
            n.applied = meta.index
            self.log(f"n{n.id} installs snapshot at {meta.index}")
        for e in rd.committed_entries:
            if e.index <= n.applied:
                continue
            self._apply(n, e)
        for rs in rd.read_states:
            op = n.pending_reads.pop(rs.ctx, None)
            if op is not None:
                n.waiting_reads.append((rs.index, op))
        if n.waiting_reads:
            still = []
            for index, op in n.waiting_reads:
                if index <= n.applied:
                    self._finish(op, n.value)
                else:
                    still.append((index, op))
            n.waiting_reads = still
        g.advance(rd)
        if (rd.committed_entries and g.role == LEADER and not self.healed
                and self.rng.random() < self.crash_after_commit_p):
            self._observe(n)
            self._crash(n)
            return
        if rd.snapshot_wanted and g.applied == n.applied:
            snap = g.compact(g.applied, _enc(n.value))
            n.disk.save_snapshot(snap, g.storage.first_index())
            self.log(f"n{n.id} snapshot at {snap.meta.index}")
        self._observe(n)

    def _apply(self, n: SimNode, e: Entry) -> None:
        if e.index != n.applied + 1:
            raise Violation(f"n{n.id} applies {e.index} after {n.applied}: a gap")
        seen = self.applied_at.get(e.index)
        # The entry was committed by a leader of a term no later than this node's current term.
        if seen is None:
            self.applied_at[e.index] = (e.term, e.data, n.group.term)
            self.stats["applied"] += 1
        elif seen[:2] != (e.term, e.data):
            raise Violation(f"state machine safety: n{n.id} applies {e} at {e.index}, another node applied "
                            f"term {seen[0]} {seen[1]!r}")
        elif n.group.term < seen[2]:
            self.applied_at[e.index] = (e.term, e.data, n.group.term)
        n.applied = e.index
        if e.kind != ENTRY_NORMAL or not e.data:
            return
        key, kind, a, b = _dec(e.data)
        result = None
        if kind == "w":
            n.value = a
        elif kind == "c":
            result = n.value == a
            if result:
                n.value = b
        elif kind == "p" and self.probe_pending == (n.id, key):
            self.probe_done_us = self.now
            self.probe_pending = None
            self.log(f"liveness probe committed at n{n.id}")
        op = n.pending_ops.pop(key, None)
        if op is not None:
            self._finish(op, result)

    def _observe(self, n: SimNode) -> None:
        g = n.group
        if g.role != LEADER:
            return
        st = g.storage
        if n.led_term != g.term:
            prev = self.leaders_by_term.setdefault(g.term, n.id)
            if prev != n.id:
                raise Violation(f"election safety: n{prev} and n{n.id} both lead term {g.term}")
            n.led_term = g.term
            n.trunc_mark = st.truncations
            self.stats["elections"] += 1
            self.log(f"n{n.id} leads term {g.term} (last {st.last_index()}, commit {g.commit})")
            # Leader completeness: every entry committed in an earlier term is in this leader's log.
            snap_index = st.snapshot().meta.index
            for index, (term, _, committed_by) in self.applied_at.items():
                if committed_by < g.term and index > snap_index and st.term(index) != term:
                    raise Violation(f"leader completeness: n{n.id} leads term {g.term} without entry {index} "
                                    f"(term {term}) committed by term {committed_by} at the latest")
        elif st.truncations != n.trunc_mark:
            raise Violation(f"leader append-only: n{n.id} truncated its log while leading term {g.term}")

    def _check_new_entries(self, n: SimNode, rd: Ready) -> None:
        st = n.group.storage
        for e in rd.entries:
            prev_term = st.term(e.index - 1)
            key = (e.index, e.term)
            value = (e.data, e.kind, prev_term)
            seen = self.log_index.setdefault(key, value)
            if seen != value and prev_term is not None and seen[2] is not None:
                raise Violation(f"log matching: n{n.id} stores entry {key} {value} but another log has {seen}")

    def _check_logs_match(self) -> None:
        """At the end, pairwise: logs that share an (index, term) agree on everything before it."""
        logs = {}
        for n in self.nodes.values():
            st = n.group.storage
            logs[n.id] = {i: st.term(i) for i in range(st.first_index(), st.last_index() + 1)}
        ids = sorted(logs)
        for x in ids:
            for y in ids:
                if x >= y:
                    continue
                common = [i for i in logs[x] if logs[y].get(i) == logs[x][i]]
                if not common:
                    continue
                top = max(common)
                for i in range(top, 0, -1):
                    if i in logs[x] and i in logs[y] and logs[x][i] != logs[y][i]:
                        raise Violation(f"log matching: n{x} and n{y} agree at {top} but differ at {i}")

    # ---- network --------------------------------------------------------------------------

    def _send(self, m: Message) -> None:
        link = self.net.get(m.frm, m.to)
        if link is None or link.blocked:
            return
        r = self.rng
        self.stats["messages"] += 1
        if r.random() < self.loss_p:
            return
        lo, hi = self.latency_us
        delay = r.randint(lo, hi)
        if r.random() < self.slow_p:
            delay += r.randint(50_000, 300_000)
        t = link.arrival_us(self.now, delay)
        self.at(t, _DELIVER, m.to, m, link.epoch)
        if r.random() < self.dup_p:
            self.at(t + r.randint(0, 50_000), _DELIVER, m.to, m, link.epoch)

    def _deliver(self, to: int, m: Message, epoch: int) -> None:
        n = self.nodes[to]
        if not n.alive:
            return
        link = self.net.links[(m.frm, to)]
        if epoch != link.epoch and self.rng.random() < 0.5:
            return  # lost with its connection; the other half arrives late, out of order
        if type(m).__name__ == "InstallSnapshot":
            self.stats["snapshots_sent"] += 1
        n.group.step(m)
        self._observe(n)
        self._pump(n)

    # ---- faults ---------------------------------------------------------------------------

    def _fault(self) -> None:
        if self.healed:
            return
        r = self.rng
        x = r.random()
        alive = [n for n in self.nodes.values() if n.alive]
        if x < 0.25 * self.crash_p and len(alive) > 1:
            ld = self._leader()
            self._crash(ld if ld is not None and r.random() < self.leader_crash_bias else r.choice(alive))
        elif x < 0.5 * self.crash_p or x < 0.1:
            dead = [n for n in self.nodes.values() if not n.alive]
            if dead:
                n = r.choice(dead)
                self._restart(n.id, n.incarnation)
        elif x < 0.5 + 0.5 * self.partition_p:
            self._partition()
        elif x < 0.9 and self.membership:
            self._change_membership()
        elif self.transfers:
            self._transfer()
        self.at(self.now + r.randint(self.fault_every_us // 2, self.fault_every_us * 3 // 2), _FAULT)

    def _partition(self) -> None:
        blocked = draw_partition(self.rng, list(self.nodes))
        self.stats["partitions"] += 1
        self.log(f"partition {sorted(blocked)}")
        self.net.set_blocked(blocked)

    def _leader(self) -> SimNode | None:
        best = None
        for n in self.nodes.values():
            if n.alive and n.group.role == LEADER and (best is None or n.group.term > best.group.term):
                best = n
        return best

    def _change_membership(self) -> None:
        ld = self._leader()
        if ld is None:
            return
        g = ld.group
        members = set(g.voters) | set(g.learners)
        outside = [i for i in self.nodes if i not in members]
        r = self.rng
        try:
            if outside and (len(g.voters) <= self.o.nodes or r.random() < 0.5):
                x = r.choice(outside)
                g.propose_conf_change(ConfChange(CONF_ADD_LEARNER, (x,)))
                self.log(f"n{ld.id} adds learner n{x}")
            elif len(g.voters) >= 3 and not outside:
                x = r.choice(g.voters)
                g.propose_conf_change(ConfChange(CONF_REMOVE, (x,)))
                self.log(f"n{ld.id} removes n{x}")
            else:
                return
            self.stats["conf_changes"] += 1
        except ProposalRejected as e:
            self.log(f"membership change refused: {e}")
        self._pump(ld)

    def _transfer(self) -> None:
        ld = self._leader()
        if ld is None or len(ld.group.voters) < 2:
            return
        to = self.rng.choice([v for v in ld.group.voters if v != ld.id] or [ld.id])
        try:
            ld.group.transfer_leadership(to)
            self.stats["transfers"] += 1
            self.log(f"n{ld.id} transfers leadership to n{to}")
        except Exception as e:  # NotLeader / ProposalRejected: nothing to do
            self.log(f"transfer refused: {e}")
        self._pump(ld)

    def _heal(self) -> None:
        self.healed = True
        self.log("heal: all links up, all nodes restarted, no more loss")
        self.net.set_blocked(set())
        self.loss_p = 0.0
        self.dup_p = 0.0
        self.slow_p = 0.0
        for n in self.nodes.values():
            if not n.alive:
                self._start(n)
                self.at(self.now + self.rng.randrange(n.tick_us), _TICK, n.id, n.incarnation)

    def _probe(self) -> None:
        """After healing: keep proposing a probe to whoever leads until one commits."""
        if self.probe_done_us is not None:
            return
        ld = self._leader()
        if ld is not None and self.probe_pending is None or (
                self.probe_pending is not None and not self.nodes[self.probe_pending[0]].alive):
            if ld is not None:
                key = -(self.qseq + 1)
                try:
                    ld.group.propose(_enc((key, "p", None, None)))
                    self.probe_pending = (ld.id, key)
                    self._pump(ld)
                except (NotLeader, ProposalRejected):
                    pass
        elif self.probe_pending is not None and ld is not None and ld.id != self.probe_pending[0]:
            self.probe_pending = None  # leadership moved: propose again to the new leader
        self.at(self.now + 20_000, _PROBE)

    # ---- clients --------------------------------------------------------------------------

    def _client_next(self, cid: int) -> None:
        cl = self.clients[cid]
        if cl.busy is not None or cl.done >= self.o.ops_per_client_max:
            return
        r = self.rng
        n = self.nodes.get(cl.guess)
        if n is None or not n.alive:
            cl.guess = r.choice(list(self.nodes))
            self.at(self.now + 5_000, _CLIENT, cid)
            return
        cl.seq += 1
        key = cid * 1_000_000 + cl.seq
        x = r.random()
        g = n.group
        try:
            if x < 0.4:
                op = Op(cid, READ, self.now, None)
                ctx = key.to_bytes(8, "big")
                g.read_index(ctx)
                n.pending_reads[ctx] = op
            elif x < 0.8:
                self.write_value += 1
                op = Op(cid, WRITE, self.now, None, self.write_value)
                g.propose(_enc((key, "w", self.write_value, None)))
                n.pending_ops[key] = op
            else:
                self.write_value += 1
                expected = cl.last_seen if r.random() < 0.7 else r.randint(0, self.write_value)
                op = Op(cid, CAS, self.now, None, (expected, self.write_value))
                g.propose(_enc((key, "c", expected, self.write_value)))
                n.pending_ops[key] = op
        except NotLeader as e:
            cl.guess = e.leader if e.leader is not None else r.choice(list(self.nodes))
            self.at(self.now + 2_000, _CLIENT, cid)
            return
        except ProposalRejected:
            self.at(self.now + 10_000, _CLIENT, cid)
            return
        cl.busy = op
        self.history.append(op)
        self.at(self.now + 300_000, _OP_DEADLINE, cid, op)
        self._pump(n)

    def _finish(self, op: Op, result) -> None:
        cl = self.clients[op.client]
        if cl.busy is not op:
            return
        op.ret_time = self.now
        op.result = result
        if op.kind == READ:
            cl.last_seen = result
        elif op.kind == WRITE:
            cl.last_seen = op.arg
        elif result:
            cl.last_seen = op.arg[1]
        cl.busy = None
        cl.done += 1
        self.at(self.now + self.rng.randint(0, 20_000), _CLIENT, cl.id)

    def _op_deadline(self, cid: int, op: Op) -> None:
        cl = self.clients[cid]
        if cl.busy is not op:
            return
        cl.busy = None  # outcome unknown: a write or cas stays in the history as maybe-applied
        cl.done += 1
        if op.kind == READ:
            self.history.remove(op)
        cl.guess = self.rng.choice(list(self.nodes))
        self.at(self.now + 1_000, _CLIENT, cid)

    def _check_history(self) -> None:
        ok = check_register(self.history)
        if ok is False:
            raise Violation(f"linearizability: the register history of {len(self.history)} operations "
                            f"has no linearization")


def run_seed(seed: int, **kw) -> SimResult:
    return Simulation(SimOptions(seed=seed, **kw)).run()


def format_history(ops: list[Op]) -> str:
    lines = []
    for op in sorted(ops, key=lambda o: o.call_time):
        ret = "?" if op.ret_time is None else f"{op.ret_time / 1000:.3f}"
        lines.append(f"c{op.client} {op.kind}({op.arg}) -> {op.result}  [{op.call_time / 1000:.3f}, {ret}]")
    return "\n".join(lines)


@click.group()
def cli() -> None:
    """Deterministic simulation of hutch's cores."""


@cli.command("raft")
@click.option("--seed", type=int, default=1, show_default=True, help="First seed.")
@click.option("--seeds", type=int, default=1, show_default=True, help="How many consecutive seeds to run.")
@click.option("--nodes", type=click.Choice(["3", "5"]), default="3", show_default=True)
@click.option("--steps", type=int, default=200, show_default=True,
              help="Length of the fault phase in ticks (one tick = 10 ms of simulated time).")
@click.option("--profile", type=click.Choice(["swarm", "churn"]), default="swarm", show_default=True,
              help="Fault mix: every kind drawn per seed, or constant leader crashes.")
@click.option("--bug", "bugs", multiple=True, help="Switch on a deliberate bug (see RaftConfig._unsafe_bugs).")
@click.option("-v", "--verbose", is_flag=True, help="Print the trace of each run.")
def raft_cmd(seed: int, seeds: int, nodes: str, steps: int, profile: str, bugs: tuple[str, ...], verbose: bool) -> None:
    """Run seeded simulations of Raft groups; any failure is replayed by its seed."""
    failures = run_seeds(
        lambda s: run_seed(s, nodes=int(nodes), fault_ms=steps * 10, profile=profile, bugs=frozenset(bugs),
                           trace=verbose),
        seed, seeds,
        lambda s: (f"hutch sim raft --seed {s} --nodes {nodes} --steps {steps} --profile {profile}"
                   + "".join(f" --bug {b}" for b in bugs)),
        click.echo, verbose)
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    cli()
