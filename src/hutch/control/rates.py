"""Message rates and sample histories, as RabbitMQ's management API reports them (rates_mode basic).

The counters themselves are kept on the hot path by hutch.broker.msgstats (plain list
increments). A `Sampler` per broker reads them every `collect_statistics_interval_ms` (RabbitMQ's
`collect_statistics_interval`, 5000 ms by default) and keeps, per object (the node, each vhost,
queue, exchange, channel and connection), a ring of at most `SAMPLES_MAX` samples: ten minutes
at the default interval, the finest tier of RabbitMQ's basic retention policy (605 s at 5 s).
Each sample is stamped with the wall clock rounded down to the interval, so samples taken on
different nodes line up and a cluster-wide figure is the sum of the nodes' step functions.

From a ring the API derives what the management plugin shows (seed: "Management Plugin",
HTTP API statistics): `<counter>_details: {rate}` for the counters in `message_stats`,
`messages_details` and its kin for queue lengths, and, when a request carries
`msg_rates_age`/`msg_rates_incr` (or `lengths_age`/`lengths_incr`), `samples` (newest first,
one per `incr` seconds over `age` seconds), `avg` and `avg_rate`.

Nothing here runs per message, and nothing here changes broker state.
"""

from __future__ import annotations

import shutil
import time
import weakref
from collections import deque
from typing import Any

import psutil

from hutch.broker import msgstats

SAMPLES_MAX = 121  # per object: 605 s at the default 5 s interval
AGE_S_MAX = 24 * 3600  # the longest history a request may ask for (seconds)
INCR_S_MIN = 1
LENGTHS = ("messages", "messages_ready", "messages_unacknowledged")
CONNECTION_FIELDS = ("recv_oct", "send_oct")

NODE = "node"
VHOST = "vhost"
QUEUE = "queue"
EXCHANGE = "exchange"
CHANNEL = "channel"
CONNECTION = "connection"
CHURN = "churn"  # the overview's churn_rates: objects created and closed
RESOURCES = "resources"  # this node's memory, descriptors, sockets and disk, for /api/nodes
CHURN_FIELDS = ("channel_closed", "channel_created", "connection_closed", "connection_created", "queue_created",
                "queue_declared", "queue_deleted")
RESOURCE_FIELDS = ("mem_used", "fd_used", "sockets_used", "proc_used", "disk_free")


def fields_of(kind: str) -> tuple[str, ...]:
    """The counter names of one kind of object, in sample order."""
    if kind == EXCHANGE:
        return msgstats.X_FIELDS
    if kind == CONNECTION:
        return CONNECTION_FIELDS
    if kind == CHURN:
        return CHURN_FIELDS
    if kind == RESOURCES:
        return RESOURCE_FIELDS
    return msgstats.FIELDS


class Sample:
    __slots__ = ("ts_ms", "counts", "lengths")

    def __init__(self, ts_ms: int, counts: tuple, lengths: tuple):
        self.ts_ms = ts_ms
        self.counts = counts
        self.lengths = lengths


