"""A quorum queue's deliveries to a consumer on another node, as its node receives them
(hutch.quorum.host, hutch.quorum.handle): the leader's state machine (hutch.quorum.fifo) checks
messages out to the consumer, and the outcomes travel to the consumer's node, where one may be
lost (a leader stopped between the commit and the send, a peer link that dropped). Every message
checked out to a live consumer must reach it, in order, and none twice without `redelivered`
(RabbitMQ's rabbit_fifo_client: consecutive deliveries per consumer, a gap is asked for again).

The consumer's node here is a real `QuorumHost` with no Raft group of its own; the test carries
its proposals to the leader's state machine and the leader's outcomes back, as the peer transport
would, and can drop any of them.
"""

from __future__ import annotations

from types import SimpleNamespace

import msgspec

from hutch.amqp import codec
from hutch.cluster import catalogue as cat
from hutch.cluster.peers import Peers
from hutch.queues.message import Message
from hutch.quorum import fifo
from hutch.quorum.handle import SETTLE_HOLD_MS, QuorumQueue
from hutch.quorum.host import (
    COUNTED_PROPS_MAX,
    RESEND_ASK_AGAIN_S,
    RETRY_LEADER_S,
    RETRY_S,
    Outcome,
    PublishDecided,
    QuorumHost,
    ToConsumer,
    _delivery,
    _QuorumApp,
)

GID = 7
NO_PROPS = b"\x00\x00"  # AMQP content properties with no flag set


class _Channel:
    closed = False
    global_prefetch = False


class _Consumer:
    """What the handle needs of the broker's consumer: a prefetch it counts against."""

    def __init__(self, prefetch: int):
        self.prefetch = prefetch
        self.no_ack = False
        self.channel = _Channel()
        self.tag = "ctag"
        self.priority = 0
        self.ref = ""
        self.got: list[tuple[bytes, bool]] = []  # (body, redelivered) as the client saw them
        self.unacked = 0

    def can_take(self) -> bool:
        return self.unacked < self.prefetch


class _Port:
    def __init__(self):
        self.t_ms = 1_800_000_000_000
        self.timers = True
        self.wakes: list[tuple] = []  # (callback, when) the handle asked the timer for
        self.dirty_queues: list = []

    def now_ms(self) -> int:
        return self.t_ms

    def metadata_timeout_ms(self) -> int:
        return 15_000

    def dirty(self, q) -> None:
        self.dirty_queues.append(q)

    def call_later(self, delay_ms: int, fn) -> bool:
        """The broker's timer: the test fires it (`Link.wake`); `timers` False: none."""
        if not self.timers:
            return False
        self.wakes.append((fn, self.t_ms + delay_ms))
        return True

    def schedule(self) -> None:
        pass

    def new_stats(self):
        return None

    def queue_settings(self, vhost, name, queue_type, args):
        """No policies: the queue's own arguments (here none: QuorumConfig's defaults)."""
        c = fifo.QuorumConfig()
        return SimpleNamespace(max_length=c.max_length, max_length_bytes=c.max_length_bytes, overflow=c.overflow,
                               delivery_limit=c.delivery_limit, dead_letter_exchange=c.dead_letter_exchange,
                               dead_letter_routing_key=c.dead_letter_routing_key, message_ttl_ms=c.message_ttl_ms,
                               expires_ms=c.expires_ms, warnings=[])

    def deliver(self, c, q, msg_id, delivery_count, redelivered, route, props, body) -> None:
        c.got.append((body, redelivered))
        c.unacked += 1


