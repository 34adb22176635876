"""The cluster catalogue: vhosts, users (with their limits), permissions, topic permissions,
exchanges, bindings, queue records, policies and runtime parameters (a vhost's limits among
them), as one deterministic state machine.

Every node keeps a copy; the copies stay equal because they change only by applying the same
commands in the same order — the commands the cluster's metadata Raft group commits (as
RabbitMQ 4.x keeps its schema in Khepri). `Catalogue.apply(command) -> Result` is the whole
write interface: a command is a small msgpack-encodable `msgspec.Struct`, and the result says
exactly what happened (created, existed, updated, deleted, absent, or an AMQP reply code and
RabbitMQ's text), so the node that proposed the command can answer its client as RabbitMQ
would. Redeclaring an exchange or queue checks RabbitMQ's equivalence rules: type, durable,
auto_delete, internal and the `alternate-exchange` argument for exchanges; durable, the
exclusive owner (405 RESOURCE_LOCKED), auto_delete and the compared `x-` arguments for
queues — a difference is a 406 PRECONDITION_FAILED "inequivalent arg ...".

`snapshot()` encodes the whole state canonically (sorted, msgpack), so two catalogues with the
same content give the same bytes whatever their history; `restore(bytes)` loads one (a Raft
snapshot). `to_definitions()` and `from_definitions()` translate to and from RabbitMQ's
definitions export document.

What it must never do: read a clock, draw a random number, touch a file or a socket, or depend
on hash or set order. Identities that need inventing (a queue's journal id, its home node) come
in the commands, chosen by the proposer. Validation that depends on who asks (permissions, the
`amq.` prefix, argument ranges) is the caller's, before it proposes.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import msgspec

from hutch.amqp.codec import field_text as _show
from hutch.amqp.codec import field_type_name as _type_name

# AMQP reply codes a result can carry.
OK = 200
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406

# Result statuses.
CREATED = "created"
EXISTED = "existed"  # a redeclare of an equivalent thing: nothing changed
UPDATED = "updated"  # a put over an existing record (user, permissions, policy, parameter)
DELETED = "deleted"
ABSENT = "absent"  # a delete or clear of something that was not there (not an error, as in RabbitMQ)
ERROR = "error"

QUEUE = "queue"
EXCHANGE = "exchange"
CLASSIC = "classic"
QUORUM = "quorum"
STREAM = "stream"
QUEUE_TYPES = (CLASSIC, QUORUM, STREAM)
POLICY_APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "quorum_queues")

DEFAULT_EXCHANGES = (
    ("", "direct"), ("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
    ("amq.headers", "headers"), ("amq.match", "headers"),
)
# The arguments a redeclare must repeat exactly (RabbitMQ's rabbit_exchange / rabbit_amqqueue).
EXCHANGE_ARGS_COMPARED = ("alternate-exchange",)
QUEUE_ARGS_COMPARED = ("x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes", "x-overflow",
                       "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-priority",
                       "x-single-active-consumer", "x-queue-type", "x-queue-mode", "x-queue-master-locator")
HASHING_SHA256 = "rabbit_password_hashing_sha256"
VHOST_LIMITS = "vhost-limits"  # the runtime parameter component that holds a vhost's limits

NAME_BYTES_MAX = 255  # AMQP shortstr: vhost, exchange, queue and user names
MEMBER_NODES_MAX = 64


# ---- records ------------------------------------------------------------------------------


class VhostRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    name: str
    description: str = ""
    tags: tuple[str, ...] = ()
    default_queue_type: str = ""  # "": none set (RabbitMQ shows 'undefined')


class UserRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    name: str
    password_hash: str  # "": password login disabled
    tags: tuple[str, ...] = ()
    hashing_algorithm: str = HASHING_SHA256
    limits: dict[str, int] = {}  # max-connections, max-channels (RabbitMQ's user limits)


class PermissionRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    user: str
    vhost: str
    configure: str
    write: str
    read: str


class TopicPermissionRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """A user's topic permissions on one exchange of a vhost: regexes the routing key must match
    to publish (`write`) and to bind (`read`); `{username}` and `{vhost}` are expanded first."""

    user: str
    vhost: str
    exchange: str
    write: str
    read: str


class ExchangeRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = {}


class BindingRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    vhost: str
    source: str
    destination_type: str  # QUEUE | EXCHANGE
    destination: str
    routing_key: str = ""
    arguments: dict[str, Any] = {}


class QueueRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    vhost: str
    name: str
    type: str = CLASSIC
    durable: bool = True
    auto_delete: bool = False
    exclusive_owner: str | None = None  # the owning connection's id (it names its node); None: shared
    arguments: dict[str, Any] = {}
    leader_node: str = ""  # the home node of a classic queue, the leader of a mirrored or quorum one
    member_nodes: tuple[str, ...] = ()  # mirrors of a classic queue, Raft members of a quorum queue
    journal_id: int = 0  # the identity its messages are journalled under; new on every declare
    # a transient (non-durable or exclusive) queue lives as long as its home node's run that
    # created it: the run's random incarnation, 0 when the proposer did not know it
    home_incarnation: int = 0
    # a mirrored queue: nodes whose mirror its leader declared dead while synchronised, and then
    # went on without. Such a mirror's last view says it is synchronised, but it lacks what the
    # leader confirmed since; it may not be promoted where only a synchronised mirror may be,
    # until a leader has seen a mirror on that node synchronised again (CheckQueueLeader)
    fenced_nodes: tuple[str, ...] = ()


class PolicyRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    vhost: str
    name: str
    pattern: str
    apply_to: str = "all"
    priority: int = 0
    definition: dict[str, Any] = {}


class ParameterRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    component: str
    vhost: str
    name: str
    value: Any = None


# ---- commands -----------------------------------------------------------------------------


class Command(msgspec.Struct, frozen=True, tag_field="op", forbid_unknown_fields=False):
    """Base of every catalogue command; encoded as a msgpack map with an `op` tag."""


class AddVhost(Command, tag="vhost.add"):
    name: str
    description: str = ""
    tags: tuple[str, ...] = ()
    default_queue_type: str = ""


class DeleteVhost(Command, tag="vhost.delete"):
    name: str


class PutUser(Command, tag="user.put"):
    name: str
    password_hash: str
    tags: tuple[str, ...] = ()
    hashing_algorithm: str = HASHING_SHA256
    limits: dict[str, int] | None = None  # None: an existing user keeps its limits


class SetUserLimits(Command, tag="user.limits.set"):
    """Set some of a user's limits (the others stay); -1 is stored as given (no limit)."""

    user: str
    limits: dict[str, int]


class ClearUserLimits(Command, tag="user.limits.clear"):
    user: str
    name: str = "all"  # one limit's name, or "all"


class DeleteUser(Command, tag="user.delete"):
    name: str