class Sampler:
    """One node's rings of samples, keyed by (kind, *identity)."""

    def __init__(self, interval_ms: int):
        self.interval_ms = max(100, int(interval_ms))
        self.rings: dict[tuple, deque[Sample]] = {}
        # queue types' counters of queues deleted since (Prometheus counters must not go down)
        self.gone_by_type: dict[str, list[int]] = {}
        self._last_queue: dict[tuple, tuple[str, list[int]]] = {}
        self.queues_seen = 0  # queues homed here that appeared, and disappeared, between two looks
        self.queues_gone = 0
        self._homed: set[tuple] = set()

    def stamp(self, now_s: float | None = None) -> int:
        now_ms = int((time.time() if now_s is None else now_s) * 1000)
        return now_ms - now_ms % self.interval_ms

    # ------------------------------------------------------------ taking samples

    def tick(self, broker: Any, now_s: float | None = None) -> None:
        ts = self.stamp(now_s)
        current = collect(broker)
        for key, (counts, lengths) in current.items():
            ring = self.rings.get(key)
            if ring is None:
                ring = self.rings[key] = deque(maxlen=SAMPLES_MAX)
            elif ring and ring[-1].ts_ms == ts:
                ring.pop()  # two ticks in one interval: keep the later
            ring.append(Sample(ts, counts, lengths))
        for key in [k for k in self.rings if k not in current]:
            del self.rings[key]
        self.queue_type_totals(broker)

    def queue_type_totals(self, broker: Any) -> dict[str, list[int]]:
        """Counters by queue type ("classic", "quorum") that only grow: the live queues' plus
        those of queues gone since (as last seen)."""
        out = {t: list(c) for t, c in self.gone_by_type.items()}
        now: dict[tuple, tuple[str, list[int]]] = {}
        node = broker.config.node_name
        homed: set[tuple] = set()  # created here: counted in queues_created/deleted by this node only
        for vname, v in broker.vhosts.items():
            for q in v.queues.values():
                kind = "quorum" if q.quorum else "classic"
                key = (vname, q.name, id(q))
                now[key] = (kind, q.mstats)
                if (getattr(q, "declared_leader", None) == node) if q.quorum else q.local:
                    homed.add(key)
                acc = out.setdefault(kind, msgstats.new())
                for i, n in enumerate(q.mstats):
                    acc[i] += n
        self.queues_seen += sum(1 for key in homed if key not in self._last_queue)
        for key, (kind, counts) in self._last_queue.items():
            if key not in now:
                if key in self._homed:
                    self.queues_gone += 1
                gone = self.gone_by_type.setdefault(kind, msgstats.new())
                acc = out.setdefault(kind, msgstats.new())
                for i, n in enumerate(counts):
                    gone[i] += n
                    acc[i] += n
        self._last_queue = {k: (kind, list(c)) for k, (kind, c) in now.items()}
        self._homed = homed
        return out

    # ------------------------------------------------------------ reading

    def ring(self, key: tuple) -> list[tuple[int, tuple]]:
        return [(s.ts_ms, s.counts) for s in self.rings.get(key, ())]

    def lengths_ring(self, key: tuple) -> list[tuple[int, tuple]]:
        return [(s.ts_ms, s.lengths) for s in self.rings.get(key, ())]

    def report(self, broker: Any, kinds: list[str], n: int) -> list[list]:
        """This node's counters now and its newest `n` samples of every object of these kinds,
        for another node that adds them up: [[kind, *identity], counts, [[ts_ms, counts], ...]]."""
        n = max(2, min(int(n), SAMPLES_MAX))
        wanted = set(kinds)
        out = []
        for key, (counts, _lengths) in collect(broker, wanted).items():
            tail = list(self.rings.get(key, ()))[-n:]
            out.append([list(key), list(counts), [[s.ts_ms, list(s.counts)] for s in tail]])
        return out


def resources(broker: Any) -> tuple[int, ...]:
    """This node's mem_used, fd_used, sockets_used, proc_used and disk_free now."""
    proc = psutil.Process()
    try:
        fds = proc.num_fds()
    except (psutil.Error, AttributeError):
        fds = 0
    try:
        disk_free = shutil.disk_usage(broker.config.data_dir).free
    except OSError:
        disk_free = 0
    return proc.memory_info().rss, fds, len(broker.sessions), 1, disk_free