class Link:
    """The leader's node (its host carries out the state machine's effects) and the consumer's
    node, with the transport between them: what either sends is kept until the test hands it on."""

    def __init__(self):
        self.port = _Port()
        self.to_n1: list[list] = []  # the consumer's node's messages to the leader's
        self.to_n3: list[list] = []  # the leader's node's messages to the consumer's
        rec = cat.QueueRecord("/", "q", "quorum", leader_node="n1", member_nodes=("n1", "n2", "n4"),
                              journal_id=GID)
        self.leader = self._host("n1", self.to_n3)
        self.lq = QuorumQueue(self.leader, rec, fifo.QuorumConfig())
        self.lq.machine = self.state = fifo.QuorumQueueState()
        self.leader.queues[GID] = self.lq
        self.host = self._host("n3", self.to_n1)
        self.q = QuorumQueue(self.host, rec, fifo.QuorumConfig())
        self.host.queues[GID] = self.q

    def _host(self, node: str, outbox: list) -> QuorumHost:
        peers = Peers(node, lambda _peer, payload: outbox.append(payload) or True, lambda _n: True,
                      lambda fn, *a: fn(*a))
        return QuorumHost(peers, self.port)

    def apply(self, cmd, origin: str = "n1", req: int = 0) -> list:
        """The leader applies a command and sends what it decided; returns the outcomes for the
        consumer's node (the answer to its proposal `req` among them), not yet delivered."""
        self.leader.carry_out(self.lq, self.state.apply(cmd), origin, req)
        return self.sent_to_consumer()

    def sent_to_consumer(self) -> list:
        self.leader.flush()
        msgs, self.to_n3[:] = list(self.to_n3), []
        return [o for m in msgs for o in _outcomes.decode(m[1])]

    def proposals(self) -> list:
        """The consumer's node's proposals, applied by the leader; the outcomes for the consumer's node."""
        msgs, self.to_n1[:] = list(self.to_n1), []
        out = []
        for m in msgs:
            assert m[0] == "QP" and m[1] == GID
            origin, req, cmd = msgspec.msgpack.decode(m[2])
            out += self.apply(fifo.decode_command(cmd), origin, req)
        return out

    def consume(self, prefetch: int) -> _Consumer:
        c = _Consumer(prefetch)
        self.q.consume(c, lambda _r: None)
        self.arrive(self.proposals())
        return c

    def publish(self, *bodies: bytes) -> list:
        return [o for b in bodies for o in self.apply(fifo.Enqueue("", "q", NO_PROPS, b, now_ms=self.port.t_ms))]

    def arrive(self, outcomes: list) -> None:
        self.host.on_effects(_outcomes_enc.encode(outcomes))

    def new_leader(self) -> list:
        """A new leader's unasked resend to each live consumer (QuorumHost.leadership_changed)."""
        self.leader.carry_out(self.lq, self.state.resends(), "n1", 0)
        return self.sent_to_consumer()

    def settle(self, c: _Consumer) -> None:
        for msg_id in list(self.q._owner):
            self.q.settle(msg_id)
        c.unacked = 0
        self.q.flush()
        self.wake()
        self.arrive(self.proposals())

    def wake(self) -> None:
        """The timers asked for fire, time moving to each; the broker's run then flushes the
        queues they made dirty."""
        wakes, self.port.wakes = self.port.wakes, []
        for fn, when in wakes:
            self.port.t_ms = max(self.port.t_ms, when)
            fn()
        dirty, self.port.dirty_queues = self.port.dirty_queues, []
        for q in dict.fromkeys(dirty):
            q.flush()


_outcomes = msgspec.msgpack.Decoder(list[Outcome])
_outcomes_enc = msgspec.msgpack.Encoder()


def bodies(c: _Consumer) -> list[bytes]:
    return [b for b, _r in c.got]


def test_a_delivery_lost_on_the_way_is_asked_for_when_the_next_one_names_it():
    link = Link()
    c = link.consume(prefetch=10)
    m1, m2, m3 = link.publish(b"m1", b"m2", b"m3")
    link.arrive([m1, m3])  # m2 lost on the way
    assert bodies(c) == [b"m1"]  # m3 waits behind the gap
    link.arrive(link.proposals())  # the consumer's node asked (Resend); the leader answers
    assert c.got == [(b"m1", False), (b"m2", False), (b"m3", False)]
    assert link.state.messages_unacknowledged == 3
    link.settle(c)
    assert link.state.messages == 0


def test_the_last_deliveries_lost_with_the_old_leader_come_from_the_new_one():
    link = Link()
    c = link.consume(prefetch=10)
    m1, _m2, _m3 = link.publish(b"m1", b"m2", b"m3")
    link.arrive([m1])  # the old leader stopped before m2 and m3 left
    link.arrive(link.new_leader())
    assert c.got == [(b"m1", False), (b"m2", False), (b"m3", False)]
    assert link.proposals() == []  # nothing was missing in between: no question asked


