"""Prometheus metrics on their own listener, as RabbitMQ's rabbitmq_prometheus plugin serves them.

Three endpoints, on `prometheus_port` (15692 by default, `prometheus.tcp.port`, 0: none):

    GET /metrics             every metric of this node, aggregated: one sample per metric
    GET /metrics/per-object  the same metrics, one sample per queue, channel or connection
    GET /metrics/detailed    only the groups asked for (?family=queue_coarse_metrics&...),
                             per object, names prefixed rabbitmq_detailed_; ?vhost=... keeps
                             the queues of those vhosts

The names, types, help texts and labels are rabbitmq_prometheus's (its core metrics
collector's groups: connection_churn_metrics, node_coarse_metrics, node_metrics, ra_metrics,
queue_coarse_metrics, queue_metrics, channel_*, connection_*), the global counters
(rabbitmq_global_messages_*_total with protocol and queue_type labels, rabbit_global_counters),
the alarm gauges and rabbitmq_build_info / rabbitmq_identity_info, so the published Grafana
dashboards ("RabbitMQ-Overview", "RabbitMQ-Quorum-Queues-Raft") find their series. Like
RabbitMQ, every node reports only itself; Prometheus scrapes each node.

Where hutch differs: a channel's counters are per channel, not per (channel, exchange) or
(channel, queue), so per-object channel metrics carry the `channel` label only, and
rabbitmq_queue_messages_published_total per object carries queue_vhost and queue; a channel is
labelled with its name, not an Erlang pid. The erlang_* process metrics have no meaning here
and are left out.

Every counter only grows: closed channels and connections, and deleted queues, stay counted
in the node's totals. This module exposes what the broker counts; it never changes broker state
and is never on a message's path (the exposition format is prometheus_client's).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import prometheus_client
import psutil
from aiohttp import web
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

from hutch import __version__
from hutch.broker import msgstats as ms
from hutch.control import rates

log = logging.getLogger("hutch.prometheus")

RABBITMQ_COMPAT_VERSION = "3.10.8"
PREFIX = "rabbitmq_"
DETAILED_PREFIX = "rabbitmq_detailed_"
CLUSTER_PREFIX = "rabbitmq_cluster_"
QUEUE_TYPES = ("rabbit_classic_queue", "rabbit_quorum_queue", "rabbit_stream_queue")
_TYPE_OF = {"classic": "rabbit_classic_queue", "quorum": "rabbit_quorum_queue", "stream": "rabbit_stream_queue"}

# (name, type, help) per group, as rabbitmq_prometheus's core collector names them
GROUPS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "connection_churn_metrics": (
        ("connections_opened_total", "counter", "Total number of connections opened"),
        ("connections_closed_total", "counter", "Total number of connections closed or terminated"),
        ("channels_opened_total", "counter", "Total number of channels opened"),
        ("channels_closed_total", "counter", "Total number of channels closed"),
        ("queues_declared_total", "counter", "Total number of queues declared"),
        ("queues_created_total", "counter", "Total number of queues created"),
        ("queues_deleted_total", "counter", "Total number of queues deleted"),
    ),
    "node_coarse_metrics": (
        ("process_open_fds", "gauge", "Open file descriptors"),
        ("process_open_tcp_sockets", "gauge", "Open TCP sockets"),
        ("process_resident_memory_bytes", "gauge", "Memory used in bytes"),
        ("disk_space_available_bytes", "gauge", "Disk space available in bytes"),
    ),
    "node_metrics": (
        ("process_max_fds", "gauge", "Open file descriptors limit"),
        ("process_max_tcp_sockets", "gauge", "Open TCP sockets limit"),
        ("resident_memory_limit_bytes", "gauge", "Memory high watermark in bytes"),
        ("disk_space_available_limit_bytes", "gauge", "Free disk space low watermark in bytes"),
        ("erlang_net_ticktime_seconds", "gauge", "Inter-node heartbeat interval"),
        ("erlang_uptime_seconds", "gauge", "Node uptime"),
    ),
    "ra_metrics": (
        ("raft_term_total", "counter", "Current Raft term number"),
        ("raft_log_snapshot_index", "gauge", "Raft log snapshot index"),
        ("raft_log_last_applied_index", "gauge", "Raft log last applied index"),
        ("raft_log_commit_index", "gauge", "Raft log commit index"),
        ("raft_log_last_written_index", "gauge", "Raft log last written index"),
        ("raft_entry_commit_latency_seconds", "gauge", "Time taken for a log entry to be committed"),
    ),
    "queue_coarse_metrics": (
        ("queue_messages_ready", "gauge", "Messages ready to be delivered to consumers"),
        ("queue_messages_unacked", "gauge", "Messages delivered to consumers but not yet acknowledged"),
        ("queue_messages", "gauge", "Sum of ready and unacknowledged messages - total queue depth"),
    ),
    "queue_consumer_count": (
        ("queue_consumers", "gauge", "Consumers on a queue"),
    ),
    "queue_metrics": (
        ("queue_consumers", "gauge", "Consumers on a queue"),
        ("queue_messages_bytes", "gauge", "Size in bytes of ready and unacknowledged messages"),
        ("queue_messages_ready_bytes", "gauge", "Size in bytes of ready messages"),
        ("queue_messages_unacked_bytes", "gauge", "Size in bytes of all unacknowledged messages"),
    ),
    "channel_metrics": (
        ("channel_consumers", "gauge", "Consumers on a channel"),
        ("channel_messages_unacked", "gauge", "Delivered but not yet acknowledged messages"),
        ("channel_messages_unconfirmed", "gauge", "Published but not yet confirmed messages"),
        ("channel_messages_uncommitted", "gauge", "Messages received in a transaction but not yet committed"),
        ("channel_acks_uncommitted", "gauge", "Message acknowledgements in a transaction not yet committed"),
        ("consumer_prefetch", "gauge", "Limit of unacknowledged messages for each consumer"),
        ("channel_prefetch", "gauge", "Total limit of unacknowledged messages for all consumers on a channel"),
    ),
    "channel_exchange_metrics": (
        ("channel_messages_published_total", "counter",
         "Total number of messages published into an exchange on a channel"),
        ("channel_messages_confirmed_total", "counter",
         "Total number of messages published into an exchange and confirmed on the channel"),
        ("channel_messages_unroutable_returned_total", "counter",
         "Total number of messages published as mandatory into an exchange and returned to the publisher as "
         "unroutable"),
        ("channel_messages_unroutable_dropped_total", "counter",
         "Total number of messages published as non-mandatory into an exchange and dropped as unroutable"),
    ),
    "channel_queue_metrics": (
        ("channel_get_ack_total", "counter",
         "Total number of messages fetched with basic.get in manual acknowledgement mode"),
        ("channel_get_total", "counter",
         "Total number of messages fetched with basic.get in automatic acknowledgement mode"),
        ("channel_messages_delivered_ack_total", "counter",
         "Total number of messages delivered to consumers in manual acknowledgement mode"),
        ("channel_messages_delivered_total", "counter",
         "Total number of messages delivered to consumers in automatic acknowledgement mode"),
        ("channel_messages_redelivered_total", "counter", "Total number of messages redelivered to consumers"),
        ("channel_messages_acked_total", "counter", "Total number of messages acknowledged by consumers"),
        ("channel_get_empty_total", "counter", "Total number of times basic.get operations fetched no message"),
    ),
    "connection_coarse_metrics": (
        ("connection_incoming_bytes_total", "counter", "Total number of bytes received on a connection"),
        ("connection_outgoing_bytes_total", "counter", "Total number of bytes sent on a connection"),
    ),
    "connection_metrics": (
        ("connection_channels", "gauge", "Channels on a connection"),
    ),
    "channel_queue_exchange_metrics": (
        ("queue_messages_published_total", "counter", "Total number of messages published to queues"),
    ),
}
# the groups only /metrics/detailed serves, with the rabbitmq_cluster_ prefix
CLUSTER_GROUPS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "vhost_status": (("vhost_status", "gauge", "Whether a given vhost is running"),),
    "exchange_bindings": (("exchange_bindings", "gauge",
                           "Number of bindings for an exchange. This value is cluster-wide."),),
}
TOTALS = (
    ("connections", "gauge", "Connections currently open"),
    ("channels", "gauge", "Channels currently open"),
    ("consumers", "gauge", "Consumers currently connected"),
    ("queues", "gauge", "Queues available"),
)
GLOBAL_PROTOCOL = (
    ("messages_received_total", "counter", "Total number of messages received from publishers"),
    ("messages_received_confirm_total", "counter",
     "Total number of messages received from publishers expecting confirmations"),
    ("messages_routed_total", "counter", "Total number of messages routed to queues or streams"),
    ("messages_unroutable_dropped_total", "counter",
     "Total number of messages published as non-mandatory into an exchange and dropped as unroutable"),
    ("messages_unroutable_returned_total", "counter",
     "Total number of messages published as mandatory into an exchange and returned to the publisher as "
     "unroutable"),
    ("messages_confirmed_total", "counter", "Total number of messages confirmed to publishers"),
    ("publishers", "gauge", "Current number of publishers"),
    ("consumers", "gauge", "Current number of consumers"),
)
GLOBAL_QUEUE_TYPE = (
    ("messages_delivered_total", "counter", "Total number of messages delivered to consumers"),
    ("messages_delivered_consume_manual_ack_total", "counter",
     "Total number of messages delivered to consumers using basic.consume with manual acknowledgment"),
    ("messages_delivered_consume_auto_ack_total", "counter",
     "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment"),
    ("messages_delivered_get_manual_ack_total", "counter",
     "Total number of messages delivered to consumers using basic.get with manual acknowledgment"),
    ("messages_delivered_get_auto_ack_total", "counter",
     "Total number of messages delivered to consumers using basic.get with automatic acknowledgment"),
    ("messages_get_empty_total", "counter", "Total number of times basic.get operations fetched no message"),
    ("messages_redelivered_total", "counter", "Total number of messages redelivered to consumers"),
    ("messages_acknowledged_total", "counter", "Total number of messages acknowledged by consumers"),
)
ALARMS = (
    ("file_descriptor_limit", "is 1 if file descriptor limit alarm is in effect", "fd"),
    ("free_disk_space_watermark", "is 1 if free disk space watermark alarm is in effect", "disk"),
    ("memory_used_watermark", "is 1 if VM memory watermark alarm is in effect", "memory"),
)


def _family(full_name: str, mtype: str, help_text: str, labels: list[str]):
    if mtype == "counter":
        return CounterMetricFamily(full_name, help_text, labels=labels)
    if mtype == "gauge":
        return GaugeMetricFamily(full_name, help_text, labels=labels)
    return UnknownMetricFamily(full_name, help_text, labels=labels)


class Scrape:
    """One scrape's view of the node: read once, shared by every metric family."""

    def __init__(self, broker: Any, started_at_s: float):
        self.broker = broker
        self.cfg = broker.config
        self.started_at_s = started_at_s
        self.sampler = rates.sampler_of(broker)
        self.by_type = self.sampler.queue_type_totals(broker)
        self.node_counts = ms.node_totals(broker)
        self.node_counters = ms.node_counters(broker)
        self.sessions = [s for s in broker.sessions if s.vhost is not None]
        self.queues = [q for v in broker.vhosts.values() for q in v.queues.values()]

    # -- the node
    def node_values(self) -> dict[str, float]:
        proc = psutil.Process()
        try:
            fds = proc.num_fds()
        except (psutil.Error, AttributeError):
            fds = 0
        try:
            fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ValueError, OSError):
            fd_limit = 0
        try:
            disk_free = shutil.disk_usage(self.cfg.data_dir).free
        except OSError:
            disk_free = 0
        mem_limit = self.cfg.vm_memory_high_watermark_bytes or int(
            psutil.virtual_memory().total * self.cfg.vm_memory_high_watermark)
        return {
            "process_open_fds": fds,
            "process_open_tcp_sockets": len(self.broker.sessions),
            "process_resident_memory_bytes": proc.memory_info().rss,
            "disk_space_available_bytes": disk_free,
            "process_max_fds": fd_limit,
            "process_max_tcp_sockets": fd_limit,
            "resident_memory_limit_bytes": mem_limit,
            "disk_space_available_limit_bytes": self.cfg.disk_free_limit_bytes,
            "erlang_net_ticktime_seconds": self.cfg.net_ticktime_s,
            "erlang_uptime_seconds": max(0.0, time.time() - self.started_at_s),
        }

    def churn(self) -> dict[str, float]:
        c = self.node_counters
        tracker = self.sampler
        return {
            "connections_opened_total": c[ms.CONNECTIONS_OPENED],
            "connections_closed_total": c[ms.CONNECTIONS_CLOSED],
            "channels_opened_total": c[ms.CHANNELS_OPENED],
            "channels_closed_total": c[ms.CHANNELS_CLOSED],
            "queues_declared_total": c[ms.QUEUES_DECLARED],
            "queues_created_total": tracker.queues_seen,
            "queues_deleted_total": tracker.queues_gone,
        }

    def raft_rows(self) -> list[tuple[tuple[str, str], dict[str, float]]]:
        """Per quorum queue and stream (a Raft group each) this node is a member of: its Raft
        figures (a stream's commit latency is not measured: 0)."""
        cl = self.broker.cluster
        rows = []
        for host in (getattr(cl, "quorum", None), getattr(cl, "streams", None)) if cl is not None else ():
            rows += self._raft_rows_of(host)
        return rows

    @staticmethod
    def _raft_rows_of(host: Any) -> list[tuple[tuple[str, str], dict[str, float]]]:
        raft = getattr(host, "raft", None)
        if raft is None:
            return []
        latencies = getattr(host, "commit_latency_ms", {})
        rows = []
        for q in list(host.queues.values()):
            st = raft.status(q.gid)
            if st is None:
                continue
            latency_ms = latencies.get(q.gid, 0)
            rows.append(((q.vhost, q.name), {
                "raft_term_total": st.get("term", 0),
                "raft_log_snapshot_index": st.get("snapshot_index", 0),
                "raft_log_last_applied_index": st.get("applied", 0),
                "raft_log_commit_index": st.get("commit", 0),
                "raft_log_last_written_index": st.get("last_index", 0),
                "raft_entry_commit_latency_seconds": latency_ms / 1000,
            }))
        return rows

    # -- queues, channels, connections: (labels, {metric: value}) per object
    def is_home(self, q: Any) -> bool:
        """The node that reports a queue's figures: a classic queue's own node, a quorum queue's
        or a stream's leader (as RabbitMQ, where the queue's process reports them), so that
        adding up the nodes' series counts each queue once."""
        if q.queue_type != "classic":
            return q.home_node == self.cfg.node_name
        return q.local

    def queue_rows(self, vhosts: set[str] | None, home_only: bool = True
                   ) -> list[tuple[tuple[str, ...], dict[str, float]]]:
        rows = []
        for q in self.queues:
            if vhosts is not None and q.vhost not in vhosts:
                continue
            if home_only and not self.is_home(q):
                continue
            f = q.figures()
            rows.append(((q.vhost, q.name), {
                "queue_messages_ready": f.ready,
                "queue_messages_unacked": f.unacked,
                "queue_messages": f.ready + f.unacked,
                "queue_consumers": f.consumers,
                "queue_messages_bytes": f.ready_bytes + f.unacked_bytes,
                "queue_messages_ready_bytes": f.ready_bytes,
                "queue_messages_unacked_bytes": f.unacked_bytes,
                "queue_messages_published_total": q.mstats[ms.PUBLISH],
            }))
        return rows

    def channel_rows(self) -> list[tuple[tuple[str, ...], dict[str, float]]]:
        rows = []
        for s in self.sessions:
            for ch in s.channels.values():
                tx = ch.tx or []
                rows.append(((f"{s.name} ({ch.number})",), {
                    "channel_consumers": len(ch.consumers),
                    "channel_messages_unacked": len(ch.unacked),
                    "channel_messages_unconfirmed": len(ch.confirm_waiting),
                    "channel_messages_uncommitted": sum(1 for op in tx if op[0] == "publish"),
                    "channel_acks_uncommitted": sum(1 for op in tx if op[0] != "publish"),
                    "consumer_prefetch": ch.prefetch,
                    "channel_prefetch": ch.global_prefetch,
                    **_channel_counters(ch.mstats),
                }))
        return rows

    def connection_rows(self) -> list[tuple[tuple[str, ...], dict[str, float]]]:
        return [((s.name,), {"connection_incoming_bytes_total": s.recv_oct,
                             "connection_outgoing_bytes_total": s.send_oct,
                             "connection_channels": len(s.channels)}) for s in self.sessions]

    def node_channel_counters(self) -> dict[str, float]:
        """Every channel's counters, closed ones included: these only grow."""
        return _channel_counters(self.node_counts)

    def node_connection_counters(self) -> dict[str, float]:
        c = self.node_counters
        return {"connection_incoming_bytes_total": c[ms.RECV_OCT_CLOSED] + sum(s.recv_oct for s in self.sessions),
                "connection_outgoing_bytes_total": c[ms.SEND_OCT_CLOSED] + sum(s.send_oct for s in self.sessions),
                "connection_channels": sum(len(s.channels) for s in self.sessions)}


