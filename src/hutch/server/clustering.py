"""A node's part in a cluster: the peer transport, the catalogue's Raft group and its log.

`ClusterRuntime` wires the sans-I/O pieces under the node's event loop:

- the `PeerTransport` (one authenticated TCP link per pair of nodes, heartbeats, net_ticktime),
  carrying three groups: `"raft"` (`[group id, message]` for every Raft group: the catalogue is
  group 0), `"q"` (operations on queues
  homed on another node, `hutch.broker.cluster`) and `"rpc"` (proposals forwarded to the
  leader, joins);
- the catalogue's `RaftGroup` on the node's `RaftHostStorage` (DATA_DIR/raft), hosted with the
  quorum queues' groups by `hutch.server.raft_host`: every Ready is made durable (one fsync)
  before its messages leave, then its committed entries are applied to the catalogue and the
  broker (`ClusterBroker.apply_command`);
- proposals: a change proposed on a follower is forwarded to the leader and retried until
  this node has applied it or `metadata_timeout_ms` has passed — then it fails with 541
  INTERNAL_ERROR saying that no majority is reachable. A node on the minority side of a
  partition therefore never changes the catalogue;
- the leader's chores: the first start of a cluster (default vhost, user, cluster name and
  member addresses), adding a node that joins, deleting the non-durable and exclusive queues
  of a node that is down (RabbitMQ's rule for non-mirrored queues), mirror placement, and
  forget_cluster_node. `hutch.broker.chores` decides each of them as a pure function; this
  module carries the decisions out (proposes, logs, remembers when it last acted).

The runtime's owner (`hutch.server.runtime.Node`) is known only through the callback it
passes in (`on_partition`); nothing here imports it.

Node ids in Raft are 63-bit hashes of node names, so every node derives the same id for a
name without coordination.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from hutch.broker import chores
from hutch.broker.broker import Broker, Config, hash_password
from hutch.broker.cluster import INIT_PARAM, NODE_PARAM, ClusterBroker
from hutch.cluster import catalogue as cat
from hutch.cluster.raftlog import RaftHostStorage
from hutch.cluster.transport import PeerTransport
from hutch.cluster.wire import MalformedMessage
from hutch.raft.group import LEADER, RaftConfig
from hutch.raft.storage import BOOTSTRAP_TERM
from hutch.server.cluster_file import read_cluster_file
from hutch.server.partitions import partitioned_from
from hutch.server.raft_host import CallbackApp, QueueGroups, RaftHost
from hutch.server.tasks import TaskSet
from hutch.server.worker import WorkerThread

log = logging.getLogger("hutch.cluster")

CATALOGUE_GROUP = 0
TICK_S = 0.1
PP_CHECK_S = 1.0  # a partial-partition check some member asked has not answered by then is over
PP_ASKED_MAX = 1024  # partial-partition pings awaiting their answer (a handful: members x members)
ELECTION_TIMEOUT_TICKS = 10  # a follower that hears no leader for a second stands for election
HEARTBEAT_INTERVAL_TICKS = 1
BOOT_POLL_S = 0.005  # while booting: how often the catalogue's progress is checked
SHUTDOWN_ANNOUNCE_WAIT_S = 2.0  # a controlled stop waits this long for mirrors to hear of it
STOP_FLUSH_S = 0.05  # a controlled stop: time for the links to write the goodbyes queued on them
JOIN_RETRY_S = 1.0  # a joining node asks its seed again until it is a member
FORGET_RETRY_EVERY_TICKS = 10  # the removal of a forgotten member is proposed again every second
NEVER_S = -1e9  # a loop time before anything happened
PROPOSAL_SLACK_S = 1.0  # waiting on proposals: beyond metadata_timeout_ms, by which each one fails
RETRY_S = 1.0  # a forwarded proposal not applied by then is sent again
RETRY_EVERY_TICKS = 10  # ... checked for once a second (a scan of the node's request table)
CATALOGUE_REQUEST = "catalogue"  # the request-table tag of this node's catalogue changes in flight
STATS_EVERY_TICKS = 10  # queue figures to every peer each second
PLACE_EVERY_TICKS = 5  # the catalogue leader checks mirror placement twice a second
NODE_INFO_EVERY_TICKS = 50  # the node's /api/nodes object every five seconds
DEFAULT_PEER_PORT = 25672

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()
# a cluster call ("rpc"): its kind, then arguments of these types
_RPC_ARGS = {"propose": tuple[bytes], "join": tuple[str, str], "forget": tuple[str], "leaving": tuple[()],
             "members": tuple[dict[str, str]], "pp_check": tuple[str], "pp_ping": tuple[str], "pp_pong": tuple[str],
             "pp_seen": tuple[str], "pp_unseen": tuple[str]}


class MalformedProposal(ValueError):
    """A catalogue proposal whose envelope or command cannot be decoded."""


def _envelope(data: bytes) -> tuple[str, int, cat.Command]:
    """A catalogue proposal's (origin node, request id, command)."""
    try:
        origin, req, cmd_bytes = msgspec.msgpack.decode(data, type=tuple[str, int, bytes])
        return origin, req, cat.decode_command(cmd_bytes)
    except (msgspec.DecodeError, ValueError, TypeError) as e:
        raise MalformedProposal(str(e)) from None


