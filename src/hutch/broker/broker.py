"""The broker of one node: vhosts, users, sessions, and the work done once per loop iteration.

Handling a socket read only records what must happen: queues that got messages or
consumer capacity are marked dirty, sessions with bytes to send are listed. `run()` —
called by the runtime once per event-loop iteration when anything is pending — dispatches
dirty queues, sends batched publisher confirms, and hands each session's frames to its
transport in one write. So a read of many publishes becomes one write of many deliveries.

Disk-first classic queues (hutch.queues.paging, docs/durability.md): past a queue's memory
window the broker stores a new message's body on disk — a persistent message of a durable
queue is in the journal already, any other goes to the node's scratch log — and the queue
keeps only its location; the broker is the queue's `BodyStore` and reads bodies back for it.

Resource alarms follow RabbitMQ: above the memory high watermark every connection that
publishes is sent `connection.blocked` (when its client announced the capability) and is
no longer read from until the alarm clears, when it gets `connection.unblocked`.
"""

from __future__ import annotations

import base64
import datetime
import gc
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pamqp import commands

from hutch import __version__
from hutch.amqp import codec, spec
from hutch.amqp.spec import AMQPError
from hutch.broker import arguments as qargs
from hutch.broker.exchanges import QUEUE, Exchange
from hutch.broker.journal import (
    REF_DELIVERED,
    REF_EXPIRATION,
    REF_PRIORITY_SHIFT,
    REF_SIZE_MASK,
    Journal,
    ScratchLog,
    Unreadable,
)
from hutch.broker.msgstats import PUBLISH
from hutch.broker.vhost import VHost
from hutch.queues import effective
from hutch.queues.classic import ClassicQueue
from hutch.queues.message import Message
from hutch.queues.paging import (
    PAGED_INDEX_BYTES,
    SCRATCH,
    WINDOW_BYTES_DEFAULT,
    WINDOW_MESSAGES_DEFAULT,
    PagingPolicy,
)
from hutch.queues.state import REJECT_PUBLISH_DLX, Entry, QueueLimits
from hutch.store import StoreError

log = logging.getLogger("hutch.broker")


STREAM_FSYNC_MODES = ("before_confirm", "background")  # the values of stream.fsync (Config.stream_fsync)


@dataclass
class Config:
    node_name: str = "hutch@localhost"
    amqp_host: str = "0.0.0.0"
    amqp_port: int = 5672
    data_dir: str = "./var/hutch"
    log_level: str = "info"
    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat_s: int = 60
    max_message_size: int = 128 * 1024 * 1024
    vm_memory_high_watermark: float = 0.4  # of total memory, as RabbitMQ's relative watermark
    vm_memory_high_watermark_bytes: int | None = None  # absolute, overrides the relative one
    memory_check_interval_ms: int = 1000
    disk_free_limit_bytes: int = 50 * 1000 * 1000  # RabbitMQ's default disk_free_limit.absolute
    disk_check_interval_ms: int = 1000
    default_user: str = "guest"
    default_pass: str = "guest"
    default_vhost: str = "/"
    loopback_users: list[str] = field(default_factory=lambda: ["guest"])
    socket_write_buffer_high_bytes: int = 1024 * 1024
    auth_mechanisms: list[str] = field(default_factory=lambda: ["PLAIN", "AMQPLAIN"])
    # TLS (AMQPS): a listener starts when a certificate and key are configured
    amqps_port: int = 5671
    # RabbitMQ's stream protocol (stream.listeners.tcp.default; 0: no listener), and the address
    # clients are told to use for this node (stream.advertised_host/port; empty/0: the listener's)
    stream_port: int = 5552
    stream_advertised_host: str = ""
    stream_advertised_port: int = 0
    stream_frame_max: int = 1048576
    stream_heartbeat_s: int = 60
    # stream.fsync: "before_confirm" (a confirm waits until a majority of a stream's members have
    # fsynced its chunk) or "background" (until a majority wrote it, each fsyncing right after)
    stream_fsync: str = "before_confirm"
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    tls_cacertfile: str | None = None
    tls_verify_peer: bool = False
    tls_fail_if_no_peer_cert: bool = False
    ssl_cert_login_from: str = "distinguished_name"  # or common_name (EXTERNAL mechanism)
    cluster_name: str = ""
    mgmt_port: int = 15672  # management HTTP API; 0: no HTTP listener
    prometheus_port: int = 15692  # Prometheus metrics (rabbitmq_prometheus's port); 0: no listener
    prometheus_host: str | None = None  # None: amqp_host
    collect_statistics_interval_ms: int = 5000  # how often message rates are sampled (RabbitMQ's default)
    # clustering
    peer_port: int = 25672  # the inter-node listener (RabbitMQ's distribution port)
    cluster_nodes: list[str] = field(default_factory=list)  # NAME@HOST[:PEER_PORT]; non-empty: clustered
    peer_addresses: dict[str, tuple[str, int]] = field(default_factory=dict)  # how to reach a peer (overrides)
    cluster_secret_file: str | None = None  # default: $HUTCH_CLUSTER_SECRET, else ~/.hutch.cookie
    net_ticktime_s: float = 60.0
    metadata_timeout_ms: int = 15000  # a catalogue change that cannot commit in this long fails
    queue_master_locator: str = "client-local"  # client-local | min-masters | random
    # a quorum queue's delivery limit when neither x-delivery-limit nor a policy sets one (RabbitMQ
    # 4.0's default; None: unlimited, as in 3.13)
    quorum_queue_default_delivery_limit: int | None = 20
    # how long a channel may hold a delivery unacknowledged (RabbitMQ's consumer_timeout; None: no limit)
    consumer_timeout_ms: int | None = 1_800_000
    mirroring_sync_batch_size: int = 4096  # messages per sync batch unless ha-sync-batch-size says
    mirroring_sync_max_throughput: int = 0  # bytes/s a sync may send (0: no limit)
    mirroring_sync_background: bool = False  # hutch's own: syncs keep the queue serving (ha-sync-background)
    mirroring_recover_from_disk: bool = True  # hutch's own: a mirror of a durable queue keeps its copy on disk
    # disk-first classic queues: ready messages a queue keeps in memory before new ones are paged
    classic_queue_memory_window_messages: int = WINDOW_MESSAGES_DEFAULT
    classic_queue_memory_window_bytes: int = WINDOW_BYTES_DEFAULT
    # ... once the node's memory use passes this fraction of the high watermark (RabbitMQ's key
    # and default); 0: always past the window. Lazy queues and recovery page regardless.
    vm_memory_high_watermark_paging_ratio: float = 0.5
    cluster_partition_handling: str = "ignore"  # ignore | pause_minority | pause_if_all_down | autoheal
    load_definitions: str | None = None  # a definitions file (or directory) imported at every boot
    pause_if_all_down_nodes: list[str] = field(default_factory=list)  # pause when none of these is reachable
    pause_if_all_down_recover: str | None = None  # after the heal: ignore | autoheal (required with the mode)
    # management HTTP API: address to bind (None: amqp_host) and the HTTPS listener (management.ssl.*)
    mgmt_host: str | None = None
    mgmt_ssl_port: int | None = None  # set: an HTTPS listener serves the API
    mgmt_ssl_host: str | None = None
    mgmt_tls_certfile: str | None = None
    mgmt_tls_keyfile: str | None = None
    mgmt_tls_cacertfile: str | None = None
    mgmt_tls_password: str | None = None
    mgmt_tls_verify_peer: bool = False
    mgmt_tls_fail_if_no_peer_cert: bool = False
    mgmt_tcp_configured: bool = False  # a management.tcp.* key was given (with ssl: both listeners)
    # every log.* key of the configuration file as written (log.file, log.file.rotation.size, ...)
    log_settings: dict[str, str] = field(default_factory=dict)
    config_warnings: list[str] = field(default_factory=list)  # logged once logging is set up