def test_a_repeat_from_a_replaced_leader_is_never_given_twice():
    link = Link()
    c = link.consume(prefetch=10)
    sent = link.publish(b"m1", b"m2")
    link.arrive(sent)
    link.arrive(link.new_leader())  # the new leader resends what is checked out
    link.arrive(sent)  # and the old one, resumed, sends its deliveries again
    m3 = link.publish(b"m3")
    link.arrive(m3 + sent)
    assert c.got == [(b"m1", False), (b"m2", False), (b"m3", False)]
    assert link.proposals() == []


def test_an_answer_lost_on_the_way_is_asked_for_again():
    link = Link()
    c = link.consume(prefetch=10)
    m1, _m2, m3 = link.publish(b"m1", b"m2", b"m3")
    link.arrive([m1, m3])
    link.proposals()  # the answer is lost
    now_s = link.port.t_ms / 1000
    link.host.tick(now_s + 0.5)
    assert link.to_n1 == []  # not yet
    link.host.tick(now_s + RESEND_ASK_AGAIN_S + 0.1)
    link.arrive(link.proposals())
    assert bodies(c) == [b"m1", b"m2", b"m3"]
    link.host.tick(now_s + 2 * RESEND_ASK_AGAIN_S + 0.2)
    assert link.to_n1 == []  # answered: no more questions


def test_what_waits_behind_a_gap_goes_to_the_client_within_its_prefetch():
    link = Link()
    c = link.consume(prefetch=2)
    out = link.publish(b"m1", b"m2", b"m3", b"m4")  # the state machine sends ahead of the prefetch
    link.arrive([out[0], out[2], out[3]])
    link.arrive(link.proposals())
    assert bodies(c) == [b"m1", b"m2"]
    link.settle(c)
    assert bodies(c) == [b"m1", b"m2", b"m3", b"m4"]


def test_a_message_returned_while_its_delivery_was_lost_is_not_given_from_the_old_delivery():
    link = Link()
    c = link.consume(prefetch=10)
    m1, m2 = link.publish(b"m1", b"m2")
    link.arrive([m1])
    # the consumer nacks m1 with requeue: it comes back as a new delivery behind m2
    link.q.requeue(m1.msg_id)
    c.unacked = 0
    link.q.flush()
    again = link.proposals()
    link.arrive(again + [m2])  # m2 arrives late, after the redelivery that names it
    assert c.got == [(b"m1", False), (b"m2", False), (b"m1", True)]


class _Raft:
    """The node's Raft groups as the host sees them: who leads, and proposals appended locally
    (a leader that was suspended still thinks it leads until it hears of the new term)."""

    def __init__(self, leader: str):
        self.leader_node = leader
        self.appended: list = []
        self.entries: dict[int, bytes] = {}  # the log's committed entries (`_commit`), by index

    def entry_data(self, _gid: int, index: int) -> bytes | None:
        return self.entries.get(index)

    def leader(self, _gid: int) -> str:
        return self.leader_node

    def propose(self, _gid: int, env: bytes) -> bool:
        self.appended.append(fifo.decode_command(msgspec.msgpack.decode(env)[2]))
        return True


def test_a_replaced_leaders_verdict_on_a_node_never_reaches_the_new_leader():
    """A leader suspended (SIGSTOP) and resumed finds its links to the other nodes closed and, still
    thinking it leads, proposes NodeDown for them. The new leader, which saw those nodes up all
    along, must not apply it: their consumers would be suspended (their messages redelivered) and,
    with no NodeUp to come from a leader that never saw them go, would get nothing more."""
    link = Link()
    link.leader.raft = raft = _Raft(leader="n1")
    link.leader.peer_down("n3")
    assert [type(c) for c in raft.appended] == [fifo.NodeDown]  # in its own log, never committed
    raft.leader_node = "n2"  # it hears of the new term
    now_s = link.port.t_ms / 1000
    link.leader.tick(now_s + 10)
    link.leader.leader_known(GID)
    assert not [m for m in link.to_n3 if m[0] == "QP"]  # nothing sent on to the new leader
    assert [type(c) for c in raft.appended] == [fifo.NodeDown]