def collect(broker: Any, kinds: set[str] | None = None) -> dict[tuple, tuple[tuple, tuple]]:
    """Every object's counters and lengths now: {(kind, *identity): (counts, lengths)}."""
    out: dict[tuple, tuple[tuple, tuple]] = {}
    want = (lambda k: True) if kinds is None else kinds.__contains__
    node_len = [0, 0, 0]
    vhost_totals = msgstats.vhost_totals(broker) if want(VHOST) else {}
    for vname, v in broker.vhosts.items():
        vl = [0, 0, 0]
        for q in v.queues.values():
            f = q.figures()
            ready, unacked = f.ready, f.unacked
            if want(QUEUE):
                out[(QUEUE, vname, q.name)] = (tuple(q.mstats), (ready + unacked, ready, unacked))
            vl[0] += ready + unacked
            vl[1] += ready
            vl[2] += unacked
        if want(EXCHANGE):
            for x in v.exchanges.values():
                out[(EXCHANGE, vname, x.name)] = (tuple(x.mstats), ())
        if want(VHOST):
            out[(VHOST, vname)] = (tuple(vhost_totals.get(vname) or msgstats.new()), tuple(vl))
        for i in range(3):
            node_len[i] += vl[i]
    if want(NODE):
        out[(NODE,)] = (tuple(msgstats.node_totals(broker)), tuple(node_len))
    if want(CHURN):
        c = msgstats.node_counters(broker)
        sampler = sampler_of(broker)
        out[(CHURN,)] = ((c[msgstats.CHANNELS_CLOSED], c[msgstats.CHANNELS_OPENED], c[msgstats.CONNECTIONS_CLOSED],
                          c[msgstats.CONNECTIONS_OPENED], sampler.queues_seen, c[msgstats.QUEUES_DECLARED],
                          sampler.queues_gone), ())
    if want(RESOURCES):
        out[(RESOURCES,)] = (resources(broker), ())
    if want(CONNECTION) or want(CHANNEL):
        for s in broker.sessions:
            if s.vhost is None:
                continue
            if want(CONNECTION):
                out[(CONNECTION, s.name)] = ((s.recv_oct, s.send_oct), ())
            if want(CHANNEL):
                for ch in s.channels.values():
                    out[(CHANNEL, f"{s.name} ({ch.number})")] = (tuple(ch.mstats), ())
    return out


_samplers: weakref.WeakKeyDictionary[Any, Sampler] = weakref.WeakKeyDictionary()


def sampler_of(broker: Any) -> Sampler:
    s = _samplers.get(broker)
    if s is None:
        s = _samplers[broker] = Sampler(getattr(broker.config, "collect_statistics_interval_ms", 5000))
    return s


# ---------------------------------------------------------------- step functions and merging

def _value_at(ring: list[tuple[int, tuple]], ts: int) -> tuple | None:
    """The newest sample at or before `ts` (None when the ring starts later)."""
    found = None
    for t, v in ring:
        if t <= ts:
            found = v
        else:
            break
    return found


def merge(rings: list[list[tuple[int, tuple]]]) -> list[tuple[int, tuple]]:
    """Add up several nodes' rings of one object: at every stamp any of them has, the sum of
    each node's newest sample at or before it."""
    rings = [r for r in rings if r]
    if len(rings) <= 1:
        return rings[0] if rings else []
    stamps = sorted({t for r in rings for t, _ in r})
    width = len(rings[0][0][1])
    out = []
    for ts in stamps:
        total = [0] * width
        for r in rings:
            v = _value_at(r, ts)
            if v is not None:
                for i, n in enumerate(v):
                    total[i] += n
        out.append((ts, tuple(total)))
    return out


# ---------------------------------------------------------------- the API's JSON