def hash_password(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's rabbit_password_hashing_sha256: base64(salt(4) + sha256(salt + password))."""
    salt = salt if salt is not None else os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def check_password(password: str, password_hash: str) -> bool:
    """True when `password` matches the stored hash. A blank password never matches, and a user
    without a hash (password login disabled) matches nothing. The digests are compared in
    constant time."""
    if not password or not password_hash:
        return False
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (ValueError, TypeError):
        return False
    if len(raw) <= 4:
        return False
    salt = raw[:4]
    return hmac.compare_digest(hashlib.sha256(salt + password.encode()).digest(), raw[4:])


class User:
    __slots__ = ("name", "password_hash", "tags", "permissions")

    def __init__(self, name: str, password_hash: str, tags: list[str]):
        self.name = name
        self.password_hash = password_hash
        self.tags = tags
        self.permissions: dict[str, tuple[re.Pattern, re.Pattern, re.Pattern]] = {}

    def set_permissions(self, vhost: str, configure: str, write: str, read: str) -> None:
        self.permissions[vhost] = (re.compile(configure), re.compile(write), re.compile(read))


_PERM_INDEX = {"configure": 0, "write": 1, "read": 2}


class Broker:
    def __init__(self, config: Config, schedule: Callable[[], None] | None = None,
                 clock_ms: Callable[[], int] | None = None,
                 call_later: Callable[[float, Callable[[], None]], Any] | None = None):
        self.config = config
        self._schedule_cb = schedule or (lambda: None)
        # the loop's timer (delay in s, callback); None: the broker has no timers of its own
        self.call_later = call_later
        self.now_ms = clock_ms or (lambda: int(time.monotonic() * 1000))
        self.vhosts: dict[str, VHost] = {}
        self.users: dict[str, User] = {}
        self.sessions: set = set()
        self.dirty_queues: set[ClassicQueue] = set()
        self._outputs: list = []
        self._scheduled = False
        self._scheduled_ms = 0  # when the pending run was asked for (expiry judges by it)
        self.alarms: set[str] = set()
        # memory use past vm_memory_high_watermark_paging_ratio (set by memory_check): queues past
        # their memory window page transient messages to disk too (a ratio of 0: from the start)
        self.paging_pressure = config.vm_memory_high_watermark_paging_ratio <= 0
        self.blocking = False
        self._blocked_sessions: set = set()
        self.ttl_queues: set[ClassicQueue] = set()
        self.policies: list[dict[str, Any]] = []
        self.operator_policies: list[dict[str, Any]] = []
        self.journal: Journal | None = None
        self.scratch: ScratchLog | None = None  # bodies of paged messages the journal does not hold
        self.scratch_failed = False
        self.request_sync: Callable[[], None] = lambda: None  # set by the runtime
        self._direct_replies: dict[str, tuple[Any, str]] = {}
        self.flow_limited: set[ClassicQueue] = set()
        # whether the node is using most of a core (set by the runtime, which measures it); True
        # where nobody measures: publishers are then held back behind any busy consumer
        self.saturated = True
        self._sync_waiters: deque[tuple[int, Callable, Any]] = deque()  # (log seq, fn, arg), in seq order
        self._paged_routes: dict[tuple[str, str], bytes] = {}  # encoded routes of messages read back
        self.started_ms = self.now_ms()
        # The node's part in its cluster (a standalone node is a cluster of one): vhosts, users,
        # exchanges and queues come from the cluster's catalogue through it.
        self.cluster: Any = None

    # ---------------------------------------------------------------- scheduling

    def schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._scheduled_ms = self.now_ms()
            self._schedule_cb()

    def output_due(self, session) -> None:
        self._outputs.append(session)
        self.schedule()

    def run(self) -> None:
        """One iteration's deferred work: dispatch, confirms, then one write per session."""
        self._scheduled = False
        dirty = self.dirty_queues
        rounds = 0
        now = self.now_ms()
        asked = self._scheduled_ms
        while dirty and rounds < 64:
            rounds += 1
            batch = list(dirty)
            dirty.clear()
            for q in batch:
                if q.deleted:
                    continue
                if not q.local:
                    q.flush()
                    continue
                if q.message_ttl_ms is not None or q in self.ttl_queues:
                    self.expire_queue(q, asked)
                if q.dispatch():
                    q.last_dispatch_ms = now
                self._flow_check(q)
        if self.journal is not None:
            self.journal.flush()  # this iteration's V and A records, one of each per queue
            if self.journal.unsynced:
                self.request_sync()
        if self.scratch is not None and not self.scratch_failed:
            try:
                self.scratch.flush()
            except StoreError as e:
                self._scratch_broken(e)
        if self.cluster is not None:
            self.cluster.flush()
        outputs = self._outputs
        if outputs:
            self._outputs = []
            for s in outputs:
                s.flush_confirms()
                out = s.take_output()
                if out and s.transport_hooks is not None:
                    s.transport_hooks.write(out)
        if dirty:
            self.schedule()

    # ---------------------------------------------------------------- storage

    def open_storage(self, data_dir: str, keep_unknown: bool = False) -> None:
        """Recover journalled messages into the queues homed here (start-up, after the
        catalogue has been replayed and has made those queues). `keep_unknown`: the catalogue
        did not catch up (`_recover_messages`)."""
        self.journal = Journal(os.path.join(data_dir, "msgs"))  # first: its lock keeps a second node out
        self.scratch = ScratchLog(os.path.join(data_dir, "scratch"))
        queues = {q.journal_id: q for v in self.vhosts.values() for q in v.queues.values()
                  if q.local and q.journal_id}
        # Recovery makes many long-lived objects at once: the cyclic GC would rescan them again
        # and again while they are made, and has nothing to find among them.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            total = self._recover_messages(queues, keep_unknown)
        finally:
            if gc_was_enabled:
                gc.enable()
        gc.freeze()  # what recovery built stays: keep it out of every later collection
        log.info("recovered %d queue(s) and %d persistent message(s)", len(queues), total)
        if self.cluster is not None:
            self.cluster.recovered()  # mirrored queues are led here from now on

    def _recover_messages(self, queues: dict, keep_unknown: bool = False) -> int:
        """Put the journal's surviving messages back on their queues, in publish order. A queue
        that pages takes only its window's bodies into memory; the rest stay in the journal.
        `keep_unknown`: the catalogue has not caught up, so a queue missing from it may only be
        declared late; the journal holds on to such a queue's messages (`adopt_journalled`)."""
        recovered = self.journal.recover_refs(queues, keep_unknown=keep_unknown)
        return sum(self._recover_queue(queues[qid], refs) for qid, refs in recovered.items())

    def adopt_journalled(self, q: ClassicQueue) -> None:
        """A durable queue made here after start-up, by a catalogue entry this node applied
        late: the messages the journal kept for it since (see `_recover_messages`)."""
        if self.journal is None or not q.journal_id:
            return
        refs = self.journal.take_orphans(q.journal_id)
        if refs is not None:
            log.info("queue '%s' in vhost '%s': its declaration was applied after start-up; taking the "
                     "messages the journal kept for it", q.name, q.vhost)
            self._recover_queue(q, refs)

    def _recover_queue(self, q: ClassicQueue, refs) -> int:
        """One queue's surviving messages (the journal's refs table) back on it; how many."""
        qid = q.journal_id
        routes: dict[tuple[str, str], bytes] = {}
        journal = self.journal
        now = self.now_ms()
        lost = 0
        for log_seq, ref in refs.items():
            size = ref & REF_SIZE_MASK
            count = 1 if ref & REF_DELIVERED else 0
            if q.pages_out():
                if q.refuses(size):  # reject-publish: the queue's limit leaves no room for it any more
                    journal.settled(qid, log_seq)
                    continue
                expiration_ms = None
                if ref & REF_EXPIRATION:
                    msg = self._journal_message(q, log_seq, routes)
                    if msg is None:
                        lost += 1
                        continue
                    expiration_ms = msg.expiration_ms
                ttl = expiration_ms
                if q.message_ttl_ms is not None:
                    ttl = q.message_ttl_ms if ttl is None else min(ttl, q.message_ttl_ms)
                q.publish_paged(log_seq, size, None if ttl is None else now + ttl, count,
                                (ref >> REF_PRIORITY_SHIFT) & 0xFF)
                if ttl is not None:
                    self.ttl_queues.add(q)
                continue
            msg = self._journal_message(q, log_seq, routes)
            if msg is None:
                lost += 1
                continue
            entry, dropped = q.publish(msg, now)
            for d in dropped:  # the queue's limits leave no room for it any more
                self.settled(q, d)
            if entry is None:
                journal.settled(qid, log_seq)
                continue
            if dropped and dropped[-1] is entry:
                journal.settled(qid, log_seq)
                continue
            entry.log_seq = log_seq
            entry.delivery_count = count
            if msg.expiration_ms is not None:
                self.ttl_queues.add(q)
        for d in q.drop_over_limit(read=False):  # drop-head over the paged messages too
            self.settled(q, d)
        log.info("queue '%s' in vhost '%s': recovered %d persistent message(s)%s", q.name, q.vhost,
                 len(refs) - lost, f" ({q.paged_count} of them paged)" if q.paged_count else "")
        return len(refs) - lost

    def _journal_message(self, q: ClassicQueue, log_seq: int, routes: dict | None = None) -> Message | None:
        """A journalled message read back (CRC checked); None, logged and settled, when it cannot be."""
        try:
            exchange, routing_key, props, body = self.journal.read_enqueue(log_seq)
        except Unreadable as e:
            log.error("queue '%s' in vhost '%s': message at journal record %d cannot be read back (%s); "
                      "it is dropped", q.name, q.vhost, log_seq, e)
            self._journal_drop(q, log_seq)
            return None
        return self._message(exchange, routing_key, props, body, True, routes)

    def _message(self, exchange: str, routing_key: str, props: bytes, body: bytes, persistent: bool,
                 routes: dict | None = None) -> Message:
        key = (exchange, routing_key)
        route = routes.get(key) if routes is not None else None
        if route is None:
            route = codec.route_encoding(exchange, routing_key)
            if routes is not None and len(routes) < 4096:
                routes[key] = route
        priority, expiration_ms = priority_and_expiration(props)
        return Message(exchange, routing_key, route, props, body, persistent, priority, expiration_ms)

    # ---------------------------------------------------------------- the queues' body store (hutch.queues.paging)

    def read_paged_batch(self, q: ClassicQueue, items: list[tuple[int, int]], keep: bool = False) -> list[Message | None]:
        """BodyStore.read_paged_batch: paged messages back from the journal and the scratch log,
        each log read once for the lot (records that lie together come in one read). `keep`:
        BodyStore.peek_paged (nothing released, nothing dropped)."""
        if all(loc < SCRATCH for _seq, loc in items):  # a durable queue of persistent messages
            return self._read_journalled(q, items, keep)
        got: list[Message | None] = [None] * len(items)
        journal_at = [n for n, (_seq, loc) in enumerate(items) if loc < SCRATCH]
        if journal_at:
            for n, m in zip(journal_at, self._read_journalled(q, [items[n] for n in journal_at], keep), strict=True):
                got[n] = m
        if self.scratch is None:
            return got
        scratch_at = [n for n, (_seq, loc) in enumerate(items) if loc >= SCRATCH]
        sseqs = [items[n][1] - SCRATCH for n in scratch_at]
        routes = self._paged_routes
        for n, sseq, r in zip(scratch_at, sseqs, self.scratch.read_many(sseqs), strict=True):
            if not keep:
                self.scratch.release(sseq)
            if isinstance(r, Unreadable):
                log.error("queue '%s' in vhost '%s': paged message %d (scratch record %d) cannot be read back "
                          "(%s)%s", q.name, q.vhost, items[n][0], sseq, r, "" if keep else "; it is dropped")
                continue
            exchange, routing_key, props, body, persistent = r
            got[n] = self._message(exchange, routing_key, props, body, persistent, routes)
        return got

    def peek_paged(self, q: ClassicQueue, items: list[tuple[int, int]]) -> list[Message | None]:
        """BodyStore.peek_paged."""
        return self.read_paged_batch(q, items, keep=True)

    def _read_journalled(self, q: ClassicQueue, items: list[tuple[int, int]], keep: bool = False) -> list[Message | None]:
        if self.journal is None:
            return [None] * len(items)
        out: list[Message | None] = []
        routes = self._paged_routes
        message = self._message
        for (seq, loc), r in zip(items, self.journal.read_enqueues([loc for _seq, loc in items]), strict=True):
            if isinstance(r, Unreadable):
                log.error("queue '%s' in vhost '%s': paged message %d (journal record %d) cannot be read back "
                          "(%s)%s", q.name, q.vhost, seq, loc, r, "" if keep else "; it is dropped")
                if not keep:
                    self._journal_drop(q, loc)
                out.append(None)
                continue
            exchange, routing_key, props, body = r
            out.append(message(exchange, routing_key, props, body, True, routes))
        return out

    def _journal_drop(self, q: ClassicQueue, log_seq: int) -> None:
        """Settle a journalled message that cannot be read back, so that it does not come back
        at the next boot (unless its record is gone already)."""
        try:
            if self.journal.log.is_live(log_seq):
                self.journal.settled(q.journal_id, log_seq)
        except StoreError as e:
            log.warning("queue '%s' in vhost '%s': journal record %d could not be settled (%s)", q.name, q.vhost,
                        log_seq, e)

    def drop_paged(self, q: ClassicQueue, locs: list[int]) -> None:
        """BodyStore.drop_paged: paged messages leave unread (purge, deleted queue)."""
        journalled = []
        for loc in locs:
            if loc >= SCRATCH:
                if self.scratch is not None:
                    self.scratch.release(loc - SCRATCH)
            else:
                journalled.append(loc)
        if journalled and q.journal_id and self.journal is not None:
            self.journal.purged(q.journal_id, journalled)

    def paging_policy(self, eff: effective.Effective | None) -> PagingPolicy:
        """A queue's paging numbers: the node's window, or none with `queue-mode: lazy`."""
        if eff is not None and eff.queue_mode == "lazy":
            return PagingPolicy.lazy()
        cfg = self.config
        return PagingPolicy(cfg.classic_queue_memory_window_messages, cfg.classic_queue_memory_window_bytes)

    def durable_done(self, seq: int) -> None:
        """An fsync covered the journal up to `seq`: confirm what waited for it."""
        self.journal.synced_seq = max(self.journal.synced_seq, seq)
        waiters = self._sync_waiters
        while waiters and waiters[0][0] <= seq:
            _s, fn, arg = waiters.popleft()
            fn(arg)
        self.journal.collect()
        self.schedule()

    def after_sync(self, fn: Callable, arg: Any) -> None:
        """Call fn(arg) once everything journalled so far is on disk (now, if nothing waits)."""
        j = self.journal
        if j is not None:
            j.flush()
        if j is None or not j.unsynced:
            fn(arg)
            return
        self._sync_waiters.append((j.log.last_seq, fn, arg))
        self.schedule()

    def close_storage(self) -> None:
        if self.journal is not None:
            self.journal.sync()
            self.journal.close()
        if self.scratch is not None:
            self.scratch.close()
            self.scratch = None

    # ---------------------------------------------------------------- sessions

    def server_properties(self) -> dict[str, Any]:
        return {
            "product": "hutch",
            "version": __version__,
            "platform": "Python",
            "copyright": "hutch contributors",
            "information": "Licensed under the Apache License 2.0",
            "cluster_name": self.config.cluster_name or self.config.node_name,
            "capabilities": {
                "publisher_confirms": True,
                "exchange_exchange_bindings": True,
                "basic.nack": True,
                "consumer_cancel_notify": True,
                "connection.blocked": True,
                "consumer_priorities": True,
                "authentication_failure_close": True,
                "per_consumer_qos": True,
                "direct_reply_to": False,
            },
        }

    def session_opened(self, session) -> None:
        self.sessions.add(session)

    def session_gone(self, session) -> None:
        self.sessions.discard(session)
        self._blocked_sessions.discard(session)
        for q in session.flow_queues:
            if q.flow_waiters is not None:
                q.flow_waiters.discard(session)
        session.flow_queues.clear()
        self.schedule()

    def authenticate(self, username: str, password: str, peer: str) -> User | None:
        """The user when `password` is theirs (PLAIN, AMQPLAIN, HTTP basic auth); None otherwise.
        A blank password is refused outright, as RabbitMQ's internal backend refuses it."""
        if not password:
            log.warning("user '%s' attempted to log in with a blank password, which is prohibited by the "
                        "internal authN backend. To use TLS/x509 certificate-based authentication, configure "
                        "the client to use the EXTERNAL authentication mechanism. Alternatively change the "
                        "password for the user to be non-blank.", username)
            return None
        user = self.users.get(username)
        if user is None or not check_password(password, user.password_hash):
            return None
        if username in self.config.loopback_users and not _is_loopback(peer):
            log.error("User '%s' can only connect via localhost", username)
            return None
        return user

    def authenticate_external(self, cert: dict | None) -> tuple[str, User | None]:
        """EXTERNAL: the identity is the client certificate's subject (its DN, or its CN)."""
        if not cert:
            return "", None
        subject = [rdn for rdns in cert.get("subject", ()) for rdn in rdns]
        if self.config.ssl_cert_login_from == "common_name":
            name = next((v for k, v in subject if k == "commonName"), "")
        else:
            short = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
                     "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST"}
            name = ",".join(f"{short.get(k, k)}={v}" for k, v in reversed(subject))
        return name, self.users.get(name)

    def may_access_vhost(self, user: User, vhost: str) -> bool:
        return vhost in user.permissions

    def check_permission(self, user: User, vhost: str, perm: str, kind: str, name: str) -> None:
        """RabbitMQ's rule: the permission's regex must match somewhere in the resource name
        (an unanchored search; write ^...$ to anchor), and the empty regex grants nothing. The
        default exchange is named 'amq.default' for this check."""
        perms = user.permissions.get(vhost)
        resource = "amq.default" if kind == "exchange" and name == "" else name
        pattern = perms[_PERM_INDEX[perm]] if perms is not None else None
        if pattern is None or not pattern.pattern or pattern.search(resource) is None:
            raise AMQPError(spec.ACCESS_REFUSED, f"access to {kind} '{resource}' in vhost '{vhost}' refused for "
                            f"user '{user.name}'")

    def check_topic_permission(self, user: User, vhost: str, x: Exchange, perm: str, routing_key: str) -> None:
        """RabbitMQ's topic authorisation, for topic exchanges only: with no topic permission for
        (user, vhost, exchange) everything is allowed; otherwise the routing key must match the
        `write` (publish) or `read` (bind, unbind) regex after `{username}` and `{vhost}` are
        replaced; an empty regex matches only the empty key."""
        if x.type != "topic" or self.cluster is None:
            return
        tp = self.cluster.catalogue.topic_permissions.get((user.name, vhost, x.name))
        if tp is None:
            return
        pattern = (tp.write if perm == "write" else tp.read) or "^$"
        pattern = pattern.replace("{username}", user.name).replace("{vhost}", vhost)
        try:
            allowed = re.search(pattern, routing_key) is not None
        except re.error:
            allowed = False
        if not allowed:
            raise AMQPError(spec.ACCESS_REFUSED, f"access to topic '{routing_key}' in exchange '{x.name}' in vhost "
                                                 f"'{vhost}' refused for user '{user.name}'")

    # ---------------------------------------------------------------- limits (RabbitMQ's user and vhost limits)

    def user_limit(self, username: str, name: str) -> int | None:
        """A user's max-connections or max-channels; None when unset or negative (no limit)."""
        rec = self.cluster.catalogue.users.get(username) if self.cluster is not None else None
        value = rec.limits.get(name) if rec is not None else None
        return value if isinstance(value, int) and value >= 0 else None

    def vhost_limit(self, vhost: str, name: str) -> int | None:
        """A vhost's max-connections or max-queues; None when unset or negative (no limit)."""
        value = self.cluster.catalogue.vhost_limits(vhost).get(name) if self.cluster is not None else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    def connection_counts(self) -> dict[str, dict[str, int]]:
        """This node's open connections per vhost ("v") and per user ("u"), and channels per user
        ("c"): sent to the other nodes every second, so that limits count the whole cluster."""
        v: dict[str, int] = {}
        u: dict[str, int] = {}
        c: dict[str, int] = {}
        for s in self.sessions:
            if s.vhost is None or s.closed:
                continue
            v[s.vhost.name] = v.get(s.vhost.name, 0) + 1
            u[s.username] = u.get(s.username, 0) + 1
            c[s.username] = c.get(s.username, 0) + len(s.channels)
        return {"v": v, "u": u, "c": c}

    def _cluster_count(self, kind: str, key: str) -> int:
        """Connections (or channels) of a vhost or user on the running nodes: this node's now,
        the others' as they last reported (at most a second ago, as RabbitMQ's tracking too
        lags a little behind)."""
        counts = self.connection_counts()
        total = counts[kind].get(key, 0)
        cl = self.cluster
        if cl is not None:
            for peer, theirs in cl.peer_counts.items():
                if peer != cl.node and cl.is_up(peer):
                    n = theirs.get(kind, {}).get(key, 0) if isinstance(theirs.get(kind), dict) else 0
                    total += n if isinstance(n, int) else 0
        return total

    def connection_refusal(self, username: str, vhost: str) -> str | None:
        """Why a connection of `username` to `vhost` may not open (its vhost's or its user's
        connection limit is reached, counted across the cluster), in RabbitMQ's words; None when
        it may."""
        limit = self.vhost_limit(vhost, "max-connections")
        if limit is not None and (limit == 0 or self._cluster_count("v", vhost) >= limit):
            return f"access to vhost '{vhost}' refused for user '{username}': connection limit ({limit}) is reached"
        limit = self.user_limit(username, "max-connections")
        if limit is not None and (limit == 0 or self._cluster_count("u", username) >= limit):
            return f"connection refused for user '{username}': user connection limit ({limit}) is reached"
        return None

    def channel_refusal(self, username: str) -> str | None:
        """Why a user may not open one more channel (its max-channels, counted across the cluster)."""
        limit = self.user_limit(username, "max-channels")
        if limit is None:
            return None
        if limit == 0 or self._cluster_count("c", username) >= limit:
            return (f"number of channels opened for user '{username}' has reached the maximum allowed user limit "
                    f"of ({limit})")
        return None

    def queue_refusal(self, vhost: VHost, name: str) -> str | None:
        """Why a new queue may not be declared in `vhost` (its max-queues, counted cluster-wide)."""
        limit = self.vhost_limit(vhost.name, "max-queues")
        if limit is not None and (limit == 0 or len(vhost.queues) + 1 > limit):
            return f"cannot declare queue '{name}': queue limit in vhost '{vhost.name}' ({limit}) is reached"
        return None

    # ---------------------------------------------------------------- definitions

    def add_vhost(self, name: str) -> VHost:
        v = self.vhosts.get(name)
        if v is None:
            v = self.vhosts[name] = VHost(name)
            v.policy_alternate = self._policy_alternate
        return v

    def add_exchange(self, vhost: VHost, x: Exchange) -> None:
        vhost.exchanges[x.name] = x
        vhost.topology_changed()

    def declare_queue(self, vhost: VHost, name: str, *, durable: bool, exclusive: bool, auto_delete: bool,
                      arguments: dict, owner) -> ClassicQueue:
        """This node's object for a queue homed here (the catalogue has its record)."""
        s = qargs.queue_settings(arguments, name, vhost.name)
        q = ClassicQueue(name, vhost.name, durable=durable, auto_delete=auto_delete,
                         exclusive_owner=owner if exclusive else None, arguments=dict(arguments), limits=s.limits,
                         single_active=s.single_active, message_ttl_ms=s.message_ttl_ms, expires_ms=s.expires_ms,
                         dead_letter_exchange=s.dead_letter_exchange,
                         dead_letter_routing_key=s.dead_letter_routing_key, home_node=self.config.node_name,
                         host=self)
        q.store = self
        q.last_used_ms = self.now_ms()
        vhost.queues[name] = q
        vhost.topology_changed()
        if exclusive:
            owner.exclusive_queues.append(q)
        self.apply_policies(q)
        return q

    # ---------------------------------------------------------------- policies

    def queue_settings(self, vhost: str, name: str, queue_type: str, arguments: dict) -> effective.Effective:
        """A queue's effective settings: its arguments with the policy and operator policy that
        match it now (hutch.queues.effective.resolve, RabbitMQ's precedence)."""
        pol = effective.match(self.policies, vhost, name, "queue", queue_type)
        op = effective.match(self.operator_policies, vhost, name, "queue", queue_type)
        return effective.resolve(queue_type, arguments, pol["definition"] if pol else None,
                                 op["definition"] if op else None, name=name, vhost=vhost,
                                 default_delivery_limit=self.config.quorum_queue_default_delivery_limit)

    def _policy_alternate(self, x: Exchange, vhost: str) -> str | None:
        pol = effective.match(self.policies, vhost, x.name, "exchange")
        return effective.exchange_alternate(x.arguments, pol["definition"] if pol else None)

    def apply_policies(self, q: ClassicQueue) -> None:
        """Bring a classic queue homed here (a mirrored queue's leader) in line with its effective
        settings. A lowered max-length or max-length-bytes with drop-head overflow pushes out (and
        dead-letters) heads at once, as RabbitMQ's queue does when its policy changes; a changed
        message-ttl applies to messages enqueued from now on (each message's expiry is fixed when
        it is enqueued, in RabbitMQ's classic and quorum queues alike)."""
        eff = self.queue_settings(q.vhost, q.name, "classic", q.arguments)
        old = q.policy_settings
        if old == eff:
            return
        q.policy_settings = eff
        for w in eff.warnings:
            if old is None or w not in old.warnings:
                log.warning("%s", w)
        q.message_ttl_ms = eff.message_ttl_ms
        q.expires_ms = eff.expires_ms
        q.dead_letter_exchange = eff.dead_letter_exchange
        q.dead_letter_routing_key = eff.dead_letter_routing_key
        st = q.state
        st.limits = QueueLimits(eff.max_length, eff.max_length_bytes, eff.overflow, st.limits.max_priority)
        q.set_paging(self.paging_policy(eff))
        if eff.message_ttl_ms is not None or eff.expires_ms is not None:
            self.ttl_queues.add(q)
        if old is None:
            return  # a new queue: nothing queued yet
        dropped = q.drop_over_limit()  # drop-head, over the paged messages too
        if dropped:
            self.dead_letter(q, dropped, "maxlen")
        self.dirty_queues.add(q)
        self.schedule()

    def reapply_policies(self) -> None:
        """Policies or operator policies changed: every queue homed here takes its new settings
        (a quorum queue's leader proposes them to its group), and routing sees new alternate
        exchanges."""
        for v in list(self.vhosts.values()):
            v.topology_changed()
            for q in list(v.queues.values()):
                if q.deleted:
                    continue
                if q.quorum:
                    if self.cluster is not None:
                        self.cluster.quorum.reconfigure(q)
                elif getattr(q, "stream", False):
                    if self.cluster is not None:
                        self.cluster.streams.reconfigure(q)
                elif q.local:
                    self.apply_policies(q)

    def delete_queue(self, q: ClassicQueue, propose: bool = True, keep_bindings: bool = False) -> None:
        """Delete a queue homed here. In a cluster the catalogue is told too (unless the
        catalogue is what asks), so other nodes drop their stand-ins. `keep_bindings`: the
        queue lives on elsewhere (its leader moved), only this node's object goes."""
        if q.deleted:
            return
        if self.cluster is not None and propose:
            self.cluster.propose_delete(q)
        if self.cluster is not None and not keep_bindings:
            self.cluster.mirroring.queue_gone(q.vhost, q.name)  # its ring goes with it, here and now
        q.deleted = True
        if q.flow_waiters is not None:
            self._flow_release(q)
        vhost = self.vhosts.get(q.vhost)
        if vhost is None:
            return
        if vhost.queues.get(q.name) is q:
            del vhost.queues[q.name]
        # the catalogue's change will cascade the same way: this node's view does it at once, so
        # that a client that redeclares right away finds what it would find afterwards
        if not keep_bindings:
            self._auto_delete_exchanges(vhost, vhost.remove_bindings_of_queue(q.name))
        self.ttl_queues.discard(q)
        self.dirty_queues.discard(q)
        self.cancel_consumers(q)
        owner = q.exclusive_owner
        if owner is not None and q in owner.exclusive_queues:
            owner.exclusive_queues.remove(q)
        tail = q.tail
        if tail is not None and tail.count:
            self.drop_paged(q, tail.take_all())
        if q.journal_id and self.journal is not None:
            st = q.state
            self.journal.purged(q.journal_id, [e.log_seq for e in list(st.ready()) + list(st.unacked.values())
                                               if e.log_seq])

    def _auto_delete_exchanges(self, vhost: VHost, touched: list[Exchange]) -> None:
        """Auto-delete exchanges that lost their last binding go, which may empty others."""
        while touched:
            x = touched.pop()
            if x.auto_delete and not x.bindings and vhost.exchanges.get(x.name) is x:
                touched.extend(vhost.remove_exchange(x.name))

    def cancel_consumers(self, q: ClassicQueue) -> None:
        """The queue cancels its consumers (basic.cancel to the clients that take it); what they
        held unacknowledged returns to the queue when their channels settle or close."""
        for c in q.consumers():
            ch = c.channel
            q.remove_consumer(c)
            if ch is None:  # a consumer on another node: its node cancels it
                if self.cluster is not None and not q.deleted:
                    self.cluster.cancel_proxy(q, c)
                continue
            self.cancel_notify(c)

    def cancel_notify(self, c) -> None:
        """A consumer was cancelled by the queue: its channel forgets it, and its client is
        told with basic.cancel if it accepts that (capability consumer_cancel_notify)."""
        ch = c.channel
        if ch.consumers.pop(c.tag, None) is not None and not ch.closed:
            session = ch.session
            if session.proto.capabilities.get("consumer_cancel_notify"):
                session.send_method(ch.number, commands.Basic.Cancel(consumer_tag=c.tag, nowait=True))
                if not session.output_pending:
                    session.output_pending = True
                    self.output_due(session)

    def take_messages(self, q: ClassicQueue, count: int, requeue: bool, reject: bool) -> list[tuple[Entry, int]]:
        """Up to `count` messages from the head, each with the ready count left after it, then
        requeued, rejected (dead-lettered) or acknowledged: the management API's get."""
        self.expire_queue(q)
        taken = []
        for _ in range(count):
            entry = q.take_head(no_ack=False)
            if entry is None:
                break
            self.delivered(q, entry)
            taken.append((entry, q.message_count))
        for entry, _left in taken:
            if requeue:
                q.requeue(entry.seq)
            elif reject:
                q.discard(entry.seq)
            else:
                q.settle(entry.seq)
                self.settled(q, entry)
        if reject and not requeue and taken:
            self.dead_letter(q, [e for e, _left in taken], "rejected")
        self.queue_used(q)
        self.dirty_queues.add(q)
        self.schedule()
        return taken

    def purge_queue(self, q: ClassicQueue) -> int:
        paged = q.paged_count
        removed = q.remove_ready()  # the paged ones leave through drop_paged
        if q.journal_id and self.journal is not None:
            self.journal.purged(q.journal_id, [e.log_seq for e in removed if e.log_seq])
        return len(removed) + paged

    def consumer_gone(self, q: ClassicQueue) -> None:
        if not q.local:
            return
        q.last_used_ms = self.now_ms()
        if q.auto_delete and q.consumer_count == 0 and q.ever_consumed and not q.deleted:
            self.delete_queue(q)
        else:
            self.dirty_queues.add(q)
            self.schedule()

    def queue_used(self, q: ClassicQueue) -> None:
        q.last_used_ms = self.now_ms()

    def consumer_added(self, q: ClassicQueue) -> None:
        self.dirty_queues.add(q)
        self.schedule()

    def kick_consumers_of(self, channel) -> None:
        for c in channel.consumers.values():
            self.dirty_queues.add(c.queue)
        self.schedule()

    def kick_session(self, session) -> None:
        for ch in session.channels.values():
            for c in ch.consumers.values():
                self.dirty_queues.add(c.queue)
        self.schedule()

    # ---------------------------------------------------------------- messages

    def enqueue(self, queues: tuple[ClassicQueue, ...], msg: Message, channel, seq: int) -> bool:
        """Put a routed message on its queues. True when a queue refused it (overflow, or the
        home node of a durable queue is down)."""
        refused = False
        journalled = 0
        waits = 0
        now = self.now_ms() if msg.expiration_ms is not None or self.ttl_queues else 0
        remote = None
        for q in queues:
            q.mstats[PUBLISH] += 1  # the queue's publish counter (hutch.broker.msgstats)
            if not q.local:
                if remote is None:
                    remote = []
                remote.append(q)
                continue
            entry, dropped = self._put(q, msg, now)
            if entry is None:
                refused = True
                if q.state.limits.overflow == REJECT_PUBLISH_DLX:
                    self.dead_letter(q, [Entry(0, msg, None)], "maxlen")
                continue
            if entry.log_seq:
                journalled = entry.log_seq
            mirror = q._mirror  # the slot behind ClassicQueue.mirror (a property): read per publish
            if mirror is not None and seq:
                waits += 1
                mirror.after_stable(channel.accepted, seq, channel.publish_refused)
            if q.flow_waiters is not None:
                self._flow_wait(q, channel.session)
        if remote is not None:
            remote_waits, remote_refused = self.cluster.forward(remote, msg, channel, seq)
            waits += remote_waits
            refused = refused or remote_refused
        if seq and not refused and (journalled or waits):
            channel.confirm_later(seq, waits + (1 if journalled else 0))
            if journalled:
                self._sync_waiters.append((journalled, channel.accepted, seq))
        self.schedule()
        return refused

    def enqueue_local(self, queues: tuple[ClassicQueue, ...], msg: Message,
                      maybe_delivered: bool = False) -> tuple[bool, int]:
        """A message another node routed to queues homed here: (refused, journal seq or 0).
        `maybe_delivered`: an earlier leader of the queue may have delivered it (its next
        delivery carries `redelivered`)."""
        refused = False
        journalled = 0
        now = self.now_ms() if msg.expiration_ms is not None or self.ttl_queues else 0
        for q in queues:
            entry, _dropped = self._put(q, msg, now, 1 if maybe_delivered else 0)
            if entry is None:
                refused = True
                if q.state.limits.overflow == REJECT_PUBLISH_DLX:
                    self.dead_letter(q, [Entry(0, msg, None)], "maxlen")
            else:
                if entry.log_seq:
                    journalled = entry.log_seq
        return refused, journalled

    def _put(self, q: ClassicQueue, msg: Message, now: int, delivery_count: int = 0) -> tuple[Entry | None, list[Entry]]:
        """Enqueue on one queue, journalling persistent messages of durable queues; dead-letter
        what drop-head overflow pushed out. Past the queue's memory window the body goes to disk
        (the journal, or the scratch log) and the queue keeps its location only. `delivery_count`
        1: an earlier leader of the queue may have delivered it, in memory or paged alike."""
        tail = q.tail
        if tail is not None:  # q.pages_out, inlined (it runs per publish)
            st = q.state
            # past the window: a persistent message of a durable queue always (its body is in the
            # journal already, paging it costs no write), any other under memory pressure only
            if (tail.count or ((self.paging_pressure or not q.page_window or (msg.persistent and q.journal_id))
                               and (st.ready_count >= q.page_window or st.ready_bytes >= q.page_window_bytes))) \
                    and self.scratch is not None:
                if q.refuses(len(msg.body)):  # reject-publish, paged messages counted
                    return None, []
                paged = self._put_paged(q, msg, now, delivery_count)
                if paged is not None:
                    return paged, []
        entry, dropped = q.publish(msg, now)
        if entry is None:
            return None, dropped
        if delivery_count:  # maybe delivered by an earlier leader: its next delivery is redelivered
            entry.delivery_count = delivery_count
        if msg.persistent and q.journal_id and self.journal is not None:
            if dropped and dropped[-1] is entry:
                pass  # dropped on arrival: never stored
            else:
                entry.log_seq = self.journal.enqueue(q.journal_id, msg.exchange, msg.routing_key, msg.props,
                                                     msg.body)
                if delivery_count:  # and a restart keeps it redelivered (a V record)
                    self.journal.delivered(q.journal_id, entry.log_seq)
        if dropped:
            self.dead_letter(q, dropped, "maxlen")
        if msg.expiration_ms is not None:
            self.ttl_queues.add(q)
        self.dirty_queues.add(q)
        return entry, dropped

    def _put_paged(self, q: ClassicQueue, msg: Message, now: int, delivery_count: int = 0) -> _Paged | None:
        """Store the body and add the message to the queue's paged tail. None when the scratch
        log cannot take it: the queue's tail has then been read back, and the caller keeps the
        message in memory (the order holds: nothing paged is left ahead of it). The same for a
        queue being migrated to a quorum queue (hutch.control.migrate): what arrives while it is
        deleted is moved from memory (hutch.broker.kinds), so it must not be paged."""
        migrations = getattr(self.cluster, "migrations", None) if self.cluster is not None else None
        if migrations and (q.vhost, q.name) in migrations:
            q.page_in_all()
            return None
        loc = self.store_paged(q, msg)
        if loc is None:
            q.page_in_all()
            return None
        log_seq = loc if loc < SCRATCH else 0
        if delivery_count and log_seq:  # and a restart keeps it redelivered (a V record)
            self.journal.delivered(q.journal_id, log_seq)
        expires = q.expiry_of(msg, now) if msg.expiration_ms is not None or q.message_ttl_ms is not None else None
        q.publish_paged(loc, len(msg.body), expires, delivery_count, msg.priority, msg)
        if q.limited:
            dropped = q.drop_over_limit()
            if dropped:
                self.dead_letter(q, dropped, "maxlen")
        if msg.expiration_ms is not None:
            self.ttl_queues.add(q)
        self.dirty_queues.add(q)
        return _Paged(log_seq)

    def store_paged(self, q: ClassicQueue, msg: Message) -> int | None:
        """Write the body of a message `q` pages: its location (a journal seq for a persistent
        message of a durable queue, else a scratch record), or None when the scratch log
        cannot take it."""
        if msg.persistent and q.journal_id and self.journal is not None:
            return self.journal.enqueue(q.journal_id, msg.exchange, msg.routing_key, msg.props, msg.body)
        sseq = self._scratch_write(msg)
        return None if sseq is None else SCRATCH + sseq

    def pages(self, q: ClassicQueue, msg: Message) -> bool:
        """Does `msg`, enqueued on `q` now, go to the paged tail? (`_put` has this inlined.)"""
        tail = q.tail
        if tail is None or self.scratch is None:
            return False
        st = q.state
        return bool(tail.count or ((self.paging_pressure or not q.page_window or (msg.persistent and q.journal_id))
                                   and (st.ready_count >= q.page_window or st.ready_bytes >= q.page_window_bytes)))

    def _scratch_write(self, msg: Message) -> int | None:
        if self.scratch_failed:
            return None
        try:
            return self.scratch.write(msg.exchange, msg.routing_key, msg.props, msg.body, msg.persistent)
        except StoreError as e:
            self._scratch_broken(e)
            return None

    def _scratch_broken(self, e: BaseException) -> None:
        """The scratch log failed (a write error, a full disk): no more bodies go there. Messages
        that are not journalled stay in memory from now on, as they did before disk-first queues;
        paged ones whose records were written are still read back, the others are dropped as
        unreadable when their turn comes (they were transient)."""
        if not self.scratch_failed:
            self.scratch_failed = True
            log.error("Scratch log %s failed (%s): messages that are not journalled stay in memory from now on",
                      self.scratch.log.directory, e)

    # ---------------------------------------------------------------- direct reply-to

    def register_direct_reply(self, channel, tag: str) -> str:
        """A consumer of amq.rabbitmq.reply-to: replies to the returned name go straight to it."""
        token = "amq.rabbitmq.reply-to." + base64.urlsafe_b64encode(os.urandom(18)).decode()
        self._direct_replies[token] = (channel, tag)
        return token

    def unregister_direct_reply(self, channel) -> None:
        if channel.reply_token is not None:
            self._direct_replies.pop(channel.reply_token, None)
            channel.reply_token = None

    def direct_reply(self, msg: Message) -> bool:
        """Deliver a reply published to a direct reply-to name; False if its consumer is gone."""
        target = self._direct_replies.get(msg.routing_key)
        if target is None:
            return False
        ch, tag = target
        ch.delivery_tag += 1
        ch.session.send_frames(codec.deliver_frames(ch.number, codec.shortstr(tag), ch.delivery_tag, False,
                                                    msg.route_enc, msg.props, msg.body, ch.session.frame_max))
        return True

    # ---------------------------------------------------------------- flow control

    FLOW_READY_HIGH = 2000  # ready messages behind busy consumers before publishers wait
    FLOW_READY_LOW = 500
    FLOW_ACTIVE_MS = 1000  # consumers that received within this long count as busy

    def _flow_check(self, q: ClassicQueue) -> None:
        """Backpressure from consumers to publishers (RabbitMQ's credit flow, in effect).

        A queue is flow-limited while messages pile up ready behind consumers that are busy —
        their sockets backed up, or they received messages within the last FLOW_ACTIVE_MS while
        the node is the bottleneck: it is `saturated` (its runtime measures it using most of a
        core), or a consumer with room for more (not at its prefetch limit) is not being given
        messages fast enough — and sessions that publish into it are not read from until the
        backlog falls below the low-water mark. So publishers are slowed to what the node can
        deliver, as RabbitMQ's credit flow slows them to what its queue process can handle.
        Consumers that wait for their clients' acknowledgements (all at their prefetch limit)
        on a node with time to spare do not hold publishers back, however steadily they ack:
        the queue simply grows (paged to disk past its window), as RabbitMQ's does behind a
        slow consumer, rather than publishers being throttled to that consumer's pace. Nor do
        consumers that have gone quiet (no delivery within FLOW_ACTIVE_MS): a consumer that
        never acknowledges can never stall a publisher for good."""
        st = q.state
        mirror = q.mirror
        tail = q.tail
        ready = st.ready_count + tail.count if tail is not None else st.ready_count
        if q.flow_waiters is None:
            if (ready > self.FLOW_READY_HIGH and q.consumer_count and self._consumers_busy(q)) or (
                    mirror is not None and mirror.backlogged()):
                q.flow_waiters = set()
                self.flow_limited.add(q)
            return
        if mirror is not None and not mirror.drained():
            return  # a mirror has not caught up: publishers wait (credit flow through the ring)
        if ready <= self.FLOW_READY_LOW or not q.consumer_count or not self._consumers_busy(q):
            self._flow_release(q)

    def _consumers_busy(self, q: ClassicQueue) -> bool:
        recent = self.now_ms() - q.last_dispatch_ms < self.FLOW_ACTIVE_MS
        if recent and self.saturated:
            return True  # (the usual case under load: no walk over the consumers)
        consumers = q.consumers()
        if any(c.channel is not None and not c.channel.session.writable for c in consumers):
            return True
        return recent and not all(c.waits_for_acks() for c in consumers)

    def _flow_release(self, q: ClassicQueue) -> None:
        waiters, q.flow_waiters = q.flow_waiters, None
        self.flow_limited.discard(q)
        if self.cluster is not None:
            self.cluster.flow_released(q)
        for s in waiters:
            s.flow_queues.discard(q)
            if not s.flow_queues and not s.blocked and not s.closed and s.transport_hooks is not None:
                s.transport_hooks.resume_reading()

    def _flow_wait(self, q: ClassicQueue, session) -> None:
        if session in q.flow_waiters:
            return
        q.flow_waiters.add(session)
        if not session.flow_queues and session.transport_hooks is not None:
            session.transport_hooks.pause_reading()
        session.flow_queues.add(q)

    def settled(self, q: ClassicQueue, entry: Entry) -> None:
        """A message left its queue for good (ack, no-ack delivery, discard)."""
        if entry.log_seq and self.journal is not None:
            self.journal.settled(q.journal_id, entry.log_seq)
            entry.log_seq = 0

    def delivered(self, q: ClassicQueue, entry: Entry) -> None:
        """First delivery of a journalled message: remember it, so it comes back `redelivered`."""
        if entry.log_seq and entry.delivery_count == 1 and self.journal is not None:
            self.journal.delivered(q.journal_id, entry.log_seq)

    def expire_queue(self, q: ClassicQueue, now: int | None = None) -> None:
        # a message expires once its TTL has passed, not at its last moment: one published with
        # TTL 0 (x-message-ttl 0) still goes to a consumer that can take it at once, as in
        # RabbitMQ. The dispatch that follows a publish passes the time its run was asked for,
        # so a busy loop's delay before that run does not expire what arrived meanwhile.
        if now is None:
            now = self.now_ms()
        expired = q.expire(now - 1)
        if expired:
            self.dead_letter(q, expired, "expired")

    def tick(self) -> None:
        """Timers: message expiry at queue heads, queue expiry (x-expires), and releasing
        publishers held back by queues whose consumers went quiet."""
        now = self.now_ms()
        for q in list(self.flow_limited):
            self._flow_check(q)
        for q in list(self.ttl_queues):
            if q.deleted:
                self.ttl_queues.discard(q)
                continue
            if not (self._scheduled and q in self.dirty_queues):
                # (a run already asked for expires it by the time it was asked for: under uvloop
                # a due timer may run first, and would expire a TTL 0 message a waiting
                # consumer was to get)
                self.expire_queue(q)
            if q.expires_ms is not None and q.consumer_count == 0 and now - q.last_used_ms >= q.expires_ms:
                log.info("queue '%s' in vhost '%s' expired (x-expires %s ms)", q.name, q.vhost, q.expires_ms)
                self.delete_queue(q)
                continue
            if q.state.head() is not None or q.paged_count:
                self.dirty_queues.add(q)
        if self.dirty_queues:
            self.schedule()

    def dead_letter(self, q: ClassicQueue, entries: list[Entry], reason: str) -> None:
        """Republish discarded messages to the queue's dead-letter exchange, with x-death."""
        if not q.local and not q.quorum:
            return  # its home node dead-letters (a quorum queue's leader calls this itself)
        for e in entries:
            self.settled(q, e)
        dlx_name = q.dead_letter_exchange
        if dlx_name is None:
            return
        vhost = self.vhosts.get(q.vhost)
        if vhost is None:
            return
        dlx = vhost.exchanges.get(dlx_name)
        if dlx is None:
            log.warning("Dead-letter exchange '%s' for queue '%s' in vhost '%s' does not exist; %d message(s) "
                        "dropped", dlx_name, q.name, q.vhost, len(entries))
            return
        for e in entries:
            m = e.message
            summary = codec.summarize_properties(m.props)
            headers = codec.decode_headers(m.props, summary.headers_span)
            deaths = [dict(d) for d in (headers.get("x-death") or []) if isinstance(d, dict)]
            for d in deaths:
                if d.get("queue") == q.name and d.get("reason") == reason:
                    # as RabbitMQ: the same queue and reason again counts up; the entry moves first
                    d["count"] = int(d.get("count", 1)) + 1
                    deaths.remove(d)
                    deaths.insert(0, d)
                    break
            else:
                stamp = datetime.datetime.fromtimestamp(int(time.time()), tz=datetime.UTC)
                death = {"count": 1, "reason": reason, "queue": q.name, "time": stamp, "exchange": m.exchange,
                         "routing-keys": [m.routing_key]}
                if summary.expiration is not None:
                    death["original-expiration"] = summary.expiration
                deaths.insert(0, death)
            added = {"x-death": codec.typed_value(deaths)}
            if "x-first-death-reason" not in headers:
                added["x-first-death-reason"] = codec.typed_value(reason)
                added["x-first-death-queue"] = codec.typed_value(q.name)
                added["x-first-death-exchange"] = codec.typed_value(m.exchange)
            # whatever the reason, a dead letter does not expire again by its old expiration;
            # the publisher's own headers keep their wire types (the properties are spliced)
            new_props = codec.edit_properties(m.props, set_headers=added, drop=("expiration",))
            headers["x-death"] = deaths
            rk = q.dead_letter_routing_key if q.dead_letter_routing_key is not None else m.routing_key
            dm = Message(dlx_name, rk, codec.route_encoding(dlx_name, rk), new_props, m.body, m.persistent,
                         m.priority, None)
            targets = vhost.route(dlx, rk, headers if dlx.type == "headers" else None)
            if reason != "rejected":
                targets = [t for t in targets if not _dead_letter_cycle(t.name, deaths)]
            for t in targets:
                if not t.local:
                    self.cluster.forward([t], dm, None, 0)
                else:
                    self._put(t, dm, self.now_ms())
        self.schedule()

    # ---------------------------------------------------------------- alarms

    MESSAGE_OVERHEAD_BYTES = 200  # bookkeeping per queued message besides its body

    def accounted_bytes(self) -> int:
        """Memory held by messages in queues (bodies and bookkeeping). The memory alarm compares
        the node's idle footprint plus this figure with the watermark, so freeing messages (a
        purge, consumers catching up) clears the alarm at once, whatever the allocator keeps."""
        total = 0
        per = self.MESSAGE_OVERHEAD_BYTES
        for v in self.vhosts.values():
            for q in v.queues.values():
                if not q.local:
                    continue
                st = q.state
                total += st.ready_bytes + st.unacked_bytes + per * (st.ready_count + len(st.unacked))
                tail = q.tail
                if tail is not None:
                    total += tail.memory_bytes() + PAGED_INDEX_BYTES * tail.count
        return total

    def memory_check(self, used_bytes: int, total_bytes: int) -> None:
        limit = self.config.vm_memory_high_watermark_bytes or int(total_bytes * self.config.vm_memory_high_watermark)
        # past the paging ratio, queues past their memory window page transient messages to disk
        # as well (persistent ones of durable queues always are): a backlog stays below the alarm,
        # and a node with memory to spare does not write them to its scratch log
        self.paging_pressure = used_bytes >= limit * self.config.vm_memory_high_watermark_paging_ratio
        if used_bytes > limit and "memory" not in self.alarms:
            log.warning("vm_memory_high_watermark set. Memory used:%d allowed:%d", used_bytes, limit)
            self._set_alarm("memory")
        elif used_bytes <= limit and "memory" in self.alarms:
            log.warning("vm_memory_high_watermark clear. Memory used:%d allowed:%d", used_bytes, limit)
            self._clear_alarm("memory")

    def disk_check(self, free_bytes: int) -> None:
        """The disk alarm, as RabbitMQ's: free space on the data directory's file system below
        disk_free_limit blocks publishers until it is back above it."""
        limit = self.config.disk_free_limit_bytes
        if free_bytes < limit and "disk" not in self.alarms:
            log.warning("Free disk space is insufficient. Free bytes: %d. Limit: %d", free_bytes, limit)
            self._set_alarm("disk")
        elif free_bytes >= limit and "disk" in self.alarms:
            log.warning("Free disk space is sufficient. Free bytes: %d. Limit: %d", free_bytes, limit)
            self._clear_alarm("disk")

    def _set_alarm(self, resource: str) -> None:
        log.warning("%s resource limit alarm set on node %s.\n\n"
                    "**********************************************************\n"
                    "*** Publishers will be blocked until this alarm clears ***\n"
                    "**********************************************************", resource, self.config.node_name)
        self.alarms.add(resource)
        self.blocking = True

    def _clear_alarm(self, resource: str) -> None:
        log.warning("%s resource limit alarm cleared on node %s", resource, self.config.node_name)
        self.alarms.discard(resource)
        self.blocking = bool(self.alarms)
        if not self.blocking:
            self._unblock_all()

    def block_publisher(self, session) -> None:
        session.blocked = True
        self._blocked_sessions.add(session)
        if session.proto.capabilities.get("connection.blocked"):
            reason = "low on memory" if "memory" in self.alarms else "low on disk"
            session.send_method(0, commands.Connection.Blocked(reason=reason))
        if session.transport_hooks is not None:
            session.transport_hooks.pause_reading()

    def _unblock_all(self) -> None:
        for s in list(self._blocked_sessions):
            s.blocked = False
            if s.proto.capabilities.get("connection.blocked"):
                s.send_method(0, commands.Connection.Unblocked())
            if s.transport_hooks is not None and not s.flow_queues:
                s.transport_hooks.resume_reading()
        self._blocked_sessions.clear()


