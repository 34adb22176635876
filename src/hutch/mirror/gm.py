"""Guaranteed multicast (GM) over a ring: the channel a mirrored classic queue's leader uses to
keep its mirrors in step (seed 004 §4.2.3–4.2.4; the design of RabbitMQ's ``gm``).

A group is a ring of members. Any member may broadcast; its message travels once round the
ring, and every member delivers it when it first sees it and passes it to its right
neighbour. When the message comes back to its sender, the sender knows every member has it
(``Stable`` — what publisher confirms of a mirrored queue wait for) and starts an ack round
the ring; each member drops the message from its cache as the ack passes. Every member
therefore holds every message until all members are known to have it, so that when a member
dies its left neighbour can resend what the dead one may not have passed on. Guarantees
between surviving members, for each sender: delivery in the sender's order, without gaps or
duplicates, and all-or-nothing (what one survivor delivers every survivor delivers). A
member's death is reported (``MembersChanged``) to each survivor after exactly the same
prefix of the dead member's messages: the first live member to its right (its *heir*) ends
the dead member's stream with an end-of-stream marker placed after everything it holds, and
acks on its behalf. A member that joins delivers only what passes its place in the ring after
it was inserted; joins are made known round the whole ring before the newcomer receives
anything, so no survivor can ever mistake who is the heir of a dead member.

This module is sans-I/O: inputs are method calls (``broadcast``, ``receive``,
``member_down``, ``leave``), outputs are drained with ``take_messages()`` and
``take_events()``. It never reads a clock, draws a random number or touches a socket, and
it imports nothing else from hutch. ``docs/design/gm.md`` explains the protocol and its
invariants; ``hutch.mirror.gmsim`` checks them under random failures.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

MemberId = str

JOINING = "joining"  # waiting to be let into the ring
MEMBER = "member"
FAILED = "failed"  # the join did not happen (the member it asked died or refused)
REMOVED = "removed"  # left the group, or was declared dead by it


class GMError(Exception):
    pass


class GMInvariantError(GMError):
    """A protocol invariant does not hold: a bug in this module or a misbehaving peer."""


class GMNotMember(GMError):
    """broadcast() on a member that is not (or no longer) in the group."""


class GMOverloaded(GMError):
    """broadcast() while `GMConfig.inflight_max` of this member's messages are not yet stable."""


# -- messages between members (msgpack arrays with an integer tag) ----------------------------


