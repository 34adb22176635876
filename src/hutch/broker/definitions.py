"""Definitions: RabbitMQ's definitions document, planned into catalogue commands and made from the catalogue.

The format is RabbitMQ's definitions export (`GET /api/definitions`, `rabbitmqctl
export_definitions`; RabbitMQ's "Schema Definition Export and Import" guide), so files move
between RabbitMQ and hutch in both directions.

Importing is done in two steps. `plan(doc, ...)` reads the whole document and turns every item
into the catalogue commands that create it, or into a *refusal* that names the item and says
why hutch cannot honour it ("exchange 'delayed' in vhost 'shop': exchange type
'x-delayed-message' is not supported"). Each kind of item (a top-level key: users, vhosts,
queues, ...) is one `Kind` in `KINDS`, and each vhost-scoped runtime parameter component one
entry in `COMPONENTS`; a kind or component that hutch does not keep refuses its items by name.
Adding a kind is adding an entry. A malformed item (a field missing or of the wrong type) is a
problem too, listed with the others. The caller decides: any problem refuses the whole import,
and nothing is changed; with `skip_unsupported` only malformed items refuse it, and what hutch
cannot honour is left out and reported. Items that depend on a skipped one (bindings to a
skipped queue) are skipped with it, by name.

`export(catalogue, ...)` writes the catalogue back as RabbitMQ's document, in the key order
RabbitMQ's management plugin uses, with vhosts in `rabbitmqctl`'s form (name, limits,
metadata) so that their descriptions, tags and default queue type travel too.

What it must never do: change anything (planning is pure; the commands are applied by the
caller), drop an item without naming it, or report an import as complete when something in
the document was left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hutch.amqp.spec import AMQPError
from hutch.broker import arguments as qargs
from hutch.cluster import catalogue as cat
from hutch.quorum import fifo
from hutch.streams.config import StreamArgumentError, stream_config

RABBITMQ_VERSION = "3.10.8"
HASHING_SHA256 = cat.HASHING_SHA256
EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
QUEUE_TYPES = ("classic", "quorum", "stream")
VHOST_DEFAULT_QUEUE_TYPES = ("classic", "quorum", "stream")
# a document's own description of itself: read by nobody, never refused
META_KEYS = ("rabbit_version", "rabbitmq_version", "product_name", "product_version", "explanation")
# a hutch cluster's own bookkeeping (member addresses, "initialised"): not the operator's data,
# neither exported for users nor taken from a document
INTERNAL_GLOBAL_PREFIX = "hutch_"
# the keys a per-vhost document (`/api/definitions/{vhost}`) carries
VHOST_SCOPED_KEYS = ("parameters", "policies", "queues", "exchanges", "bindings")


class DefinitionsError(ValueError):
    """A document that is not a definitions document at all (not an object, a key not a list)."""


class Unsupported(Exception):
    """An item hutch cannot honour; the text says why (the item is named by the caller)."""


class Malformed(Exception):
    """An item that is not a valid definition (a field missing or of the wrong type)."""


@dataclass
class Context:
    """What planning needs from outside: how to hash a plain password (random salt), how to
    check a policy's definition (the control layer's rules), and which queues and exchanges
    were skipped so far (items that depend on them are skipped too)."""

    hash_password: Callable[[str], str] | None = None
    check_policy: Callable[[str, str, dict], dict] | None = None  # -> normalised record, ValueError if bad
    check_operator_policy: Callable[[str, str, dict], dict] | None = None
    skipped_users: set[str] = field(default_factory=set)
    skipped_queues: set[tuple[str, str]] = field(default_factory=set)
    skipped_exchanges: set[tuple[str, str]] = field(default_factory=set)
    parameter_vhost_limits: set[str] = field(default_factory=set)  # vhosts with a vhost-limits parameter
    left_out: list[str] = field(default_factory=list)  # parts of the current item not imported

    def leave_out(self, why: str) -> None:
        """A part of an item that hutch cannot honour (a user's limits): the rest of the item is
        imported, and the part is reported as an item hutch cannot honour."""
        self.left_out.append(why)


@dataclass
class Plan:
    """The commands that import a document, and what cannot be imported."""

    commands: list[cat.Command] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # kind (document key) -> items planned
    unsupported: list[str] = field(default_factory=list)  # "<item>: <why>", in document order
    malformed: list[str] = field(default_factory=list)
    # bindings whose ends exist neither in the document nor on the node (found when the plan is
    # tried on the node's catalogue): skipped, as RabbitMQ skips them, and reported
    dangling: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return self.malformed + self.unsupported


ItemPlanner = Callable[[dict, Context], list[cat.Command]]


@dataclass(frozen=True)
class Kind:
    """One top-level key of the document: how to name one of its items, and how to plan it
    (None: hutch keeps no such thing, and every item is refused with `why_not`)."""

    key: str
    noun: str  # for log lines: "Importing 3 <noun>..."
    describe: Callable[[dict], str]
    planner: ItemPlanner | None
    why_not: str = ""


# ---- reading fields --------------------------------------------------------------------------


def _get(rec: dict, key: str, types: type | tuple, default: Any = ...) -> Any:
    if key not in rec or rec[key] is None:
        if default is not ...:
            return default
        raise Malformed(f"'{key}' is missing")
    v = rec[key]
    if not isinstance(v, types) or (types is int and isinstance(v, bool)):
        raise Malformed(f"'{key}' has the wrong type: {v!r}")
    return v


def _name(rec: Any, key: str = "name") -> str:
    v = rec.get(key) if isinstance(rec, dict) else None
    return v if isinstance(v, str) else "?"


def _in_vhost(rec: Any) -> str:
    return f" in vhost '{_name(rec, 'vhost')}'"


def _tags(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return tuple(t.strip() for t in raw.split(",") if t.strip())
    if isinstance(raw, list) and all(isinstance(t, str) for t in raw):
        return tuple(raw)
    raise Malformed(f"tags must be a list of strings or a comma-separated string, got {raw!r}")


def _pairs(v: Any) -> Any:
    """rabbitmqctl writes some maps as lists of [key, value] pairs; the HTTP API as objects."""
    if isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in v):
        return {p[0]: p[1] for p in v}
    return v


def _limit_names(limits: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(limits.items()))


# ---- planners, one per kind ------------------------------------------------------------------

def _checked_limits(limits: dict, allowed: tuple[str, ...], kind: str, ctx: Context) -> dict[str, int]:
    """The limits hutch enforces, sorted; a limit it does not know is left out of the item and
    named (the rest of the user or vhost is imported)."""
    out: dict[str, int] = {}
    for k, v in sorted(limits.items()):
        if not isinstance(v, int) or isinstance(v, bool):
            raise Malformed(f"{kind} limit '{k}' must be an integer, got {v!r}")
        if k not in allowed:
            ctx.leave_out(f"{kind} limit '{k}' is not supported (only {', '.join(allowed)})")
            continue
        out[k] = v
    return out


def _user_limits(user: str, limits: dict, ctx: Context) -> list[cat.Command]:
    kept = _checked_limits(limits, ("max-channels", "max-connections"), "user", ctx)
    return [cat.SetUserLimits(user, kept)] if kept else []


def _vhost_limits(vhost: str, limits: dict, ctx: Context) -> list[cat.Command]:
    """As RabbitMQ keeps them: the runtime parameter vhost-limits/limits."""
    kept = _checked_limits(limits, ("max-connections", "max-queues"), "vhost", ctx)
    return [cat.SetParameter(cat.VHOST_LIMITS, vhost, "limits", kept)] if kept else []


# Planners for limits: a user's ({"max-connections": 10} inside a user) and a vhost's (inside a
# vhost, or the vhost-limits parameter). None: hutch keeps no such limits, and a document that
# sets them is refused by name.
USER_LIMITS: Callable[[str, dict, Context], list[cat.Command]] | None = _user_limits
VHOST_LIMITS: Callable[[str, dict, Context], list[cat.Command]] | None = _vhost_limits


def _plan_vhost(v: dict, ctx: Context) -> list[cat.Command]:
    name = _get(v, "name", str)
    meta = _get(v, "metadata", dict, {})
    # 3.11+ HTTP exports put the metadata at the top level; rabbitmqctl's inside "metadata"
    description = meta.get("description", v.get("description", "")) or ""
    if not isinstance(description, str):
        raise Malformed(f"description must be a string, got {description!r}")
    tags = _tags(meta.get("tags", v.get("tags")))
    dqt = meta.get("default_queue_type", v.get("default_queue_type")) or ""
    if dqt == "undefined":
        dqt = ""
    if not isinstance(dqt, str):
        raise Malformed(f"default_queue_type must be a string, got {dqt!r}")
    if dqt and dqt not in VHOST_DEFAULT_QUEUE_TYPES:
        ctx.leave_out(f"default queue type '{dqt}' is not supported")
        dqt = ""
    out: list[cat.Command] = [cat.AddVhost(name, description, tags, default_queue_type=dqt)]
    limits = _pairs(v.get("limits") or {})
    if not isinstance(limits, dict):
        raise Malformed(f"limits must be an object or a list of pairs, got {limits!r}")
    if limits and name not in ctx.parameter_vhost_limits:  # else the parameter carries the same limits
        if VHOST_LIMITS is None:
            ctx.leave_out(f"vhost limits are not supported ({_limit_names(limits)})")
        else:
            out += VHOST_LIMITS(name, limits, ctx)
    return out


def _plan_user(u: dict, ctx: Context) -> list[cat.Command]:
    name = _get(u, "name", str)
    alg = _get(u, "hashing_algorithm", str, HASHING_SHA256)
    if "password_hash" in u:
        ph = _get(u, "password_hash", str)
        if alg != HASHING_SHA256:
            ctx.skipped_users.add(name)
            raise Unsupported(f"password hashing algorithm '{alg}' is not supported (hutch verifies "
                              f"{HASHING_SHA256} hashes)")
    elif "password" in u and ctx.hash_password is not None:
        ph, alg = ctx.hash_password(_get(u, "password", str)), HASHING_SHA256
    else:
        raise Malformed("it has no password_hash")
    out: list[cat.Command] = [cat.PutUser(name, ph, _tags(u.get("tags")), alg)]
    limits = _pairs(u.get("limits") or {})
    if not isinstance(limits, dict):
        raise Malformed(f"limits must be an object, got {limits!r}")
    if limits:
        if USER_LIMITS is None:
            ctx.leave_out(f"user limits are not supported ({_limit_names(limits)})")
        else:
            out += USER_LIMITS(name, limits, ctx)
    return out


def _plan_permission(p: dict, ctx: Context) -> list[cat.Command]:
    if _get(p, "user", str) in ctx.skipped_users:
        raise Unsupported(f"its user '{p['user']}' is not imported")
    return [cat.SetPermissions(*(_get(p, k, str) for k in ("user", "vhost", "configure", "write", "read")))]


def _policy_fields(vhost: str, name: str, p: dict, check: Callable | None) -> dict:
    body = {"pattern": _get(p, "pattern", str), "definition": _pairs(_get(p, "definition", (dict, list))),
            "apply-to": _get(p, "apply-to", str, "all"), "priority": _get(p, "priority", int, 0)}
    if not isinstance(body["definition"], dict):
        raise Malformed(f"'definition' must be an object, got {body['definition']!r}")
    if check is None:
        return body
    try:
        return check(vhost, name, body)
    except ValueError as e:
        raise Unsupported(str(e).strip().replace("\n\n", ": ").replace("\n", " ")) from None


def _plan_policy(p: dict, ctx: Context) -> list[cat.Command]:
    vhost, name = _get(p, "vhost", str), _get(p, "name", str)
    r = _policy_fields(vhost, name, p, ctx.check_policy)
    return [cat.SetPolicy(vhost, name, r["pattern"], r.get("apply-to", "all"), int(r.get("priority", 0)),
                          r["definition"])]


def _plan_operator_policy(vhost: str, name: str, p: dict, ctx: Context) -> list[cat.Command]:
    command = getattr(cat, "SetOperatorPolicy", None)
    if command is None:
        raise Unsupported("operator policies are not supported")
    r = _policy_fields(vhost, name, p, ctx.check_operator_policy)
    return [command(vhost, name, r["pattern"], r.get("apply-to", "all"), int(r.get("priority", 0)),
                    r["definition"])]


def _plan_operator_policy_item(p: dict, ctx: Context) -> list[cat.Command]:
    """A top-level "operator_policies" item (the shape policies have); RabbitMQ itself writes
    operator policies as runtime parameters of the `operator_policy` component."""
    return _plan_operator_policy(_get(p, "vhost", str), _get(p, "name", str), p, ctx)


def _component_operator_policy(vhost: str, name: str, value: Any, ctx: Context) -> list[cat.Command]:
    if not isinstance(value, dict):
        raise Malformed(f"the value must be an object, got {value!r}")
    return _plan_operator_policy(vhost, name, value, ctx)


def _component_vhost_limits(vhost: str, name: str, value: Any, ctx: Context) -> list[cat.Command]:
    limits = _pairs(value)
    if not isinstance(limits, dict):
        raise Malformed(f"the value must be an object, got {value!r}")
    if VHOST_LIMITS is None:
        raise Unsupported(f"vhost limits are not supported ({_limit_names(limits)})")
    return VHOST_LIMITS(vhost, limits, ctx)


# Runtime parameter components hutch understands: component -> planner(vhost, name, value, ctx).
COMPONENTS: dict[str, Callable[[str, str, Any, Context], list[cat.Command]]] = {
    "operator_policy": _component_operator_policy,
    "vhost-limits": _component_vhost_limits,
}


def _plan_parameter(p: dict, ctx: Context) -> list[cat.Command]:
    component, vhost, name = _get(p, "component", str), _get(p, "vhost", str), _get(p, "name", str)
    planner = COMPONENTS.get(component)
    if planner is None:
        raise Unsupported(f"component '{component}' is not supported (hutch has no {component} plugin)")
    return planner(vhost, name, p.get("value"), ctx)


def _plan_global_parameter(p: dict, ctx: Context) -> list[cat.Command]:
    name = _get(p, "name", str)
    if name.startswith(INTERNAL_GLOBAL_PREFIX):
        return []  # another hutch cluster's own bookkeeping: never carried over
    if "value" not in p:
        raise Malformed("'value' is missing")
    return [cat.SetGlobalParameter(name, p["value"])]


def _plan_exchange(x: dict, ctx: Context) -> list[cat.Command]:
    vhost, name = _get(x, "vhost", str), _get(x, "name", str)
    xtype = _get(x, "type", str)
    args = _get(x, "arguments", dict, {})
    if xtype not in EXCHANGE_TYPES:
        ctx.skipped_exchanges.add((vhost, name))
        raise Unsupported(f"exchange type '{xtype}' is not supported")
    try:
        qargs.validate_exchange_args(args, name, vhost)
    except AMQPError as e:
        raise Malformed(e.text) from None
    return [cat.DeclareExchange(vhost, name, xtype, bool(_get(x, "durable", bool, True)),
                                bool(_get(x, "auto_delete", bool, False)), bool(_get(x, "internal", bool, False)),
                                args)]


def _plan_queue(q: dict, ctx: Context) -> list[cat.Command]:
    vhost, name = _get(q, "vhost", str), _get(q, "name", str)
    args = _get(q, "arguments", dict, {})
    qtype = args.get("x-queue-type", q.get("type", "classic")) or "classic"
    if qtype not in QUEUE_TYPES:
        ctx.skipped_queues.add((vhost, name))
        raise Unsupported(f"queue type '{qtype}' is not supported")
    durable, auto_delete = bool(_get(q, "durable", bool, True)), bool(_get(q, "auto_delete", bool, False))
    try:  # the declare's own checks, with RabbitMQ's texts
        qargs.queue_settings(args, name, vhost)
        if qtype == cat.QUORUM:
            fifo.quorum_config(args, name, vhost, durable=durable, exclusive=False, auto_delete=auto_delete)
        elif qtype == cat.STREAM:
            stream_config(args, name, vhost, durable=durable, exclusive=False, auto_delete=auto_delete)
    except AMQPError as e:
        raise Malformed(e.text) from None
    except (fifo.QuorumArgumentError, StreamArgumentError) as e:
        raise Malformed(e.text) from None
    jid = _get(q, "hutch_id", int, 0)
    return [cat.DeclareQueue(vhost, name, str(qtype), durable, auto_delete, None, args, "", (), jid)]


def _plan_binding(b: dict, ctx: Context) -> list[cat.Command]:
    vhost, source = _get(b, "vhost", str), _get(b, "source", str)
    dtype, dest = _get(b, "destination_type", str), _get(b, "destination", str)
    if dtype not in (cat.QUEUE, cat.EXCHANGE):
        raise Malformed(f"destination_type must be 'queue' or 'exchange', got '{dtype}'")
    if (vhost, source) in ctx.skipped_exchanges:
        raise Unsupported(f"its source exchange '{source}' is not imported")
    skipped = ctx.skipped_queues if dtype == cat.QUEUE else ctx.skipped_exchanges
    if (vhost, dest) in skipped:
        raise Unsupported(f"its destination {dtype} '{dest}' is not imported")
    return [cat.Bind(vhost, source, dtype, dest, _get(b, "routing_key", str, ""), _get(b, "arguments", dict, {}))]


def _describe_binding(b: Any) -> str:
    return (f"binding from exchange '{_name(b, 'source')}' to {_name(b, 'destination_type')} "
            f"'{_name(b, 'destination')}'{_in_vhost(b)}")


def _describe_parameter(p: Any) -> str:
    return f"runtime parameter '{_name(p)}' of component '{_name(p, 'component')}'{_in_vhost(p)}"


def _describe_topic_permission(p: Any) -> str:
    return (f"topic permission of user '{_name(p, 'user')}' on exchange '{_name(p, 'exchange')}'"
            f"{_in_vhost(p)}")


def _plan_topic_permission(p: dict, ctx: Context) -> list[cat.Command]:
    if _get(p, "user", str) in ctx.skipped_users:
        raise Unsupported(f"its user '{p['user']}' is not imported")
    return [cat.SetTopicPermissions(*(_get(p, k, str) for k in ("user", "vhost", "exchange", "write", "read")))]


# In dependency order: what an item refers to is planned before it.
KINDS: list[Kind] = [
    Kind("vhosts", "vhosts", lambda v: f"vhost '{_name(v)}'", _plan_vhost),
    Kind("users", "users", lambda u: f"user '{_name(u)}'", _plan_user),
    Kind("permissions", "permissions",
         lambda p: f"permissions of user '{_name(p, 'user')}'{_in_vhost(p)}", _plan_permission),
    Kind("topic_permissions", "topic permissions", _describe_topic_permission, _plan_topic_permission),
    Kind("parameters", "parameters", _describe_parameter, _plan_parameter),
    Kind("global_parameters", "global runtime parameters", lambda p: f"global runtime parameter '{_name(p)}'",
         _plan_global_parameter),
    Kind("policies", "policies", lambda p: f"policy '{_name(p)}'{_in_vhost(p)}", _plan_policy),
    Kind("operator_policies", "operator policies", lambda p: f"operator policy '{_name(p)}'{_in_vhost(p)}",
         _plan_operator_policy_item),
    Kind("queues", "queues", lambda q: f"queue '{_name(q)}'{_in_vhost(q)}", _plan_queue),
    Kind("exchanges", "exchanges", lambda x: f"exchange '{_name(x)}'{_in_vhost(x)}", _plan_exchange),
    Kind("bindings", "bindings", _describe_binding, _plan_binding),
]


def kind(key: str) -> Kind:
    for k in KINDS:
        if k.key == key:
            return k
    raise KeyError(key)


def register(new: Kind) -> None:
    """Add or replace the planner of a kind (a catalogue that learns to keep topic permissions
    registers them here); a new key goes before queues, after what it may refer to."""
    for i, k in enumerate(KINDS):
        if k.key == new.key:
            KINDS[i] = new
            return
    KINDS.insert(next(i for i, k in enumerate(KINDS) if k.key == "queues"), new)


def plan(doc: Any, ctx: Context | None = None) -> Plan:
    """Plan a whole document. Raises DefinitionsError only when `doc` is not a definitions
    document at all; everything else is in the plan's `malformed` and `unsupported` lists."""
    ctx = ctx or Context()
    if not isinstance(doc, dict):
        raise DefinitionsError("definitions must be a JSON object")
    out = Plan()
    known = {k.key for k in KINDS}
    for key, value in doc.items():
        if key in META_KEYS:
            continue
        if key not in known:
            if value:  # an empty list or object carries nothing
                out.unsupported.append(f"'{key}': not a part of RabbitMQ's definitions format that hutch knows")
            continue
        if not isinstance(value, list):
            raise DefinitionsError(f"'{key}' must be a list")
    for p in doc.get("parameters", []):
        if isinstance(p, dict) and p.get("component") == "vhost-limits" and isinstance(p.get("vhost"), str):
            ctx.parameter_vhost_limits.add(p["vhost"])
    for k in KINDS:
        n = 0
        for item in doc.get(k.key, []):
            where = k.describe(item)
            if not isinstance(item, dict):
                out.malformed.append(f"{where}: not a JSON object: {item!r}")
                continue
            ctx.left_out = []
            try:
                if k.planner is None:
                    raise Unsupported(k.why_not or f"{k.noun} are not supported")
                cmds = k.planner(item, ctx)
            except Unsupported as e:
                out.unsupported.append(f"{where}: {e}")
                continue
            except Malformed as e:
                out.malformed.append(f"{where}: {e}")
                continue
            out.commands += cmds
            out.unsupported += [f"{where}: {why}" for why in ctx.left_out]
            n += 1
        if n:
            out.counts[k.key] = n
    return out


def scoped(doc: Any, vhost: str) -> dict[str, Any]:
    """A per-vhost document (`POST /api/definitions/{vhost}`) as a whole one: its items get the
    vhost; keys a per-vhost document cannot carry (users, vhosts, ...) are kept as they are, so
    that they are refused by name rather than dropped."""
    if not isinstance(doc, dict):
        raise DefinitionsError("definitions must be a JSON object")
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key in VHOST_SCOPED_KEYS:
            if not isinstance(value, list):
                raise DefinitionsError(f"'{key}' must be a list")
            out[key] = [{**r, "vhost": vhost} if isinstance(r, dict) else r for r in value]
        elif key in META_KEYS or not value:
            continue
        else:
            out[f"{key} (in a definitions document for one vhost)"] = value
    return out


# ---- export ----------------------------------------------------------------------------------

# More sections of the export, for what the catalogue learns to keep: each is called with the
# catalogue and the document and adds its items (topic permissions, limits, ...).
def _export_access(c: cat.Catalogue, doc: dict[str, Any]) -> None:
    """Topic permissions, and the limits inside users and vhosts (a vhost's limits are also in
    the parameters, as the vhost-limits component: rabbitmqctl exports them both ways)."""
    doc["topic_permissions"] = [{"user": p.user, "vhost": p.vhost, "exchange": p.exchange, "write": p.write,
                                 "read": p.read} for _, p in sorted(c.topic_permissions.items())]
    for u in doc["users"]:
        rec = c.users.get(u["name"])
        u["limits"] = dict(rec.limits) if rec is not None else {}
    for v in doc["vhosts"]:  # rabbitmqctl's form: a list of [name, value] pairs
        v["limits"] = [[k, x] for k, x in c.vhost_limits(v["name"]).items()]


EXPORTERS: list[Callable[[cat.Catalogue, dict[str, Any]], None]] = [_export_access]


def jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def _policy_value(p: Any) -> dict[str, Any]:
    return {"vhost": p.vhost, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
            "definition": jsonable(p.definition), "priority": p.priority}


def export(c: cat.Catalogue, product_version: str, *, internal: bool = False) -> dict[str, Any]:
    """The catalogue as RabbitMQ's definitions document. Left out, as RabbitMQ leaves them
    out: exclusive queues, the default and `amq.*` exchanges. `internal` adds the journal id of
    each queue (`hutch_id`), for a node that restores itself from the file."""
    doc: dict[str, Any] = {
        "rabbit_version": RABBITMQ_VERSION,
        "rabbitmq_version": RABBITMQ_VERSION,
        "product_name": "hutch",
        "product_version": product_version,
        "users": [{"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": u.hashing_algorithm,
                   "tags": list(u.tags), "limits": {}} for _, u in sorted(c.users.items())],
        "vhosts": [],
        "permissions": [{"user": p.user, "vhost": p.vhost, "configure": p.configure, "write": p.write,
                         "read": p.read} for _, p in sorted(c.permissions.items())],
        "topic_permissions": [],
        "parameters": [{"value": jsonable(p.value), "vhost": p.vhost, "component": p.component,
                        "name": p.name} for _, p in sorted(c.parameters.items())],
        "global_parameters": [{"name": k, "value": jsonable(v)} for k, v in sorted(c.global_parameters.items())
                              if not k.startswith(INTERNAL_GLOBAL_PREFIX)],
        "policies": [_policy_value(p) for _, p in sorted(c.policies.items())],
        "queues": [],
        "exchanges": [],
        "bindings": [],
    }
    for _, v in sorted(c.vhosts.items()):
        meta: dict[str, Any] = {"description": v.description, "tags": list(v.tags)}
        dqt = getattr(v, "default_queue_type", "")
        if dqt:
            meta["default_queue_type"] = dqt
        doc["vhosts"].append({"name": v.name, "limits": [], "metadata": meta})
    for _, p in sorted(getattr(c, "operator_policies", {}).items()):
        value = {k: x for k, x in _policy_value(p).items() if k not in ("vhost", "name")}
        doc["parameters"].append({"value": value, "vhost": p.vhost, "component": "operator_policy", "name": p.name})
    kept: set[tuple[str, str]] = set()
    for key, q in sorted(c.queues.items()):
        if q.exclusive_owner is not None:
            continue
        kept.add(key)
        args = jsonable(q.arguments)
        if q.type != cat.CLASSIC and "x-queue-type" not in args:
            args["x-queue-type"] = q.type
        rec = {"name": q.name, "vhost": q.vhost, "durable": q.durable, "auto_delete": q.auto_delete,
               "arguments": args}
        if internal:
            rec["hutch_id"] = q.journal_id
        doc["queues"].append(rec)
    for _, x in sorted(c.exchanges.items()):
        if x.name == "" or x.name.startswith("amq."):
            continue
        doc["exchanges"].append({"name": x.name, "vhost": x.vhost, "type": x.type, "durable": x.durable,
                                 "auto_delete": x.auto_delete, "internal": x.internal,
                                 "arguments": jsonable(x.arguments)})
    for _, b in sorted(c.bindings.items()):
        if b.destination_type == cat.QUEUE and (b.vhost, b.destination) not in kept:
            continue  # to an exclusive queue
        doc["bindings"].append({"source": b.source, "vhost": b.vhost, "destination": b.destination,
                                "destination_type": b.destination_type, "routing_key": b.routing_key,
                                "arguments": jsonable(b.arguments)})
    for section in EXPORTERS:
        section(c, doc)
    return doc


def export_vhost(c: cat.Catalogue, vhost: str, product_version: str) -> dict[str, Any]:
    """One vhost's part (`GET /api/definitions/{vhost}`): its parameters, policies, queues,
    exchanges and bindings, without the vhost field, as RabbitMQ writes it."""
    full = export(c, product_version)
    doc = {k: full[k] for k in META_KEYS if k in full}
    for key in VHOST_SCOPED_KEYS:
        doc[key] = [{k: v for k, v in rec.items() if k != "vhost"} for rec in full[key] if rec.get("vhost") == vhost]
    return doc


def counts_text(counts: dict[str, int]) -> list[str]:
    """The per-kind log lines of an import, as RabbitMQ writes them."""
    return [f"Importing {n} {kind(key).noun}..." for key, n in counts.items()]

