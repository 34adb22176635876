"""Cluster-wide message statistics for the management API: counters, rates and histories.

RabbitMQ's management plugin keeps a statistics database per node and, for a query, adds up
what every node's database holds about the object (rabbit_mgmt_db merging the nodes' fine
stats). hutch does the same on request: the node serving the API takes its own sampler's
figures and asks every running peer for theirs (the "list" call with what = "mstats"), sums
the counters and merges the sample rings (hutch.control.rates.merge), then writes
`message_stats` with `*_details` into the JSON objects. Queue lengths are not summed: every
node already sees each queue's figures (a queue homed elsewhere reports them to the others),
so their details come from this node's samples.

A request never waits long for a peer: it waits at most `PEER_WAIT_S` for the peers' answers and
uses, for a peer that has not answered by then, the newest figures that peer sent before (its
counters only grow, so older figures are a lower bound). A peer whose earlier ask is still out —
a hung node, say, that the failure detector has not yet declared down — is not asked again nor
waited for until that ask ends (answered, failed, or `PEER_TIMEOUT_S` passed). A peer whose ask
failed is left out, as RabbitMQ leaves out a node it cannot reach. This module only reads; it
never changes broker state.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from hutch.control import ops, rates
from hutch.control.errors import bad_request

PEER_WAIT_S = 0.5  # how long an API request waits for the peers' figures
PEER_TIMEOUT_S = 5.0  # how long an ask may stay out before it counts as failed
ANSWERS_KEPT_MAX = 256  # (peer, question) answers kept; questions vary with the query's ages


class _PeerFigures:
    """Per (peer, question): the newest answer, and the one ask that may be out at a time."""

    def __init__(self) -> None:
        self.last: dict[tuple, list] = {}
        self.asking: dict[tuple, asyncio.Task] = {}

    def ask(self, broker: Any, key: tuple, params: list) -> asyncio.Task | None:
        """Ask `key`'s peer unless an earlier ask of the same is still out; the new task, or None."""
        if key in self.asking:
            return None
        task = asyncio.get_running_loop().create_task(
            ops.call_peer(broker, key[0], "list", params, timeout_s=PEER_TIMEOUT_S))
        self.asking[key] = task
        task.add_done_callback(lambda t: self.answered(key, t))
        return task

    def answered(self, key: tuple, task: asyncio.Task) -> None:
        """Take a finished ask's outcome (idempotent)."""
        if self.asking.get(key) is task:
            del self.asking[key]
        if task.cancelled() or task.exception() is not None:
            self.last.pop(key, None)  # left out until it answers again
        else:
            self.last.pop(key, None)
            self.last[key] = task.result() or []
            while len(self.last) > ANSWERS_KEPT_MAX:
                del self.last[next(iter(self.last))]  # the least recently answered


_peer_figures: weakref.WeakKeyDictionary[Any, _PeerFigures] = weakref.WeakKeyDictionary()


def window_of(request: web.Request) -> rates.Window:
    try:
        return rates.window_of(request.query)
    except ValueError as e:
        raise bad_request(str(e)) from None


def local_report(broker: Any, params: dict) -> list:
    """What a peer asked for: this node's counters and newest samples of some kinds."""
    kinds = [k for k in params.get("kinds", []) if isinstance(k, str)]
    n = params.get("n", 2)
    return rates.sampler_of(broker).report(broker, kinds, n if isinstance(n, int) else 2)