def test_a_new_leader_revives_the_consumers_of_a_node_that_came_back_before_it_led():
    link = Link()
    link.consume(prefetch=10)
    link.apply(fifo.NodeDown("n3"))  # the old leader saw n3 go and did not see it come back
    link.leader.raft = raft = _Raft(leader="n1")
    link.leader.leadership_changed(GID, True)
    assert fifo.NodeUp("n3") in [msgspec.structs.replace(c, now_ms=0) for c in raft.appended
                                 if type(c) is fifo.NodeUp]


def test_a_publish_handed_to_a_live_leader_is_sent_again_only_when_its_answer_may_be_lost():
    """Under load an answer takes longer than RETRY_S; sending the publish again then only added
    Raft log entries. It is sent again when another leader is known, when the leader's node comes
    back, or after RETRY_LEADER_S."""
    link = Link()
    link.host.raft = raft = _Raft(leader="n1")
    now_s = link.port.t_ms / 1000
    link.host.publish(link.q, Message("", "q", b"\x00\x01q", NO_PROPS, b"m1", True, 0, None), None, 0)
    assert len(link.to_n1) == 1
    link.host.tick(now_s + RETRY_S + 0.1)
    assert len(link.to_n1) == 1
    link.host.tick(now_s + RETRY_LEADER_S + 0.1)
    assert len(link.to_n1) == 2
    raft.leader_node = "n2"
    link.host.leader_known(GID)
    assert len(link.to_n1) == 3
    link.host.peer_up("n2")
    assert len(link.to_n1) == 4


def test_the_delivery_count_header_is_the_same_from_the_kept_properties():
    counted: dict = {}
    props = b"\x10\x00\x02"  # delivery_mode 2
    for count in (0, 1, 0, 2, 1):
        got = _delivery(count, count > 0, "", "q", props, b"x", counted)[3]
        assert got == codec.edit_properties(props, set_headers={"x-delivery-count": codec.typed_value(count)})
    assert len(counted) == 3
    for count in range(COUNTED_PROPS_MAX + 1):  # as many kinds as it keeps, and one more
        _delivery(count, True, "", "q", props, b"x", counted)
    assert len(counted) <= COUNTED_PROPS_MAX


def test_deliveries_sent_while_the_consumers_node_was_unreachable_come_when_it_is_back():
    """The leader sent the deliveries while its link to the consumer's node was down (the
    transport dropped them) and nothing followed them to show the gap: when the link is back the
    leader sends that node what is checked out to its consumers."""
    link = Link()
    c = link.consume(prefetch=10)
    link.leader.raft = _Raft(leader="n1")
    link.publish(b"m1", b"m2")  # lost on the way
    link.leader.peer_up("n3")
    link.arrive(link.sent_to_consumer())
    assert c.got == [(b"m1", False), (b"m2", False)]


def test_a_consumer_whose_channel_closed_before_its_registration_was_applied_is_cancelled():
    """basic.consume waited for a leader (a partition) and the client gave up and closed its
    connection; the channel's close had no consumer of the queue to cancel yet. When the
    registration is applied after all, its node cancels it, so what the queue checked out to it
    comes back instead of waiting for a channel that is gone (hutch sim cluster, seed 115)."""
    link = Link()
    c = _Consumer(prefetch=10)
    link.q.consume(c, lambda _r: None)
    registration, link.to_n1[:] = list(link.to_n1), []
    c.channel.closed = True
    link.to_n1[:] = registration  # applied only now, after the heal
    link.publish(b"m1")
    link.arrive(link.proposals())  # the answer and the delivery reach the consumer's node
    link.arrive(link.proposals())  # which cancels the consumer, with its messages returned
    assert link.state.consumer_count == 0 and link.state.messages_ready == 1


def _applier(link: Link) -> _QuorumApp:
    """The leader's node applying committed entries of the queue's group, as its Raft runtime does."""
    app = _QuorumApp(link.leader, link.lq)
    link.lq.machine = link.state
    return app


def _commit(app: _QuorumApp, cmd, index: int) -> None:
    data = msgspec.msgpack.encode(["n1", 0, fifo.encode_command(cmd)])
    if isinstance(app.host.raft, _Raft):
        app.host.raft.entries[index] = data
    app.apply(data, index)