class SetPermissions(Command, tag="permissions.set"):
    user: str
    vhost: str
    configure: str
    write: str
    read: str


class ClearPermissions(Command, tag="permissions.clear"):
    user: str
    vhost: str


class SetTopicPermissions(Command, tag="topic_permissions.set"):
    user: str
    vhost: str
    exchange: str
    write: str
    read: str


class ClearTopicPermissions(Command, tag="topic_permissions.clear"):
    user: str
    vhost: str
    exchange: str | None = None  # None: on every exchange of the vhost


class DeclareExchange(Command, tag="exchange.declare"):
    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = {}


class DeleteExchange(Command, tag="exchange.delete"):
    vhost: str
    name: str
    if_unused: bool = False


class Bind(Command, tag="bind"):
    vhost: str
    source: str
    destination_type: str
    destination: str
    routing_key: str = ""
    arguments: dict[str, Any] = {}


class Unbind(Command, tag="unbind"):
    vhost: str
    source: str
    destination_type: str
    destination: str
    routing_key: str = ""
    arguments: dict[str, Any] = {}


class DeclareQueue(Command, tag="queue.declare"):
    vhost: str
    name: str
    type: str = CLASSIC
    durable: bool = True
    auto_delete: bool = False
    exclusive_owner: str | None = None
    arguments: dict[str, Any] = {}
    leader_node: str = ""
    member_nodes: tuple[str, ...] = ()
    journal_id: int = 0
    home_incarnation: int = 0


class DeleteQueue(Command, tag="queue.delete"):
    vhost: str
    name: str


class SetQueueNodes(Command, tag="queue.nodes"):
    """A queue's leader or members moved (promotion, a policy change, a member added)."""

    vhost: str
    name: str
    leader_node: str
    member_nodes: tuple[str, ...] = ()
    # applied only while the leader is still this node ("" = whatever it is): a promotion or a
    # placement decided from an older record must not undo a change made since
    expect_leader: str = ""
    # a mirror taking over from a failed leader (checked before it is proposed); refused if its node
    # is no longer among the queue's member nodes (its mirror was taken off since)
    promotion: bool = False
    # the promotion is allowed only for a synchronised mirror (ha-promote-on-failure when-synced, or
    # a stopping leader under ha-promote-on-shutdown when-synced): refused if its node is fenced
    synchronised_only: bool = False


class CheckQueueLeader(Command, tag="queue.check_leader"):
    """Succeeds while `leader_node` leads the queue, and then adds `fence` to the queue's fenced
    nodes and takes `unfence` from them (QueueRecord.fenced_nodes). A mirrored queue's leader asks
    it before it confirms what became stable while it was cut off from the majority, or after a
    synchronised mirror was declared dead: a barrier through the log (once committed, no other
    node took the queue over before it, and the dead mirror can no longer be promoted)."""

    vhost: str
    name: str
    leader_node: str
    fence: tuple[str, ...] = ()
    unfence: tuple[str, ...] = ()


class Barrier(Command, tag="barrier"):
    """Changes nothing. A node that has applied it has applied everything committed before it:
    a node resuming after a pause waits for one before it lets clients in again."""


class SetPolicy(Command, tag="policy.set"):
    vhost: str
    name: str
    pattern: str
    apply_to: str = "all"
    priority: int = 0
    definition: dict[str, Any] = {}


class ClearPolicy(Command, tag="policy.clear"):
    vhost: str
    name: str


class SetOperatorPolicy(Command, tag="operator_policy.set"):
    """An operator policy (set by administrators; only a few numeric keys, see hutch.control.policy)."""

    vhost: str
    name: str
    pattern: str
    apply_to: str = "all"
    priority: int = 0
    definition: dict[str, Any] = {}


class ClearOperatorPolicy(Command, tag="operator_policy.clear"):
    vhost: str
    name: str


class SetParameter(Command, tag="parameter.set"):
    component: str
    vhost: str
    name: str
    value: Any = None


class ClearParameter(Command, tag="parameter.clear"):
    component: str
    vhost: str
    name: str


class SetGlobalParameter(Command, tag="global_parameter.set"):
    name: str
    value: Any = None


class ClearGlobalParameter(Command, tag="global_parameter.clear"):
    name: str


AnyCommand = (AddVhost | DeleteVhost | PutUser | DeleteUser | SetPermissions | ClearPermissions
              | DeclareExchange | DeleteExchange | Bind | Unbind | DeclareQueue | DeleteQueue | SetQueueNodes
              | CheckQueueLeader | Barrier
              | SetPolicy | ClearPolicy | SetParameter | ClearParameter | SetGlobalParameter
              | ClearGlobalParameter | SetOperatorPolicy | ClearOperatorPolicy)


class Result(msgspec.Struct, frozen=True):
    """What a command did. `code` is an AMQP reply code (200 when it succeeded)."""

    status: str
    code: int = OK
    text: str = ""
    queue: QueueRecord | None = None  # declare-queue: the record as it now is
    exchanges_deleted: tuple[str, ...] = ()  # auto-delete exchanges that lost their last binding
    bindings_deleted: int = 0

    @property
    def ok(self) -> bool:
        return self.code == OK


# topic permissions and user limits
AnyCommand = AnyCommand | SetTopicPermissions | ClearTopicPermissions | SetUserLimits | ClearUserLimits

_encoder = msgspec.msgpack.Encoder(order="deterministic")
_command_decoder = msgspec.msgpack.Decoder(AnyCommand)


def encode_command(cmd: Command) -> bytes:
    return _encoder.encode(cmd)


def decode_command(data: bytes) -> Command:
    return _command_decoder.decode(data)


# ---- snapshot layout ----------------------------------------------------------------------

SNAPSHOT_FORMAT = 1


class _State(msgspec.Struct, forbid_unknown_fields=False):
    format: int
    vhosts: list[VhostRecord]
    users: list[UserRecord]
    permissions: list[PermissionRecord]
    exchanges: list[ExchangeRecord]
    bindings: list[BindingRecord]
    queues: list[QueueRecord]
    policies: list[PolicyRecord]
    parameters: list[ParameterRecord]
    global_parameters: list[tuple[str, Any]]
    operator_policies: list[PolicyRecord] = []
    topic_permissions: list[TopicPermissionRecord] = []


_state_decoder = msgspec.msgpack.Decoder(_State)


class CatalogueError(ValueError):
    """A snapshot or definitions document that cannot be loaded."""


# ---- helpers ------------------------------------------------------------------------------