async def cluster_figures(broker: Any, kinds: list[str], window: rates.Window) -> dict[tuple, tuple[list, list]]:
    """{key: (summed counters now, merged ring)} over this node and its running peers."""
    wanted = window.samples_wanted(rates.sampler_of(broker).interval_ms)
    reports = [local_report(broker, {"kinds": kinds, "n": wanted})]
    cl = broker.cluster
    if cl is not None:
        peers = [p for p in cl.running_nodes() if p != cl.node]
        state = _peer_figures.get(broker)
        if state is None:
            state = _peer_figures[broker] = _PeerFigures()
        params = ["mstats", {"kinds": kinds, "n": wanted}]
        keys = [(p, tuple(kinds), wanted) for p in peers]
        started = {k: t for k in keys if (t := state.ask(broker, k, params)) is not None}
        if started:
            await asyncio.wait(started.values(), timeout=PEER_WAIT_S)
            for k, t in started.items():
                if t.done():
                    state.answered(k, t)
        reports += [state.last.get(k, []) for k in keys]
    counts: dict[tuple, list[int]] = {}
    rings: dict[tuple, list] = {}
    for report in reports:
        for row in report or ():
            try:
                key_list, live, samples = row
            except (TypeError, ValueError):
                continue
            key = tuple(key_list)
            acc = counts.get(key)
            if acc is None:
                counts[key] = list(live)
            else:
                for i, n in enumerate(live):
                    acc[i] += n
            rings.setdefault(key, []).append([(t, tuple(v)) for t, v in samples])
    return {key: (counts[key], rates.merge(rings.get(key, []))) for key in counts}


# what fills in queue rows this node cannot tell alone (a stream without a replica here:
# hutch.control.streams asks a member), awaited by `decorate` before the figures
QUEUE_ROWS_COMPLETERS: list[Callable[[Any, list[dict]], Awaitable[None]]] = []


async def decorate(broker: Any, kind: str, rows: list[dict], window: rates.Window) -> list[dict]:
    """Fill `message_stats` (and for queues and vhosts the length details) into API objects
    of one kind: queues and exchanges by (vhost, name), vhosts by name."""
    if not rows:
        return rows
    if kind == rates.QUEUE:
        for complete in QUEUE_ROWS_COMPLETERS:
            await complete(broker, rows)
    figures = await cluster_figures(broker, [kind], window)
    sampler = rates.sampler_of(broker)
    interval = sampler.interval_ms
    zero = [0] * len(rates.fields_of(kind))
    for row in rows:
        key = (kind, row.get("name")) if kind == rates.VHOST else (kind, row.get("vhost"), row.get("name"))
        counts, ring = figures.get(key, (zero, []))
        row["message_stats"] = rates.message_stats(kind, counts, ring, window, interval)
        if kind in (rates.QUEUE, rates.VHOST):
            row.update(rates.length_details(sampler.lengths_ring(key), window, interval))
    return rows


async def overview(broker: Any, window: rates.Window) -> tuple[dict, dict, dict]:
    """The overview's message_stats (the cluster's channels), queue_totals' details and
    churn_rates (connections, channels and queues created and closed, cluster-wide)."""
    figures = await cluster_figures(broker, [rates.NODE, rates.CHURN], window)
    counts, ring = figures.get((rates.NODE,), (rates.msgstats.new(), []))
    sampler = rates.sampler_of(broker)
    interval = sampler.interval_ms
    msg = rates.message_stats(rates.NODE, counts, ring, window, interval)
    lengths = rates.length_details(sampler.lengths_ring((rates.NODE,)), window, interval)
    churn_counts, churn_ring = figures.get((rates.CHURN,), ([0] * len(rates.CHURN_FIELDS), []))
    churn: dict[str, Any] = {}
    for i, name in enumerate(rates.CHURN_FIELDS):
        churn[name] = churn_counts[i]
        churn[name + "_details"] = rates.details(churn_ring, i, window.msg_rates, interval)
    return msg, lengths, churn


def node_resource_details(broker: Any) -> dict[str, Any]:
    """/api/nodes' mem_used_details, fd_used_details, sockets_used_details, proc_used_details
    and disk_free_details, from this node's samples."""
    sampler = rates.sampler_of(broker)
    ring = sampler.ring((rates.RESOURCES,))
    return {name + "_details": rates.details(ring, i, None, sampler.interval_ms)
            for i, name in enumerate(rates.RESOURCE_FIELDS)}