def test_a_nodedown_committed_after_the_new_leader_looked_is_undone_when_the_node_is_up():
    """A leader cut off from the others proposed NodeDown for the consumer's node; the entry stayed
    in its log, and when it led again after the heal it was committed with the new term's first
    entries, after leadership_changed had found the node up and its consumers not suspended. The
    leader then judges the node again from what it sees: the consumer receives again (hutch sim
    cluster, quorum seed 417: the consumer got none of the ten messages published after it)."""
    link = Link()
    c = link.consume(prefetch=10)
    link.leader.raft = raft = _Raft(leader="n1")
    app = _applier(link)
    link.leader.leadership_changed(GID, True)
    assert not [cmd for cmd in raft.appended if type(cmd) in (fifo.NodeDown, fifo.NodeUp)]
    _commit(app, fifo.NodeDown("n3"), 54)  # the old term's verdict
    ups = [cmd for cmd in raft.appended if type(cmd) is fifo.NodeUp]
    assert [cmd.node for cmd in ups] == ["n3"]
    _commit(app, ups[0], 55)
    link.arrive(link.sent_to_consumer())
    link.arrive(link.publish(b"m1"))
    assert bodies(c) == [b"m1"]


def test_a_nodeup_committed_while_the_leader_sees_the_node_down_is_undone():
    link = Link()
    link.consume(prefetch=10)
    link.leader.raft = raft = _Raft(leader="n1")
    app = _applier(link)
    link.leader.peers.is_up = lambda n: n != "n3"
    _commit(app, fifo.NodeDown("n3"), 10)  # agrees with what the leader sees: nothing more
    assert raft.appended == []
    _commit(app, fifo.NodeUp("n3"), 11)  # proposed by a leader that saw n3 back before it went again
    assert [type(cmd) for cmd in raft.appended] == [fifo.NodeDown]
    assert raft.appended[0].node == "n3"


def test_a_delivery_to_a_consumer_gone_from_its_node_goes_back_after_the_consumers_cancel():
    """The consumer's channel closed while no member of the queue was reachable: its Cancel waits
    for its resend. When the links are back, the leader, which still has the consumer, delivers to
    it, and its node gives the deliveries back, sending the Cancel again first. Given back before the
    Cancel, each message went to the same consumer again, and every round trip raised its count
    until x-delivery-limit dropped it (hutch sim cluster, quorum seed 729)."""
    link = Link()
    c = link.consume(prefetch=10)
    c.channel.closed = True
    link.q.remove_consumer(c)
    link.to_n1.clear()  # the Cancel found no member to send it to
    link.arrive(link.publish(b"m1", b"m2"))
    sent = [fifo.decode_command(msgspec.msgpack.decode(m[2])[2]) for m in link.to_n1]
    assert type(sent[0]) is fifo.Cancel
    assert [o for o in link.proposals() if type(o) is ToConsumer] == []  # nothing goes to it again
    assert link.state.consumer_count == 0 and link.state.messages_ready == 2


def test_nothing_is_delivered_to_a_node_whose_nodedown_is_proposed_and_not_yet_applied():
    """The link to the consumer's node broke and came back before the leader's NodeDown for it was
    committed (with the publishes before it). The publishes' deliveries to that node are not sent:
    the NodeDown, once applied, gives the messages to the queue's other consumers, flagged, and
    deliveries sent now would reach the consumer too, perhaps after those, without the flag
    (hutch sim cluster, quorum seed 58). Once it is applied, the consumer's node gets deliveries
    again, and a publish's confirm is never held back."""
    link = Link()
    c = link.consume(prefetch=10)
    link.leader.raft = raft = _Raft(leader="n1")
    app = _applier(link)
    link.leader.peer_down("n3")
    assert [type(cmd) for cmd in raft.appended] == [fifo.NodeDown]
    _commit(app, fifo.Enqueue("", "q", NO_PROPS, b"m1", now_ms=link.port.t_ms, publisher="n3/1/1", publisher_seq=1),
            20)
    sent = link.sent_to_consumer()
    assert [type(o) for o in sent] == [PublishDecided]  # the confirm goes; the delivery does not
    _commit(app, raft.appended[0], 21)  # the NodeDown: m1 is back in the queue
    assert link.state.messages_ready == 1 and not link.sent_to_consumer()
    _commit(app, fifo.NodeUp("n3"), 22)
    link.arrive(link.sent_to_consumer())  # it names the delivery never sent: the node asks for it
    link.arrive(link.proposals())
    assert c.got == [(b"m1", True)]  # delivered once, after the NodeUp, flagged