def _text(v: Any) -> Any:
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def _type_class(v: Any) -> str:
    """RabbitMQ's type classes for argument equivalence (rabbit_misc:type_class): every integer
    type is one class, float and double another; any other type is its own class."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, (str, bytes)):
        return "longstr"
    return _type_name(v)


def _same_arg(a: Any, b: Any) -> bool:
    """Two present argument values are equivalent when their type classes match and their values
    are equal: x-max-length 10 and 10 (any integer width) are, 10 and "10" or 10 and 10.0 are not."""
    if _type_class(a) != _type_class(b):
        return False
    if isinstance(a, Decimal):
        return a.as_tuple() == b.as_tuple()
    return _text(a) == _text(b)


def args_difference(kind: str, name: str, vhost: str, current: dict, received: dict,
                    compared: tuple[str, ...]) -> str | None:
    """RabbitMQ's "inequivalent arg" text for the first compared argument that differs, or None
    (rabbit_misc:assert_args_equivalence). The one equivalence rule of hutch: the AMQP and HTTP
    declares check it before they propose, and the catalogue again when the declare commits.
    A missing x-queue-type and "classic" are equivalent, as in RabbitMQ."""
    for key in compared:
        a, b = current.get(key), received.get(key)
        if a is None and b is None or a is not None and b is not None and _same_arg(a, b):
            continue
        if key == "x-queue-type" and _text(a if b is None else b) == CLASSIC and (a is None or b is None):
            continue
        if a is not None and b is not None:  # RabbitMQ shows both bare, even when their types differ
            got, cur = f"'{_show(b)}'", f"'{_show(a)}'"
        else:
            got = "none" if b is None else f"the value '{_show(b)}' of type '{_type_name(b)}'"
            cur = "none" if a is None else f"the value '{_show(a)}' of type '{_type_name(a)}'"
        return f"inequivalent arg '{key}' for {kind} '{name}' in vhost '{vhost}': received {got} but current is {cur}"
    return None


def _bool(v: bool) -> str:
    return "true" if v else "false"


def _args_key(args: dict[str, Any]) -> bytes:
    """A canonical form of an arguments table, so bindings that differ only in key order match."""
    return _encoder.encode(args) if args else b""


def _err(code: int, text: str) -> Result:
    return Result(ERROR, code, text)


def _no_vhost(vhost: str) -> Result:
    return _err(NOT_FOUND, f"vhost '{vhost}' not found")


def _rs(kind: str, name: str, vhost: str) -> str:
    return f"{kind} '{name}' in vhost '{vhost}'"


BindingKey = tuple[str, str, str, str, str, bytes]  # vhost, source, destination_type, destination, key, args


def _binding_key(vhost: str, source: str, dtype: str, dest: str, rk: str, args: dict) -> BindingKey:
    return (vhost, source, dtype, dest, rk, _args_key(args))


# ---- the state machine ----------------------------------------------------------------------


class Catalogue:
    """The catalogue. Reads are plain attribute and method access; writes are `apply`."""

    def __init__(self) -> None:
        self.vhosts: dict[str, VhostRecord] = {}
        self.users: dict[str, UserRecord] = {}
        self.permissions: dict[tuple[str, str], PermissionRecord] = {}  # (user, vhost)
        self.topic_permissions: dict[tuple[str, str, str], TopicPermissionRecord] = {}  # (user, vhost, exchange)
        self.exchanges: dict[tuple[str, str], ExchangeRecord] = {}  # (vhost, name)
        self.bindings: dict[BindingKey, BindingRecord] = {}
        self.queues: dict[tuple[str, str], QueueRecord] = {}  # (vhost, name)
        self.policies: dict[tuple[str, str], PolicyRecord] = {}  # (vhost, name)
        self.operator_policies: dict[tuple[str, str], PolicyRecord] = {}  # (vhost, name)
        self.parameters: dict[tuple[str, str, str], ParameterRecord] = {}  # (component, vhost, name)
        self.global_parameters: dict[str, Any] = {}
        # Indexes over bindings (dicts used as ordered sets: never iterate a set here).
        self._by_source: dict[tuple[str, str], dict[BindingKey, None]] = {}
        self._by_destination: dict[tuple[str, str, str], dict[BindingKey, None]] = {}
        self.applied_count = 0

    # -- reads ------------------------------------------------------------------------------

    def exchange(self, vhost: str, name: str) -> ExchangeRecord | None:
        return self.exchanges.get((vhost, name))

    def queue(self, vhost: str, name: str) -> QueueRecord | None:
        return self.queues.get((vhost, name))

    def bindings_from(self, vhost: str, source: str) -> list[BindingRecord]:
        return [self.bindings[k] for k in sorted(self._by_source.get((vhost, source), ()))]

    def bindings_to(self, vhost: str, destination_type: str, destination: str) -> list[BindingRecord]:
        return [self.bindings[k] for k in sorted(self._by_destination.get((vhost, destination_type, destination), ()))]

    def policies_of(self, vhost: str) -> list[PolicyRecord]:
        return [p for (v, _n), p in sorted(self.policies.items()) if v == vhost]

    def policy_for(self, vhost: str, name: str, kind: str, queue_type: str = CLASSIC,
                   operator: bool = False) -> PolicyRecord | None:
        """The policy (with `operator`: the operator policy) that applies to a queue or exchange:
        the highest priority match; among equal priorities the greatest name (RabbitMQ's rule, as
        `hutch.queues.effective.match`), so every node picks the same one whatever order the
        policies were stored in."""
        best: PolicyRecord | None = None
        table = self.operator_policies if operator else self.policies
        for p in [p for (v, _n), p in sorted(table.items()) if v == vhost]:
            if not _policy_applies(p, kind, queue_type) or re.search(p.pattern, name) is None:
                continue
            if best is None or (p.priority, p.name) > (best.priority, best.name):
                best = p
        return best

    # -- writes -----------------------------------------------------------------------------

    def apply(self, cmd: Command) -> Result:
        """Apply one command. Deterministic: the same commands in the same order give the same
        state and the same results on every node."""
        handler = _HANDLERS.get(type(cmd))
        if handler is None:
            raise TypeError(f"not a catalogue command: {cmd!r}")
        self.applied_count += 1
        return handler(self, cmd)

    def apply_encoded(self, data: bytes) -> Result:
        """Apply a command as committed in a Raft entry (see `encode_command`)."""
        return self.apply(decode_command(data))

    def _add_vhost(self, c: AddVhost) -> Result:
        old = self.vhosts.get(c.name)
        rec = VhostRecord(c.name, c.description, tuple(c.tags), c.default_queue_type)
        self.vhosts[c.name] = rec
        if old is not None:
            return Result(EXISTED if old == rec else UPDATED)
        for xname, xtype in DEFAULT_EXCHANGES:
            self.exchanges[(c.name, xname)] = ExchangeRecord(c.name, xname, xtype, durable=True)
        return Result(CREATED)

    def _delete_vhost(self, c: DeleteVhost) -> Result:
        if c.name not in self.vhosts:
            return Result(ABSENT)
        v = c.name
        n_bindings = 0
        for key in [k for k in self.bindings if k[0] == v]:
            self._remove_binding(key)
            n_bindings += 1
        for table in (self.exchanges, self.queues, self.policies, self.operator_policies):
            for key in [k for k in table if k[0] == v]:
                del table[key]
        for key in [k for k in self.permissions if k[1] == v]:
            del self.permissions[key]
        for key in [k for k in self.topic_permissions if k[1] == v]:
            del self.topic_permissions[key]
        for key in [k for k in self.parameters if k[1] == v]:
            del self.parameters[key]
        del self.vhosts[v]
        return Result(DELETED, bindings_deleted=n_bindings)

    def _put_user(self, c: PutUser) -> Result:
        old = self.users.get(c.name)
        limits = dict(c.limits) if c.limits is not None else (dict(old.limits) if old is not None else {})
        rec = UserRecord(c.name, c.password_hash, tuple(c.tags), c.hashing_algorithm, limits)
        return _store(self.users, c.name, rec)

    def _delete_user(self, c: DeleteUser) -> Result:
        if self.users.pop(c.name, None) is None:
            return Result(ABSENT)
        for key in [k for k in self.permissions if k[0] == c.name]:
            del self.permissions[key]
        for key in [k for k in self.topic_permissions if k[0] == c.name]:
            del self.topic_permissions[key]
        return Result(DELETED)

    def _set_user_limits(self, c: SetUserLimits) -> Result:
        old = self.users.get(c.user)
        if old is None:
            return _err(NOT_FOUND, f"user '{c.user}' not found")
        limits = dict(old.limits)
        limits.update(c.limits)
        return _store(self.users, c.user, msgspec.structs.replace(old, limits=dict(sorted(limits.items()))))

    def _clear_user_limits(self, c: ClearUserLimits) -> Result:
        old = self.users.get(c.user)
        if old is None:
            return _err(NOT_FOUND, f"user '{c.user}' not found")
        limits = {} if c.name == "all" else {k: v for k, v in old.limits.items() if k != c.name}
        if limits == old.limits:
            return Result(ABSENT)
        self.users[c.user] = msgspec.structs.replace(old, limits=limits)
        return Result(DELETED)

    def _set_topic_permissions(self, c: SetTopicPermissions) -> Result:
        if c.user not in self.users:
            return _err(NOT_FOUND, f"user '{c.user}' not found")
        if c.vhost not in self.vhosts:
            return _no_vhost(c.vhost)
        for what, pattern in (("write", c.write), ("read", c.read)):
            problem = _regex_problem(pattern)
            if problem is not None:
                return _err(PRECONDITION_FAILED, f"{what} topic permission '{pattern}' is not a valid regular "
                                                 f"expression: {problem}")
        rec = TopicPermissionRecord(c.user, c.vhost, c.exchange, c.write, c.read)
        return _store(self.topic_permissions, (c.user, c.vhost, c.exchange), rec)

    def _clear_topic_permissions(self, c: ClearTopicPermissions) -> Result:
        if c.exchange is not None:
            return _discard(self.topic_permissions, (c.user, c.vhost, c.exchange))
        keys = [k for k in self.topic_permissions if k[0] == c.user and k[1] == c.vhost]
        for key in keys:
            del self.topic_permissions[key]
        return Result(DELETED if keys else ABSENT)

    def topic_permission(self, user: str, vhost: str, exchange: str) -> TopicPermissionRecord | None:
        return self.topic_permissions.get((user, vhost, exchange))

    def vhost_limits(self, vhost: str) -> dict[str, Any]:
        """A vhost's limits: RabbitMQ keeps them as the runtime parameter vhost-limits/limits."""
        p = self.parameters.get((VHOST_LIMITS, vhost, "limits"))
        return dict(p.value) if p is not None and isinstance(p.value, dict) else {}

    def _set_permissions(self, c: SetPermissions) -> Result:
        if c.user not in self.users:
            return _err(NOT_FOUND, f"user '{c.user}' not found")
        if c.vhost not in self.vhosts:
            return _no_vhost(c.vhost)
        for what, pattern in (("configure", c.configure), ("write", c.write), ("read", c.read)):
            problem = _regex_problem(pattern)
            if problem is not None:
                return _err(PRECONDITION_FAILED, f"{what} permission '{pattern}' is not a valid regular "
                                                 f"expression: {problem}")
        rec = PermissionRecord(c.user, c.vhost, c.configure, c.write, c.read)
        return _store(self.permissions, (c.user, c.vhost), rec)

    def _clear_permissions(self, c: ClearPermissions) -> Result:
        return _discard(self.permissions, (c.user, c.vhost))

    def _declare_exchange(self, c: DeclareExchange) -> Result:
        if c.vhost not in self.vhosts:
            return _no_vhost(c.vhost)
        if c.name == "":
            return _err(ACCESS_REFUSED, "operation not permitted on the default exchange")
        old = self.exchanges.get((c.vhost, c.name))
        if old is None:
            self.exchanges[(c.vhost, c.name)] = ExchangeRecord(c.vhost, c.name, c.type, bool(c.durable),
                                                               bool(c.auto_delete), bool(c.internal),
                                                               dict(c.arguments))
            return Result(CREATED)

        def ineq(arg: str, got: str, cur: str) -> Result:
            return _err(PRECONDITION_FAILED, f"inequivalent arg '{arg}' for exchange '{c.name}' in vhost "
                                             f"'{c.vhost}': received '{got}' but current is '{cur}'")
        if old.type != c.type:
            return ineq("type", c.type, old.type)
        if old.durable != bool(c.durable):
            return ineq("durable", _bool(c.durable), _bool(old.durable))
        if old.auto_delete != bool(c.auto_delete):
            return ineq("auto_delete", _bool(c.auto_delete), _bool(old.auto_delete))
        if old.internal != bool(c.internal):
            return ineq("internal", _bool(c.internal), _bool(old.internal))
        text = args_difference("exchange", c.name, c.vhost, old.arguments, c.arguments, EXCHANGE_ARGS_COMPARED)
        if text is not None:
            return _err(PRECONDITION_FAILED, text)
        return Result(EXISTED)

    def _delete_exchange(self, c: DeleteExchange) -> Result:
        if c.name == "":
            return _err(ACCESS_REFUSED, "operation not permitted on the default exchange")
        if (c.vhost, c.name) not in self.exchanges:
            return Result(ABSENT)
        if c.if_unused and self._by_source.get((c.vhost, c.name)):
            return _err(PRECONDITION_FAILED, f"exchange '{c.name}' in vhost '{c.vhost}' in use")
        n, gone = self._remove_exchange(c.vhost, c.name)
        return Result(DELETED, exchanges_deleted=gone, bindings_deleted=n)

    def _bind_check(self, c: Bind | Unbind) -> Result | None:
        if c.vhost not in self.vhosts:
            return _no_vhost(c.vhost)
        if c.source == "" or (c.destination_type == EXCHANGE and c.destination == ""):
            return _err(ACCESS_REFUSED, "operation not permitted on the default exchange")
        if c.destination_type == QUEUE:
            if (c.vhost, c.destination) not in self.queues:
                return _err(NOT_FOUND, f"no queue '{c.destination}' in vhost '{c.vhost}'")
        elif c.destination_type == EXCHANGE:
            if (c.vhost, c.destination) not in self.exchanges:
                return _err(NOT_FOUND, f"no exchange '{c.destination}' in vhost '{c.vhost}'")
        else:
            return _err(PRECONDITION_FAILED, f"unknown destination type '{c.destination_type}'")
        if (c.vhost, c.source) not in self.exchanges:
            return _err(NOT_FOUND, f"no exchange '{c.source}' in vhost '{c.vhost}'")
        return None

    def _bind(self, c: Bind) -> Result:
        problem = self._bind_check(c)
        if problem is not None:
            return problem
        key = _binding_key(c.vhost, c.source, c.destination_type, c.destination, c.routing_key, c.arguments)
        if key in self.bindings:
            return Result(EXISTED)
        self.bindings[key] = BindingRecord(c.vhost, c.source, c.destination_type, c.destination, c.routing_key,
                                           dict(c.arguments))
        self._by_source.setdefault((c.vhost, c.source), {})[key] = None
        self._by_destination.setdefault((c.vhost, c.destination_type, c.destination), {})[key] = None
        return Result(CREATED)

    def _unbind(self, c: Unbind) -> Result:
        problem = self._bind_check(c)
        if problem is not None:
            return problem
        key = _binding_key(c.vhost, c.source, c.destination_type, c.destination, c.routing_key, c.arguments)
        if key not in self.bindings:
            return Result(ABSENT)
        self._remove_binding(key)
        gone = self._auto_delete([(c.vhost, c.source)])
        return Result(DELETED, exchanges_deleted=gone, bindings_deleted=1)

    def _declare_queue(self, c: DeclareQueue) -> Result:
        if c.vhost not in self.vhosts:
            return _no_vhost(c.vhost)
        if c.type not in QUEUE_TYPES:
            return _err(PRECONDITION_FAILED, f"invalid arg 'x-queue-type' for queue '{c.name}' in vhost "
                                             f"'{c.vhost}': unknown queue type '{c.type}'")
        if len(c.member_nodes) > MEMBER_NODES_MAX:
            return _err(PRECONDITION_FAILED, f"queue '{c.name}' in vhost '{c.vhost}': more than "
                                             f"{MEMBER_NODES_MAX} member nodes")
        old = self.queues.get((c.vhost, c.name))
        if old is None:
            rec = QueueRecord(c.vhost, c.name, c.type, bool(c.durable), bool(c.auto_delete), c.exclusive_owner,
                              dict(c.arguments), c.leader_node, tuple(c.member_nodes), c.journal_id,
                              c.home_incarnation)
            self.queues[(c.vhost, c.name)] = rec
            return Result(CREATED, queue=rec)
        if old.exclusive_owner is not None and old.exclusive_owner != c.exclusive_owner:
            return _locked(c.name, c.vhost)

        def ineq(arg: str, got: str, cur: str) -> Result:
            return _err(PRECONDITION_FAILED, f"inequivalent arg '{arg}' for queue '{c.name}' in vhost "
                                             f"'{c.vhost}': received '{got}' but current is '{cur}'")
        if old.durable != bool(c.durable):
            return ineq("durable", _bool(c.durable), _bool(old.durable))
        if (old.exclusive_owner is not None) != (c.exclusive_owner is not None):
            return _locked(c.name, c.vhost)
        if old.auto_delete != bool(c.auto_delete):
            return ineq("auto_delete", _bool(c.auto_delete), _bool(old.auto_delete))
        text = args_difference("queue", c.name, c.vhost, old.arguments, c.arguments, QUEUE_ARGS_COMPARED)
        if text is not None:
            return _err(PRECONDITION_FAILED, text)
        if old.type != c.type:
            return ineq("x-queue-type", c.type, old.type)
        return Result(EXISTED, queue=old)

    def _delete_queue(self, c: DeleteQueue) -> Result:
        if (c.vhost, c.name) not in self.queues:
            return Result(ABSENT)
        del self.queues[(c.vhost, c.name)]
        n, gone = self._remove_bindings_to(c.vhost, QUEUE, c.name)
        return Result(DELETED, exchanges_deleted=gone, bindings_deleted=n)

    def _set_queue_nodes(self, c: SetQueueNodes) -> Result:
        old = self.queues.get((c.vhost, c.name))
        if old is None:
            return _err(NOT_FOUND, f"no queue '{c.name}' in vhost '{c.vhost}'")
        if c.expect_leader and old.leader_node != c.expect_leader:
            return _err(PRECONDITION_FAILED, f"queue '{c.name}' in vhost '{c.vhost}' is led by "
                                             f"{old.leader_node}, not {c.expect_leader}")
        if len(c.member_nodes) > MEMBER_NODES_MAX:
            return _err(PRECONDITION_FAILED, f"queue '{c.name}' in vhost '{c.vhost}': more than "
                                             f"{MEMBER_NODES_MAX} member nodes")
        if c.promotion and c.leader_node not in old.member_nodes:
            # its mirror was taken off the queue after it proposed this (its node no longer held a
            # mirror by then): a queue made afresh there would lose what the mirror held
            return _err(PRECONDITION_FAILED, f"queue '{c.name}' in vhost '{c.vhost}' has no mirror on "
                                             f"{c.leader_node} to promote")
        fenced = old.fenced_nodes
        if c.promotion and c.leader_node in fenced:
            if c.synchronised_only:
                return _err(PRECONDITION_FAILED, f"queue '{c.name}' in vhost '{c.vhost}': the mirror on "
                                                 f"{c.leader_node} is not synchronised (its leader went on "
                                                 f"without it)")
            fenced = tuple(n for n in fenced if n != c.leader_node)
        rec = msgspec.structs.replace(old, leader_node=c.leader_node, member_nodes=tuple(c.member_nodes),
                                      fenced_nodes=fenced)
        self.queues[(c.vhost, c.name)] = rec
        return Result(EXISTED if rec == old else UPDATED, queue=rec)

    def _check_queue_leader(self, c: CheckQueueLeader) -> Result:
        rec = self.queues.get((c.vhost, c.name))
        if rec is None:
            return _err(NOT_FOUND, f"no queue '{c.name}' in vhost '{c.vhost}'")
        if rec.leader_node != c.leader_node:
            return _err(PRECONDITION_FAILED, f"queue '{c.name}' in vhost '{c.vhost}' is led by "
                                             f"{rec.leader_node}, not {c.leader_node}")
        if not c.fence and not c.unfence:
            return Result(EXISTED, queue=rec)
        fenced = [n for n in rec.fenced_nodes if n not in c.unfence]
        fenced += [n for n in c.fence if n not in fenced and n != rec.leader_node]
        new = msgspec.structs.replace(rec, fenced_nodes=tuple(sorted(fenced)))
        self.queues[(c.vhost, c.name)] = new
        return Result(EXISTED if new == rec else UPDATED, queue=new)

    def _set_policy(self, c: SetPolicy | SetOperatorPolicy) -> Result:
        if c.vhost not in self.vhosts:
            return _no_vhost(c.vhost)
        if c.apply_to not in POLICY_APPLY_TO:
            return _err(PRECONDITION_FAILED, f"'{c.apply_to}' is not a valid apply-to value; expected one of "
                                             + ", ".join(POLICY_APPLY_TO))
        problem = _regex_problem(c.pattern)
        if problem is not None:
            return _err(PRECONDITION_FAILED, f"pattern '{c.pattern}' is not a valid regular expression: {problem}")
        if not c.definition:
            return _err(PRECONDITION_FAILED, f"policy '{c.name}' in vhost '{c.vhost}': the definition is empty")
        rec = PolicyRecord(c.vhost, c.name, c.pattern, c.apply_to, int(c.priority), dict(c.definition))
        table = self.operator_policies if type(c) is SetOperatorPolicy else self.policies
        return _store(table, (c.vhost, c.name), rec)

    def _clear_policy(self, c: ClearPolicy) -> Result:
        return _discard(self.policies, (c.vhost, c.name))

    def _clear_operator_policy(self, c: ClearOperatorPolicy) -> Result:
        return _discard(self.operator_policies, (c.vhost, c.name))

    def _set_parameter(self, c: SetParameter) -> Result:
        if c.vhost not in self.vhosts:
            return _no_vhost(c.vhost)
        rec = ParameterRecord(c.component, c.vhost, c.name, c.value)
        key = (c.component, c.vhost, c.name)
        return _store(self.parameters, key, rec)

    def _clear_parameter(self, c: ClearParameter) -> Result:
        return _discard(self.parameters, (c.component, c.vhost, c.name))

    def _set_global_parameter(self, c: SetGlobalParameter) -> Result:
        return _store(self.global_parameters, c.name, c.value)

    def _clear_global_parameter(self, c: ClearGlobalParameter) -> Result:
        return _discard(self.global_parameters, c.name)

    # -- bindings and auto-delete -----------------------------------------------------------

    def _remove_binding(self, key: BindingKey) -> None:
        b = self.bindings.pop(key)
        src = self._by_source[(b.vhost, b.source)]
        del src[key]
        if not src:
            del self._by_source[(b.vhost, b.source)]
        dst = self._by_destination[(b.vhost, b.destination_type, b.destination)]
        del dst[key]
        if not dst:
            del self._by_destination[(b.vhost, b.destination_type, b.destination)]

    def _remove_bindings_to(self, vhost: str, dtype: str, dest: str) -> tuple[int, tuple[str, ...]]:
        keys = sorted(self._by_destination.get((vhost, dtype, dest), ()))
        for key in keys:
            self._remove_binding(key)
        gone = self._auto_delete(sorted({(k[0], k[1]) for k in keys}))
        return len(keys), gone

    def _remove_exchange(self, vhost: str, name: str) -> tuple[int, tuple[str, ...]]:
        """Delete an exchange with the bindings from and to it; cascade auto-deletes."""
        del self.exchanges[(vhost, name)]
        keys = sorted(self._by_source.get((vhost, name), ()))
        for key in keys:
            self._remove_binding(key)
        n, gone = self._remove_bindings_to(vhost, EXCHANGE, name)
        return n + len(keys), gone

    def _auto_delete(self, sources: list[tuple[str, str]]) -> tuple[str, ...]:
        """Delete the auto-delete exchanges among `sources` that have no binding left (as
        RabbitMQ does when the last binding from such an exchange goes), and so on."""
        gone: list[str] = []
        work = list(sources)
        while work:
            vhost, name = work.pop(0)
            x = self.exchanges.get((vhost, name))
            if x is None or not x.auto_delete or self._by_source.get((vhost, name)):
                continue
            del self.exchanges[(vhost, name)]
            gone.append(name)
            keys = sorted(self._by_destination.get((vhost, EXCHANGE, name), ()))
            for key in keys:
                self._remove_binding(key)
            work.extend(sorted({(k[0], k[1]) for k in keys}))
        return tuple(gone)

    # -- snapshots ----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state, canonical: equal catalogues give equal bytes."""
        state = _State(
            format=SNAPSHOT_FORMAT,
            vhosts=[v for _, v in sorted(self.vhosts.items())],
            users=[u for _, u in sorted(self.users.items())],
            permissions=[p for _, p in sorted(self.permissions.items())],
            topic_permissions=[p for _, p in sorted(self.topic_permissions.items())],
            exchanges=[x for _, x in sorted(self.exchanges.items())],
            bindings=[b for _, b in sorted(self.bindings.items())],
            queues=[q for _, q in sorted(self.queues.items())],
            policies=[p for _, p in sorted(self.policies.items())],
            parameters=[p for _, p in sorted(self.parameters.items())],
            global_parameters=sorted(self.global_parameters.items()),
            operator_policies=[p for _, p in sorted(self.operator_policies.items())],
        )
        return _encoder.encode(state)

    def restore(self, data: bytes) -> None:
        """Replace the whole state by a snapshot's."""
        try:
            state = _state_decoder.decode(data)
        except msgspec.DecodeError as e:
            raise CatalogueError(f"not a catalogue snapshot: {e}") from e
        if state.format != SNAPSHOT_FORMAT:
            raise CatalogueError(f"catalogue snapshot format {state.format} is not {SNAPSHOT_FORMAT}")
        applied = self.applied_count
        self.__init__()
        self.applied_count = applied
        self.vhosts = {v.name: v for v in state.vhosts}
        self.users = {u.name: u for u in state.users}
        self.permissions = {(p.user, p.vhost): p for p in state.permissions}
        self.topic_permissions = {(p.user, p.vhost, p.exchange): p for p in state.topic_permissions}
        self.exchanges = {(x.vhost, x.name): x for x in state.exchanges}
        self.queues = {(q.vhost, q.name): q for q in state.queues}
        self.policies = {(p.vhost, p.name): p for p in state.policies}
        self.operator_policies = {(p.vhost, p.name): p for p in state.operator_policies}
        self.parameters = {(p.component, p.vhost, p.name): p for p in state.parameters}
        self.global_parameters = dict(state.global_parameters)
        for b in state.bindings:
            key = _binding_key(b.vhost, b.source, b.destination_type, b.destination, b.routing_key, b.arguments)
            self.bindings[key] = b
            self._by_source.setdefault((b.vhost, b.source), {})[key] = None
            self._by_destination.setdefault((b.vhost, b.destination_type, b.destination), {})[key] = None

    @classmethod
    def from_snapshot(cls, data: bytes) -> Catalogue:
        c = cls()
        c.restore(data)
        return c

    # -- definitions --------------------------------------------------------------------------

    def to_definitions(self, durable_only: bool = False, internal: bool = False,
                       product_version: str = "") -> dict[str, Any]:
        """RabbitMQ's definitions export document (as `GET /api/definitions` gives it).

        Exclusive queues, the default and `amq.*` exchanges and bindings from the default
        exchange are left out, as RabbitMQ leaves them out. `durable_only` keeps only durable
        exchanges and queues and the bindings between durable ends; `internal` adds the
        hutch-only fields a node needs to restore itself (`hutch_id`, the journal id)."""
        doc: dict[str, Any] = {
            "rabbit_version": "3.10.8",
            "rabbitmq_version": "3.10.8",
            "product_name": "hutch",
            "product_version": product_version,
            "users": [{"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": u.hashing_algorithm,
                       "tags": list(u.tags), "limits": dict(u.limits)} for _, u in sorted(self.users.items())],
            "vhosts": [{"name": v.name, "limits": [[k, x] for k, x in self.vhost_limits(v.name).items()],
                        "metadata": {"description": v.description, "tags": list(v.tags)}}
                       for _, v in sorted(self.vhosts.items())],
            "permissions": [{"user": p.user, "vhost": p.vhost, "configure": p.configure, "write": p.write,
                             "read": p.read} for _, p in sorted(self.permissions.items())],
            "topic_permissions": [{"user": p.user, "vhost": p.vhost, "exchange": p.exchange, "write": p.write,
                                   "read": p.read} for _, p in sorted(self.topic_permissions.items())],
            "parameters": [{"value": _jsonable(p.value), "vhost": p.vhost, "component": p.component,
                            "name": p.name} for _, p in sorted(self.parameters.items())],
            "global_parameters": [{"name": k, "value": _jsonable(v)}
                                  for k, v in sorted(self.global_parameters.items())],
            "policies": [{"vhost": p.vhost, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
                          "definition": _jsonable(p.definition), "priority": p.priority}
                         for _, p in sorted(self.policies.items())],
            "operator_policies": [{"vhost": p.vhost, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
                                   "definition": _jsonable(p.definition), "priority": p.priority}
                                  for _, p in sorted(self.operator_policies.items())],
            "queues": [],
            "exchanges": [],
            "bindings": [],
        }
        kept_queues: set[tuple[str, str]] = set()
        for key, q in sorted(self.queues.items()):
            if q.exclusive_owner is not None or (durable_only and not q.durable):
                continue
            kept_queues.add(key)
            rec = {"name": q.name, "vhost": q.vhost, "durable": q.durable, "auto_delete": q.auto_delete,
                   "arguments": _jsonable(q.arguments)}
            if internal:
                rec["hutch_id"] = q.journal_id
            doc["queues"].append(rec)
        kept_exchanges: set[tuple[str, str]] = set()
        for key, x in sorted(self.exchanges.items()):
            if x.name == "" or x.name.startswith("amq.") or (durable_only and not x.durable):
                continue
            kept_exchanges.add(key)
            doc["exchanges"].append({"name": x.name, "vhost": x.vhost, "type": x.type, "durable": x.durable,
                                     "auto_delete": x.auto_delete, "internal": x.internal,
                                     "arguments": _jsonable(x.arguments)})
        for _, b in sorted(self.bindings.items()):
            if durable_only:
                src = self.exchanges.get((b.vhost, b.source))
                if src is None or not src.durable:
                    continue
                if b.destination_type == QUEUE and (b.vhost, b.destination) not in kept_queues:
                    continue
                if b.destination_type == EXCHANGE:
                    d = self.exchanges.get((b.vhost, b.destination))
                    if d is None or not d.durable:
                        continue
            elif b.destination_type == QUEUE and (b.vhost, b.destination) not in kept_queues:
                continue  # to an exclusive queue
            doc["bindings"].append({"source": b.source, "vhost": b.vhost, "destination": b.destination,
                                    "destination_type": b.destination_type, "routing_key": b.routing_key,
                                    "arguments": _jsonable(b.arguments)})
        return doc


