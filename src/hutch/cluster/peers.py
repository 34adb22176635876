"""The narrow peer service the queue-type glue talks to: who this node is, which run of it
this is, which peers are up, sending to a peer, node-scoped ids, and one table of requests
waiting for an answer.

Every part of a node that speaks to other nodes about queues (queues homed elsewhere,
mirrored classic queues, quorum queues) uses this service instead of a back-reference to the
broker: it needs only `send`, `call`, `new_id`, `is_up`, `incarnation_of` and the node's name.

Ids. `new_id()` draws from one counter per run of the node, so an id is never handed out twice
while the node runs; the counter's high bits are random per run, so that ids of a restarted
node do not meet the ids its earlier run left in its peers' tables. `owner_id()` names a
publisher, consumer or requester cluster-wide as "node/incarnation/n" (RabbitMQ names them by
pid; an Erlang pid is not reused while anything still refers to it, and neither is this).
Nothing here may ever derive an id from `id()` of an object: CPython reuses addresses.

Requests (`Requests`). One table, rid -> callback, for everything answered once: calls to a
named peer (failed with `None` when that peer goes down) and proposals that may be answered
by whichever node leads a Raft group (peer `None`: only their deadline fails them). Every
entry has a deadline (`inf` for those the caller resends until answered); `expire(now_s)`
fails the ones past it. The table is bounded by `REQUESTS_MAX`.

Must never: do I/O itself (sending is the `send` callable the runtime gives), read a clock
(times come in as arguments), or import anything from `hutch.broker` or above.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

REQUESTS_MAX = 1_000_000  # requests waiting for an answer on one node (calls, proposals, consumes)
ID_COUNTER_BITS = 32  # the low bits of an id count; the high bits are random per run
NO_DEADLINE = float("inf")


class RequestLimitError(Exception):
    """More requests in flight than REQUESTS_MAX: a bug (something is not answered or failed)."""


class Pending:
    """One request waiting for its answer. `state` belongs to whoever opened it (a quorum
    proposal keeps its resend data there); the table never looks at it."""

    __slots__ = ("rid", "peer", "callback", "deadline_s", "tag", "state")

    def __init__(self, rid: int, peer: str | None, callback: Callable[[Any], None], deadline_s: float, tag: str,
                 state: Any):
        self.rid = rid
        self.peer = peer
        self.callback = callback
        self.deadline_s = deadline_s
        self.tag = tag
        self.state = state


class Requests:
    """rid -> Pending; see the module docstring."""

    def __init__(self) -> None:
        self._pending: dict[int, Pending] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, rid: int) -> bool:
        return rid in self._pending

    def open(self, rid: int, callback: Callable[[Any], None], peer: str | None = None,
             deadline_s: float = NO_DEADLINE, tag: str = "", state: Any = None, replace: bool = False) -> Pending:
        """Wait for the answer carrying `rid`; `replace`: a request asked again under the same
        id (a consumer attaching again) takes the place of the one before."""
        assert replace or rid not in self._pending, f"request id {rid} is already waiting for an answer"
        if len(self._pending) >= REQUESTS_MAX:
            raise RequestLimitError(f"{len(self._pending)} requests in flight (REQUESTS_MAX)")
        p = self._pending[rid] = Pending(rid, peer, callback, deadline_s, tag, state)
        return p

    def get(self, rid: int) -> Pending | None:
        return self._pending.get(rid)

    def take(self, rid: int) -> Pending | None:
        """Remove and return the request (its answer came, or its owner gives up on it)."""
        return self._pending.pop(rid, None)

    def answer(self, rid: int, result: Any) -> bool:
        """Call back with the answer; False when nobody waits for `rid` (any more)."""
        p = self._pending.pop(rid, None)
        if p is None:
            return False
        p.callback(result)
        return True

    def tagged(self, tag: str) -> list[Pending]:
        """The requests one owner opened (a copy: callbacks may open or close others)."""
        return [p for p in self._pending.values() if p.tag == tag]

    def peer_down(self, peer: str) -> None:
        """`peer` will not answer: its requests fail with None."""
        gone = [p for p in self._pending.values() if p.peer == peer]
        for p in gone:
            del self._pending[p.rid]
        for p in gone:
            p.callback(None)

    def expire(self, now_s: float) -> None:
        """Requests past their deadline fail with None."""
        late = [p for p in self._pending.values() if now_s >= p.deadline_s]
        for p in late:
            del self._pending[p.rid]
        for p in late:
            p.callback(None)


class Peers:
    """This node as its peers know it, and the way to them. `send(peer, payload)` is the
    runtime's transport (False when the peer is not reachable); a payload to this node itself
    is handed to `deliver_local` on the next loop turn through `call_soon`."""

    def __init__(self, node: str, send: Callable[[str, Any], bool], is_up: Callable[[str], bool],
                 call_soon: Callable[..., Any], incarnation: int | None = None):
        self.node = node
        self.incarnation = incarnation or (int.from_bytes(os.urandom(8), "big") >> 1 or 1)
        self._send = send
        self.is_up = is_up
        self.call_soon = call_soon
        self.peer_incarnation: Callable[[str], int | None] = lambda _n: None  # set by the runtime
        self.deliver_local: Callable[[str, Any], None] = lambda _p, _m: None  # set by the owner
        self._id_base = int.from_bytes(os.urandom(4), "big") << ID_COUNTER_BITS
        self._next_id = 0
        self.requests = Requests()

    def new_id(self) -> int:
        """A number never handed out before by this run of this node."""
        self._next_id += 1
        assert self._next_id < (1 << ID_COUNTER_BITS), "id counter wrapped"
        return self._id_base | self._next_id

    def owner_id(self) -> str:
        """A publisher, consumer or requester id, unique in the cluster: node/incarnation/n."""
        return f"{self.node}/{self.incarnation}/{self.new_id()}"

    def incarnation_of(self, node: str) -> int | None:
        """The run of `node` this node is connected to (this node's own for itself)."""
        if node == self.node:
            return self.incarnation
        return self.peer_incarnation(node)

    def send(self, peer: str, payload: Any) -> bool:
        if peer == self.node:
            self.call_soon(self.deliver_local, peer, payload)
            return True
        return self._send(peer, payload)

    def call(self, peer: str, payload_of: Callable[[int], Any], callback: Callable[[Any], None],
             deadline_s: float = NO_DEADLINE) -> int:
        """Send `payload_of(rid)` to `peer` and call back once with its answer, or with None if
        the peer goes down (or cannot be reached, or the deadline passes) first."""
        rid = self.new_id()
        self.requests.open(rid, callback, peer, deadline_s)
        if not self.send(peer, payload_of(rid)):
            self.requests.take(rid)
            self.call_soon(callback, None)
        return rid

    def expect_reply(self, rid: int, peer: str, callback: Callable[[Any], None],
                     deadline_s: float = NO_DEADLINE) -> None:
        """callback(answer) for the reply that will carry `rid` (an id from new_id the caller
        already used), or callback(None) if `peer` goes down first."""
        self.requests.open(rid, callback, peer, deadline_s, replace=True)

    def peer_down(self, peer: str) -> None:
        self.requests.peer_down(peer)


def node_of(owner: str) -> str:
    """The node of an owner id ("node/incarnation/n")."""
    return owner.split("/", 1)[0]


def incarnation_in(owner: str) -> int | None:
    """The incarnation of an owner id ("node/incarnation/n"), None when it names none."""
    parts = owner.split("/", 2)
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None