# -- acks, a few at a time (the handle's paragraph "Acks, a few at a time")

def _commands(link: Link) -> list:
    """The consumer's node's proposals so far, decoded (not applied)."""
    return [fifo.decode_command(msgspec.msgpack.decode(m[2])[2]) for m in link.to_n1]


def _delivered(prefetch: int, n: int, timers: bool = True) -> tuple[Link, _Consumer]:
    """A consumer with this prefetch on the consumer's node, given n messages."""
    link = Link()
    link.port.timers = timers
    c = link.consume(prefetch=prefetch)
    if not prefetch:
        c.can_take = lambda: True
    link.arrive(link.publish(*[b"m%d" % i for i in range(n)]))
    assert len(c.got) == n
    return link, c


def test_acks_wait_on_the_consumers_node_and_go_as_one_settle_when_due():
    link, c = _delivered(100, 5)
    for msg_id in list(link.q._owner):
        link.q.settle(msg_id)
        c.unacked -= 1
        link.q.flush()  # one loop iteration per ack
        link.port.t_ms += 1
    assert _commands(link) == []  # held
    assert [when for _fn, when in link.port.wakes] == [link.port.t_ms - 5 + SETTLE_HOLD_MS]
    link.wake()
    cmds = _commands(link)
    assert len(cmds) == 1 and isinstance(cmds[0], fifo.Settle) and len(cmds[0].msg_ids) == 5
    link.arrive(link.proposals())
    assert link.state.messages == 0


def test_acks_that_could_hold_the_consumer_back_go_at_once():
    # what its node has given the consumer and not yet proposed as settled (acked or not) must
    # stay under half its prefetch for acks to wait: prefetch 1 never waits
    for prefetch, delivered, held in ((1, 1, False), (10, 5, False), (10, 4, True), (0, 50, True)):
        link, c = _delivered(prefetch, delivered)
        for msg_id in sorted(link.q._owner):
            link.q.settle(msg_id)
            c.unacked -= 1
            link.q.flush()
        assert (_commands(link) == []) is held, (prefetch, delivered)


def test_a_reject_proposes_the_held_acks_with_it():
    link, _c = _delivered(100, 3)
    first, second, third = sorted(link.q._owner)
    link.q.settle(first)
    link.q.flush()
    assert _commands(link) == []
    link.q.requeue(second)
    link.q.settle(third)
    link.q.flush()
    cmds = _commands(link)
    assert [type(x) for x in cmds] == [fifo.Settle, fifo.Return]
    assert sorted(cmds[0].msg_ids) == [first, third] and cmds[1].msg_ids == [second]


def test_any_other_proposal_takes_the_held_acks_first():
    link, c = _delivered(100, 2)
    for msg_id in sorted(link.q._owner):
        link.q.settle(msg_id)
    link.q.flush()
    assert _commands(link) == []
    link.q.remove_consumer(c)  # the cancel
    assert [type(x) for x in _commands(link)] == [fifo.Settle, fifo.Cancel]


def test_held_acks_go_when_the_timer_fires_even_if_the_clock_was_set_back():
    link, _c = _delivered(100, 1)
    link.q.settle(next(iter(link.q._owner)))
    link.q.flush()
    assert _commands(link) == []
    (fn, _when), = link.port.wakes
    link.port.wakes.clear()
    link.port.t_ms -= 60_000  # the node's clock went back a minute meanwhile
    fn()
    for q in link.port.dirty_queues:
        q.flush()
    assert [type(x) for x in _commands(link)] == [fifo.Settle]


def test_without_a_timer_acks_are_never_held():
    link, _c = _delivered(100, 1, timers=False)
    link.q.settle(next(iter(link.q._owner)))
    link.q.flush()
    assert [type(x) for x in _commands(link)] == [fifo.Settle]