def node_id(name: str) -> int:
    return (int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") >> 1) or 1


def parse_node(spec: str) -> tuple[str, tuple[str, int]]:
    """NAME@HOST[:PORT] -> (NAME@HOST, (HOST, PORT))."""
    name, _, port = spec.partition(":")
    if "@" not in name:
        raise ValueError(f"node '{spec}' must be NAME@HOST[:PEER_PORT]")
    host = name.split("@", 1)[1]
    return name, (host, int(port) if port else DEFAULT_PEER_PORT)


def _iso(wall_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall_s))


def load_secret(path: str | None) -> bytes:
    env = os.environ.get("HUTCH_CLUSTER_SECRET")
    if path is None and env:
        return env.encode()
    p = Path(path) if path else Path.home() / ".hutch.cookie"
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(20))
        log.info("created the cluster secret file %s", p)
    secret = p.read_text().strip()
    if not secret:
        raise ValueError(f"the cluster secret file {p} is empty")
    return secret.encode()


class ClusterRuntime:
    def __init__(self, config: Config, broker: Broker, on_partition: Callable[[set[str], list[str], bool], None],
                 fatal: Callable[[str], None] = lambda reason: None, network: Any = asyncio,
                 worker: WorkerThread | None = None):
        """`on_partition(reachable members, members, partial)` runs whenever a peer comes up or
        goes down, or a partial partition is detected (the node's pause_minority /
        pause_if_all_down handling; `partial`: detected, and not every member is reachable yet);
        `fatal(reason)` when this node's
        Raft state cannot be trusted any more (a failed fsync, an entry that failed to apply).
        `worker`: the thread the Raft log's fsyncs run in (a real node's; None: the loop's
        default executor, which a simulated node's loop runs inline); `stop` closes it."""
        cfg = config
        self.cfg = cfg
        self.broker = broker
        self.on_partition = on_partition
        self.fatal = fatal
        self.network = network  # the peer transport's sockets (hutch.cluster.transport)
        self.worker = worker
        self.transport: PeerTransport | None = None  # from `start`
        self.caught_up = False  # at start: every entry this node's log held was applied
        self.name = cfg.node_name
        self.id = node_id(self.name)
        self.loop = asyncio.get_running_loop()
        self.addresses: dict[str, tuple[str, int]] = {}
        for spec in cfg.cluster_nodes:
            n, addr = parse_node(spec)
            self.addresses[n] = addr
        self.names: dict[int, str] = {node_id(n): n for n in self.addresses}
        self.names[self.id] = self.name
        self._process_scheduled = False
        self._ticks = 0
        # one clock for every deadline in the request table and every time the chores compare:
        # the node's (hutch.server.clock), which the broker and the quorum host read too
        self.now_s = lambda: broker.now_ms() / 1000
        self.started = self.now_s()
        self.down_since: dict[str, float] = {}
        self._deleting: dict[tuple[str, str], float] = {}
        self._placing: dict[tuple[str, str], float] = {}
        self._init_sent_at = NEVER_S
        self.joins: dict[str, str] = {}  # leader: joining node -> its address
        self.stopped = False
        self.isolated = False  # its storage failed: it cut its links and stops (`isolate`)
        self.stopping_peers: set[str] = set()  # peers that announced a controlled stop
        # pause_minority: a partial partition seen (the member this node lost, the member that
        # still reaches it), until every member is reachable again (`_partition_check`)
        self.partial_partition: tuple[str, str] | None = None
        self._pp_asked: set[tuple[str, str]] = set()  # (node pinged, node that asked about it)
        # members lost whose partial-partition check is under way: the members asked that have
        # not answered, and until when the check may take
        self._pp_checking: dict[str, tuple[set[str], float]] = {}
        self.forgets: list[list] = []  # [name, callback, deadline]: waiting for the member to leave
        self._tasks = TaskSet("cluster", log)  # the join loop

    # ------------------------------------------------------------ start and stop

    async def start(self) -> None:
        cfg = self.cfg
        broker = self.broker
        self.cluster = ClusterBroker(broker, self.name, self._send_q, self.is_up, self.submit,
                                     self.loop.call_soon, self.status)
        broker.cluster = self.cluster
        self.cluster.promotion_held = self.promotion_hold
        self.cluster.recovering = True  # until the runtime has opened the broker's storage
        raft_dir = Path(cfg.data_dir) / "raft"
        self.host = RaftHostStorage(raft_dir, unlink_in_background=True)
        storage = self.host.group(CATALOGUE_GROUP)
        joined = read_cluster_file(cfg.data_dir)
        if storage.last_index() == 0 and storage.snapshot().meta.index == 0:
            if joined.get("join") is None:
                if self.name not in self.addresses:
                    raise ValueError(f"--cluster-nodes must include this node ({self.name})")
                storage = self.host.bootstrap(CATALOGUE_GROUP, tuple(sorted(self.names)))
                self.host.sync()
                log.info("formed a new cluster of %d node(s): %s", len(self.addresses), ", ".join(sorted(self.addresses)))
        snap = storage.snapshot()
        if snap.data:
            self.cluster.catalogue.restore(snap.data)
        raft_cfg = RaftConfig(election_timeout_ticks=ELECTION_TIMEOUT_TICKS,
                              heartbeat_interval_ticks=HEARTBEAT_INTERVAL_TICKS, seed=self.id & 0xFFFFFFFF)
        self.raft = RaftHost(self.id, self.name, self.host, raft_cfg, self.names, CATALOGUE_GROUP,
                             send=self._send_raft, schedule=self._schedule,
                             on_leader_known=self._group_leader_known,
                             on_leadership=self._group_leadership,
                             fatal=self.fatal, sync_in_thread=True, flush=self._flush_raft, worker=self.worker)
        self.multi = self.raft.multi
        self.group = self.raft.add_main_group(storage, CallbackApp(self._apply_catalogue, self._restore_catalogue,
                                                                   lambda: self.cluster.catalogue.snapshot()))
        logged_at_start = storage.last_index()
        self.cluster.quorum.raft = QueueGroups(self.raft, node_id)
        self.cluster.streams.raft = QueueGroups(self.raft, node_id, alone_fsyncs_first=False,
                                                entries_wait_for_fsync=cfg.stream_fsync == "before_confirm")
        self._drain(initial=True)
        self.cluster.rebuild()
        for n, addr in self.cluster.members.items():
            self._learn(n, addr)
        self.secret = load_secret(cfg.cluster_secret_file)
        self.transport = PeerTransport(
            self.name, cfg.amqp_host or "0.0.0.0", cfg.peer_port, self.secret,
            peers={n: self._address(n) for n in self.addresses if n != self.name},
            net_ticktime_s=cfg.net_ticktime_s, on_message=self._on_message, on_peer_up=self._on_peer_up,
            on_peer_down=self._on_peer_down, network=self.network)
        self.transport.incarnation = self.cluster.incarnation  # one number names this run everywhere
        self.cluster.peer_incarnation = lambda n: (self.transport.link_info(n) or {}).get("incarnation")
        await self.transport.start()
        log.info("started peer listener on port %s (node %s)", self.transport.bound_port, self.name)
        joining = joined.get("join") if joined.get("join") and not self._is_member() else None
        if joining:
            self._tasks.spawn(self._join_loop(joining, tuple(joined["address"])), "join")
        self._tick_handle = self.loop.call_later(TICK_S, self._tick)
        alone = tuple(self.group.voters) == (self.id,)
        if alone:
            for _ in range(self.group.cfg.election_timeout_ticks * 2):  # nobody else can vote: elect at once
                if self.group.role == LEADER:
                    break
                self.multi.tick()
                self._drain()
        self.caught_up = await self._catch_up(logged_at_start, joining)
        if self.caught_up:
            self.cluster.streams.forget_orphans()  # safe only with every entry this node had applied
        if alone:
            await self._lead_alone()
        elif self.caught_up:
            await self._await_initialisation()

    async def _catch_up(self, target: int, joining: str | None = None) -> bool:
        """Before clients are let in: a leader is known and every entry this node's log held at
        start is applied (an entry applied before a crash may not have been known committed on
        disk: routing to a queue it declared must not see the queue missing). A node that
        cannot reach a majority starts after metadata_timeout_ms with what it has. A node
        joining a cluster (`joining`: the node it joins through) has nothing to start with: it
        waits until it is a member, however long that takes, saying so every
        metadata_timeout_ms (with no users yet it would refuse every login), unless its storage
        failed meanwhile (`isolate`): then it goes on to stop."""
        timeout_s = self.cfg.metadata_timeout_ms / 1000
        deadline = self.loop.time() + timeout_s
        while (self.loop.time() < deadline or (joining and not self._is_member())) and not self.isolated:
            self._drain()
            if self.group.leader is not None and self.group.applied >= target and self._is_member():
                return True
            if joining and self.loop.time() >= deadline:
                log.info("node %s is not a member of the cluster yet; still asking %s to let it join", self.name,
                         joining)
                deadline += timeout_s
            await asyncio.sleep(BOOT_POLL_S)
        log.warning("the catalogue did not catch up within %d ms (applied %d of %d, leader %s): starting with "
                    "what this node has", self.cfg.metadata_timeout_ms, self.group.applied, target,
                    self.leader_name())
        return False

    async def _lead_alone(self) -> None:
        """A cluster of one: wait until the catalogue holds the default vhost and user, so that
        the first client can log in."""
        restarted = INIT_PARAM in self.cluster.catalogue.global_parameters
        await self._await_initialisation()
        if restarted:
            await self._forget_transient_exchanges()

    async def _await_initialisation(self) -> None:
        """Until the catalogue holds what the cluster's first start creates (the default vhost and
        user), within metadata_timeout_ms: a node of a cluster formed a moment ago opens its
        listeners only once the first client can log in. The leader's chores make it."""
        deadline = self.loop.time() + self.cfg.metadata_timeout_ms / 1000
        while INIT_PARAM not in self.cluster.catalogue.global_parameters and self.loop.time() < deadline:
            if self.group.role == LEADER:
                self._leader_chores(self.now_s())
            self._drain()
            await asyncio.sleep(BOOT_POLL_S)

    async def _forget_transient_exchanges(self) -> None:
        """The whole cluster (this one node) restarted: its non-durable exchanges are gone, as
        in RabbitMQ, where they live only while some node of the cluster keeps running."""
        transient = [x for x in self.cluster.catalogue.exchanges.values() if not x.durable]
        if not transient:
            return
        done = asyncio.Event()
        left = [len(transient)]

        def one(_r: cat.Result) -> None:
            left[0] -= 1
            if left[0] == 0:
                done.set()
        for x in transient:
            self.submit(cat.DeleteExchange(x.vhost, x.name), one)
        self._drain()
        await asyncio.wait_for(done.wait(), self.cfg.metadata_timeout_ms / 1000 + PROPOSAL_SLACK_S)

    def isolate(self) -> None:
        """This node's storage failed: peers see it go now, as after a crash, rather than once it
        has stopped. Until then they would go on sending it work (a mirror to add, a sync) that
        its failed store refuses, and each refusal closes the link and starts it all again."""
        self.isolated = True
        if self.transport is not None:
            self.transport.isolate()

    async def stop(self, failed: bool = False) -> None:
        # a controlled shutdown: peers hear it is not a partition; mirrored queues led here tell
        # their mirrors (which then apply ha-promote-on-shutdown) and leave their rings before
        # the links close. A node whose storage `failed` hands nothing over: it goes as a crashed
        # node does (its mirrors elsewhere are promoted as after a failure), at once
        peers = self.transport.up_peers
        for peer in peers:
            self.transport.send(peer, "rpc", ["leaving"])
        mirroring = self.cluster.mirroring
        if mirroring.leaders and not failed:
            # every mirror must hold the "stopping" view before this node leaves the rings
            announced = asyncio.Event()
            mirroring.announce_shutdown()
            mirroring.flush()
            mirroring.after_all_stable(lambda _arg: announced.set(), None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(announced.wait(), SHUTDOWN_ANNOUNCE_WAIT_S)
        if (mirroring.leaders or mirroring.mirrors) and not failed:
            mirroring.shutdown()
            mirroring.flush()
        if peers:
            await asyncio.sleep(STOP_FLUSH_S)  # the links write what was queued on the next loop turns
        self.stopped = True
        self._tick_handle.cancel()
        await self._tasks.close(grace_s=0)  # the join loop only waits to ask again
        requests = self.cluster.peers.requests
        for p in requests.tagged(CATALOGUE_REQUEST):
            requests.take(p.rid)
            p.callback(cat.Result(cat.ERROR, 320, "the node is shutting down"))
        await self.transport.close()
        try:
            if not self.raft.failed:
                self.host.sync()
        except OSError as e:  # a failing disk: what was not synced is not claimed durable
            log.error("Raft log could not be synced at stop: %s", e)
        self.host.close()
        if self.worker is not None:
            self.worker.close()

    # ------------------------------------------------------------ members and addresses

    def _address(self, name: str) -> tuple[str, int]:
        return self.cfg.peer_addresses.get(name) or self.addresses[name]

    def _learn(self, name: str, address: str) -> None:
        """A member's advertised address (from the catalogue)."""
        host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or "@" not in name:
            log.warning("ignoring the address %.100r given for node %.100r", address, name)
            return
        self.names[node_id(name)] = name
        if self.addresses.get(name) != (host, int(port)):
            self.addresses[name] = (host, int(port))
            if hasattr(self, "transport"):
                self.transport.set_peers({n: self._address(n) for n in self.addresses if n != self.name})

    def _is_member(self) -> bool:
        return self.id in self.group.voters or self.id in self.group.learners

    def members(self) -> list[str]:
        ids = list(self.group.voters) + list(self.group.learners)
        return sorted(self.names.get(i, str(i)) for i in ids)

    def is_up(self, name: str) -> bool:
        """Whether `name` is this node or a peer linked now (none yet while the node boots: the
        broker may ask before the transport exists)."""
        transport = getattr(self, "transport", None)
        return name == self.name or (not self.stopped and transport is not None and transport.is_up(name))

    def leader_name(self) -> str | None:
        lead = self.group.leader
        return self.names.get(lead) if lead is not None else None

    def status(self) -> dict[str, Any]:
        members = self.members()
        return {
            "cluster_name": self.broker.config.cluster_name or self.name,
            "node": self.name,
            "members": members,
            "disk_nodes": members,
            "running_nodes": [n for n in members if self.is_up(n)],
            "leader": self.leader_name(),
            "raft": {"term": self.group.term, "commit_index": self.group.commit, "applied": self.group.applied,
                     "role": self.group.role_name},
            "partitions": self.partitions(),
            "last_seen": {p: _iso(self.down_since[p]) for p in self.partitioned() if p in self.down_since},
            "alarms": sorted(self.broker.alarms),  # this node's resource alarms in effect
        }

    def partitioned(self) -> list[str]:
        """The members this node cannot reach and that did not say they were stopping."""
        members = self.members()
        up = {m for m in members if self.is_up(m)}
        return partitioned_from(self.name, members, up, self.stopping_peers)

    def partitions(self) -> dict[str, list[str]]:
        """RabbitMQ's shape: node -> the nodes it is partitioned from; this node's own view, and
        what each peer it still reaches last reported of its own."""
        out = {}
        mine = self.partitioned()
        if mine:
            out[self.name] = mine
        for peer in self.members():
            if peer != self.name and self.is_up(peer):
                theirs = (self.cluster.peer_info.get(peer) or {}).get("partitions") or []
                if theirs:
                    out[peer] = sorted(theirs)
        return out

    # ------------------------------------------------------------ the Raft loop

    def _schedule(self) -> None:
        if not self._process_scheduled:
            self._process_scheduled = True
            self.loop.call_soon(self._process)

    def _process(self) -> None:
        self._process_scheduled = False
        if not self.stopped:
            self._drain()

    def _drain(self, initial: bool = False) -> None:
        """Every group's Ready: persist, send, apply, advance (hutch.server.raft_host)."""
        self.raft.drain(initial)

    def _flush_raft(self) -> None:
        """After a drain, and after a worker thread's fsync released followers' answers: what
        the quorum queues led here decided (confirms, deliveries, answers) joins the Raft
        messages, and both are written at once. Left to the end of the loop's iteration, the
        Raft messages would go in one write and the outcomes an iteration later in another,
        and each peer would be woken twice, the second time for what a client waits for."""
        self.cluster.quorum.flush()
        if self.transport is not None:
            self.transport.flush()

    def _group_leader_known(self, gid: Any) -> None:
        if gid in self.cluster.streams.queues:
            self.cluster.streams.leader_known(gid)
        else:
            self.cluster.quorum.leader_known(gid)

    def _group_leadership(self, gid: Any, leading: bool) -> None:
        if gid in self.cluster.streams.queues:
            self.cluster.streams.leadership_changed(gid, leading)
        else:
            self.cluster.quorum.leadership_changed(gid, leading)

    def _send_raft(self, peer: str, gid: Any, message: bytes) -> None:
        self.transport.send(peer, "raft", [gid, message])

    def _restore_catalogue(self, data: bytes) -> None:
        cl = self.cluster
        cl.catalogue.restore(data)
        cl.rebuild()
        for n, addr in cl.members.items():
            self._learn(n, addr)

    def _apply_catalogue(self, data: bytes) -> None:
        try:
            origin, req, cmd = _envelope(data)
        except MalformedProposal as e:  # every member skips it alike
            log.error("a catalogue entry cannot be decoded (%s); skipped", e)
            return
        res = self.cluster.apply_command(cmd)
        if isinstance(cmd, (cat.SetGlobalParameter,)) and cmd.name.startswith(NODE_PARAM):
            self._learn(cmd.name[len(NODE_PARAM):], cmd.value)
        if origin == self.name:
            self.cluster.peers.requests.answer(req, res)

    # ------------------------------------------------------------ proposing

    def submit(self, cmd: cat.Command, callback) -> None:
        """Propose `cmd`; callback(result) once this node has applied it, or with a 541 error
        after metadata_timeout_ms."""
        peers = self.cluster.peers
        req = peers.new_id()
        env = _enc.encode([self.name, req, cat.encode_command(cmd)])
        now = self.now_s()
        # in the node's one request table; the state is [envelope, when to propose it again]
        peers.requests.open(req, lambda res: callback(res if res is not None else self._timed_out()), None,
                            now + self.cfg.metadata_timeout_ms / 1000, CATALOGUE_REQUEST, [env, now + RETRY_S])
        self._propose(env)

    async def barrier(self) -> bool:
        """Whether a catalogue barrier committed and this node applied it (False after
        metadata_timeout_ms): everything committed before it is then applied here too."""
        done: asyncio.Future[cat.Result] = self.loop.create_future()
        self.submit(cat.Barrier(), lambda res: done.done() or done.set_result(res))
        return (await done).ok

    def _timed_out(self) -> cat.Result:
        leader = self.leader_name()
        why = (f"no leader is known and {self.name} cannot reach a majority of the cluster's nodes"
               if leader is None else f"the change did not commit (leader {leader})")
        return cat.Result(cat.ERROR, 541, f"timed out after {self.cfg.metadata_timeout_ms} ms waiting for "
                                          f"the cluster metadata store: {why}")

    def _stale_promotion(self, cmd: cat.Command) -> bool:
        """Whether this (catalogue leader) node refuses a proposed promotion
        (hutch.broker.chores.refuse_promotion): its old leader is still running."""
        if chores.refuse_promotion(cmd, self.name, self.transport.is_up):
            log.info("refusing to promote the mirror of queue '%s' in vhost '%s' on %s: its leader %s is running",
                     cmd.name, cmd.vhost, cmd.leader_node, cmd.expect_leader)
            return True
        return False

    def _propose(self, env: bytes) -> None:
        if self.group.role == LEADER:
            self._propose_here(env)
            return
        leader = self.leader_name()
        if leader is not None:
            self.transport.send(leader, "rpc", ["propose", env])

    def _propose_here(self, env: bytes, peer: str | None = None) -> None:
        """On the catalogue's leader: into the log, unless it is malformed (from `peer`) or a
        stale promotion (a proposal that does not fit now is retried by its proposer)."""
        try:
            _origin, _req, cmd = _envelope(env)
        except MalformedProposal as e:
            log.error("refusing a catalogue proposal from %s that cannot be decoded: %s", peer or "this node", e)
            return
        if not self._stale_promotion(cmd):
            self.raft.propose(CATALOGUE_GROUP, env)

    def _retry_catalogue(self, now: float) -> None:
        """Catalogue changes not yet applied are proposed again every RETRY_S (a leader may
        have changed, or dropped the proposal); past metadata_timeout_ms they fail (541) when
        the tick expires the request table."""
        for p in self.cluster.peers.requests.tagged(CATALOGUE_REQUEST):
            if now >= p.state[1]:
                p.state[1] = now + RETRY_S
                self._propose(p.state[0])

    # ------------------------------------------------------------ transport callbacks

    def _send_q(self, peer: str, payload: Any) -> bool:
        return self.transport.send(peer, "q", payload)

    def _on_message(self, peer: str, group: Any, payload: Any) -> None:
        if group == "raft":
            self.raft.step(peer, payload)
        elif group == "q":
            self.cluster.on_message(peer, payload)
        elif group == "rpc":
            self._on_rpc(peer, payload)

    def _on_rpc(self, peer: str, payload: Any) -> None:
        args = _RPC_ARGS.get(payload[0]) if type(payload) is list and payload and type(payload[0]) is str else None
        try:
            if args is None:
                raise msgspec.ValidationError("not a known call")
            msgspec.convert(payload[1:], args)
        except msgspec.ValidationError as e:
            raise MalformedMessage(f"a malformed cluster call from {peer} ({e}): {payload!r:.200}") from None
        kind = payload[0]
        if kind == "propose":
            if self.group.role == LEADER:
                self._propose_here(payload[1], peer)
            elif (leader := self.leader_name()) is not None and leader != peer:
                self.transport.send(leader, "rpc", payload)
        elif kind == "join":
            name, address = payload[1], payload[2]
            self._learn(name, address)
            if self.group.role == LEADER:
                self.joins[name] = address
                log.info("node %s asks to join the cluster", name)
            elif (leader := self.leader_name()) is not None:
                self.transport.send(leader, "rpc", payload)
            self.transport.send(name, "rpc", ["members", {n: f"{h}:{p}" for n, (h, p) in self.addresses.items()}])
        elif kind == "forget":
            if not self.is_up(payload[1]):
                self._remove_member(payload[1])
        elif kind == "leaving":  # a peer's controlled stop: it is not running, not partitioned
            self.stopping_peers.add(peer)
        elif kind == "members":
            for n, addr in payload[1].items():
                if n != self.name:
                    self._learn(n, addr)
        elif kind == "pp_check":  # `peer` lost node X: do we still reach it? X must answer a ping
            x = payload[1]
            if x in (peer, self.name):
                pass
            elif not self.transport.is_up(x) or x in self.stopping_peers:
                self.transport.send(peer, "rpc", ["pp_unseen", x])  # the asking node need not wait for this one
            elif len(self._pp_asked) < PP_ASKED_MAX:
                self._pp_asked.add((x, peer))
                self.transport.send(x, "rpc", ["pp_ping", peer])
        elif kind == "pp_ping":
            self.transport.send(peer, "rpc", ["pp_pong", payload[1]])
        elif kind == "pp_pong":  # `peer` is alive: tell the node that lost it
            asker = payload[1]
            if (peer, asker) in self._pp_asked:
                self._pp_asked.discard((peer, asker))
                self.transport.send(asker, "rpc", ["pp_seen", peer])
        elif kind == "pp_seen":
            self._pp_checking.pop(payload[1], None)
            self._partial_partition(payload[1], peer)
        elif kind == "pp_unseen":
            self._pp_answered(payload[1], peer)

    def _on_peer_up(self, peer: str) -> None:
        self._pp_checking.pop(peer, None)
        was_partitioned = peer in self.down_since and peer not in self.stopping_peers
        self.down_since.pop(peer, None)
        self.stopping_peers.discard(peer)
        if was_partitioned and (self.cfg.cluster_partition_handling == "autoheal" or (
                self.cfg.cluster_partition_handling == "pause_if_all_down"
                and self.cfg.pause_if_all_down_recover == "autoheal")):
            log.info("Autoheal: the partition with node %s has healed; no node restarts, as the catalogue "
                     "is Raft-replicated and this node takes the leader's log", peer)
        self.cluster.peer_up(peer)
        self.announce_info()  # to the new peer, and to the others: the partitions it lists changed
        log.info("node %s up", peer)
        self._partition_check()
        self._elect_first_leader()
        self.cluster.broker.schedule()

    def _elect_first_leader(self) -> None:
        """A cluster formed a moment ago elects its first catalogue leader as soon as a majority
        of its members can talk, instead of after an election timeout (one to two seconds): the
        member with the lowest id stands then. Any member may stand at any time, so this saves
        only the wait; a cluster that has had an election (a term past the bootstrap's, or a vote)
        waits as before."""
        g = self.group
        if g.term != BOOTSTRAP_TERM or g.vote is not None or g.leader is not None or not g.voters \
                or min(g.voters) != self.id:
            return
        up = self.transport.up_peers
        reachable = 1 + sum(1 for v in g.voters if v != self.id and self.names.get(v) in up)
        if 2 * reachable > len(g.voters):
            g.campaign()
            self.multi.touched(CATALOGUE_GROUP)
            self._schedule()

    def announce_info(self) -> None:
        """Send this node's info (its stream-protocol address and the nodes it is partitioned
        from among it) to the peers up now, rather than at the next periodic send: when the
        runtime has just wired `local_info`, and when a peer came or went (another node's
        `partitions` shows what this one last said)."""
        if self.cluster.local_info is not None:
            info = self.cluster.local_info()
            for peer in self.transport.up_peers:
                self.transport.send(peer, "q", ["NI", info])

    def _partition_check(self) -> None:
        members = self.members()
        up = {m for m in members if m == self.name or self.transport.is_up(m)}
        if self.partial_partition is not None and not partitioned_from(self.name, members, up, self.stopping_peers):
            log.warning("Partial partition over: every node is reachable again")
            self.partial_partition = None
        self.on_partition(up, members, self.partial_partition is not None)

    def _on_peer_down(self, peer: str, reason: str) -> None:
        for x, asker in [a for a in self._pp_asked if a[0] == peer]:  # it will not answer the ping now
            self.transport.send(asker, "rpc", ["pp_unseen", x])
        self._pp_asked = {a for a in self._pp_asked if peer not in a}
        for lost in list(self._pp_checking):  # nor, gone, answer a check
            self._pp_answered(lost, peer)
        self.down_since[peer] = self.now_s()
        self.raft.peer_down(node_id(peer), {node_id(m) for m in self._running()})
        self.cluster.peer_down(peer)
        self._partition_check()
        self.announce_info()
        if self.cfg.cluster_partition_handling == "pause_minority" and peer not in self.stopping_peers:
            # a partial partition? ask the members still reached whether they reach `peer`
            # (RabbitMQ's check_partial_partition): each pings it and answers only once it has
            # answered, so a node that died is not taken for one cut off
            asked = {other for other in self.transport.up_peers if other != peer}
            for other in asked:
                self.transport.send(other, "rpc", ["pp_check", peer])
            if asked:
                self._pp_checking[peer] = (asked, self.now_s() + PP_CHECK_S)

    def _pp_answered(self, lost: str, peer: str) -> None:
        """`peer` does not reach `lost` (or went down itself): one answer fewer to wait for."""
        entry = self._pp_checking.get(lost)
        if entry is not None:
            entry[0].discard(peer)
            if not entry[0]:
                del self._pp_checking[lost]

    def promotion_hold(self, dead_leader: str) -> bool:
        """pause_minority: whether a mirror on this node must not take over from its leader on
        `dead_leader` now. Not while this node is paused by a partial partition (it serves no
        one, and that leader may still serve the nodes beyond the cut), nor while it waits to
        hear whether the members it reaches still reach `dead_leader` (PP_CHECK_S at most):
        otherwise a mirror at one end of a cut link could be promoted in the moment before its
        node pauses."""
        if self.partial_partition is not None:
            return True
        entry = self._pp_checking.get(dead_leader)
        if entry is not None and self.now_s() >= entry[1]:
            del self._pp_checking[dead_leader]
            return False
        return entry is not None

    def _partial_partition(self, lost: str, seer: str) -> None:
        """`seer` still reaches `lost`, which this node lost: pause_minority pauses until the
        entire cluster recovers, as RabbitMQ does; otherwise each side of a partial partition may
        see a majority and act on it (a mirrored queue with a leader on each)."""
        if (self.cfg.cluster_partition_handling != "pause_minority" or self.partial_partition is not None
                or self.transport.is_up(lost) or not self.transport.is_up(seer) or lost not in self.members()):
            return
        log.warning("Partial partition detected:\n * We saw DOWN from %s\n * We can still see %s which can see %s\n"
                    " * pause_minority mode enabled\nWe will therefore pause until the *entire* cluster recovers",
                    lost, seer, lost)
        self.partial_partition = (lost, seer)
        self._partition_check()

    # ------------------------------------------------------------ timers

    def _tick(self) -> None:
        if self.stopped:
            return
        self._tick_handle = self.loop.call_later(TICK_S, self._tick)
        self._ticks += 1
        self.multi.tick()
        now = self.now_s()
        if self._ticks % RETRY_EVERY_TICKS == 0:
            self._retry_catalogue(now)
        if self.forgets:
            self._check_forgets(now)
        self.cluster.quorum.tick(now)
        # the node's one request table: a client waiting past metadata_timeout_ms gets its error
        self.cluster.peers.requests.expire(now)
        self.cluster.tick(now)
        if self.group.role == LEADER:
            self._leader_chores(now)
            if self._ticks % PLACE_EVERY_TICKS == 0:
                self._place_mirrors(now)
        if self._ticks % STATS_EVERY_TICKS == 0:
            rows = self.cluster.stats()
            info = self.cluster.local_info() if self.cluster.local_info and self._ticks % NODE_INFO_EVERY_TICKS == 0 \
                else None
            counts = self.cluster.broker.connection_counts()  # for vhost and user limits elsewhere
            for peer in self.transport.up_peers:
                self.transport.send(peer, "q", ["ST", rows])
                self.transport.send(peer, "q", ["CC", counts])
                if info is not None:
                    self.transport.send(peer, "q", ["NI", info])
        self._drain()

    def _running(self) -> set[str]:
        """The members this node reaches now, itself included."""
        return {m for m in self.members() if m == self.name or self.transport.is_up(m)}

    def _leader_chores(self, now: float) -> None:
        """Carry out the catalogue leader's decisions (hutch.broker.chores): the first start, the
        nodes that asked to join, the transient queues of nodes that are gone."""
        c = self.cluster.catalogue
        if chores.initialisation_due(INIT_PARAM in c.global_parameters, now, self._init_sent_at):
            self._init_sent_at = now
            self._initialise()
        if self.joins:
            in_group = {name for name in self.joins if node_id(name) in self.group.voters
                        or node_id(name) in self.group.learners}
            for step in chores.join_steps(self.joins, c.global_parameters, in_group):
                if step.action == chores.RECORD:
                    self.submit(step.command, _ignore)
                elif step.action == chores.JOINED:
                    del self.joins[step.node]
                    log.info("node %s joined the cluster", step.node)
                else:
                    self.raft.change_member(CATALOGUE_GROUP, True, node_id(step.node))  # else again next tick
        running = self._running()
        gone = chores.members_gone(self.name, self.members(), running, self.down_since, self.started,
                                   self.cfg.net_ticktime_s, now)
        if gone:
            self._deleting = chores.recent(self._deleting, now, chores.DELETE_RETRY_S)
        for member in gone:
            self._delete_transient_queues_of(member, running, now)

    def _place_mirrors(self, now: float) -> None:
        """Keep each classic queue's mirror nodes in line with the policy that applies to it
        (hutch.broker.chores.mirror_placements): nodes that start or join get mirrors, a down
        mirror under `exactly` is replaced, a `nodes` change moves the leader once a listed
        mirror is synchronised. A queue whose leader's node is down is left to its mirrors'
        promotion."""
        c = self.cluster.catalogue
        members = self.members()
        running = [m for m in members if m == self.name or self.transport.is_up(m)]
        self._placing = chores.recent(self._placing, now, chores.PLACEMENT_RETRY_S)
        for p in chores.mirror_placements(list(c.queues.values()), members, running, self.cluster.mirror_params,
                                          lambda v, n: self.cluster.mirror_status(v, n)[1], self._placing, now):
            rec = p.record
            if p.moved_to is not None:
                log.info("Mirrored queue '%s' in vhost '%s': moving its leader from %s to the synchronised mirror "
                         "on %s (policy ha-mode nodes)", rec.name, rec.vhost, rec.leader_node, p.moved_to)
            self._placing[(rec.vhost, rec.name)] = now
            self.submit(p.command, _ignore)

    def _delete_transient_queues_of(self, node: str, running: set[str], now: float) -> None:
        """RabbitMQ's rule (hutch.broker.chores.transient_deletions): a non-durable (or exclusive)
        queue whose home node is gone is deleted (a mirrored one only when no mirror is left to
        promote)."""
        for rec in chores.transient_deletions(node, self.cluster.queues_homed_on(node), running, self._deleting,
                                              now):
            self._deleting[(rec.vhost, rec.name)] = now
            log.info("deleting %s queue '%s' in vhost '%s': its home node %s is down",
                     "exclusive" if rec.exclusive_owner else "non-durable", rec.name, rec.vhost, node)
            self.submit(cat.DeleteQueue(rec.vhost, rec.name), _ignore)

    def _initialise(self) -> None:
        cfg = self.cfg
        first = parse_node(cfg.cluster_nodes[0])[0] if cfg.cluster_nodes else self.name
        legacy = _legacy_definitions(cfg.data_dir, self.name)
        wants_user = legacy is None and bool(cfg.default_user) and not cfg.load_definitions
        cmds = chores.first_start_commands(
            default_vhost=cfg.default_vhost, default_user=cfg.default_user,
            password_hash=hash_password(cfg.default_pass) if wants_user else None,
            load_definitions=bool(cfg.load_definitions), legacy=legacy, cluster_name=cfg.cluster_name or first,
            addresses=self.addresses)
        for cmd in cmds:
            self.submit(cmd, _ignore)

    # ------------------------------------------------------------ forgetting a member

    def forget(self, name: str, callback) -> None:
        """Remove `name` from the cluster: its queues are deleted (or go to a mirror) and it
        leaves the catalogue's group (hutch.broker.chores.forget_commands). callback(None) when
        done, callback(error text) when refused or timed out."""
        refusal = chores.forget_refusal(name, self.name, self.members(), self.is_up)
        if refusal is not None:
            return callback(refusal)
        log.info("Removing node %s from the cluster", name)
        for step in chores.forget_commands(name, self.cluster.queues_homed_on(name)):
            if step.promoted is not None:
                log.info("Mirrored queue '%s' in vhost '%s': promoting the mirror on %s (its leader's node %s is "
                         "forgotten)", step.record.name, step.record.vhost, step.promoted, name)
            self.submit(step.command, _ignore)
        self.submit(chores.forget_parameter(name), _ignore)
        self.forgets.append([name, callback, self.now_s() + self.cfg.metadata_timeout_ms / 1000])
        self._remove_member(name)

    def _remove_member(self, name: str) -> None:
        if self.group.role == LEADER:
            self.raft.change_member(CATALOGUE_GROUP, False, node_id(name))  # else retried from the tick
        elif (leader := self.leader_name()) is not None:
            self.transport.send(leader, "rpc", ["forget", name])

    def _check_forgets(self, now: float) -> None:
        for item in list(self.forgets):
            name, callback, deadline = item
            if name not in self.members():
                self.forgets.remove(item)
                log.info("node %s was removed from the cluster", name)
                callback(None)
            elif now >= deadline:
                self.forgets.remove(item)
                callback(f"timed out removing node {name}: no majority of the cluster's nodes is reachable")
            elif self._ticks % FORGET_RETRY_EVERY_TICKS == 0:
                self._remove_member(name)

    # ------------------------------------------------------------ joining

    async def _join_loop(self, seed: str, seed_address: tuple[str, int]) -> None:
        self._learn(seed, f"{seed_address[0]}:{seed_address[1]}")
        my_address = f"{self.name.split('@', 1)[1]}:{self.transport.bound_port}"
        while not self.stopped and not self._is_member():
            self.transport.send(seed, "rpc", ["join", self.name, my_address])
            await asyncio.sleep(JOIN_RETRY_S)
        if not self.stopped:
            log.info("node %s is a member of the cluster (via %s)", self.name, seed)


def _legacy_definitions(data_dir: str, node: str) -> list[cat.Command] | None:
    """A node that kept its definitions in DATA_DIR/definitions.json (before it ran the
    catalogue) brings them into the catalogue once, journal ids included, so that its durable
    queues keep their messages."""
    p = Path(data_dir) / "definitions.json"
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    try:
        cmds = cat.from_definitions(doc, home_node=node, first_journal_id=1, hash_password=hash_password)
    except (cat.CatalogueError, ValueError) as e:
        log.error("cannot bring %s into the catalogue: %s", p, e)
        return None
    log.info("bringing the definitions in %s into the cluster catalogue (%d changes)", p, len(cmds))
    return cmds


def _ignore(_result: cat.Result) -> None:
    """The callback of a proposal whose outcome the proposer does not wait for (it is retried
    by the next chore pass if it did not take)."""