def _channel_counters(c) -> dict[str, float]:
    return {
        "channel_messages_published_total": c[ms.PUBLISH],
        "channel_messages_confirmed_total": c[ms.CONFIRM],
        "channel_messages_unroutable_returned_total": c[ms.RETURN_UNROUTABLE],
        "channel_messages_unroutable_dropped_total": c[ms.DROP_UNROUTABLE],
        "channel_get_ack_total": c[ms.GET],
        "channel_get_total": c[ms.GET_NO_ACK],
        "channel_messages_delivered_ack_total": c[ms.DELIVER],
        "channel_messages_delivered_total": c[ms.DELIVER_NO_ACK],
        "channel_messages_redelivered_total": c[ms.REDELIVER],
        "channel_messages_acked_total": c[ms.ACK],
        "channel_get_empty_total": c[ms.GET_EMPTY],
    }


class CoreCollector(Collector):
    """rabbitmq_prometheus's core metrics: per group, aggregated or per object."""

    def __init__(self, scrape: Callable[[], Scrape | None], per_object: bool, prefix: str = PREFIX,
                 groups: list[str] | None = None, vhosts: set[str] | None = None, totals: bool = True):
        self.scrape = scrape
        self.per_object = per_object
        self.prefix = prefix
        self.groups = groups
        self.vhosts = vhosts
        self.totals = totals

    def collect(self) -> Iterator[Any]:
        sc = self.scrape()
        if sc is None:
            return
        groups = self.groups if self.groups is not None else [
            g for g in GROUPS if g != "queue_consumer_count"]  # queue_metrics has the same figure
        if "queue_metrics" in groups and "queue_consumer_count" in groups:
            groups = [g for g in groups if g != "queue_consumer_count"]
        for group in groups:
            if group in GROUPS:
                yield from self._group(sc, group)
        if self.groups is not None:
            for group in self.groups:
                if group in CLUSTER_GROUPS:
                    yield from self._cluster_group(sc, group)
        if self.totals:
            yield from self._totals(sc)

    def _emit(self, metrics: tuple, labels: list[str], rows: list[tuple[tuple, dict]]) -> Iterator[Any]:
        for name, mtype, help_text in metrics:
            fam = _family(self.prefix + name, mtype, help_text, labels)
            if not labels:  # aggregated: one sample, 0 when there is nothing to add up (as RabbitMQ)
                fam.add_metric([], sum(values.get(name, 0) for _l, values in rows))
            else:
                for label_values, values in rows:
                    if name in values:
                        fam.add_metric(list(label_values), values[name])
            yield fam

    def _group(self, sc: Scrape, group: str) -> Iterator[Any]:
        metrics = GROUPS[group]
        per = self.per_object
        if group == "connection_churn_metrics":
            yield from self._emit(metrics, [], [((), sc.churn())])
        elif group in ("node_coarse_metrics", "node_metrics"):
            yield from self._emit(metrics, [], [((), sc.node_values())])
        elif group == "ra_metrics":
            rows = sc.raft_rows()
            if per:
                yield from self._emit(metrics, ["vhost", "queue"], rows)
            else:
                total = {}
                for _labels, values in rows:
                    for k, v in values.items():
                        total[k] = total.get(k, 0) + v
                if rows:  # the commit latency is an average over the groups
                    total["raft_entry_commit_latency_seconds"] /= len(rows)
                yield from self._emit(metrics, [], [((), total)])
        elif group in ("queue_coarse_metrics", "queue_metrics", "queue_consumer_count"):
            rows = sc.queue_rows(self.vhosts)
            yield from self._emit(metrics, ["vhost", "queue"], rows) if per else \
                self._emit(metrics, [], [((), _sum(rows))])
        elif group == "channel_queue_exchange_metrics":
            if per:
                rows = sc.queue_rows(self.vhosts, home_only=False)  # counted where the channels are
                yield from self._emit(metrics, ["queue_vhost", "queue"], rows)
            else:
                published = sum(c[ms.PUBLISH] for c in sc.by_type.values())
                yield from self._emit(metrics, [], [((), {"queue_messages_published_total": published})])
        elif group in ("channel_metrics", "channel_exchange_metrics", "channel_queue_metrics"):
            if per:
                yield from self._emit(metrics, ["channel"], sc.channel_rows())
            else:
                rows = sc.channel_rows()
                agg = _sum(rows)
                if group != "channel_metrics":
                    agg = sc.node_channel_counters()
                yield from self._emit(metrics, [], [((), agg)])
        elif group in ("connection_coarse_metrics", "connection_metrics"):
            if per:
                yield from self._emit(metrics, ["channel"], sc.connection_rows())
            else:
                yield from self._emit(metrics, [], [((), sc.node_connection_counters())])

    def _cluster_group(self, sc: Scrape, group: str) -> Iterator[Any]:
        metrics = CLUSTER_GROUPS[group]
        broker = sc.broker
        vhosts = [v for v in broker.vhosts if self.vhosts is None or v in self.vhosts]
        if group == "vhost_status":
            rows = [((v,), {"vhost_status": 1}) for v in vhosts]
            yield from _emit_prefixed(CLUSTER_PREFIX, metrics, ["vhost"], rows)
        elif group == "exchange_bindings":
            rows = []
            for vname in vhosts:
                for x in broker.vhosts[vname].exchanges.values():
                    if x.internal or x.name == "":
                        continue
                    rows.append(((vname, x.name, x.type), {"exchange_bindings": len(x.bindings)}))
            yield from _emit_prefixed(CLUSTER_PREFIX, metrics, ["vhost", "exchange", "type"], rows)

    def _totals(self, sc: Scrape) -> Iterator[Any]:
        values = {
            "connections": len(sc.sessions),
            "channels": sum(len(s.channels) for s in sc.sessions),
            "consumers": sum(len(ch.consumers) for s in sc.sessions for ch in s.channels.values()),
            "queues": sum(1 for q in sc.queues if sc.is_home(q)),
        }
        yield from _emit_prefixed(PREFIX, TOTALS, [], [((), values)])


