"""A linearizability checker for one register (read / write / compare-and-set), WGL style.

The search is the Wing-Gong algorithm with Lowe's memoisation, as Knossos and Porcupine use
it: walk the history's call and return events in time order; at a call, try to linearize
that operation now (if the model allows its result) and remove it; at a return whose
operation has not been linearized, backtrack to the last choice. A (set of linearized
operations, model state) pair already explored is not explored again.

Operations whose outcome the client never learned (a write or cas that timed out, or whose
node crashed) return at +infinity and may or may not have taken effect. To keep the model
deterministic the state is the *set* of values the register may hold (Porcupine's trick for
nondeterministic models), so an unknown write `w(v)` maps S to S | {v}. Reads that timed out
told nobody anything and are left out of the history by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

READ, WRITE, CAS = "read", "write", "cas"
INFINITY = float("inf")


@dataclass(slots=True)
class Op:
    """One client operation. `ret_time` None = unknown outcome. For cas, `result` is True/False."""

    client: int
    kind: str
    call_time: float
    ret_time: float | None
    arg: object = None  # write: value; cas: (expected, new)
    result: object = None  # read: value seen; cas: succeeded?


def _step(states: frozenset, op: Op) -> frozenset:
    """The register model: the possible values after `op`, or empty if `op` cannot happen now."""
    unknown = op.ret_time is None
    if op.kind == WRITE:
        return states | {op.arg} if unknown else frozenset((op.arg,))
    if op.kind == READ:
        return frozenset((op.result,)) if op.result in states else frozenset()
    expected, new = op.arg
    if unknown:
        return states | {new} if expected in states else states
    if op.result:
        return frozenset((new,)) if expected in states else frozenset()
    rest = states - {expected}
    return rest


class _Node:
    __slots__ = ("op_id", "is_call", "match", "prev", "next")

    def __init__(self, op_id: int, is_call: bool) -> None:
        self.op_id = op_id
        self.is_call = is_call
        self.match: _Node | None = None
        self.prev: _Node | None = None
        self.next: _Node | None = None


def check_register(ops: list[Op], initial: object = None, max_steps: int = 2_000_000) -> bool | None:
    """True if the history is linearizable, False if not, None if the search ran out of steps."""
    events: list[tuple[float, int, int]] = []  # (time, 0 call / 1 return, op id)
    for i, op in enumerate(ops):
        ret = INFINITY if op.ret_time is None else op.ret_time
        if ret < op.call_time:
            raise ValueError(f"operation {i} returns before it is called")
        events.append((op.call_time, 0, i))
        events.append((ret, 1, i))
    # Calls sort before returns at the same time: treating touching operations as concurrent
    # can only make the checker more lenient, never report a false violation.
    events.sort()
    head = _Node(-1, False)
    prev = head
    calls: dict[int, _Node] = {}
    for _, kind, i in events:
        n = _Node(i, kind == 0)
        if kind == 0:
            calls[i] = n
        else:
            calls[i].match = n
        prev.next = n
        n.prev = prev
        prev = n

    def lift(n: _Node) -> None:
        n.prev.next = n.next
        if n.next is not None:
            n.next.prev = n.prev
        m = n.match
        m.prev.next = m.next
        if m.next is not None:
            m.next.prev = m.prev

    def unlift(n: _Node) -> None:
        m = n.match
        m.prev.next = m
        if m.next is not None:
            m.next.prev = m
        n.prev.next = n
        if n.next is not None:
            n.next.prev = n

    state = frozenset((initial,))
    linearized = 0
    seen: set[tuple[int, frozenset]] = set()
    stack: list[tuple[_Node, frozenset]] = []
    entry = head.next
    steps = 0
    while head.next is not None:
        steps += 1
        if steps > max_steps:
            return None
        if entry.is_call:
            nxt = _step(state, ops[entry.op_id])
            if nxt:
                lin = linearized | (1 << entry.op_id)
                key = (lin, nxt)
                if key not in seen:
                    seen.add(key)
                    stack.append((entry, state))
                    state = nxt
                    linearized = lin
                    lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:
            if not stack:
                return False
            entry, state = stack.pop()
            linearized &= ~(1 << entry.op_id)
            unlift(entry)
            entry = entry.next
    return True
