"""Deterministic simulation of a GM group (`hutch.mirror.gm`): one process, a simulated clock
and network, every choice drawn from one seed so that a seed names one run exactly.

Members broadcast in bursts (a burst's messages leave in one batch, as a runtime's loop
iteration would send them). Every message is encoded to msgpack and decoded again, and
crosses a directed link with its own random latency; links are FIFO, as the peer transport
is per (peer, group). Faults: members are killed at random points (up to all but one), and a
link out of a killed member delivers only a prefix of what was in flight; each survivor's
failure detector reports the death after a random delay, and never before the last message
from the dead member has arrived (a closed link delivers nothing more). Newcomers join after
random members (their inserter may die during the join), and members leave. The seed also
draws the group size, the latencies, the burst sizes and the batch size limit.

Checked as the run goes: every payload delivered is the one its sender sent under that seq;
each member delivers each sender's messages in order, without gaps or duplicates, starting
right after the point where it joined; nothing from a member is delivered after its death
was reported; ``Stable(n)`` at a sender means every member in the group holds its messages up
to n; no member is expelled that did not leave or die. Checked at the end, once the network
is quiet: all survivors hold the same messages of every sender (so what one survivor
delivered, all did), have delivered everything every survivor broadcast, ended each dead
member's stream at the same point and reported its death there, report the same members
(exactly the survivors), and hold nothing in their caches.

``python -m hutch.mirror.gmsim --seed N`` replays seed N; ``-v`` prints its trace.
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass

import click

from hutch.mirror.gm import (
    JOINING,
    MEMBER,
    Deliver,
    GMConfig,
    GMInvariantError,
    GMMember,
    JoinFailed,
    MembersChanged,
    Removed,
    Stable,
    decode,
    encode,
)
from hutch.simkernel import Kernel, Network, Violation, run_seeds
from hutch.simkernel import SimResult as GMSimResult

_MSG, _BCAST, _KILL, _DOWN, _JOIN, _LEAVE = range(6)
EVENTS_MAX = 2_000_000


@dataclass(slots=True)
class GMSimOptions:
    seed: int
    members: int = 0  # founders; 0: drawn from the seed (2..6)
    broadcasts_max: int = 300
    fault_us: int = 100_000  # kills, joins and broadcasts happen in [0, fault_us)
    profile: str = "swarm"  # "swarm": each fault mix drawn per seed; "churn": joins race kills all the time
    member_class: type[GMMember] = GMMember  # tests pass deliberately broken subclasses
    trace: bool = False


class _Node:
    __slots__ = ("id", "gm", "alive", "left_group", "last", "deaths_at", "stable", "sent", "born_seen")

    def __init__(self, node_id: str, gm: GMMember) -> None:
        self.id = node_id
        self.gm = gm
        self.alive = True  # the process runs
        self.left_group = False
        self.last: dict[str, int] = {}  # sender -> last seq delivered
        self.deaths_at: dict[str, int] = {}  # sender -> last seq delivered when its death was reported
        self.stable = 0
        self.sent = 0
        self.born_seen: set[str] = set()


class GMSimulation(Kernel):
    def __init__(self, opts: GMSimOptions) -> None:
        super().__init__(opts.seed, trace=opts.trace)
        self.o = opts
        r = self.rng
        n = opts.members or r.randint(2, 6)
        self.latency_us = (r.choice((20, 100)), r.choice((300, 2_000, 10_000)))
        self.down_delay_us = r.choice((100, 5_000, 30_000))
        self.kills = r.randint(0, n - 1)
        self.joins = r.choice((0, 0, 1, 2, 4))
        self.leaves = r.choice((0, 0, 0, 1))
        self.burst_max = r.choice((1, 4, 40))
        if opts.profile == "churn":
            self.kills = r.randint(n - 1, n + 4)
            self.joins = r.randint(4, 10)
            self.leaves = r.randint(0, 2)
        elif opts.profile != "swarm":
            raise ValueError(f"unknown profile {opts.profile!r}")
        self.cfg = GMConfig(batch_bytes_max=r.choice((1 << 20, 1 << 20, 40)))
        ids = [f"m{i}" for i in range(n)]
        self.nodes: dict[str, _Node] = {i: _Node(i, opts.member_class.create(i, ids, self.cfg)) for i in ids}
        self.net = Network()  # links made on first use: members join during the run
        self.inflight: dict[tuple[str, str], deque[int]] = {}
        self.dropped: set[int] = set()
        self.broadcasts_left = opts.broadcasts_max
        self.killed: list[str] = []
        self.joiner_count = 0
        self.stats = {"members": n, "messages": 0, "bytes": 0, "broadcasts": 0, "deliveries": 0, "kills": 0,
                      "joins": 0, "joins_failed": 0, "leaves": 0, "probes": 0}

    # ---- plumbing ----------------------------------------------------------------------------

    def run(self) -> GMSimResult:
        r, o = self.rng, self.o
        try:
            for node in self.nodes.values():
                self.at(r.randrange(o.fault_us // 10 + 1), _BCAST, node.id)
            for _ in range(self.kills):
                self.at(r.randrange(o.fault_us), _KILL)
            for _ in range(self.joins):
                self.at(r.randrange(o.fault_us), _JOIN)
            for _ in range(self.leaves):
                self.at(r.randrange(o.fault_us), _LEAVE)
            steps = 0
            handlers = {_BCAST: self._broadcast, _KILL: self._kill, _DOWN: self._down, _JOIN: self._join,
                        _LEAVE: self._leave}
            while self.queue:
                eid, kind, args = self.next_event()
                steps += 1
                if steps > EVENTS_MAX:
                    raise Violation(f"no quiescence after {EVENTS_MAX} events (a message loop?)")
                if kind == _MSG:
                    self._arrive(*args, eid)  # a message is known by its event id
                else:
                    handlers[kind](*args)
            self._check_end()
        except Violation as v:
            return self._result(str(v))
        except GMInvariantError as e:
            return self._result(f"gm invariant at {self.now / 1000:.3f}ms: {e}")
        return self._result(None)

    def _result(self, violation: str | None) -> GMSimResult:
        self.stats["sim_ms"] = self.now // 1000
        return self.result(violation, self.stats)

    def _pump(self, node: _Node) -> None:
        gm = node.gm
        for to, msg in gm.take_messages():
            data = encode(msg)
            self.stats["messages"] += 1
            self.stats["bytes"] += len(data)
            if type(msg).__name__ == "Probe":
                self.stats["probes"] += 1
            lo, hi = self.latency_us
            t = self.net.link(node.id, to).arrival_us(self.now, self.rng.randint(lo, hi))
            mid = self.at(t, _MSG, node.id, to, data)
            self.inflight.setdefault((node.id, to), deque()).append(mid)
        for ev in gm.take_events():
            self._check_event(node, ev)

    def _arrive(self, src: str, dst: str, data: bytes, mid: int) -> None:
        link = (src, dst)
        fl = self.inflight[link]
        if fl and fl[0] == mid:
            fl.popleft()
        if mid in self.dropped:
            self.dropped.discard(mid)
            return
        node = self.nodes.get(dst)
        if node is None or not node.alive:
            return
        node.gm.receive(src, decode(data))
        self._pump(node)

    # ---- workload and faults -------------------------------------------------------------------

    def _broadcast(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if not node.alive or self.now >= self.o.fault_us or self.broadcasts_left <= 0:
            return
        if node.gm.status == MEMBER:
            k = min(self.rng.randint(1, self.burst_max), self.broadcasts_left)
            for _ in range(k):
                seq = node.sent + 1
                got = node.gm.broadcast(f"{node.id}:{seq}".encode())
                if got != seq:
                    raise Violation(f"{node.id}: broadcast returned seq {got}, expected {seq}")
                node.sent = seq
            self.broadcasts_left -= k
            self.stats["broadcasts"] += k
            self._pump(node)
        if node.gm.status in (MEMBER, JOINING):
            self.at(self.now + self.rng.randint(500, 8_000), _BCAST, node_id)

    def _live_members(self) -> list[_Node]:
        return [n for n in self.nodes.values() if n.alive and n.gm.status == MEMBER]

    def _kill(self) -> None:
        members = self._live_members()
        cands = [n for n in self.nodes.values() if n.alive and n.gm.status in (MEMBER, JOINING)]
        if len(members) <= 1:
            cands = [n for n in cands if n.gm.status != MEMBER]
        if not cands:
            return
        victim = self.rng.choice(cands)
        victim.alive = False
        self.killed.append(victim.id)
        self.stats["kills"] += 1
        self.log(f"kill {victim.id} ({victim.gm.status})")
        last_kept: dict[str, int] = {}
        for (a, b), fl in self.inflight.items():
            if a != victim.id or not fl:
                continue
            cut = self.rng.randint(0, len(fl))  # the link delivers only a prefix
            for mid in list(fl)[cut:]:
                self.dropped.add(mid)
            if cut:
                last_kept[b] = self.net.link(a, b).last_us  # upper bound of the kept prefix's arrival
        for n in self.nodes.values():
            if n.alive and n.id != victim.id:
                t = max(self.now, last_kept.get(n.id, 0)) + self.rng.randint(1, self.down_delay_us)
                self.at(t, _DOWN, n.id, victim.id)

    def _down(self, at: str, dead: str) -> None:
        node = self.nodes[at]
        if not node.alive:
            return
        node.gm.member_down(dead)
        self._pump(node)

    def _join(self) -> None:
        members = self._live_members()
        if not members:
            return
        via = self.rng.choice(members)
        self.joiner_count += 1
        jid = f"j{self.joiner_count}"
        node = self.nodes[jid] = _Node(jid, self.o.member_class.joiner(jid, via.id, self.cfg))
        self.stats["joins"] += 1
        self.log(f"{jid} joins after {via.id}")
        for dead in self.killed:
            self.at(self.now + self.rng.randint(1, self.down_delay_us), _DOWN, jid, dead)
        self._pump(node)
        self.at(self.now + self.rng.randint(500, 8_000), _BCAST, jid)

    def _leave(self) -> None:
        members = self._live_members()
        if len(members) <= 1:
            return
        node = self.rng.choice(members)
        node.left_group = True
        self.stats["leaves"] += 1
        self.log(f"{node.id} leaves")
        node.gm.leave()
        self._pump(node)

    # ---- checks ----------------------------------------------------------------------------------

    def _check_event(self, node: _Node, ev) -> None:
        gm = node.gm
        if isinstance(ev, Deliver):
            self.stats["deliveries"] += 1
            s, seq = ev.sender, ev.seq
            if ev.payload != f"{s}:{seq}".encode():
                raise Violation(f"{node.id} delivered {s}:{seq} with payload {ev.payload!r}")
            if s in node.deaths_at:
                raise Violation(f"{node.id} delivered {s}:{seq} after reporting {s} dead")
            prev = node.last.get(s)
            expect = gm.joined_after(s) + 1 if prev is None else prev + 1
            if seq != expect:
                raise Violation(f"{node.id} delivered {s}:{seq}, expected {s}:{expect} (order, gap or duplicate)")
            node.last[s] = seq
        elif isinstance(ev, Stable):
            if ev.seq <= node.stable or ev.seq > node.sent:
                raise Violation(f"{node.id}: Stable({ev.seq}) after Stable({node.stable}), {node.sent} sent")
            node.stable = ev.seq
            for other in self.nodes.values():
                if other is node or not other.alive or other.gm.status != MEMBER:
                    continue
                if other.gm.received_upto(node.id) < ev.seq:
                    raise Violation(f"{node.id}: Stable({ev.seq}) but {other.id} holds only "
                                    f"{other.gm.received_upto(node.id)}")
            self.log(f"{node.id} stable {ev.seq}")
        elif isinstance(ev, MembersChanged):
            for x in ev.births:
                if x in node.born_seen:
                    raise Violation(f"{node.id} reported the birth of {x} twice")
                node.born_seen.add(x)
            for x in ev.deaths:
                if x in node.deaths_at:
                    raise Violation(f"{node.id} reported the death of {x} twice")
                node.deaths_at[x] = node.last.get(x, gm.joined_after(x))
                if gm.ended_at(x) != node.deaths_at[x] + 1:
                    raise Violation(f"{node.id} reported {x} dead at {node.deaths_at[x]}, "
                                    f"its stream ends at {gm.ended_at(x)}")
            self.log(f"{node.id} view {ev.version} {ev.members} +{ev.births} -{ev.deaths}")
        elif isinstance(ev, JoinFailed):
            self.stats["joins_failed"] += 1
            self.log(f"{node.id} join failed: {ev.reason}")
        elif isinstance(ev, Removed):
            if not node.left_group:
                raise Violation(f"{node.id} removed though alive: {ev.reason}")

    def _check_end(self) -> None:
        survivors = self._live_members()
        if not survivors:
            raise Violation("no survivor")
        ids = {n.id for n in survivors}
        first = survivors[0]
        view = first.gm.members
        if set(view) != ids:
            raise Violation(f"{first.id} reports members {view}, survivors are {sorted(ids)}")
        senders = set()
        for n in survivors:
            senders.update(n.gm._streams)
        for n in survivors:
            gm = n.gm
            if gm.members != view:
                raise Violation(f"{n.id} reports members {gm.members}, {first.id} reports {view}")
            if gm.cached_count() or gm.inflight:
                raise Violation(f"{n.id} still caches {gm.cached_count()} messages ({gm.inflight} own unstable)")
            if n.stable != n.sent:
                raise Violation(f"{n.id}: {n.sent} broadcast, stable only up to {n.stable}")
        for s in senders:
            got = {n.id: (n.gm.received_upto(s), n.gm.ended_at(s)) for n in survivors}
            if len(set(got.values())) != 1:
                raise Violation(f"survivors disagree on {s}'s stream (received, end): {got}")
            received, ended = got[first.id]
            if s in ids:
                if ended or received != self.nodes[s].sent:
                    raise Violation(f"survivor {s} sent {self.nodes[s].sent}, survivors hold {received} end {ended}")
            elif s in self.nodes and self.nodes[s].sent and not ended:
                raise Violation(f"dead {s}'s stream never ended")
            for n in survivors:
                delivered_upto = n.last.get(s, n.gm.joined_after(s))
                if delivered_upto != (ended - 1 if ended else received) and received > n.gm.joined_after(s):
                    raise Violation(f"{n.id} delivered {s} up to {delivered_upto}, holds {received} end {ended}")
                if ended and s in n.born_seen and n.deaths_at.get(s) != ended - 1:
                    raise Violation(f"{n.id} did not report {s}'s death at {ended - 1}: {n.deaths_at.get(s)}")
        self.stats["survivors"] = len(survivors)


def run_seed(seed: int, **kw) -> GMSimResult:
    return GMSimulation(GMSimOptions(seed=seed, **kw)).run()


@click.command()
@click.option("--seed", type=int, default=1, show_default=True, help="First seed.")
@click.option("--seeds", type=int, default=1, show_default=True, help="How many consecutive seeds.")
@click.option("--members", type=int, default=0, show_default=True, help="Founders (0: drawn per seed).")
@click.option("--broadcasts", type=int, default=300, show_default=True, help="Broadcasts per run at most.")
@click.option("--profile", type=click.Choice(["swarm", "churn"]), default="swarm", show_default=True,
              help="Fault mix: drawn per seed, or joins racing kills all the time.")
@click.option("-v", "--verbose", is_flag=True, help="Print each run's trace.")
def main(seed: int, seeds: int, members: int, broadcasts: int, profile: str, verbose: bool) -> None:
    """Run seeded simulations of a GM group; a failure is replayed by its seed."""
    failures = run_seeds(
        lambda s: run_seed(s, members=members, broadcasts_max=broadcasts, profile=profile, trace=verbose),
        seed, seeds,
        lambda s: (f"python -m hutch.mirror.gmsim --seed {s} --members {members} --broadcasts {broadcasts} "
                   f"--profile {profile}"),
        click.echo, verbose)
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
