"""Message counters where RabbitMQ counts them: per channel, queue, exchange, vhost and node.

RabbitMQ's channel process keeps the "fine" statistics of the management plugin
(rabbit_channel's incr_stats): a publish is counted once on the channel and on the exchange
it was published to (`publish_in`), and once on every queue it was routed to (the exchange's
`publish_out` adds them up). Deliveries, gets, acks and redeliveries are counted on the
channel and on the queue they came from; confirms and unroutable messages (returned or
dropped) on the channel. A vhost's and the node's figures are its channels' figures, including
the channels that have closed since. A queue's figures on one node are what that node's
channels did with it; the cluster's figure is the sum over nodes, so a queue homed elsewhere,
a mirrored queue or a quorum queue is counted wherever its clients are.

Counters are plain lists of ints indexed by the constants below, so the hot path pays one
list increment per figure and never a lookup by name. Reading them (rates, samples,
Prometheus) happens elsewhere, off the hot path. This module must never do I/O or keep
anything per message.
"""

from __future__ import annotations

import weakref
from typing import Any

# a channel's and a queue's counters (a queue leaves confirm and the unroutable ones at 0)
PUBLISH = 0
CONFIRM = 1
RETURN_UNROUTABLE = 2
DROP_UNROUTABLE = 3
DELIVER = 4
DELIVER_NO_ACK = 5
GET = 6
GET_NO_ACK = 7
GET_EMPTY = 8
REDELIVER = 9
ACK = 10
PUBLISH_CONFIRM = 11  # publishes on a channel in confirm mode: a channel's publish_seq, read when summed
SHOWN_FIELDS = ("publish", "confirm", "return_unroutable", "drop_unroutable", "deliver", "deliver_no_ack", "get",
                "get_no_ack", "get_empty", "redeliver", "ack")
FIELDS = (*SHOWN_FIELDS, "publish_confirm")
QUEUE_FIELDS = ("publish", "deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "redeliver", "ack")

# an exchange's counters
X_PUBLISH_IN = 0
X_PUBLISH_OUT = 1
X_RETURN_UNROUTABLE = 2
X_DROP_UNROUTABLE = 3
X_FIELDS = ("publish_in", "publish_out", "return_unroutable", "drop_unroutable")


def new() -> list[int]:
    return [0] * len(FIELDS)


def new_exchange() -> list[int]:
    return [0] * len(X_FIELDS)


def count_delivery(ch_stats: list[int], q_stats: list[int], no_ack: bool, redelivered: bool) -> None:
    """One basic.deliver to a consumer of a queue, on the channel and on the queue."""
    i = DELIVER_NO_ACK if no_ack else DELIVER
    ch_stats[i] += 1
    q_stats[i] += 1
    if redelivered:
        ch_stats[REDELIVER] += 1
        q_stats[REDELIVER] += 1


def count_get(ch_stats: list[int], q_stats: list[int], no_ack: bool, redelivered: bool) -> None:
    """One basic.get-ok, on the channel and on the queue."""
    i = GET_NO_ACK if no_ack else GET
    ch_stats[i] += 1
    q_stats[i] += 1
    if redelivered:
        ch_stats[REDELIVER] += 1
        q_stats[REDELIVER] += 1


# The node's churn and what closed connections sent and received, per broker
CONNECTIONS_OPENED = 0
CONNECTIONS_CLOSED = 1
CHANNELS_OPENED = 2
CHANNELS_CLOSED = 3
QUEUES_DECLARED = 4
RECV_OCT_CLOSED = 5
SEND_OCT_CLOSED = 6
_node: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()


def node_counters(broker: Any) -> list[int]:
    """The broker's churn counters (CONNECTIONS_OPENED ...), created on first use."""
    c = _node.get(broker)
    if c is None:
        c = _node[broker] = [0] * 7
    return c


# What the channels of a vhost counted before they closed, per broker (so the vhost's and
# the node's figures never go down when a channel closes).
_retired: weakref.WeakKeyDictionary[Any, dict[str, list[int]]] = weakref.WeakKeyDictionary()


def retire(broker: Any, vhost: str, counts: list[int]) -> None:
    """A channel of `vhost` closed: keep its counts in the vhost's totals."""
    per_vhost = _retired.get(broker)
    if per_vhost is None:
        per_vhost = _retired[broker] = {}
    totals = per_vhost.get(vhost)
    if totals is None:
        per_vhost[vhost] = list(counts)
    else:
        for i, n in enumerate(counts):
            totals[i] += n


GONE_VHOSTS = ""  # the bucket of vhosts deleted since (a vhost's name is never empty)


def vhost_totals(broker: Any) -> dict[str, list[int]]:
    """Each vhost's channel counters now: the closed channels' plus the open ones'. A deleted
    vhost's figures move to one bucket, kept for the node's totals, so they take no room per vhost."""
    per_vhost = _retired.get(broker, {})
    for name in [n for n in per_vhost if n != GONE_VHOSTS and n not in broker.vhosts]:
        retire(broker, GONE_VHOSTS, per_vhost.pop(name))
    out = {name: list(c) for name, c in per_vhost.items() if name in broker.vhosts}
    for s in broker.sessions:
        v = s.vhost
        if v is None:
            continue
        totals = out.get(v.name)
        if totals is None:
            totals = out[v.name] = new()
        for ch in s.channels.values():
            for i, n in enumerate(ch.mstats):
                totals[i] += n
            totals[PUBLISH_CONFIRM] += ch.publish_seq
    for name in broker.vhosts:
        out.setdefault(name, new())
    return out


def node_totals(broker: Any) -> list[int]:
    """The node's channel counters, ever: a deleted vhost's channels still count here, so the
    node's figures only grow (Prometheus counters)."""
    totals = new()
    channels = [ch for s in broker.sessions if s.vhost is not None for ch in s.channels.values()]
    for counts in [*_retired.get(broker, {}).values(), *(ch.mstats for ch in channels)]:
        for i, n in enumerate(counts):
            totals[i] += n
    totals[PUBLISH_CONFIRM] += sum(ch.publish_seq for ch in channels)
    return totals


# hutch.queues cannot import this module: ClassicQueue sizes its counters by this number
QUEUE_COUNTERS = 12
assert len(FIELDS) == QUEUE_COUNTERS
