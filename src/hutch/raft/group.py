"""One Raft group as a sans-I/O state machine: `step`, `tick`, `propose`, then `ready`/`advance`.

This implements the Raft paper (Ongaro and Ousterhout, "In Search of an Understandable
Consensus Algorithm", §5 election and replication, §5.4.1 election restriction, §5.4.2
commit rule, §6 membership, §7 snapshots, §8 client interaction) with the extensions of
Ongaro's thesis that production systems use: pre-vote (§9.6), check-quorum (§6.2), leadership
transfer (§3.10), single-server membership changes with learners that catch up before they
vote (§4.1-4.2), and read-index reads (§6.4). The shape follows etcd-raft's RawNode: inputs are
peer messages, logical ticks and proposals; outputs are collected into a `Ready` that the
runtime persists (entries, hard state, received snapshot), then sends (messages), then
applies (committed entries), and then acknowledges with `advance`. Messages in a Ready may
depend on the entries and hard state of the same Ready, so they must never be sent before
those are durable.

The group never touches sockets, clocks, files or a global random source: time is the count
of `tick` calls, and election timeouts are drawn from a per-group splitmix64 sequence seeded
from the configuration. Replication is pipelined per follower within limits on messages and
bytes in flight, and every message carries at most `entries_per_message_max` entries.
`RaftConfig._unsafe_bugs` switches on known-wrong behaviour so the simulator can show that
its checkers catch it; nothing else may set it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hutch.raft.messages import (
    CONF_ADD_LEARNER,
    CONF_BOOTSTRAP,
    CONF_PROMOTE,
    CONF_REMOVE,
    ENTRY_CONF,
    ENTRY_NORMAL,
    AppendEntries,
    AppendResponse,
    ConfChange,
    ConfState,
    Entry,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    NodeId,
    ReadState,
    RequestVote,
    Snapshot,
    SnapshotMeta,
    TimeoutNow,
    VoteResponse,
    decode_conf_change,
    encode_conf_change,
    entry_size_bytes,
)
from hutch.raft.storage import LogStorage

FOLLOWER, PRE_CANDIDATE, CANDIDATE, LEADER = 0, 1, 2, 3
ROLE_NAMES = ("follower", "pre-candidate", "candidate", "leader")

# Replication progress states (etcd-raft's names): probing for the match point one message
# at a time, replicating in a pipeline, or waiting for a snapshot to land.
PROBE, REPLICATE, SNAPSHOT = 0, 1, 2

UNSAFE_BUGS = frozenset(
    {
        "vote_ignores_log",  # §5.4.1 off: grant votes to candidates with stale logs
        "vote_twice",  # §5.2 off: vote for a second candidate in the same term
        "commit_previous_term",  # §5.4.2 off: count replicas of older-term entries to commit them
        "skip_prev_term_check",  # §5.3 off: accept AppendEntries without the log-matching check
        "read_without_quorum",  # §8 off: answer read-index at once without a heartbeat round
    }
)

_MASK64 = (1 << 64) - 1


class RaftError(Exception):
    pass


NOT_LEADER = "not the leader"  # how a refusal for that reason reads (also across nodes)


class NotLeader(RaftError):
    """Only the leader takes proposals and reads; `leader` is the known leader or None."""

    def __init__(self, leader: NodeId | None) -> None:
        super().__init__(f"{NOT_LEADER} (leader: {leader})")
        self.leader = leader


class ProposalRejected(RaftError):
    pass


class RaftInvariantError(AssertionError):
    """An invariant of the algorithm was about to be broken: a bug, never a runtime condition."""


@dataclass(frozen=True, slots=True)
class RaftConfig:
    election_timeout_ticks: int = 10  # randomized per election in [this, 2 * this)
    heartbeat_interval_ticks: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    entries_per_message_max: int = 64
    bytes_per_message_max: int = 1 << 20
    inflight_messages_max: int = 64  # per follower, pipelined AppendEntries not yet acknowledged
    inflight_bytes_max: int = 8 << 20  # per follower
    uncommitted_entries_max: int = 10_000  # proposals beyond this are refused
    apply_bytes_per_ready_max: int = 16 << 20
    snapshot_after_entries: int = 8192  # Ready.snapshot_wanted once this many applied entries are kept
    snapshot_trailing_entries: int = 256  # entries kept after a snapshot for slightly slow followers
    pending_reads_max: int = 4096
    auto_promote_learners: bool = True  # the leader promotes a learner once it has caught up
    seed: int = 0
    _unsafe_bugs: frozenset[str] = field(default=frozenset())

    def __post_init__(self) -> None:
        if self.heartbeat_interval_ticks < 1 or self.election_timeout_ticks <= self.heartbeat_interval_ticks:
            raise ValueError("need 1 <= heartbeat_interval_ticks < election_timeout_ticks")
        for name in ("entries_per_message_max", "bytes_per_message_max", "inflight_messages_max",
                     "inflight_bytes_max", "uncommitted_entries_max", "apply_bytes_per_ready_max",
                     "snapshot_after_entries", "pending_reads_max"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        unknown = self._unsafe_bugs - UNSAFE_BUGS
        if unknown:
            raise ValueError(f"unknown unsafe bugs: {sorted(unknown)}")


class Ready:
    """What one loop iteration must do, in this order: persist `snapshot`, `entries` and
    `hard_state` (one fsync); send `messages`; apply `committed_entries` (after installing
    `snapshot` into the state machine); serve `read_states` once applied; then `advance`."""

    __slots__ = ("hard_state", "entries", "snapshot", "committed_entries", "messages", "read_states",
                 "snapshot_wanted")

    def __init__(self, hard_state, entries, snapshot, committed_entries, messages, read_states,
                 snapshot_wanted) -> None:
        self.hard_state: HardState | None = hard_state
        self.entries: list[Entry] = entries
        self.snapshot: Snapshot | None = snapshot
        self.committed_entries: list[Entry] = committed_entries
        self.messages: list[Message] = messages
        self.read_states: list[ReadState] = read_states
        self.snapshot_wanted: bool = snapshot_wanted

    def __repr__(self) -> str:
        return (f"Ready(hs={self.hard_state}, entries={len(self.entries)}, snapshot={self.snapshot is not None}, "
                f"committed={len(self.committed_entries)}, messages={len(self.messages)}, "
                f"reads={len(self.read_states)})")


class Progress:
    """The leader's view of one member's log (Raft paper §5.3 nextIndex/matchIndex)."""

    __slots__ = ("match", "next", "state", "paused", "inflight", "inflight_bytes", "recent_active",
                 "read_ack", "pending_snapshot", "snapshot_ticks")

    def __init__(self, next_index: int) -> None:
        self.match = 0
        self.next = next_index
        self.state = PROBE
        self.paused = False
        self.inflight: deque[tuple[int, int]] = deque()  # (last index sent, bytes) per message
        self.inflight_bytes = 0
        self.recent_active = True
        self.read_ack = 0
        self.pending_snapshot = 0
        self.snapshot_ticks = 0

    def maybe_update(self, index: int) -> bool:
        updated = index > self.match
        if updated:
            self.match = index
            self.paused = False
        if self.next < index + 1:
            self.next = index + 1
        return updated

    def maybe_decrease(self, rejected: int, hint: int) -> bool:
        if self.state == REPLICATE:
            if rejected <= self.match:
                return False  # a stale rejection
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False  # a rejection of an earlier probe
        self.next = max(min(rejected, hint + 1), self.match + 1, 1)
        self.paused = False
        return True

    def become(self, state: int) -> None:
        self.state = state
        self.paused = False
        self.inflight.clear()
        self.inflight_bytes = 0
        self.next = self.match + 1

    def free_to(self, index: int) -> None:
        q = self.inflight
        while q and q[0][0] <= index:
            self.inflight_bytes -= q.popleft()[1]


_BCAST_NONE, _BCAST_NEW_ENTRIES, _BCAST_ALL = 0, 1, 2


class RaftGroup:
    """A member of one Raft group. All inputs are method calls; all outputs come out in `ready()`."""

    __slots__ = (
        "id", "cfg", "storage", "term", "vote", "commit", "applied", "persisted", "role", "leader",
        "voters", "learners", "elapsed", "timeout", "hb_elapsed", "rng", "votes", "progress", "msgs",
        "pending_conf_index", "transferee", "unstable_from", "hs_saved", "ready_out", "trunc_cap",
        "snapshot_in", "read_seq", "pending_reads", "read_states", "bcast",
    )

    def __init__(self, node_id: NodeId, storage: LogStorage, config: RaftConfig, seed: int | None = None) -> None:
        self.id = node_id
        self.cfg = config
        self.storage = storage
        hs = storage.hard_state()
        snap = storage.snapshot().meta
        last = storage.last_index()
        self.term = hs.term
        self.vote = hs.vote
        # the commit index is volatile state (Raft §5.3): one stored beyond the log's end (a
        # group whose entries count once written, after a power loss kept its hard state's record
        # and not the entries before it) is learnt again from the leader
        self.commit = min(max(hs.commit, snap.index), max(last, snap.index))
        self.applied = snap.index
        self.persisted = last
        self.voters: tuple[NodeId, ...] = snap.conf.voters
        self.learners: tuple[NodeId, ...] = snap.conf.learners
        self.role = FOLLOWER
        self.leader: NodeId | None = None
        self.elapsed = 0
        self.hb_elapsed = 0
        self.rng = _mix((config.seed * 0x9E3779B97F4A7C15 + (seed if seed is not None else node_id)) & _MASK64)
        self.timeout = 0
        self._reset_timeout()
        self.votes: dict[NodeId, bool] | None = None
        self.progress: dict[NodeId, Progress] | None = None
        self.msgs: list[Message] | None = None
        self.pending_conf_index = 0
        self.transferee: NodeId | None = None
        self.unstable_from: int | None = None
        self.hs_saved = hs
        self.ready_out: tuple[int | None, int | None] | None = None
        self.trunc_cap = 0
        self.snapshot_in: Snapshot | None = None
        self.read_seq = 0
        self.pending_reads: deque[list] | None = None  # [seq (0: waiting for a commit in this term), index, ctx]
        self.read_states: list[ReadState] | None = None
        self.bcast = _BCAST_NONE

    # ---- introspection ------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.role == LEADER

    @property
    def role_name(self) -> str:
        return ROLE_NAMES[self.role]

    def last_index(self) -> int:
        return self.storage.last_index()

    def status(self) -> dict:
        d = {
            "id": self.id, "role": self.role_name, "term": self.term, "vote": self.vote, "leader": self.leader,
            "commit": self.commit, "applied": self.applied, "last_index": self.storage.last_index(),
            "voters": list(self.voters), "learners": list(self.learners),
        }
        if self.progress is not None:
            d["progress"] = {n: {"match": p.match, "next": p.next, "state": ("probe", "replicate", "snapshot")[p.state]}
                             for n, p in self.progress.items()}
        return d

    # ---- inputs -------------------------------------------------------------------------

    def tick(self) -> None:
        """One unit of logical time: election timeouts and heartbeats count these."""
        if self.role == LEADER:
            self._tick_leader()
            return
        self.elapsed += 1
        if self.elapsed >= self.timeout and self.id in self.voters:
            self.elapsed = 0
            self._campaign(pre_vote=self.cfg.pre_vote, transfer=False)

    def campaign(self) -> None:
        """Stand for election now instead of when the election timeout runs out (through a
        pre-vote when configured). Always safe; a runtime calls it where waiting only costs
        time, such as a cluster formed a moment ago."""
        if self.role != LEADER and self.id in self.voters:
            self._campaign(pre_vote=self.cfg.pre_vote, transfer=False)

    def propose(self, data: bytes) -> int:
        """Append a command to the leader's log; returns its index. Committed once it comes out
        of `ready().committed_entries`; it may still be lost if leadership changes first."""
        self._check_can_propose()
        return self._append_local(ENTRY_NORMAL, data)

    def propose_conf_change(self, cc: ConfChange) -> int:
        """Add a learner, promote a learner to voter, or remove a member — one at a time."""
        self._check_can_propose()
        if self.pending_conf_index > self.applied:
            raise ProposalRejected("a membership change is still in progress")
        if self.storage.term(self.commit) != self.term:
            raise ProposalRejected("the leader has not committed an entry of its term yet")
        if len(cc.nodes) != 1:
            raise ProposalRejected("membership changes add, promote or remove exactly one member")
        n = cc.nodes[0]
        if cc.op == CONF_ADD_LEARNER and (n in self.voters or n in self.learners):
            raise ProposalRejected(f"{n} is already a member")
        if cc.op == CONF_PROMOTE and n not in self.learners:
            raise ProposalRejected(f"{n} is not a learner")
        if cc.op == CONF_REMOVE:
            if n not in self.voters and n not in self.learners:
                raise ProposalRejected(f"{n} is not a member")
            if self.voters == (n,):
                raise ProposalRejected("cannot remove the last voter")
        if cc.op not in (CONF_ADD_LEARNER, CONF_PROMOTE, CONF_REMOVE):
            raise ProposalRejected(f"unknown membership change {cc.op}")
        idx = self._append_local(ENTRY_CONF, encode_conf_change(cc))
        self.pending_conf_index = idx
        return idx

    def transfer_leadership(self, to: NodeId) -> None:
        """Hand leadership to `to` once its log is complete (thesis §3.10). Proposals are refused
        until it takes over or the transfer is abandoned after an election timeout."""
        if self.role != LEADER:
            raise NotLeader(self.leader)
        if to == self.id or to not in self.voters:
            raise ProposalRejected(f"{to} is not another voter")
        self.transferee = to
        self.elapsed = 0
        pr = self.progress[to]
        if pr.match == self.storage.last_index():
            self._send(TimeoutNow(self.term, self.id, to))
        else:
            self._send_append(to)

    def read_index(self, ctx: bytes) -> None:
        """Start a linearizable read (thesis §6.4). A `ReadState(index, ctx)` comes out of a later
        Ready once a majority confirmed this node is still the leader; serve the read when the
        local applied index reaches `index`. Local reads (of applied state, possibly stale)
        need no call at all."""
        if self.role != LEADER:
            raise NotLeader(self.leader)
        if self.pending_reads is None:
            self.pending_reads = deque()
        if len(self.pending_reads) >= self.cfg.pending_reads_max:
            raise ProposalRejected("too many reads pending")
        if len(self.voters) == 1 and self.id in self.voters or "read_without_quorum" in self.cfg._unsafe_bugs:
            self._read_ready(ReadState(self.commit, ctx))
            return
        if self.storage.term(self.commit) != self.term:
            self.pending_reads.append([0, 0, ctx])  # started once the no-op of this term commits
            return
        self.read_seq += 1
        self.pending_reads.append([self.read_seq, self.commit, ctx])
        self._bcast_heartbeat()

    def report_unreachable(self, peer: NodeId) -> None:
        """The transport lost its connection to `peer`: appends in flight are gone, so probe it."""
        if self.role == LEADER:
            pr = self.progress.get(peer)
            if pr is not None and pr.state == REPLICATE:
                pr.become(PROBE)

    def leader_down(self, peer: NodeId, campaign_now: bool) -> None:
        """The failure detector says `peer` is dead. If it was our leader, forget it (no lease
        then holds back other candidates), and with `campaign_now` stand at the next tick rather
        than after a whole election timeout. Safety does not depend on when elections start;
        the caller lets one survivor (the lowest id) go first so that they do not split the vote."""
        if self.role == LEADER or self.leader != peer:
            return
        self.leader = None
        if campaign_now and self.id in self.voters:
            self.elapsed = max(self.elapsed, self.timeout - 1)

    def compact(self, index: int, data: bytes, keep_from: int | None = None,
                conf: ConfState | None = None) -> Snapshot:
        """The application took a snapshot of its state at `index`: the applied index, or (with
        `conf`, the membership at the time) an earlier one after the current snapshot, which it
        kept until it was time to compact to it. Record it and drop the log below it, keeping a
        few trailing entries, and every entry from `keep_from` on (an application whose state
        names entries it reads back: a quorum queue's messages). The runtime persists the
        returned snapshot itself."""
        if conf is None:
            if index != self.applied:
                raise ValueError(f"snapshot index {index} is not the applied index {self.applied}")
            conf = self.conf_state()
        elif not self.storage.snapshot().meta.index < index <= self.applied:
            raise ValueError(f"snapshot index {index} is not after the last snapshot "
                             f"({self.storage.snapshot().meta.index}) and at most the applied index {self.applied}")
        term = self.storage.term(index)
        if term is None:
            raise ValueError(f"no term known for index {index}")
        snap = Snapshot(SnapshotMeta(index, term, conf), data)
        keep = index + 1 - self.cfg.snapshot_trailing_entries
        self.storage.create_snapshot(snap, keep if keep_from is None else min(keep, keep_from))
        return snap

    def conf_state(self) -> ConfState:
        """The membership now (a snapshot taken now carries it)."""
        return ConfState(self.voters, self.learners)

    def entries_since_snapshot(self) -> int:
        """Entries applied since the last snapshot (or since the first entry the log keeps)."""
        st = self.storage
        return self.applied - max(st.snapshot().meta.index, st.first_index() - 1)

    def step(self, m: Message) -> None:
        """Feed one message from a peer."""
        if m.to != self.id or m.frm == self.id:
            return
        if m.term > self.term:
            if type(m) is RequestVote:
                in_lease = (self.cfg.check_quorum and self.leader is not None
                            and self.elapsed < self.cfg.election_timeout_ticks)
                if in_lease and not m.transfer:
                    return  # we hear from a live leader: do not let a returning node disrupt it
            if type(m) is RequestVote and m.pre_vote:
                pass  # a pre-vote never changes our term
            elif type(m) is VoteResponse and m.pre_vote and m.granted:
                pass  # pre-vote granted for the term we would move to
            elif type(m) in (AppendEntries, Heartbeat, InstallSnapshot):
                self._become_follower(m.term, m.frm)
            else:
                self._become_follower(m.term, None)
        elif m.term < self.term:
            if (self.cfg.check_quorum or self.cfg.pre_vote) and type(m) in (AppendEntries, Heartbeat):
                # A stale leader (or one cut off while we moved on): tell it the current term.
                self._send(AppendResponse(self.term, self.id, m.frm, 0, True, 0))
            elif type(m) is RequestVote and m.pre_vote:
                self._send(VoteResponse(self.term, self.id, m.frm, False, True))
            return

        t = type(m)
        if t is RequestVote:
            self._handle_vote_request(m)
        elif self.role == LEADER:
            if t is AppendResponse:
                self._leader_append_response(m)
            elif t is HeartbeatResponse:
                self._leader_heartbeat_response(m)
        elif t is VoteResponse:
            self._candidate_vote_response(m)
        elif t is AppendEntries:
            self._follow(m.frm)
            self._handle_append(m)
        elif t is Heartbeat:
            self._follow(m.frm)
            # the leader sends min(its commit, what it knows this follower stores): more than this
            # log holds only when the follower lost its log and came back under its old id (a node
            # reset and joined again before it was forgotten). It says so, a rejection of index 0
            # (which no append can draw) with its log's end, and the leader sends it the entries
            # again.
            last = self.storage.last_index()
            if m.commit > last:
                self._send(AppendResponse(self.term, self.id, m.frm, 0, True, last))
            self._commit_to(min(m.commit, last))
            self._send(HeartbeatResponse(self.term, self.id, m.frm, m.read_seq))
        elif t is InstallSnapshot:
            self._follow(m.frm)
            self._handle_snapshot(m)
        elif t is TimeoutNow:
            if self.id in self.voters:
                self._campaign(pre_vote=False, transfer=True)

    # ---- ready / advance ----------------------------------------------------------------

    def has_ready(self) -> bool:
        if self.ready_out is not None:
            return False
        self._flush()
        return bool(
            self.msgs
            or self.unstable_from is not None
            or self.snapshot_in is not None
            or self.read_states
            or self.applied < self.commit
            or self._hs_changed()
        )

    def ready(self) -> Ready:
        if self.ready_out is not None:
            raise RaftError("the previous Ready has not been advanced")
        self._flush()
        st = self.storage
        hs = None
        if self._hs_changed():
            hs = HardState(self.term, self.vote, self.commit)
            st.set_hard_state(hs)
            self.hs_saved = hs
        last = st.last_index()
        entries = st.entries(self.unstable_from, last + 1, 1 << 62) if self.unstable_from is not None else []
        committed = []
        if self.applied < self.commit:
            committed = st.entries(self.applied + 1, self.commit + 1, self.cfg.apply_bytes_per_ready_max)
        rd = Ready(hs, entries, self.snapshot_in, committed, self.msgs or [], self.read_states or [],
                   self.entries_since_snapshot() >= self.cfg.snapshot_after_entries)
        self.ready_out = (entries[-1].index if entries else None, committed[-1].index if committed else None)
        self.trunc_cap = 1 << 62
        self.unstable_from = None
        self.snapshot_in = None
        self.msgs = None
        self.read_states = None
        return rd

    def advance(self, rd: Ready, durable: bool = True) -> None:
        """The runtime has persisted, sent and applied everything in `rd`.

        `durable=False`: a Ready whose entries were written but whose fsync is still running.
        A leader's: its AppendEntries were sent (thesis §10.2.1: a leader may send them before
        its own write is durable, as long as it counts itself towards a commit only once it
        is), and it does not count those entries as its own until `persisted_to`. A
        follower's: its answers wait for that fsync (the runtime holds them), and should it
        become leader it counts its log as its own only from an fsync after that."""
        if self.ready_out is None:
            raise RaftError("advance without a Ready")
        last_entry, _ = self.ready_out
        self.ready_out = None
        if not durable and (rd.snapshot is not None or rd.hard_state is not None and (
                rd.hard_state.term != self.term or rd.hard_state.vote != self.vote)):
            raise RaftError("a snapshot, a term or a vote must be durable before its Ready is advanced")
        if durable and rd.snapshot is not None:
            self.persisted = max(self.persisted, min(rd.snapshot.meta.index, self.trunc_cap))
        if durable and last_entry is not None:
            self.persisted = max(self.persisted, min(last_entry, self.trunc_cap))
        for e in rd.committed_entries:
            if e.index <= self.applied:
                continue  # superseded by a snapshot installed since this Ready
            if e.kind == ENTRY_CONF:
                self._apply_conf(e)
            self.applied = e.index
        if self.role == LEADER:
            me = self.progress.get(self.id)
            if me is not None:
                me.match = self.persisted
                me.next = self.persisted + 1
            if self._maybe_commit():
                self.bcast = _BCAST_ALL

    def persisted_to(self, index: int, term: int) -> None:
        """The runtime's fsync made this node's log durable through `index`, entries it
        appended as leader in `term` and handed over with `advance(rd, durable=False)`. Counted
        only while it still leads in that term (a leader never truncates its own log, so those
        entries are still the ones written); otherwise ignored: counting a member's entries
        late is safe, counting them early is not, and the next durable Ready counts them."""
        if self.role != LEADER or self.term != term or index <= self.persisted:
            return
        self.persisted = min(index, self.storage.last_index())
        me = self.progress.get(self.id)
        if me is not None:
            me.match = max(me.match, self.persisted)
            me.next = max(me.next, self.persisted + 1)
        if self._maybe_commit():
            self.bcast = _BCAST_ALL

    # ---- roles --------------------------------------------------------------------------

    def _reset_timeout(self) -> None:
        et = self.cfg.election_timeout_ticks
        self.timeout = et + self._rand_below(et)

    def _rand_below(self, n: int) -> int:
        self.rng = (self.rng + 0x9E3779B97F4A7C15) & _MASK64
        return _mix(self.rng) % n

    def _become_follower(self, term: int, leader: NodeId | None) -> None:
        if term != self.term:
            if term < self.term:
                raise RaftInvariantError(f"term going down from {self.term} to {term}")
            self.term = term
            self.vote = None
        self.role = FOLLOWER
        self.leader = leader
        self.elapsed = 0
        self._reset_timeout()
        self.votes = None
        self.progress = None
        self.transferee = None
        self.pending_reads = None
        self.bcast = _BCAST_NONE

    def _follow(self, leader: NodeId) -> None:
        """A message from the leader of our term: (re)start following it."""
        if self.role != FOLLOWER:
            self._become_follower(self.term, leader)
        self.leader = leader
        self.elapsed = 0

    def _campaign(self, pre_vote: bool, transfer: bool) -> None:
        st = self.storage
        if pre_vote:
            self.role = PRE_CANDIDATE
            vote_term = self.term + 1
        else:
            self.term += 1
            self.vote = self.id
            self.role = CANDIDATE
            vote_term = self.term
        self.leader = None
        self.elapsed = 0
        self._reset_timeout()
        self.votes = {}
        self.progress = None
        if self._poll(self.id, True) > 0:
            if pre_vote:
                self._campaign(pre_vote=False, transfer=False)
            else:
                self._become_leader()
            return
        last = st.last_index()
        last_term = st.term(last)
        for v in self.voters:
            if v != self.id:
                self._send(RequestVote(vote_term, self.id, v, last, last_term, pre_vote, transfer))

    def _poll(self, frm: NodeId, granted: bool) -> int:
        """Record a vote; 1 = won, -1 = lost, 0 = undecided."""
        voters = self.voters
        if frm not in voters:
            return 0
        self.votes.setdefault(frm, granted)
        # Count only current voters: the configuration may have changed since the campaign began.
        yes = no = 0
        for v, g in self.votes.items():
            if v in voters:
                if g:
                    yes += 1
                else:
                    no += 1
        q = len(voters) // 2 + 1
        if yes >= q:
            return 1
        if no > len(self.voters) - q:
            return -1
        return 0

    def _become_leader(self) -> None:
        st = self.storage
        last = st.last_index()
        self.role = LEADER
        self.leader = self.id
        self.votes = None
        self.elapsed = 0
        self.hb_elapsed = 0
        self.progress = {}
        for n in self.voters + self.learners:
            self.progress[n] = Progress(last + 1)
        me = self.progress.get(self.id)
        if me is not None:
            me.match = self.persisted
            me.state = REPLICATE
        self.pending_conf_index = last  # no membership change until everything before us is applied
        self._append_local(ENTRY_NORMAL, b"")  # the no-op that lets this term commit (§5.4.2, §8)

    def _tick_leader(self) -> None:
        cfg = self.cfg
        self.hb_elapsed += 1
        self.elapsed += 1
        if self.elapsed >= cfg.election_timeout_ticks:
            self.elapsed = 0
            if cfg.check_quorum:
                q = len(self.voters) // 2 + 1
                active = 0
                for n, pr in self.progress.items():
                    if n in self.voters and (n == self.id or pr.recent_active):
                        active += 1
                    pr.recent_active = False
                if active < q:
                    self._become_follower(self.term, None)  # cut off from a majority: step down
                    return
            self.transferee = None  # a transfer that did not finish within an election timeout
        for pr in self.progress.values():
            if pr.state == SNAPSHOT:
                pr.snapshot_ticks += 1
                if pr.snapshot_ticks > cfg.election_timeout_ticks:
                    pr.become(PROBE)  # the snapshot was lost: probe again, which resends it
        if self.hb_elapsed >= cfg.heartbeat_interval_ticks:
            self.hb_elapsed = 0
            self._bcast_heartbeat()
            if cfg.auto_promote_learners and self.learners:
                self._maybe_promote_learner()

    def _maybe_promote_learner(self) -> None:
        if self.pending_conf_index > self.applied or self.transferee is not None:
            return
        if self.storage.term(self.commit) != self.term:
            return
        for n in self.learners:
            pr = self.progress.get(n)
            if pr is not None and pr.match >= self.commit:
                try:
                    self.propose_conf_change(ConfChange(CONF_PROMOTE, (n,)))
                except ProposalRejected:
                    pass  # the log is full of uncommitted proposals: try again at the next heartbeat
                return

    # ---- votes --------------------------------------------------------------------------

    def _handle_vote_request(self, m: RequestVote) -> None:
        bugs = self.cfg._unsafe_bugs
        st = self.storage
        last = st.last_index()
        # a node that knows no configuration (an empty log: a member being added, or one that
        # lost its log) does not vote: it cannot tell whether it voted in this term before
        can_vote = bool(self.voters) and (
            self.vote == m.frm
            or (self.vote is None and self.leader is None)
            or (m.pre_vote and m.term > self.term)
            or ("vote_twice" in bugs and not m.pre_vote)
        )
        up_to_date = (m.last_term, m.last_index) >= (st.term(last), last) or "vote_ignores_log" in bugs
        if can_vote and up_to_date:
            self._send(VoteResponse(m.term, self.id, m.frm, True, m.pre_vote))
            if not m.pre_vote:
                self.vote = m.frm
                self.elapsed = 0
        else:
            self._send(VoteResponse(self.term, self.id, m.frm, False, m.pre_vote))

    def _candidate_vote_response(self, m: VoteResponse) -> None:
        if self.role == PRE_CANDIDATE and m.pre_vote:
            r = self._poll(m.frm, m.granted)
            if r > 0:
                self._campaign(pre_vote=False, transfer=False)
            elif r < 0:
                self._become_follower(self.term, None)
        elif self.role == CANDIDATE and not m.pre_vote:
            r = self._poll(m.frm, m.granted)
            if r > 0:
                self._become_leader()
            elif r < 0:
                self._become_follower(self.term, None)

    # ---- follower side of replication ---------------------------------------------------

    def _handle_append(self, m: AppendEntries) -> None:
        st = self.storage
        if m.prev_index < self.commit:
            self._send(AppendResponse(self.term, self.id, m.frm, self.commit))
            return
        if "skip_prev_term_check" in self.cfg._unsafe_bugs:
            matches = m.prev_index <= st.last_index()
        else:
            matches = st.term(m.prev_index) == m.prev_term
        if not matches:
            self._send(AppendResponse(self.term, self.id, m.frm, m.prev_index, True,
                                      min(m.prev_index, st.last_index())))
            return
        ents = m.entries
        skip = 0
        for e in ents:
            if st.term(e.index) != e.term:
                break
            skip += 1
        if skip < len(ents):
            first_new = ents[skip].index
            if first_new <= self.commit:
                raise RaftInvariantError(f"node {self.id}: truncating committed entry {first_new} "
                                         f"(commit {self.commit})")
            if first_new <= st.last_index():
                self._on_truncate(first_new)
            st.append(ents[skip:] if skip else ents)
            self._mark_unstable(first_new)
        last_new = m.prev_index + len(ents)
        self._commit_to(min(m.commit, last_new))
        self._send(AppendResponse(self.term, self.id, m.frm, last_new))

    def _handle_snapshot(self, m: InstallSnapshot) -> None:
        snap = m.snapshot
        meta = snap.meta
        st = self.storage
        if meta.index <= self.commit:
            self._send(AppendResponse(self.term, self.id, m.frm, self.commit))
            return
        if st.term(meta.index) == meta.term:
            # We have the entry the snapshot ends at: everything before it is committed.
            self._commit_to(meta.index)
            self._send(AppendResponse(self.term, self.id, m.frm, meta.index))
            return
        self._on_truncate(min(st.last_index() + 1, meta.index + 1))
        st.install_snapshot(snap)
        self.unstable_from = None
        self.commit = meta.index
        self.applied = meta.index
        self.voters = meta.conf.voters
        self.learners = meta.conf.learners
        self.snapshot_in = snap
        self._send(AppendResponse(self.term, self.id, m.frm, meta.index))

    def _on_truncate(self, index: int) -> None:
        self.persisted = min(self.persisted, index - 1)
        self.trunc_cap = min(self.trunc_cap, index - 1)

    def _commit_to(self, index: int) -> None:
        if index > self.commit:
            self.commit = index

    # ---- leader side of replication -----------------------------------------------------

    def _check_can_propose(self) -> None:
        if self.role != LEADER:
            raise NotLeader(self.leader)
        if self.transferee is not None:
            raise ProposalRejected("leadership transfer in progress")
        if self.storage.last_index() - self.commit >= self.cfg.uncommitted_entries_max:
            raise ProposalRejected("too many uncommitted entries")

    def _append_local(self, kind: int, data: bytes) -> int:
        idx = self.storage.last_index() + 1
        self.storage.append([Entry(self.term, idx, kind, data)])
        self._mark_unstable(idx)
        if self.bcast == _BCAST_NONE:
            self.bcast = _BCAST_NEW_ENTRIES
        return idx

    def _mark_unstable(self, index: int) -> None:
        if self.unstable_from is None or index < self.unstable_from:
            self.unstable_from = index

    def _flush(self) -> None:
        """Send what proposals and commit changes since the last Ready call for, in batches."""
        if self.bcast == _BCAST_NONE or self.role != LEADER:
            self.bcast = _BCAST_NONE
            return
        all_peers = self.bcast == _BCAST_ALL
        self.bcast = _BCAST_NONE
        for to in self.progress:
            if to != self.id:
                sent = self._send_append(to, send_if_empty=all_peers)
                while sent and self._send_append(to, send_if_empty=False):
                    pass

    def _paused(self, pr: Progress) -> bool:
        if pr.state == PROBE:
            return pr.paused
        if pr.state == REPLICATE:
            return len(pr.inflight) >= self.cfg.inflight_messages_max or pr.inflight_bytes >= self.cfg.inflight_bytes_max
        return True

    def _send_append(self, to: NodeId, send_if_empty: bool = True) -> bool:
        pr = self.progress[to]
        if self._paused(pr):
            return False
        st = self.storage
        last = st.last_index()
        if pr.next > last + 1:
            pr.next = last + 1
        prev = pr.next - 1
        prev_term = st.term(prev)
        if prev_term is None:
            return self._send_snapshot(to, pr)
        ents: list[Entry] = []
        if pr.next <= last:
            hi = min(last + 1, pr.next + self.cfg.entries_per_message_max)
            ents = st.entries(pr.next, hi, self.cfg.bytes_per_message_max)
        if not ents and not send_if_empty:
            return False
        self._send(AppendEntries(self.term, self.id, to, prev, prev_term, ents, self.commit))
        if ents and pr.state == REPLICATE:
            size = 0
            for e in ents:
                size += entry_size_bytes(e)
            pr.next = ents[-1].index + 1
            pr.inflight.append((ents[-1].index, size))
            pr.inflight_bytes += size
        elif pr.state == PROBE:
            pr.paused = True
        return True

    def _send_snapshot(self, to: NodeId, pr: Progress) -> bool:
        snap = self.storage.snapshot()
        if snap.meta.index == 0:
            raise RaftInvariantError(f"entry {pr.next - 1} is compacted but there is no snapshot")
        pr.become(SNAPSHOT)
        pr.pending_snapshot = snap.meta.index
        pr.snapshot_ticks = 0
        self._send(InstallSnapshot(self.term, self.id, to, snap))
        return True

    def _leader_append_response(self, m: AppendResponse) -> None:
        pr = self.progress.get(m.frm)
        if pr is None:
            return
        pr.recent_active = True
        if m.reject:
            if m.index == 0 and m.hint_index < pr.match:  # the follower lost entries it had acknowledged
                pr.match = m.hint_index
                pr.become(PROBE)
                self._send_append(m.frm)
                return
            if pr.maybe_decrease(m.index, m.hint_index):
                if pr.state == REPLICATE:
                    pr.become(PROBE)
                self._send_append(m.frm)
            return
        if not pr.maybe_update(m.index):
            return
        if pr.state == PROBE or (pr.state == SNAPSHOT and pr.match >= pr.pending_snapshot):
            pr.become(REPLICATE)
        elif pr.state == REPLICATE:
            pr.free_to(m.index)
        if self._maybe_commit():
            self.bcast = _BCAST_ALL  # tell everyone the new commit index, batched at the next Ready
        while self._send_append(m.frm, send_if_empty=False):
            pass
        if self.transferee == m.frm and pr.match == self.storage.last_index():
            self._send(TimeoutNow(self.term, self.id, m.frm))

    def _leader_heartbeat_response(self, m: HeartbeatResponse) -> None:
        pr = self.progress.get(m.frm)
        if pr is None:
            return
        pr.recent_active = True
        if pr.state == PROBE:
            pr.paused = False
        elif pr.state == REPLICATE and pr.inflight and self._paused(pr):
            # The window is full and nothing came back: some append was lost. Free one slot so
            # the next append goes out; the follower rejects its gap and we fall back to probing.
            pr.inflight_bytes -= pr.inflight.popleft()[1]
        if m.read_seq > pr.read_ack:
            pr.read_ack = m.read_seq
            self._resolve_reads()
        if pr.match < self.storage.last_index():
            self._send_append(m.frm)

    def _bcast_heartbeat(self) -> None:
        for to, pr in self.progress.items():
            if to != self.id:
                self._send(Heartbeat(self.term, self.id, to, min(pr.match, self.commit), self.read_seq))

    def _maybe_commit(self) -> bool:
        """Commit the highest index stored on a majority of voters — if it is of this term (§5.4.2)."""
        voters = self.voters
        if not voters:
            return False
        progress = self.progress
        matches = sorted(progress[v].match if v in progress else 0 for v in voters)
        n = matches[len(matches) - (len(matches) // 2 + 1)]
        if n <= self.commit:
            return False
        if self.storage.term(n) != self.term and "commit_previous_term" not in self.cfg._unsafe_bugs:
            return False
        first_in_term = self.storage.term(self.commit) != self.term
        self.commit = n
        if first_in_term and self.pending_reads:
            self._start_waiting_reads()
        return True

    # ---- reads --------------------------------------------------------------------------

    def _read_ready(self, rs: ReadState) -> None:
        if self.read_states is None:
            self.read_states = [rs]
        else:
            self.read_states.append(rs)

    def _start_waiting_reads(self) -> None:
        self.read_seq += 1
        for r in self.pending_reads:
            if r[0] == 0:
                r[0] = self.read_seq
                r[1] = self.commit
        self._bcast_heartbeat()

    def _resolve_reads(self) -> None:
        q = len(self.voters) // 2 + 1
        pending = self.pending_reads
        while pending and pending[0][0] > 0:
            seq = pending[0][0]
            acks = 0
            for v in self.voters:
                if v == self.id:
                    acks += 1
                else:
                    pr = self.progress.get(v)
                    if pr is not None and pr.read_ack >= seq:
                        acks += 1
            if acks < q:
                return
            _, index, ctx = pending.popleft()
            self._read_ready(ReadState(index, ctx))

    # ---- membership ---------------------------------------------------------------------

    def _apply_conf(self, e: Entry) -> None:
        cc = decode_conf_change(e.data)
        voters, learners = list(self.voters), list(self.learners)
        if cc.op == CONF_BOOTSTRAP:
            voters, learners = list(cc.nodes), []
        else:
            n = cc.nodes[0]
            if cc.op == CONF_ADD_LEARNER:
                if n not in voters and n not in learners:
                    learners.append(n)
            elif cc.op == CONF_PROMOTE:
                if n in learners:
                    learners.remove(n)
                    voters.append(n)
            elif cc.op == CONF_REMOVE:
                if n in voters:
                    voters.remove(n)
                if n in learners:
                    learners.remove(n)
        self.voters, self.learners = tuple(sorted(voters)), tuple(sorted(learners))
        if self.role in (PRE_CANDIDATE, CANDIDATE) and self.id not in self.voters:
            self._become_follower(self.term, None)  # no longer a voter: give up the campaign
            return
        if self.role != LEADER:
            return
        members = set(self.voters) | set(self.learners)
        if self.id not in members:
            self._become_follower(self.term, None)  # the leader removed itself
            return
        last = self.storage.last_index()
        for n in members:
            if n not in self.progress:
                self.progress[n] = Progress(last + 1)
        for n in list(self.progress):
            if n not in members:
                del self.progress[n]
        if self.transferee is not None and self.transferee not in self.voters:
            self.transferee = None
        if self._maybe_commit():
            self.bcast = _BCAST_ALL
        else:
            self._resolve_reads()

    # ---- helpers ------------------------------------------------------------------------

    def _send(self, m: Message) -> None:
        if self.msgs is None:
            self.msgs = [m]
        else:
            self.msgs.append(m)

    def _hs_changed(self) -> bool:
        hs = self.hs_saved
        return hs.term != self.term or hs.vote != self.vote or hs.commit != self.commit


def _mix(z: int) -> int:
    """splitmix64's output function: a well-spread 64-bit value from a counter."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)