def _locked(name: str, vhost: str) -> Result:
    return _err(RESOURCE_LOCKED, f"cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost}'. "
                                 "It could be originally declared on another connection or the exclusive property "
                                 "value does not match that of the original declaration.")


def _regex_problem(pattern: str) -> str | None:
    try:
        re.compile(pattern)
    except re.error as e:
        return str(e)
    return None


def _policy_applies(p: PolicyRecord, kind: str, queue_type: str) -> bool:
    if p.apply_to == "all":
        return True
    if kind == EXCHANGE:
        return p.apply_to == "exchanges"
    if p.apply_to == "queues":
        return True
    return p.apply_to == f"{queue_type}_queues"


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


_HANDLERS = {
    AddVhost: Catalogue._add_vhost,
    DeleteVhost: Catalogue._delete_vhost,
    PutUser: Catalogue._put_user,
    DeleteUser: Catalogue._delete_user,
    SetPermissions: Catalogue._set_permissions,
    ClearPermissions: Catalogue._clear_permissions,
    DeclareExchange: Catalogue._declare_exchange,
    DeleteExchange: Catalogue._delete_exchange,
    Bind: Catalogue._bind,
    Unbind: Catalogue._unbind,
    DeclareQueue: Catalogue._declare_queue,
    DeleteQueue: Catalogue._delete_queue,
    SetQueueNodes: Catalogue._set_queue_nodes,
    CheckQueueLeader: Catalogue._check_queue_leader,
    Barrier: lambda _self, _c: Result(EXISTED),
    SetPolicy: Catalogue._set_policy,
    ClearPolicy: Catalogue._clear_policy,
    SetOperatorPolicy: Catalogue._set_policy,
    ClearOperatorPolicy: Catalogue._clear_operator_policy,
    SetParameter: Catalogue._set_parameter,
    ClearParameter: Catalogue._clear_parameter,
    SetGlobalParameter: Catalogue._set_global_parameter,
    ClearGlobalParameter: Catalogue._clear_global_parameter,
    SetTopicPermissions: Catalogue._set_topic_permissions,
    ClearTopicPermissions: Catalogue._clear_topic_permissions,
    SetUserLimits: Catalogue._set_user_limits,
    ClearUserLimits: Catalogue._clear_user_limits,
}