class Window:
    """A request's history parameters: (age_s, incr_s) for message rates and for lengths."""

    def __init__(self, msg_rates: tuple[int, int] | None = None, lengths: tuple[int, int] | None = None):
        self.msg_rates = msg_rates
        self.lengths = lengths

    def samples_wanted(self, interval_ms: int) -> int:
        """How many samples, taken every `interval_ms`, the histories need (2 give a rate)."""
        n = 2
        for w in (self.msg_rates, self.lengths):
            if w is not None:
                n = max(n, w[0] * 1000 // max(1, interval_ms) + 2)
        return min(n, SAMPLES_MAX)


def _history(ring: list[tuple[int, tuple]], idx: int, age_s: int, incr_s: int, interval_ms: int) -> list[dict]:
    """One sample per `incr_s` over `age_s`, newest first from the newest sample, each the
    newest value at or before its timestamp."""
    if not ring:
        return []
    incr_ms = incr_s * 1000
    top = ring[-1][0]
    out = []
    for k in range(age_s // incr_s + 1):
        ts = top - k * incr_ms
        v = _value_at(ring, ts)
        if v is None:
            break
        out.append({"sample": v[idx], "timestamp": ts})
    return out


def details(ring: list[tuple[int, tuple]], idx: int, window: tuple[int, int] | None, interval_ms: int) -> dict:
    """`<name>_details` of one counter or length: its rate per second from the last two samples,
    and when asked for, the samples with their average and average rate."""
    rate = 0.0
    if len(ring) >= 2:
        (t0, v0), (t1, v1) = ring[-2], ring[-1]
        if t1 > t0:
            rate = (v1[idx] - v0[idx]) * 1000 / (t1 - t0)
    out: dict[str, Any] = {"rate": round(rate, 1)}
    if window is not None:
        age_s, incr_s = window
        samples = _history(ring, idx, age_s, incr_s, interval_ms)
        out["samples"] = samples
        if samples:
            out["avg"] = round(sum(s["sample"] for s in samples) / len(samples), 1)
            if len(samples) > 1:
                span_s = (samples[0]["timestamp"] - samples[-1]["timestamp"]) / 1000
                out["avg_rate"] = round((samples[0]["sample"] - samples[-1]["sample"]) / span_s, 1)
            else:
                out["avg_rate"] = 0.0
        else:
            out["avg"] = 0.0
            out["avg_rate"] = 0.0
    return out


def message_stats(kind: str, counts: list[int] | tuple, ring: list[tuple[int, tuple]], window: Window,
                  interval_ms: int) -> dict[str, Any]:
    """`message_stats` of one object: each counter RabbitMQ shows for the kind, with details,
    plus deliver_get (deliver + deliver_no_ack + get + get_no_ack)."""
    names = fields_of(kind)
    if kind == QUEUE:
        shown = msgstats.QUEUE_FIELDS
    elif kind == EXCHANGE:
        shown = ("publish_in", "publish_out")
    else:
        shown = msgstats.SHOWN_FIELDS
    out: dict[str, Any] = {}
    w = window.msg_rates
    for name in shown:
        i = names.index(name)
        out[name] = counts[i]
        out[name + "_details"] = details(ring, i, w, interval_ms)
    if kind not in (EXCHANGE, CONNECTION):
        parts = [names.index(n) for n in ("deliver", "deliver_no_ack", "get", "get_no_ack")]
        dg_ring = [(t, (sum(v[i] for i in parts),)) for t, v in ring]
        out["deliver_get"] = sum(counts[i] for i in parts)
        out["deliver_get_details"] = details(dg_ring, 0, w, interval_ms)
    return out


def length_details(ring: list[tuple[int, tuple]], window: Window, interval_ms: int) -> dict[str, Any]:
    """messages_details, messages_ready_details, messages_unacknowledged_details."""
    return {name + "_details": details(ring, i, window.lengths, interval_ms) for i, name in enumerate(LENGTHS)}


def window_of(query: Any) -> Window:
    """The history a request asks for: ?msg_rates_age=&msg_rates_incr= and
    ?lengths_age=&lengths_incr= (seconds). Bad values are a ValueError naming the parameter."""
    def pair(prefix: str) -> tuple[int, int] | None:
        age, incr = query.get(prefix + "_age"), query.get(prefix + "_incr")
        if age is None and incr is None:
            return None
        try:
            age_s = int(age) if age is not None else 60
            incr_s = int(incr) if incr is not None else 5
        except ValueError:
            raise ValueError(f"{prefix}_age and {prefix}_incr must be whole numbers of seconds") from None
        if not 0 < age_s <= AGE_S_MAX:
            raise ValueError(f"{prefix}_age must be between 1 and {AGE_S_MAX} seconds")
        if not INCR_S_MIN <= incr_s <= age_s:
            raise ValueError(f"{prefix}_incr must be between {INCR_S_MIN} and {prefix}_age")
        return age_s, incr_s
    return Window(pair("msg_rates"), pair("lengths"))


def local_object_stats(broker: Any, kind: str, name: str | tuple, counts) -> dict:
    """message_stats of a channel or queue, or recv_oct/send_oct with details of a connection,
    from this node's samples (a channel or connection is counted on its node only)."""
    sampler = sampler_of(broker)
    key = (kind, *name) if isinstance(name, tuple) else (kind, name)
    ring = sampler.ring(key)
    if kind == CONNECTION:
        out: dict[str, Any] = {}
        for i, f in enumerate(CONNECTION_FIELDS):
            out[f] = counts[i]
            out[f + "_details"] = details(ring, i, None, sampler.interval_ms)
        return out
    return message_stats(kind, counts, ring, Window(), sampler.interval_ms)