class _Paged:
    """What `_put` answers for a message that went straight to a queue's paged tail: no entry
    object exists for it; `log_seq` is its journal record (0: not journalled)."""

    __slots__ = ("log_seq",)

    def __init__(self, log_seq: int):
        self.log_seq = log_seq


def _dead_letter_cycle(queue: str, deaths: list) -> bool:
    """RabbitMQ's cycle rule: a dead letter would return to a queue it already died in, and no
    death since then (that one included) was a rejection, so nothing but timers and limits
    would move it round again. Such targets are dropped."""
    for d in deaths:
        if not isinstance(d, dict) or d.get("reason") == "rejected":
            return False
        if d.get("queue") == queue:
            return True
    return False


def priority_and_expiration(props: bytes) -> tuple[int, int | None]:
    """A recovered message's priority and per-message TTL (the TTL runs again from recovery,
    not from publish)."""
    if len(props) < 2 or not props[0] & 0x09:  # neither flag set: priority (bit 11), expiration (bit 8)
        return 0, None
    try:
        summary = codec.summarize_properties(props)
        exp = summary.expiration
        return summary.priority, (qargs.parse_expiration(exp) if exp is not None else None)
    except AMQPError:
        return 0, None


def _is_loopback(peer: str) -> bool:
    host = peer.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host in ("localhost", "")


__all__ = ["Broker", "Config", "User", "hash_password", "check_password", "QUEUE"]