# ---- importing a definitions document ----------------------------------------------------------


def _field(rec: Any, key: str, kind: str, types: type | tuple, default: Any = ...) -> Any:
    if not isinstance(rec, dict):
        raise CatalogueError(f"{kind} definition must be an object, got {rec!r}")
    if key not in rec:
        if default is not ...:
            return default
        raise CatalogueError(f"{kind} definition {rec!r} lacks '{key}'")
    v = rec[key]
    if not isinstance(v, types):
        raise CatalogueError(f"{kind} definition field '{key}' has the wrong type: {v!r}")
    return v


def from_definitions(doc: Any, *, home_node: str = "", first_journal_id: int = 1,
                     hash_password: Any = None) -> list[Command]:
    """The commands that import a RabbitMQ definitions document, in dependency order (vhosts,
    users, permissions, policies, parameters, exchanges, queues, bindings). The whole document
    is checked first: it raises `CatalogueError` before returning anything.

    Queues get `home_node` as their leader and journal ids from `hutch_id` when the document
    has them (a node's own export), else `first_journal_id`, `first_journal_id + 1`, ... Users
    given by plain `password` need `hash_password(str) -> str` (hashing salts at random, so it
    happens here, outside the state machine)."""
    if not isinstance(doc, dict):
        raise CatalogueError("definitions must be a JSON object")
    for key in ("users", "vhosts", "permissions", "queues", "exchanges", "bindings", "policies", "parameters",
                "global_parameters", "operator_policies"):
        if key in doc and not isinstance(doc[key], list):
            raise CatalogueError(f"'{key}' must be a list")
    out: list[Command] = []
    for v in doc.get("vhosts", []):
        meta = _field(v, "metadata", "vhost", dict, {})
        out.append(AddVhost(_field(v, "name", "vhost", str), str(meta.get("description", "") or ""),
                            tuple(str(t) for t in (meta.get("tags") or ()))))
        vlimits = _limits(v, "vhost")
        if vlimits:
            out.append(SetParameter(VHOST_LIMITS, v["name"], "limits", vlimits))
    for u in doc.get("users", []):
        name = _field(u, "name", "user", str)
        alg = _field(u, "hashing_algorithm", "user", str, HASHING_SHA256)
        if "password_hash" in u:
            ph = _field(u, "password_hash", "user", str)
        elif "password" in u and hash_password is not None:
            ph = hash_password(_field(u, "password", "user", str))
            alg = HASHING_SHA256
        else:
            raise CatalogueError(f"user '{name}' has no password_hash")
        tags = u.get("tags", [])
        if isinstance(tags, str):
            tags = [t for t in tags.split(",") if t]
        out.append(PutUser(name, ph, tuple(str(t) for t in tags), alg, _limits(u, "user") or None))
    for p in doc.get("permissions", []):
        out.append(SetPermissions(*(_field(p, k, "permission", str) for k in ("user", "vhost", "configure",
                                                                               "write", "read"))))
    if "topic_permissions" in doc and not isinstance(doc["topic_permissions"], list):
        raise CatalogueError("'topic_permissions' must be a list")
    for p in doc.get("topic_permissions", []):
        out.append(SetTopicPermissions(*(_field(p, k, "topic permission", str)
                                         for k in ("user", "vhost", "exchange", "write", "read"))))
    for p in doc.get("policies", []):
        out.append(SetPolicy(_field(p, "vhost", "policy", str), _field(p, "name", "policy", str),
                             _field(p, "pattern", "policy", str), _field(p, "apply-to", "policy", str, "all"),
                             int(_field(p, "priority", "policy", int, 0)), _field(p, "definition", "policy", dict)))
    for p in doc.get("operator_policies", []):
        out.append(SetOperatorPolicy(
            _field(p, "vhost", "operator policy", str), _field(p, "name", "operator policy", str),
            _field(p, "pattern", "operator policy", str), _field(p, "apply-to", "operator policy", str, "all"),
            int(_field(p, "priority", "operator policy", int, 0)), _field(p, "definition", "operator policy", dict)))
    for p in doc.get("parameters", []):
        out.append(SetParameter(_field(p, "component", "parameter", str), _field(p, "vhost", "parameter", str),
                                _field(p, "name", "parameter", str), p.get("value")))
    for p in doc.get("global_parameters", []):
        out.append(SetGlobalParameter(_field(p, "name", "global parameter", str), p.get("value")))
    for x in doc.get("exchanges", []):
        out.append(DeclareExchange(_field(x, "vhost", "exchange", str), _field(x, "name", "exchange", str),
                                   _field(x, "type", "exchange", str), bool(x.get("durable", True)),
                                   bool(x.get("auto_delete", False)), bool(x.get("internal", False)),
                                   _field(x, "arguments", "exchange", dict, {})))
    journal_id = first_journal_id
    for q in doc.get("queues", []):
        args = _field(q, "arguments", "queue", dict, {})
        qtype = _text(args.get("x-queue-type", CLASSIC))
        if "hutch_id" in q:
            jid = int(_field(q, "hutch_id", "queue", int))
        else:
            jid, journal_id = journal_id, journal_id + 1
        out.append(DeclareQueue(_field(q, "vhost", "queue", str), _field(q, "name", "queue", str), qtype,
                                bool(q.get("durable", True)), bool(q.get("auto_delete", False)), None, args,
                                home_node, (), jid))
    for b in doc.get("bindings", []):
        dtype = _field(b, "destination_type", "binding", str)
        if dtype not in (QUEUE, EXCHANGE):
            raise CatalogueError(f"binding destination_type must be 'queue' or 'exchange', got '{dtype}'")
        out.append(Bind(_field(b, "vhost", "binding", str), _field(b, "source", "binding", str), dtype,
                        _field(b, "destination", "binding", str), _field(b, "routing_key", "binding", str, ""),
                        _field(b, "arguments", "binding", dict, {})))
    return out


def _limits(rec: dict, kind: str) -> dict[str, int]:
    """The `limits` of a user or vhost definition: an object of integers ([] or absent: none)."""
    raw = rec.get("limits") or {}
    if isinstance(raw, list) and all(isinstance(p, list) and len(p) == 2 for p in raw):
        raw = dict(raw)  # rabbitmqctl's form: [name, value] pairs
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                            for k, v in raw.items()):
        raise CatalogueError(f"{kind} definition field 'limits' must be an object of integers: {raw!r}")
    return dict(raw)


_MISSING = object()


def _store(table: dict, key: Any, rec: Any) -> Result:
    """Put a record; say whether it is new, unchanged or changed."""
    old = table.get(key, _MISSING)
    table[key] = rec
    if old is _MISSING:
        return Result(CREATED)
    return Result(EXISTED if old == rec else UPDATED)


def _discard(table: dict, key: Any) -> Result:
    """Remove a record; say whether there was one."""
    if table.pop(key, _MISSING) is _MISSING:
        return Result(ABSENT)
    return Result(DELETED)