class JoinRecord(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """`member` was inserted right after `after`; `nonce` orders the joins `after` made."""

    member: str
    after: str
    nonce: int
    active: bool  # the join went round the ring and `after` let the member in


class MembershipState(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Everything a member knows about the group: a grow-only record, merged by union."""

    founders: tuple[str, ...]
    joins: tuple[JoinRecord, ...]
    dead: tuple[str, ...]


class Item(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One sender's part of an Activity: its messages `first_seq`.. in order (``None`` marks the
    end of a dead sender's stream), and `acked`: every member has the sender's messages up to
    there (0 when the item says nothing about acks)."""

    sender: str
    acked: int
    first_seq: int
    payloads: tuple[bytes | None, ...]


class StreamState(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A member's cache of one sender's messages: `pending` are seqs `acked`+1.. in order."""

    sender: str
    acked: int
    ended: int  # seq of the end-of-stream marker, 0 while the sender lives
    pending: tuple[bytes | None, ...]


class Activity(msgspec.Struct, tag=1, array_like=True, frozen=True, gc=False):
    """Left neighbour → right neighbour: messages, acks and (when it changed) membership.
    `full`: a catchup, carrying everything the sender caches (after a change of neighbour)."""

    membership: MembershipState | None
    items: tuple[Item, ...]
    full: bool = False


class JoinRequest(msgspec.Struct, tag=2, array_like=True, frozen=True, gc=False):
    """Newcomer → the member it wants to follow in the ring."""


class Welcome(msgspec.Struct, tag=3, array_like=True, frozen=True, gc=False):
    """Left neighbour → newcomer once the join went round: the group and the left's caches."""

    membership: MembershipState
    streams: tuple[StreamState, ...]


class JoinRefused(msgspec.Struct, tag=4, array_like=True, frozen=True, gc=False):
    reason: str


class Probe(msgspec.Struct, tag=5, array_like=True, frozen=True, gc=False):
    """"Are you in the ring?" — asked of a newcomer whose inserter died before we learned
    whether it let the newcomer in. Answered with a Notice."""


class Notice(msgspec.Struct, tag=6, array_like=True, frozen=True, gc=False):
    """Facts anyone may tell anyone: these members are dead, these newcomers are in the ring."""

    dead: tuple[str, ...]
    active: tuple[str, ...]


class Resync(msgspec.Struct, tag=7, array_like=True, frozen=True, gc=False):
    """Right neighbour → left neighbour: "send me everything you cache" (it became our left,
    or what it sent does not follow on from what we hold)."""


Message = Activity | JoinRequest | Welcome | JoinRefused | Probe | Notice | Resync

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    return _decoder.decode(data)


def answer_for_absent(member_id: MemberId, msg: Message) -> Message | None:
    """What a node answers for a member id it does not run (never created, or gone): that
    member is dead. Member ids are never reused, so this is always true. Returns the reply
    to send back to the message's sender, or None."""
    if isinstance(msg, (Activity, Probe, Resync)):
        return Notice((member_id,), ())
    if isinstance(msg, JoinRequest):
        # a newcomer asked a member that is gone (a leader replaced since the newcomer looked
        # it up): refused, so that it fails and looks the group up again instead of waiting
        return JoinRefused(f"{member_id} does not exist")
    return None


# -- events for the owner of a member -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deliver:
    """`sender`'s message number `seq`, in sender order (a member's own messages included)."""

    sender: MemberId
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Stable:
    """Every member in the ring has this member's messages up to `seq`."""

    seq: int


@dataclass(frozen=True, slots=True)
class MembersChanged:
    """The group as this member reports it. A death comes after the dead member's last
    message (the same last message at every survivor); a birth when the newcomer was let in."""

    version: int  # counts this member's MembersChanged events
    members: tuple[MemberId, ...]  # ring order
    births: tuple[MemberId, ...]
    deaths: tuple[MemberId, ...]


@dataclass(frozen=True, slots=True)
class JoinFailed:
    reason: str


@dataclass(frozen=True, slots=True)
class Removed:
    """This member is out of the group for good (it left, or the group declared it dead)."""

    reason: str


Event = Deliver | Stable | MembersChanged | JoinFailed | Removed


@dataclass(frozen=True, slots=True)
class GMConfig:
    batch_bytes_max: int = 1 << 20  # payload bytes per Activity (a message carries one payload at least)
    inflight_max: int = 1 << 17  # own messages broadcast but not yet stable


def build_ring(founders: Sequence[str], joins: Iterable[tuple[str, str, int]]) -> list[str]:
    """Ring order from the founders and join records (member, after, nonce): each member is
    followed by the members inserted after it, the latest first (each was inserted right
    after its inserter), each followed by its own joiners. Dead members keep their place."""
    children: dict[str, list[tuple[int, str]]] = {}
    for member, after, nonce in joins:
        children.setdefault(after, []).append((nonce, member))
    out: list[str] = []
    for f in founders:
        stack = [f]
        while stack:
            m = stack.pop()
            out.append(m)
            kids = children.get(m)
            if kids:
                stack.extend(c for _, c in sorted(kids))  # latest pops first
    return out


class _Stream:
    """This member's view of one sender's stream. `pending` holds seqs acked+1..received."""

    __slots__ = ("received", "acked", "deliver_from", "ended", "pending")

    def __init__(self, received: int = 0, acked: int = 0, deliver_from: int = 0, ended: int = 0,
                 pending: Iterable[bytes | None] = ()) -> None:
        self.received = received
        self.acked = acked
        self.deliver_from = deliver_from  # seqs at or below were before this member joined
        self.ended = ended
        self.pending: deque[bytes | None] = deque(pending)


_ITEM_OVERHEAD_BYTES = 16


class GMMember:
    """One member of one GM group. Create with `GMMember.create` (a founder) or
    `GMMember.joiner` (a newcomer); feed inputs; drain `take_messages()` / `take_events()`."""

    # -- construction ---------------------------------------------------------------------

    def __init__(self, member_id: MemberId, config: GMConfig | None = None) -> None:
        self.id = member_id
        self.cfg = config or GMConfig()
        self.status = JOINING
        self._founders: tuple[str, ...] = ()
        self._joins: dict[str, list] = {}  # member -> [after, nonce, active]
        self._dead: set[str] = set()
        self._ms_version = 0
        self._ms_wire: MembershipState | None = None
        self._ring: list[str] = []
        self._pos: dict[str, int] = {}
        self._left: str | None = None
        self._right: str | None = None
        self._alone = False
        self._aliases: set[str] = set()  # dead members this member is heir of
        self._streams: dict[str, _Stream] = {}
        self._left_has: dict[str, int] = {}  # per sender: highest seq the left neighbour holds
        self._outbox: dict[str, list] = {}  # sender -> [first_seq, payloads, ack]
        self._catchup_due = False
        self._sent_ms_version = -1
        self._msgs: list[tuple[str, Message]] = []
        self._events: list[Event] = []
        self._reported: set[str] = set()
        self._ever_reported: set[str] = set()
        self._view_version = 0
        self._probed: set[str] = set()
        self._told_dead: set[str] = set()
        self._deaths_told: set[str] = set()  # dead members told so when this one learnt it (`_tell_dead`)
        self._welcomed: set[str] = set()
        self._eos_dead: list[str] = []
        self._resync_sent = False
        # joining only
        self._via: str | None = None
        self._pre_dead: set[str] = set()
        self._probers: list[str] = []

    @classmethod
    def create(cls, member_id: MemberId, members: Sequence[MemberId], config: GMConfig | None = None) -> GMMember:
        """A founding member: every founder is created with the same `members` (ring order)."""
        if member_id not in members or len(set(members)) != len(members):
            raise ValueError("members must list each founder once, this one included")
        m = cls(member_id, config)
        m.status = MEMBER
        m._founders = tuple(members)
        m._streams[member_id] = _Stream()
        m._reported = set(members)
        m._ever_reported = set(members)
        m._rebuild_ring()
        m._recompute()
        m._catchup_due = False  # every founder starts with the same (empty) state
        m._sent_ms_version = m._ms_version
        m._msgs.clear()
        m._resync_sent = False
        return m

    @classmethod
    def joiner(cls, member_id: MemberId, via: MemberId, config: GMConfig | None = None) -> GMMember:
        """A newcomer asking to be inserted into the ring right after `via`. It becomes a
        member when `via` has made the join known round the ring and sends it a Welcome; it
        delivers only messages that reach it after that. `member_id` must never have been
        used in this group before (ids of dead or failed members are never reused)."""
        m = cls(member_id, config)
        m._via = via
        m._msgs.append((via, JoinRequest()))
        return m

    # -- queries ------------------------------------------------------------------------------

    @property
    def members(self) -> tuple[MemberId, ...]:
        """The group as last reported in events, in ring order."""
        return tuple(m for m in self._ring if m in self._reported)

    @property
    def view_version(self) -> int:
        return self._view_version

    @property
    def left(self) -> MemberId | None:
        return self._left

    @property
    def right(self) -> MemberId | None:
        return self._right

    @property
    def inflight(self) -> int:
        """Own messages broadcast and not yet stable."""
        st = self._streams.get(self.id)
        return 0 if st is None else st.received - st.acked

    def cached_count(self) -> int:
        """Messages held until their ack passes (all senders, own included)."""
        return sum(len(st.pending) for st in self._streams.values())

    def received_upto(self, sender: MemberId) -> int:
        st = self._streams.get(sender)
        return 0 if st is None else st.received

    def joined_after(self, sender: MemberId) -> int:
        """Seqs of `sender` at or below this were sent before this member joined (0 for founders)."""
        st = self._streams.get(sender)
        return 0 if st is None else st.deliver_from

    def ended_at(self, sender: MemberId) -> int:
        """Seq of the end marker of a dead sender's stream, 0 if not (yet) ended here."""
        st = self._streams.get(sender)
        return 0 if st is None else st.ended

    def peers(self) -> list[MemberId]:
        """Every other member this one knows of (alive or not), and the member it asked to join."""
        out = [m for m in self._ring if m != self.id]
        if self._via is not None and self._via not in out:
            out.append(self._via)
        return out

    def known_dead(self) -> frozenset[MemberId]:
        return frozenset(self._dead)

    # -- outputs ------------------------------------------------------------------------------

    def take_messages(self) -> list[tuple[MemberId, Message]]:
        """Messages to send, each to one member, in order (the link per pair must be FIFO)."""
        if self.status == MEMBER and self._right is not None:
            self._flush_to(self._right)
        else:
            self._outbox.clear()
        out, self._msgs = self._msgs, []
        return out

    def take_events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    # -- inputs -------------------------------------------------------------------------------

    def broadcast(self, payload: bytes) -> int:
        """Send `payload` to every member; returns its seq. Delivered here at once."""
        if self.status != MEMBER:
            raise GMNotMember(f"{self.id} is {self.status}")
        st = self._streams[self.id]
        if st.received - st.acked >= self.cfg.inflight_max:
            raise GMOverloaded(f"{st.received - st.acked} messages not yet stable")
        seq = st.received + 1
        st.received = seq
        st.pending.append(payload)
        self._events.append(Deliver(self.id, seq, payload))
        if self._alone:
            self._settle(self.id)
        else:
            self._forward(self.id, seq, payload)
        return seq

    def member_down(self, member: MemberId) -> None:
        """The failure detector says `member` is dead. The runtime must report it only after
        the last message that will ever arrive from it (as a closed FIFO link does)."""
        if member == self.id:
            return
        if self.status == JOINING:
            if member == self._via:
                self._fail(f"{member} died before letting this member in")
            else:
                self._pre_dead.add(member)
            return
        if self.status != MEMBER or member in self._dead:
            return
        self._dead.add(member)
        self._changed()

    def leave(self) -> None:
        """Leave the group: what this member has sent on stays in the group; it then counts as
        dead (its right neighbour ends its stream)."""
        if self.status == JOINING:
            self._fail("left before joining")
            return
        if self.status != MEMBER:
            return
        if self._right is not None:
            self._flush_to(self._right)
        for n in dict.fromkeys((self._right, self._left)):  # (ordered: replays must not depend on hashing)
            if n is not None:
                self._msgs.append((n, Notice((self.id,), ())))
        self._remove("left the group")

    def receive(self, frm: MemberId, msg: Message) -> None:
        if isinstance(msg, Activity):
            self._on_activity(frm, msg)
        elif isinstance(msg, Probe):
            self._on_probe(frm)
        elif isinstance(msg, Notice):
            self._on_notice(msg)
        elif isinstance(msg, JoinRequest):
            self._on_join_request(frm)
        elif isinstance(msg, Welcome):
            self._on_welcome(frm, msg)
        elif isinstance(msg, Resync):
            if self.status != MEMBER:
                self._on_activity(frm, Activity(None, ()))  # answered as any traffic to a non-member
            elif frm == self._right:
                self._catchup_due = True
                self._sent_ms_version = -1
        elif isinstance(msg, JoinRefused):
            if self.status == JOINING and frm == self._via:
                self._fail(f"{frm} refused: {msg.reason}")
        else:
            raise GMInvariantError(f"unknown message {msg!r}")

    # -- membership -----------------------------------------------------------------------------

    def _rebuild_ring(self) -> None:
        self._ring = build_ring(self._founders, ((m, r[0], r[1]) for m, r in self._joins.items()))
        self._pos = {m: i for i, m in enumerate(self._ring)}

    def _membership_wire(self) -> MembershipState:
        if self._ms_wire is None:
            self._ms_wire = MembershipState(
                self._founders,
                tuple(JoinRecord(m, r[0], r[1], r[2]) for m, r in self._joins.items()),
                tuple(sorted(self._dead)))
        return self._ms_wire

    def _is_active(self, m: str) -> bool:
        rec = self._joins.get(m)
        return rec is None or rec[2]

    def _merge(self, ms: MembershipState) -> bool:
        """Union `ms` into what this member knows; True if anything changed."""
        if ms.founders != self._founders:
            raise GMInvariantError(f"membership of another group: {ms.founders} != {self._founders}")
        changed = joins_changed = False
        for jr in ms.joins:
            rec = self._joins.get(jr.member)
            if rec is None:
                self._joins[jr.member] = [jr.after, jr.nonce, jr.active]
                changed = joins_changed = True
            elif rec[0] != jr.after or rec[1] != jr.nonce:
                raise GMInvariantError(f"two joins for one id {jr.member}")
            elif jr.active and not rec[2]:
                rec[2] = True
                changed = True
        for d in ms.dead:
            if d not in self._dead:
                self._dead.add(d)
                changed = True
        if joins_changed:
            self._rebuild_ring()
        return changed

    def _changed(self) -> None:
        """Membership knowledge grew: re-derive neighbours, heirs and the reported view."""
        self._ms_version += 1
        self._ms_wire = None
        if self.id in self._dead:
            self._remove("declared dead by the group")
            return
        self._tell_dead()
        self._recompute()

    def _tell_dead(self) -> None:
        """Tell each member newly known dead that it is: one declared dead on a false suspicion
        may be alive, and an idle one (a mirror only passes on what reaches it) would otherwise
        never hear of it, since the ring now closes past it. Every member that learns of the
        death tells it once, so the news gets through while some links are still down; one that
        still missed it is told again when it speaks (`_on_activity`)."""
        told = self._deaths_told
        for d in sorted(self._dead - told):  # (not this member: `_changed` removed it if it is dead)
            told.add(d)
            self._msgs.append((d, Notice((d,), ())))

    def _recompute(self) -> None:
        ring, dead, joins, me = self._ring, self._dead, self._joins, self.id
        n = len(ring)
        pos = self._pos[me]
        probes: list[str] = []
        # Right neighbour: the next member round the ring that is alive and let in. A newcomer
        # whose inserter died may or may not have been let in: ask it, and hold sends.
        right = None
        for k in range(1, n):
            m = ring[(pos + k) % n]
            if m in dead:
                continue
            rec = joins.get(m)
            if rec is None or rec[2]:
                right = m
                break
            if rec[0] == me or rec[0] not in dead:
                continue  # not let in yet (its live inserter comes first round the ring)
            probes.append(m)
            break
        # Left neighbour and the dead members just before this one (it is their heir).
        left = None
        blocked = False
        aliases: list[str] = []
        collecting = True
        for k in range(1, n):
            m = ring[(pos - k) % n]
            if m in dead:
                if collecting:
                    aliases.append(m)
                continue
            rec = joins.get(m)
            if rec is None or rec[2]:
                left = m
                break
            collecting = False
            if rec[0] == me or rec[0] not in dead:
                continue
            probes.append(m)
            blocked = True
            break
        self._alone = left is None and not blocked
        if right != self._right:
            self._set_right(right)
        if left != self._left:
            self._left = left
            self._left_has = {}
            self._resync_sent = False
            if left is not None:
                self._ask_resync()
        for m in probes:
            if m not in self._probed:
                self._probed.add(m)
                self._msgs.append((m, Probe()))
        self._report_births()
        for a in aliases:
            if a not in self._aliases:
                self._aliases.add(a)
                self._inherit(a)
        if self._alone:
            mine = [m for m, r in joins.items() if r[0] == me and not r[2] and m not in dead]
            if mine:
                self._activate(mine)
                return
            for s in list(self._streams):
                if s == me or s in self._aliases:
                    self._settle(s)

    def _report_births(self) -> None:
        births = []
        for m in self._ring:
            if m in self._ever_reported or not self._is_active(m):
                continue
            self._ever_reported.add(m)
            st = self._streams.get(m)
            if st is None or not st.ended:  # (one that died before we knew it was let in: no news)
                births.append(m)
        if births:
            births = tuple(births)
            self._reported.update(births)
            self._ever_reported.update(births)
            self._view_version += 1
            self._events.append(MembersChanged(self._view_version, self.members, births, ()))

    def _set_right(self, new: str | None) -> None:
        old = self._right
        if old is not None and old not in self._dead:
            self._flush_to(old)  # a newcomer was let in between: what we had for old goes to it
        self._outbox.clear()
        self._right = new
        if new is None:
            return
        if new in self._welcomed:
            self._catchup_due = False
            self._sent_ms_version = self._ms_version
        else:
            self._catchup_due = True  # it may lack anything we hold: send it all
            self._sent_ms_version = -1

    # -- joins ----------------------------------------------------------------------------------

    def _on_join_request(self, frm: str) -> None:
        if self.status != MEMBER:
            self._msgs.append((frm, JoinRefused(f"{self.id} is {self.status}")))
            return
        rec = self._joins.get(frm)
        if rec is not None and rec[0] == self.id:
            return  # a repeated request
        if frm in self._dead or rec is not None or frm in self._founders:
            self._msgs.append((frm, JoinRefused(f"{frm} is already known to the group")))
            return
        nonce = 1 + max((r[1] for r in self._joins.values() if r[0] == self.id), default=0)
        self._joins[frm] = [self.id, nonce, False]
        self._rebuild_ring()
        self._changed()  # the join goes round in the membership; _recompute lets it in if alone

    def _check_joins_went_round(self, ms: MembershipState) -> None:
        """`ms` came from our left neighbour: every member round the ring knows the joins in
        it, so the newcomers we inserted can be let in."""
        mine = {m for m, r in self._joins.items() if r[0] == self.id and not r[2] and m not in self._dead}
        if not mine:
            return
        seen = [jr.member for jr in ms.joins if jr.member in mine]
        if seen:
            self._activate(seen)

    def _activate(self, newcomers: list[str]) -> None:
        for m in newcomers:
            self._joins[m][2] = True
        self._ms_version += 1
        self._ms_wire = None
        welcome = Welcome(self._membership_wire(), self._snapshot())
        for m in newcomers:
            self._welcomed.add(m)
            self._msgs.append((m, welcome))
        self._recompute()
        self._welcomed.clear()

    def _snapshot(self) -> tuple[StreamState, ...]:
        return tuple(StreamState(s, st.acked, st.ended, tuple(st.pending)) for s, st in self._streams.items())

    def _on_welcome(self, frm: str, msg: Welcome) -> None:
        if self.status != JOINING or frm != self._via:
            return
        ms = msg.membership
        self._founders = ms.founders
        self._joins = {jr.member: [jr.after, jr.nonce, jr.active] for jr in ms.joins}
        self._dead = set(ms.dead) | self._pre_dead
        if self.id in self._dead or not self._is_active(self.id):
            raise GMInvariantError(f"welcome for {self.id} that does not let it in")
        for ss in msg.streams:
            received = ss.acked + len(ss.pending)
            self._streams[ss.sender] = _Stream(received, ss.acked, received, ss.ended, ss.pending)
        self._streams.setdefault(self.id, _Stream())
        self._rebuild_ring()
        self.status = MEMBER
        self._reported = {m for m in self._ring if self._is_active(m)
                          and not (m in self._streams and self._streams[m].ended)}
        self._ever_reported = {m for m in self._ring if self._is_active(m)}
        self._ms_version = 1
        self._recompute()
        if self._left == frm:  # the Welcome was its catchup
            self._msgs = [(to, m) for to, m in self._msgs if not isinstance(m, Resync)]
            self._resync_sent = False
            self._left_has = {s: st.received for s, st in self._streams.items()}
        self._view_version += 1
        self._events.append(MembersChanged(self._view_version, self.members, (self.id,), ()))
        for p in self._probers:
            self._msgs.append((p, Notice((), (self.id,))))
        self._probers.clear()

    def _fail(self, reason: str) -> None:
        self.status = FAILED
        self._events.append(JoinFailed(reason))
        for p in self._probers:
            self._msgs.append((p, Notice((self.id,), ())))
        self._probers.clear()

    def _remove(self, reason: str) -> None:
        for m, r in self._joins.items():  # newcomers we never let in must not wait for us
            if r[0] == self.id and not r[2] and m not in self._dead:
                self._msgs.append((m, JoinRefused(f"{self.id} {reason}")))
        self.status = REMOVED
        self._dead.add(self.id)
        self._outbox.clear()
        self._events.append(Removed(reason))

    def _on_probe(self, frm: str) -> None:
        if self.status == MEMBER:
            self._msgs.append((frm, Notice((), (self.id,))))
        elif self.status == JOINING:
            if frm not in self._probers:
                self._probers.append(frm)
        else:
            self._msgs.append((frm, Notice((self.id,), ())))

    def _on_notice(self, msg: Notice) -> None:
        if self.status != MEMBER:
            return
        changed = False
        for d in msg.dead:
            if d not in self._dead:
                self._dead.add(d)
                changed = True
        for a in msg.active:
            rec = self._joins.get(a)
            if rec is not None and not rec[2]:
                rec[2] = True
                changed = True
        if changed:
            self._changed()

    # -- the ring -------------------------------------------------------------------------------

    def _stream(self, s: str) -> _Stream:
        st = self._streams.get(s)
        if st is None:
            st = self._streams[s] = _Stream()
        return st

    def _forward(self, s: str, seq: int, payload: bytes | None) -> None:
        e = self._outbox.get(s)
        if e is None:
            self._outbox[s] = [seq, [payload], 0]
        elif e[0] == 0:
            e[0] = seq
            e[1].append(payload)
        else:
            if e[0] + len(e[1]) != seq:
                raise GMInvariantError(f"forwarding {s}:{seq} after {s}:{e[0] + len(e[1]) - 1}")
            e[1].append(payload)

    def _forward_ack(self, s: str, acked: int) -> None:
        if s == self._right:
            return  # the sender released these when they came back to it
        e = self._outbox.get(s)
        if e is None:
            self._outbox[s] = [0, [], acked]
        elif acked > e[2]:
            e[2] = acked

    def _on_activity(self, frm: str, msg: Activity) -> None:
        if self.status != MEMBER:
            if self.status == JOINING:  # someone believes we are in: tell it how the join ends
                if frm not in self._probers:
                    self._probers.append(frm)
            elif frm not in self._told_dead:
                self._told_dead.add(frm)
                self._msgs.append((frm, Notice((self.id,), ())))
            return
        if msg.membership is not None and self._merge(msg.membership):
            self._changed()
            if self.status != MEMBER:
                return
        if frm in self._dead:
            if frm not in self._told_dead:
                self._told_dead.add(frm)
                self._msgs.append((frm, Notice((frm,), ())))
            return
        if frm != self._left:
            return  # a stale route: our left neighbour resends all it holds when asked
        if msg.full:
            self._resync_sent = False
        origin_touched: list[str] = []
        me, aliases, left_has = self.id, self._aliases, self._left_has
        events = self._events
        for it in msg.items:
            s = it.sender
            st = self._streams.get(s)
            if st is None:
                st = self._streams[s] = _Stream()
            payloads = it.payloads
            last = it.first_seq + len(payloads) - 1
            h = it.acked if it.acked > last else last
            if h > left_has.get(s, 0):
                left_has[s] = h
            if s == me or s in aliases:
                if last > st.received:
                    raise GMInvariantError(f"{me} got {s}:{last} back but holds only up to {st.received}")
                origin_touched.append(s)
                continue
            if it.first_seq > st.received + 1 or it.acked > st.received:
                self._ask_resync()  # we dropped some of what the left sent: it resends all
                continue
            if last > st.received:
                start = st.received + 1 - it.first_seq
                for i in range(start, len(payloads)):
                    if st.ended:
                        raise GMInvariantError(f"{me}: {s}:{it.first_seq + i} after its end {st.ended}")
                    seq = it.first_seq + i
                    p = payloads[i]
                    st.pending.append(p)
                    st.received = seq
                    if p is None:
                        st.ended = seq
                        if seq > st.deliver_from:
                            self._on_end(s)
                    elif seq > st.deliver_from:
                        events.append(Deliver(s, seq, p))
                    self._forward(s, seq, p)
            if it.acked > st.acked:
                pend = st.pending
                for _ in range(it.acked - st.acked):
                    pend.popleft()
                st.acked = it.acked
                self._forward_ack(s, it.acked)
        for s in origin_touched:
            self._settle(s)
        if msg.membership is not None:
            self._check_joins_went_round(msg.membership)
        if self._eos_dead:
            new = [d for d in self._eos_dead if d not in self._dead]
            self._eos_dead.clear()
            if new:
                self._dead.update(new)
                self._changed()

    def _ask_resync(self) -> None:
        if not self._resync_sent and self._left is not None:
            self._resync_sent = True
            self._msgs.append((self._left, Resync()))

    def _settle(self, s: str) -> None:
        """For a stream this member originates (its own, or a dead member's it is heir of):
        what the left neighbour holds went all the way round; stop it and ack it."""
        st = self._streams[s]
        upto = st.received if self._alone else min(self._left_has.get(s, 0), st.received)
        if upto <= st.acked:
            return
        pend = st.pending
        for _ in range(upto - st.acked):
            pend.popleft()
        st.acked = upto
        self._forward_ack(s, upto)
        if s == self.id:
            self._events.append(Stable(upto))

    def _inherit(self, x: str) -> None:
        """This member became heir of dead `x`: end x's stream after everything held here
        (nothing more of x's can reach any survivor but through here) and ack for it."""
        st = self._stream(x)
        if not st.ended:
            seq = st.received + 1
            st.pending.append(None)
            st.received = seq
            st.ended = seq
            if seq > st.deliver_from:
                self._on_end(x)
            self._forward(x, seq, None)
        self._settle(x)

    def _on_end(self, x: str) -> None:
        if x not in self._dead:
            self._eos_dead.append(x)
        if x in self._reported:
            self._reported.discard(x)
            self._view_version += 1
            self._events.append(MembersChanged(self._view_version, self.members, (), (x,)))

    def _flush_to(self, to: str) -> None:
        ms = None
        if self._sent_ms_version != self._ms_version:
            ms = self._membership_wire()
            self._sent_ms_version = self._ms_version
        full = self._catchup_due
        if full:
            self._catchup_due = False
            raw = [(s, st.acked, st.acked + 1, st.pending) for s, st in self._streams.items()]
        else:
            raw = [(s, e[2], e[0] or 1, e[1]) for s, e in self._outbox.items()]
        self._outbox.clear()
        if ms is None and not raw:
            return
        limit = self.cfg.batch_bytes_max
        items: list[Item] = []
        size = 0
        for s, acked, first, pend in raw:
            payloads = tuple(pend)
            n = len(payloads)
            i = 0
            while True:
                j = i
                while j < n:
                    p = payloads[j]
                    c = (len(p) if p is not None else 0) + 8
                    if size + c > limit and size > 0:
                        break
                    size += c
                    j += 1
                if j == n:
                    items.append(Item(s, acked, first + i, payloads[i:] if i else payloads))
                    size += _ITEM_OVERHEAD_BYTES
                    break
                if j > i:
                    items.append(Item(s, 0, first + i, payloads[i:j]))
                self._msgs.append((to, Activity(ms, tuple(items), full)))
                ms = None
                items = []
                size = 0
                i = j
        self._msgs.append((to, Activity(ms, tuple(items), full)))