def _emit_prefixed(prefix: str, metrics: tuple, labels: list[str], rows: list) -> Iterator[Any]:
    for name, mtype, help_text in metrics:
        fam = _family(prefix + name, mtype, help_text, labels)
        for label_values, values in rows:
            if name in values:
                fam.add_metric(list(label_values), values[name])
        yield fam


def _sum(rows: list[tuple[tuple, dict]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for _labels, values in rows:
        for k, v in values.items():
            total[k] = total.get(k, 0) + v
    return total


class GlobalCollector(Collector):
    """rabbitmq_global_*: the node's message counters by protocol and by queue type."""

    def __init__(self, scrape: Callable[[], Scrape | None]):
        self.scrape = scrape

    def collect(self) -> Iterator[Any]:
        sc = self.scrape()
        if sc is None:
            return
        c = sc.node_counts
        unroutable = c[ms.DROP_UNROUTABLE] + c[ms.RETURN_UNROUTABLE]
        chans = [ch for s in sc.sessions for ch in s.channels.values()]
        per_protocol = {
            "messages_received_total": c[ms.PUBLISH],
            "messages_received_confirm_total": c[ms.PUBLISH_CONFIRM],
            "messages_routed_total": max(0, c[ms.PUBLISH] - unroutable),
            "messages_unroutable_dropped_total": c[ms.DROP_UNROUTABLE],
            "messages_unroutable_returned_total": c[ms.RETURN_UNROUTABLE],
            "messages_confirmed_total": c[ms.CONFIRM],
            "publishers": sum(1 for ch in chans if ch.mstats[ms.PUBLISH]),
            "consumers": sum(len(ch.consumers) for ch in chans),
        }
        yield from _emit_prefixed("rabbitmq_global_", GLOBAL_PROTOCOL, ["protocol"],
                                  [(("amqp091",), per_protocol)])
        rows = []
        for qtype in QUEUE_TYPES:
            t = next((v for k, v in sc.by_type.items() if _TYPE_OF.get(k) == qtype), None) or ms.new()
            rows.append((("amqp091", qtype), {
                "messages_delivered_total": t[ms.DELIVER] + t[ms.DELIVER_NO_ACK] + t[ms.GET] + t[ms.GET_NO_ACK],
                "messages_delivered_consume_manual_ack_total": t[ms.DELIVER],
                "messages_delivered_consume_auto_ack_total": t[ms.DELIVER_NO_ACK],
                "messages_delivered_get_manual_ack_total": t[ms.GET],
                "messages_delivered_get_auto_ack_total": t[ms.GET_NO_ACK],
                "messages_get_empty_total": t[ms.GET_EMPTY],
                "messages_redelivered_total": t[ms.REDELIVER],
                "messages_acknowledged_total": t[ms.ACK],
            }))
        yield from _emit_prefixed("rabbitmq_global_", GLOBAL_QUEUE_TYPE, ["protocol", "queue_type"], rows)


class AlarmCollector(Collector):
    def __init__(self, scrape: Callable[[], Scrape | None]):
        self.scrape = scrape

    def collect(self) -> Iterator[Any]:
        sc = self.scrape()
        if sc is None:
            return
        for name, help_text, alarm in ALARMS:
            yield GaugeMetricFamily("rabbitmq_alarms_" + name, help_text, value=1 if alarm in sc.broker.alarms else 0)


class IdentityCollector(Collector):
    """rabbitmq_build_info and rabbitmq_identity_info (dashboards join on the latter)."""

    def __init__(self, scrape: Callable[[], Scrape | None]):
        self.scrape = scrape

    def collect(self) -> Iterator[Any]:
        sc = self.scrape()
        if sc is None:
            return
        build = UnknownMetricFamily(
            "rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info",
            labels=["rabbitmq_version", "prometheus_plugin_version", "prometheus_client_version", "erlang_version",
                    "product_name", "product_version"])
        build.add_metric([RABBITMQ_COMPAT_VERSION, __version__, _client_version(), sys.version.split()[0],
                          "hutch", __version__], 1)
        yield build
        cfg = sc.cfg
        ident = UnknownMetricFamily("rabbitmq_identity_info", "RabbitMQ node & cluster identity info",
                                    labels=["rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id"])
        cluster = cfg.cluster_name or cfg.node_name
        ident.add_metric([cfg.node_name, cluster, _permanent_id(sc.broker, cluster)], 1)
        yield ident


def _client_version() -> str:
    try:
        from importlib.metadata import version
        return version("prometheus-client")
    except Exception:  # noqa: BLE001 - only a label
        return ""


def _permanent_id(broker: Any, cluster: str) -> str:
    cl = broker.cluster
    cid = getattr(getattr(cl, "catalogue", None), "cluster_id", None) if cl is not None else None
    return str(cid) if cid else f"hutch-cluster-id-{cluster}"


# ---------------------------------------------------------------- the listener and the sampler

class MetricsService:
    """The node's statistics clock (the message-rate sampler) and its Prometheus listener.
    `node` is anything with `.broker` (replaced when the app restarts) and `.config`."""

    def __init__(self, node: Any):
        self.node = node
        self.started_at_s = time.time()
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._timer: asyncio.TimerHandle | None = None

    def _scrape(self) -> Scrape | None:
        broker = getattr(self.node, "broker", None)
        return Scrape(broker, self.started_at_s) if broker is not None else None

    def registry(self, kind: str, groups: list[str] | None = None, vhosts: set[str] | None = None
                 ) -> CollectorRegistry:
        reg = CollectorRegistry(auto_describe=False)
        scrape_once: list[Scrape | None] = []

        def scrape() -> Scrape | None:  # one view of the node for all collectors of this scrape
            if not scrape_once:
                scrape_once.append(self._scrape())
            return scrape_once[0]
        if kind == "detailed":
            reg.register(CoreCollector(scrape, True, DETAILED_PREFIX, groups or [], vhosts, totals=False))
        else:
            reg.register(CoreCollector(scrape, kind == "per-object"))
            reg.register(GlobalCollector(scrape))
            reg.register(AlarmCollector(scrape))
        reg.register(IdentityCollector(scrape))
        return reg

    # -- the sampler
    def start_sampling(self) -> None:
        loop = asyncio.get_running_loop()
        interval_s = max(0.1, self.node.config.collect_statistics_interval_ms / 1000)

        def tick() -> None:
            broker = getattr(self.node, "broker", None)
            if broker is not None:
                try:
                    rates.sampler_of(broker).tick(broker)
                except Exception:  # noqa: BLE001 - statistics must never take the node down
                    log.exception("message statistics sample failed")
            self._timer = loop.call_later(interval_s, tick)
        self._timer = loop.call_later(interval_s, tick)

    # -- the listener
    async def start(self, host: str | None, port: int) -> list[tuple[str, int]]:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/metrics/per-object", self._per_object)
        app.router.add_get("/metrics/detailed", self._detailed)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host=host, port=port, reuse_address=True, backlog=64)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            self._runner = None
            raise
        addresses = [(a[0], a[1]) for a in self._runner.addresses]
        self.port = addresses[0][1] if addresses else port
        return addresses

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _respond(self, reg: CollectorRegistry) -> web.Response:
        body = prometheus_client.generate_latest(reg)
        return web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})

    async def _metrics(self, request: web.Request) -> web.Response:
        return self._respond(self.registry("aggregated"))

    async def _per_object(self, request: web.Request) -> web.Response:
        return self._respond(self.registry("per-object"))

    async def _detailed(self, request: web.Request) -> web.Response:
        groups = [g for g in request.query.getall("family", []) if g in GROUPS or g in CLUSTER_GROUPS]
        vhost_args = request.query.getall("vhost", [])
        vhosts = set(vhost_args) if vhost_args else None
        return self._respond(self.registry("detailed", groups, vhosts))


def default_host(config: Any) -> str | None:
    return getattr(config, "prometheus_host", None) or getattr(config, "amqp_host", None) or None


