"""A node's part in a cluster: the peer transport, the catalogue's Raft group and its log.

`ClusterRuntime` wires the sans-I/O pieces under the node's event loop:

- the `PeerTransport` (one authenticated TCP link per pair of nodes, heartbeats, net_ticktime),
  carrying three groups: `"raft"` (`[group id, message]` for every Raft group: the catalogue is
  group 0), `"q"` (operations on queues
  homed on another node, `hutch.broker.cluster`) and `"rpc"` (proposals forwarded to the
  leader, joins);
- the catalogue's `RaftGroup` on the node's `RaftHostStorage` (DATA_DIR/raft): every Ready is
  made durable (one fsync) before its messages leave, then its committed entries are applied
  to the catalogue and the broker (`ClusterBroker.apply_command`);
- proposals: a change proposed on a follower is forwarded to the leader and retried until
  this node has applied it or `metadata_timeout_ms` has passed — then it fails with 541
  INTERNAL_ERROR saying that no majority is reachable. A node on the minority side of a
  partition therefore never changes the catalogue;
- the leader's chores: the first start of a cluster (default vhost, user, cluster name and
  member addresses), adding a node that joins, and deleting the non-durable and exclusive
  queues of a node that is down (RabbitMQ's rule for non-mirrored queues).

Node ids in Raft are 63-bit hashes of node names, so every node derives the same id for a
name without coordination.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from hutch.broker.broker import hash_password
from hutch.broker.cluster import INIT_PARAM, NODE_PARAM, ClusterBroker
from hutch.cluster import catalogue as cat
from hutch.cluster.raftlog import RaftHostStorage
from hutch.cluster.transport import PeerTransport
from hutch.mirror.placement import leader_move, mirrors_for
from hutch.raft import messages as rm
from hutch.raft.group import LEADER, NotLeader, ProposalRejected, RaftConfig, RaftError
from hutch.raft.multi import MultiRaft
from hutch.server.partitions import partitioned_from

if TYPE_CHECKING:
    from hutch.server.runtime import Node

log = logging.getLogger("hutch.cluster")

CATALOGUE_GROUP = 0
TICK_S = 0.1
RETRY_S = 1.0  # a forwarded proposal not applied by then is sent again
STATS_EVERY_TICKS = 10  # queue figures to every peer each second
PLACE_EVERY_TICKS = 5  # the catalogue leader checks mirror placement twice a second
NODE_INFO_EVERY_TICKS = 50  # the node's /api/nodes object every five seconds
DEFAULT_PEER_PORT = 25672
CLUSTER_FILE = "cluster.json"

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()


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
    def __init__(self, node: Node):
        self.node = node
        cfg = node.config
        self.cfg = cfg
        self.name = cfg.node_name
        self.id = node_id(self.name)
        self.loop = asyncio.get_running_loop()
        self.addresses: dict[str, tuple[str, int]] = {}
        for spec in cfg.cluster_nodes:
            n, addr = parse_node(spec)
            self.addresses[n] = addr
        self.names: dict[int, str] = {node_id(n): n for n in self.addresses}
        self.names[self.id] = self.name
        self.pending: dict[int, list] = {}  # req id -> [callback, deadline, envelope, next retry]
        self._next_req = 0
        self._process_scheduled = False
        self._ticks = 0
        self.started = self.loop.time()
        self.down_since: dict[str, float] = {}
        self._deleting: dict[tuple[str, str], float] = {}
        self._placing: dict[tuple[str, str], float] = {}
        self._init_sent_at = -1e9
        self.joins: dict[str, str] = {}  # leader: joining node -> its address
        self.stopped = False
        self.stopping_peers: set[str] = set()  # peers that announced a controlled stop
        self.forgets: list[list] = []  # [name, callback, deadline]: waiting for the member to leave

    # ------------------------------------------------------------ start and stop

    async def start(self) -> None:
        cfg = self.cfg
        broker = self.node.broker
        self.cluster = ClusterBroker(broker, self.name, self._send_q, self.is_up, self.submit,
                                     self.loop.call_soon, self.status)
        broker.cluster = self.cluster
        raft_dir = Path(cfg.data_dir) / "raft"
        self.host = RaftHostStorage(raft_dir)
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
        raft_cfg = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1,
                              seed=self.id & 0xFFFFFFFF)
        self.multi = MultiRaft(self.id, raft_cfg)
        self.group = self.multi.add_group(CATALOGUE_GROUP, storage)
        logged_at_start = storage.last_index()
        self.apps: dict[Any, GroupApp] = {CATALOGUE_GROUP: _CatalogueApp(self)}
        self._leading: set[Any] = set()
        self._leaders: dict[Any, int | None] = {}
        self.cluster.quorum.raft = _QueueGroups(self)
        self._drain(initial=True)
        self.cluster.rebuild()
        for n, addr in self.cluster.members.items():
            self._learn(n, addr)
        self.secret = load_secret(cfg.cluster_secret_file)
        self.transport = PeerTransport(
            self.name, cfg.amqp_host or "0.0.0.0", cfg.peer_port, self.secret,
            peers={n: self._address(n) for n in self.addresses if n != self.name},
            net_ticktime_s=cfg.net_ticktime_s, on_message=self._on_message, on_peer_up=self._on_peer_up,
            on_peer_down=self._on_peer_down)
        self.transport.incarnation = self.cluster.incarnation  # one number names this run everywhere
        self.cluster.peer_incarnation = lambda n: (self.transport.link_info(n) or {}).get("incarnation")
        await self.transport.start()
        log.info("started peer listener on port %s (node %s)", self.transport.bound_port, self.name)
        if joined.get("join") and not self._is_member():
            self.loop.create_task(self._join_loop(joined["join"], tuple(joined["address"])))
        self._tick_handle = self.loop.call_later(TICK_S, self._tick)
        alone = tuple(self.group.voters) == (self.id,)
        if alone:
            for _ in range(self.group.cfg.election_timeout_ticks * 2):  # nobody else can vote: elect at once
                if self.group.role == LEADER:
                    break
                self.multi.tick()
                self._drain()
        await self._catch_up(logged_at_start)
        if alone:
            await self._lead_alone()

    async def _catch_up(self, target: int) -> None:
        """Before clients are let in: a leader is known and every entry this node's log held at
        start is applied (an entry applied before a crash may not have been known committed on
        disk: routing to a queue it declared must not see the queue missing). A node that
        cannot reach a majority starts after metadata_timeout_ms with what it has."""
        deadline = self.loop.time() + self.cfg.metadata_timeout_ms / 1000
        while self.loop.time() < deadline:
            self._drain()
            if self.group.leader is not None and self.group.applied >= target:
                return
            await asyncio.sleep(0.005)
        log.warning("the catalogue did not catch up within %d ms (applied %d of %d, leader %s): starting with "
                    "what this node has", self.cfg.metadata_timeout_ms, self.group.applied, target,
                    self.leader_name())

    async def _lead_alone(self) -> None:
        """A cluster of one: wait until the catalogue holds the default vhost and user, so that
        the first client can log in."""
        restarted = INIT_PARAM in self.cluster.catalogue.global_parameters
        deadline = self.loop.time() + self.cfg.metadata_timeout_ms / 1000
        while INIT_PARAM not in self.cluster.catalogue.global_parameters and self.loop.time() < deadline:
            if self.group.role == LEADER:
                self._leader_chores(self.loop.time())
            self._drain()
            await asyncio.sleep(0.005)
        if restarted:
            await self._forget_transient_exchanges()

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
        await asyncio.wait_for(done.wait(), self.cfg.metadata_timeout_ms / 1000 + 1)

    async def stop(self) -> None:
        # a controlled shutdown: peers hear it is not a partition; mirrored queues led here tell
        # their mirrors (which then apply ha-promote-on-shutdown) and leave their rings before
        # the links close
        peers = self.transport.up_peers
        for peer in peers:
            self.transport.send(peer, "rpc", ["leaving"])
        if self.cluster.mirroring.leaders or self.cluster.mirroring.mirrors:
            self.cluster.mirroring.shutdown()
            self.cluster.mirroring.flush()
        if peers:
            await asyncio.sleep(0.05)  # the links write what was queued on the next loop turns
        self.stopped = True
        self._tick_handle.cancel()
        for req in list(self.pending):
            cb = self.pending.pop(req)[0]
            cb(cat.Result(cat.ERROR, 320, "the node is shutting down"))
        await self.transport.close()
        self.host.sync()
        self.host.close()

    # ------------------------------------------------------------ members and addresses

    def _address(self, name: str) -> tuple[str, int]:
        return self.cfg.peer_addresses.get(name) or self.addresses[name]

    def _learn(self, name: str, address: str) -> None:
        """A member's advertised address (from the catalogue)."""
        if not isinstance(address, str) or ":" not in address:
            return
        host, _, port = address.rpartition(":")
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
        return name == self.name or (not self.stopped and self.transport.is_up(name))

    def leader_name(self) -> str | None:
        lead = self.group.leader
        return self.names.get(lead) if lead is not None else None

    def status(self) -> dict[str, Any]:
        members = self.members()
        return {
            "cluster_name": self.node.broker.config.cluster_name or self.name,
            "node": self.name,
            "members": members,
            "disk_nodes": members,
            "running_nodes": [n for n in members if self.is_up(n)],
            "leader": self.leader_name(),
            "raft": {"term": self.group.term, "commit_index": self.group.commit, "applied": self.group.applied,
                     "role": self.group.role_name},
            "partitions": self.partitions(),
            "last_seen": {p: _iso(self._wall(self.down_since[p])) for p in self.partitioned() if p in self.down_since},
            "alarms": [],
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

    def _wall(self, loop_time: float) -> float:
        return time.time() - (self.loop.time() - loop_time)

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
        """Every group's Ready: persist (one fsync for all), send, apply, advance."""
        multi = self.multi
        while True:
            mr = multi.ready()
            if mr is None:
                self._leadership()
                return
            if mr.needs_fsync():
                self.host.sync()
            if not initial:
                for to, gid, m in mr.messages():
                    peer = self.names.get(to)
                    if peer is not None:
                        self.transport.send(peer, "raft", [gid, rm.encode(m)])
            compact = []
            for gid, rd in mr.groups:
                app = self.apps.get(gid)
                g = multi.groups.get(gid)
                if app is None or g is None:
                    continue
                if rd.snapshot is not None and rd.snapshot.data:
                    app.restore(rd.snapshot.data)
                applied = g.applied
                for e in rd.committed_entries:
                    if e.index > applied and e.kind == rm.ENTRY_NORMAL and e.data:
                        try:
                            app.apply(e.data, e.index)
                        except Exception:  # a bug must not wedge the group: log it and go on
                            log.exception("Raft group %s: applying entry %d failed", gid, e.index)
                if rd.snapshot_wanted and app.snapshot_due(g.applied - g.storage.first_index() + 1):
                    compact.append((gid, app))
            multi.advance(mr)
            for gid, app in compact:
                g = multi.groups.get(gid)
                if g is not None:
                    g.compact(g.applied, app.snapshot())
                    multi.touched(gid)
            if compact:
                self.host.sync()

    def _leadership(self) -> None:
        """Tell the quorum queues whose group this node started or stopped leading."""
        for gid, g in self.multi.groups.items():
            if gid == CATALOGUE_GROUP:
                continue
            leading = g.role == LEADER
            if g.leader != self._leaders.get(gid):
                self._leaders[gid] = g.leader
                if g.leader is not None:
                    self.cluster.quorum.leader_known(gid)
            if leading != (gid in self._leading):
                if leading:
                    self._leading.add(gid)
                else:
                    self._leading.discard(gid)
                self.cluster.quorum.leadership_changed(gid, leading)

    def _apply_catalogue(self, data: bytes) -> None:
        origin, req, cmd_bytes = _dec.decode(data)
        try:
            cmd = cat.decode_command(cmd_bytes)
        except msgspec.DecodeError:
            log.error("cannot decode a catalogue command from %s; skipped", origin)
            return
        res = self.cluster.apply_command(cmd)
        if isinstance(cmd, (cat.SetGlobalParameter,)) and cmd.name.startswith(NODE_PARAM):
            self._learn(cmd.name[len(NODE_PARAM):], cmd.value)
        if origin == self.name:
            item = self.pending.pop(req, None)
            if item is not None:
                item[0](res)

    # ------------------------------------------------------------ proposing

    def submit(self, cmd: cat.Command, callback) -> None:
        """Propose `cmd`; callback(result) once this node has applied it, or with a 541 error
        after metadata_timeout_ms."""
        self._next_req += 1
        req = self._next_req
        env = _enc.encode([self.name, req, cat.encode_command(cmd)])
        now = self.loop.time()
        self.pending[req] = [callback, now + self.cfg.metadata_timeout_ms / 1000, env, now + RETRY_S]
        self._propose(env)

    def _stale_promotion(self, env: bytes) -> bool:
        """A mirror's promotion whose old leader this (catalogue leader) node still sees running:
        the mirror is cut off from it, not the other way round (a partition), so it must not
        take over — least of all once the partition heals and its retried proposal arrives."""
        try:
            cmd = cat.decode_command(_dec.decode(env)[2])
        except (msgspec.DecodeError, IndexError, TypeError):
            return False
        if not isinstance(cmd, cat.SetQueueNodes) or not cmd.promotion:
            return False
        if cmd.expect_leader == self.name or self.transport.is_up(cmd.expect_leader):
            log.info("refusing to promote the mirror of queue '%s' in vhost '%s' on %s: its leader %s is running",
                     cmd.name, cmd.vhost, cmd.leader_node, cmd.expect_leader)
            return True
        return False

    def _propose(self, env: bytes) -> None:
        g = self.group
        if g.role == LEADER:
            if self._stale_promotion(env):
                return
            try:
                self.multi.propose(CATALOGUE_GROUP, env)
                self._schedule()
            except RaftError:
                pass  # retried
            return
        leader = self.leader_name()
        if leader is not None:
            self.transport.send(leader, "rpc", ["propose", env])

    def _expire_pending(self, now: float) -> None:
        for req, item in list(self.pending.items()):
            cb, deadline, env, retry = item
            if now >= deadline:
                del self.pending[req]
                leader = self.leader_name()
                why = (f"no leader is known and {self.name} cannot reach a majority of the cluster's nodes"
                       if leader is None else f"the change did not commit (leader {leader})")
                cb(cat.Result(cat.ERROR, 541, f"timed out after {self.cfg.metadata_timeout_ms} ms waiting for "
                                              f"the cluster metadata store: {why}"))
            elif now >= retry:
                item[3] = now + RETRY_S
                self._propose(env)

    # ------------------------------------------------------------ transport callbacks

    def _send_q(self, peer: str, payload: Any) -> bool:
        return self.transport.send(peer, "q", payload)

    def _on_message(self, peer: str, group: Any, payload: Any) -> None:
        if group == "raft":
            try:
                gid, data = payload
                self.multi.step(gid, rm.decode(data))
            except (msgspec.DecodeError, RaftError, ValueError, TypeError) as e:
                log.warning("bad Raft message from %s: %s", peer, e)
            self._schedule()
        elif group == "q":
            self.cluster.on_message(peer, payload)
        elif group == "rpc":
            self._on_rpc(peer, payload)

    def _on_rpc(self, peer: str, payload: list) -> None:
        kind = payload[0]
        if kind == "propose":
            if self.group.role == LEADER:
                if self._stale_promotion(payload[1]):
                    return
                try:
                    self.multi.propose(CATALOGUE_GROUP, payload[1])
                    self._schedule()
                except RaftError:
                    pass
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

    def _on_peer_up(self, peer: str) -> None:
        was_partitioned = peer in self.down_since and peer not in self.stopping_peers
        self.down_since.pop(peer, None)
        self.stopping_peers.discard(peer)
        if was_partitioned and (self.cfg.cluster_partition_handling == "autoheal" or (
                self.cfg.cluster_partition_handling == "pause_if_all_down"
                and self.cfg.pause_if_all_down_recover == "autoheal")):
            log.info("Autoheal: the partition with node %s has healed; no node restarts, as the catalogue "
                     "is Raft-replicated and this node takes the leader's log", peer)
        self.cluster.peer_up(peer)
        if self.cluster.local_info is not None:
            self.transport.send(peer, "q", ["NI", self.cluster.local_info()])
        log.info("node %s up", peer)
        self._partition_check()
        self.cluster.broker.schedule()

    def _partition_check(self) -> None:
        members = self.members()
        up = {m for m in members if m == self.name or self.transport.is_up(m)}
        self.node.partition_changed(up, members)

    def _on_peer_down(self, peer: str, reason: str) -> None:
        self.down_since[peer] = self.loop.time()
        nid = node_id(peer)
        alive = {node_id(m) for m in self.members() if m == self.name or self.transport.is_up(m)}
        for gid, g in self.multi.groups.items():
            if nid in g.voters or nid in g.learners:
                g.report_unreachable(nid)
                if g.leader == nid:  # its leader died: the lowest surviving voter stands at once
                    live = [v for v in g.voters if v in alive]
                    g.leader_down(nid, campaign_now=bool(live) and min(live) == g.id)
                self.multi.touched(gid)
        self.cluster.peer_down(peer)
        self._partition_check()

    # ------------------------------------------------------------ timers

    def _tick(self) -> None:
        if self.stopped:
            return
        self._tick_handle = self.loop.call_later(TICK_S, self._tick)
        self._ticks += 1
        self.multi.tick()
        now = self.loop.time()
        if self.pending:
            self._expire_pending(now)
        if self.forgets:
            self._check_forgets(now)
        self.cluster.quorum.tick(self.cluster.broker.now_ms() / 1000)
        self.cluster.tick(self.cluster.broker.now_ms() / 1000)
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

    def _leader_chores(self, now: float) -> None:
        c = self.cluster.catalogue
        if INIT_PARAM not in c.global_parameters and now - self._init_sent_at > 2.0:
            self._init_sent_at = now
            self._initialise()
        for name, address in list(self.joins.items()):
            nid = node_id(name)
            if NODE_PARAM + name not in c.global_parameters:
                self.submit(cat.SetGlobalParameter(NODE_PARAM + name, address), lambda _r: None)
                continue
            if nid in self.group.voters or nid in self.group.learners:
                del self.joins[name]
                log.info("node %s joined the cluster", name)
                continue
            try:
                self.group.propose_conf_change(rm.ConfChange(rm.CONF_ADD_LEARNER, (nid,)))
                self.multi.touched(CATALOGUE_GROUP)
                self._schedule()
            except (ProposalRejected, NotLeader):
                pass
        grace = self.cfg.net_ticktime_s
        for member in self.members():
            if member == self.name or self.transport.is_up(member):
                continue
            since = self.down_since.get(member, self.started + grace)
            if now >= since:
                self._delete_transient_queues_of(member, now)

    def _place_mirrors(self, now: float) -> None:
        """Keep each classic queue's mirror nodes in line with the policy that applies to it
        (hutch.mirror.placement): nodes that start or join get mirrors, a down mirror under
        `exactly` is replaced, a `nodes` change moves the leader once a listed mirror is
        synchronised. A queue whose leader's node is down is left to its mirrors' promotion."""
        c = self.cluster.catalogue
        members = self.members()
        running = [m for m in members if m == self.name or self.transport.is_up(m)]
        for rec in list(c.queues.values()):
            if rec.type != cat.CLASSIC or rec.exclusive_owner is not None or rec.leader_node not in running:
                continue
            params = self.cluster.mirror_params(rec.vhost, rec.name)
            if params is None and not rec.member_nodes:
                continue
            key = (rec.vhost, rec.name)
            if now - self._placing.get(key, -1e9) < 2.0:
                continue
            leader = rec.leader_node
            want = mirrors_for(params, leader, rec.member_nodes, members, running)
            move = leader_move(params, leader, self.cluster.mirror_status(rec.vhost, rec.name)[1])
            if move is not None:
                log.info("Mirrored queue '%s' in vhost '%s': moving its leader from %s to the synchronised mirror "
                         "on %s (policy ha-mode nodes)", rec.name, rec.vhost, leader, move)
                want = tuple(n for n in want if n != move)
                leader = move
            if leader == rec.leader_node and want == tuple(rec.member_nodes):
                continue
            self._placing[key] = now
            self.submit(cat.SetQueueNodes(rec.vhost, rec.name, leader, want, expect_leader=rec.leader_node),
                        lambda _r: None)

    def _delete_transient_queues_of(self, node: str, now: float) -> None:
        """RabbitMQ's rule: a non-durable (or exclusive) queue whose home node is gone is deleted
        (a mirrored one only when no mirror is left to promote)."""
        for rec in self.cluster.queues_homed_on(node):
            if rec.durable and rec.exclusive_owner is None:
                continue
            if any(n != node and self.is_up(n) for n in rec.member_nodes) and rec.exclusive_owner is None:
                continue
            key = (rec.vhost, rec.name)
            if now - self._deleting.get(key, -1e9) < 5.0:
                continue
            self._deleting[key] = now
            log.info("deleting %s queue '%s' in vhost '%s': its home node %s is down",
                     "exclusive" if rec.exclusive_owner else "non-durable", rec.name, rec.vhost, node)
            self.submit(cat.DeleteQueue(rec.vhost, rec.name), lambda _r: None)

    def _initialise(self) -> None:
        cfg = self.cfg
        # as RabbitMQ: a node that imports definitions at boot gets its vhosts and users from them,
        # not the default vhost and user
        cmds: list[cat.Command] = [] if cfg.load_definitions else [cat.AddVhost(cfg.default_vhost)]
        legacy = _legacy_definitions(cfg.data_dir, self.name)
        if legacy is not None:
            cmds = legacy
        elif cfg.default_user and not cfg.load_definitions:
            cmds.append(cat.PutUser(cfg.default_user, hash_password(cfg.default_pass), ("administrator",)))
            cmds.append(cat.SetPermissions(cfg.default_user, cfg.default_vhost, ".*", ".*", ".*"))
        first = parse_node(cfg.cluster_nodes[0])[0] if cfg.cluster_nodes else self.name
        cmds.append(cat.SetGlobalParameter("cluster_name", cfg.cluster_name or first))
        for n, (h, p) in sorted(self.addresses.items()):
            cmds.append(cat.SetGlobalParameter(NODE_PARAM + n, f"{h}:{p}"))
        cmds.append(cat.SetGlobalParameter(INIT_PARAM, True))
        for cmd in cmds:
            self.submit(cmd, lambda _r: None)

    # ------------------------------------------------------------ forgetting a member

    def forget(self, name: str, callback) -> None:
        """Remove `name` from the cluster: its queues are deleted and it leaves the catalogue's
        group. callback(None) when done, callback(error text) when refused or timed out."""
        if name == self.name:
            return callback(f"node {name} cannot forget itself; run forget_cluster_node on another node")
        if name not in self.members():
            return callback(f"node {name} is not a member of the cluster")
        if self.is_up(name):
            return callback(f"node {name} is running; stop it (hutchctl -n {name} stop_app) before forgetting it")
        log.info("Removing node %s from the cluster", name)
        for rec in self.cluster.queues_homed_on(name):
            mirrors = [n for n in rec.member_nodes if n != name]
            if rec.type == cat.CLASSIC and mirrors:
                # RabbitMQ's forget_cluster_node: a mirror takes over the queue (it starts empty
                # if its node is stopped: mirrors keep nothing across a restart)
                log.info("Mirrored queue '%s' in vhost '%s': promoting the mirror on %s (its leader's node %s is "
                         "forgotten)", rec.name, rec.vhost, mirrors[0], name)
                self.submit(cat.SetQueueNodes(rec.vhost, rec.name, mirrors[0], tuple(mirrors[1:]),
                                              expect_leader=name), lambda _r: None)
                continue
            self.submit(cat.DeleteQueue(rec.vhost, rec.name), lambda _r: None)
        self.submit(cat.ClearGlobalParameter(NODE_PARAM + name), lambda _r: None)
        self.forgets.append([name, callback, self.loop.time() + self.cfg.metadata_timeout_ms / 1000])
        self._remove_member(name)

    def _remove_member(self, name: str) -> None:
        if self.group.role == LEADER:
            try:
                self.group.propose_conf_change(rm.ConfChange(rm.CONF_REMOVE, (node_id(name),)))
                self.multi.touched(CATALOGUE_GROUP)
                self._schedule()
            except (ProposalRejected, NotLeader):
                pass  # retried from the tick
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
            elif self._ticks % 10 == 0:
                self._remove_member(name)

    # ------------------------------------------------------------ joining

    async def _join_loop(self, seed: str, seed_address: tuple[str, int]) -> None:
        self._learn(seed, f"{seed_address[0]}:{seed_address[1]}")
        my_address = f"{self.name.split('@', 1)[1]}:{self.transport.bound_port}"
        while not self.stopped and not self._is_member():
            self.transport.send(seed, "rpc", ["join", self.name, my_address])
            await asyncio.sleep(1.0)
        if not self.stopped:
            log.info("node %s is a member of the cluster (via %s)", self.name, seed)


class GroupApp(Protocol):
    """What a Raft group hosted by this node applies its committed entries to."""

    def apply(self, data: bytes, index: int) -> None: ...

    def restore(self, data: bytes) -> None: ...

    def snapshot(self) -> bytes: ...

    def snapshot_due(self, entries_kept: int) -> bool:
        """Whether compacting now is worth a snapshot (which may be large: a whole queue)."""


class _QueueGroups:
    """The quorum queues' view of this node's Raft groups (hutch.broker.quorumq calls these)."""

    def __init__(self, rt: ClusterRuntime):
        self.rt = rt

    def ensure_group(self, gid: int, members: tuple[str, ...], app: GroupApp, leader_hint: str = "",
                     joining: bool = False) -> None:
        """Host the group here. A new group's first members start from the same bootstrap entry;
        a member added later (`joining`) starts empty and learns everything from the leader."""
        rt = self.rt
        if gid in rt.multi.groups:
            return
        for m in members:
            rt.names[node_id(m)] = m
        storage = rt.host.group(gid)
        if storage.last_index() == 0 and storage.snapshot().meta.index == 0 and not joining:
            for m in members:
                rt.names[node_id(m)] = m
            storage = rt.host.bootstrap(gid, tuple(sorted(node_id(m) for m in members)))
        snap = storage.snapshot()
        if snap.data:
            app.restore(snap.data)
        rt.apps[gid] = app
        g = rt.multi.add_group(gid, storage)
        if leader_hint == rt.name or tuple(g.voters) == (rt.id,):
            # the node the queue was placed on campaigns at once (alone, it wins at once)
            for _ in range(g.cfg.election_timeout_ticks * 2):
                if g.role == LEADER:
                    break
                g.tick()
        rt.multi.touched(gid)
        rt._schedule()

    def drop_group(self, gid: int) -> None:
        rt = self.rt
        if gid in rt.multi.groups:
            rt.multi.remove_group(gid)
        rt.apps.pop(gid, None)
        rt._leading.discard(gid)

    def leader(self, gid: int) -> str | None:
        g = self.rt.multi.groups.get(gid)
        if g is None or g.leader is None:
            return None
        return self.rt.names.get(g.leader)

    def propose(self, gid: int, data: bytes) -> bool:
        try:
            self.rt.multi.propose(gid, data)
        except RaftError:
            return False  # not the leader any more, or too many in flight: the proposer resends
        self.rt._schedule()
        return True

    def status(self, gid: int) -> dict | None:
        g = self.rt.multi.groups.get(gid)
        if g is None:
            return None
        st = g.status()
        st["snapshot_index"] = g.storage.snapshot().meta.index
        st["voters"] = [self.rt.names.get(n, str(n)) for n in st["voters"]]
        st["learners"] = [self.rt.names.get(n, str(n)) for n in st["learners"]]
        st["leader"] = self.rt.names.get(st["leader"]) if st["leader"] is not None else None
        st.pop("progress", None)
        return st

    def change_members(self, gid: int, op: str, node: str) -> str | None:
        """On the group's leader: add (as a learner that is promoted once caught up) or remove
        one member. None when proposed (or already so), else why not (yet)."""
        g = self.rt.multi.groups.get(gid)
        if g is None or g.role != LEADER:
            return "not the leader"
        nid = node_id(node)
        self.rt.names[nid] = node
        member = nid in g.voters or nid in g.learners
        if (op == "add") == member:
            return None
        kind = rm.CONF_ADD_LEARNER if op == "add" else rm.CONF_REMOVE
        try:
            g.propose_conf_change(rm.ConfChange(kind, (nid,)))
        except (ProposalRejected, NotLeader) as e:
            return str(e)
        self.rt.multi.touched(gid)
        self.rt._schedule()
        return None

    def members(self, gid: int) -> list[str] | None:
        g = self.rt.multi.groups.get(gid)
        if g is None:
            return None
        return sorted(self.rt.names.get(n, str(n)) for n in (*g.voters, *g.learners))


class _CatalogueApp:
    """The catalogue group's application: commands in envelopes, the broker kept in line."""

    def __init__(self, rt: ClusterRuntime):
        self.rt = rt

    def apply(self, data: bytes, index: int) -> None:
        self.rt._apply_catalogue(data)

    def restore(self, data: bytes) -> None:
        cl = self.rt.cluster
        cl.catalogue.restore(data)
        cl.rebuild()
        for n, addr in cl.members.items():
            self.rt._learn(n, addr)

    def snapshot(self) -> bytes:
        return self.rt.cluster.catalogue.snapshot()

    def snapshot_due(self, entries_kept: int) -> bool:
        return True


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


def read_cluster_file(data_dir: str) -> dict:
    p = Path(data_dir) / CLUSTER_FILE
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {}


def write_cluster_file(data_dir: str, doc: dict) -> None:
    p = Path(data_dir) / CLUSTER_FILE
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, p)
