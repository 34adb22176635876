"""A queue's effective settings: its `x-` arguments, its policy and its operator policy, resolved.

RabbitMQ lets three sources configure one queue (its policies guide, "Policies and queue
arguments" and "Operator policies"): the arguments the client declared it with, the policy
that matches it (set by users with the policymaker tag) and the operator policy that matches it
(set by administrators, limited to a few numeric keys). Their precedence, as RabbitMQ 3.13
applies it (`rabbit_policies:merge_policy_value`, and the `res_min` / `res_arg` lookups of the
classic and quorum queue processes):

- the policy and the operator policy first merge into the *effective policy definition*: for the
  numeric keys both may set, the smaller value wins; any other key comes from the policy;
- then that definition meets the arguments: `message-ttl`, `expires`, `max-length`,
  `max-length-bytes` and `delivery-limit` take the smaller (stricter) of argument and policy;
  `overflow`, `dead-letter-exchange`, `dead-letter-routing-key` and `queue-mode` take the
  argument when there is one, the policy's value otherwise;
- a quorum queue's delivery limit that neither sets is the node's default (RabbitMQ 4.0: 20;
  `quorum_queue.default_delivery_limit`); a negative limit means none, and where argument and
  policy disagree in sign the larger wins (`rabbit_quorum_queue`'s `resolve_delivery_limit`), so
  -1 on one side never lifts a limit the other side sets;
- `consumer-timeout` (RabbitMQ 3.12, classic and quorum queues) takes the smaller of argument
  and policy; with neither, the node's `consumer_timeout` applies (the channel decides that).

Not every queue type acts on every key: a classic queue has no delivery limit, a quorum queue
has no queue mode, master locator or mirroring, and takes `reject-publish-dlx` as `drop-head`.
`resolve` reports such keys (`unsupported`, `warnings`) instead of keeping them quietly.

`resolve(queue_type, arguments, policy_definition, operator_definition)` is the one place this
is decided; the broker's classic, mirrored and quorum queues and the HTTP API all call it, so
what a queue does and what the API shows for it cannot disagree. `match` picks the policy (or
operator policy) for a queue or exchange by RabbitMQ's rule.

Everything here is pure: no I/O, no clock, no broker objects. It must never import anything
outside `hutch.queues`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

CLASSIC = "classic"
QUORUM = "quorum"

DROP_HEAD = "drop-head"
REJECT_PUBLISH = "reject-publish"
REJECT_PUBLISH_DLX = "reject-publish-dlx"

# keys where the stricter (smaller) value wins, between policy and operator policy and then
# between that and the queue's argument
NUMERIC_KEYS = ("message-ttl", "expires", "max-length", "max-length-bytes", "delivery-limit", "consumer-timeout")
DEFAULT_DELIVERY_LIMIT = 20  # a quorum queue's delivery limit when nothing sets one (RabbitMQ 4.0)
# keys where the queue's argument wins over the policy
ARGUMENT_WINS_KEYS = ("overflow", "dead-letter-exchange", "dead-letter-routing-key", "queue-mode")
# the only keys an operator policy may set (rabbit_policies registers these as operator policy
# validators; max-in-memory-length/-bytes too, which hutch does not implement)
OPERATOR_POLICY_KEYS = ("expires", "message-ttl", "max-length", "max-length-bytes", "delivery-limit")
HA_KEYS = ("ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size", "ha-promote-on-shutdown",
           "ha-promote-on-failure", "ha-sync-background")  # the last one is hutch's own
EXCHANGE_KEYS = ("alternate-exchange",)

# the queue keys each queue type acts on
SUPPORTED_KEYS: dict[str, frozenset[str]] = {
    CLASSIC: frozenset(("message-ttl", "expires", "max-length", "max-length-bytes", "overflow",
                        "dead-letter-exchange", "dead-letter-routing-key", "queue-mode", "queue-master-locator",
                        "queue-leader-locator", "consumer-timeout", *HA_KEYS)),
    QUORUM: frozenset(("message-ttl", "expires", "max-length", "max-length-bytes", "overflow",
                       "dead-letter-exchange", "dead-letter-routing-key", "delivery-limit",
                       "queue-leader-locator", "consumer-timeout")),
}

_ARG = {k: "x-" + k for k in (*NUMERIC_KEYS, *ARGUMENT_WINS_KEYS)}


@dataclass(frozen=True)
class Effective:
    """What a queue does, all sources considered. None: no limit / not set."""

    queue_type: str = CLASSIC
    message_ttl_ms: int | None = None
    expires_ms: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = DROP_HEAD
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    delivery_limit: int | None = None
    consumer_timeout_ms: int | None = None  # None: the node's consumer_timeout
    queue_mode: str = "default"
    # the effective policy definition (policy merged with operator policy), as the API shows it
    definition: dict[str, Any] = field(default_factory=dict)
    # policy keys this queue type does not act on, sorted
    unsupported: tuple[str, ...] = ()
    # lines for the node's log about settings taken differently from how they were written
    warnings: tuple[str, ...] = ()


def _text(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def merge_definitions(policy: Mapping[str, Any] | None, operator: Mapping[str, Any] | None) -> dict[str, Any]:
    """RabbitMQ's effective policy definition: the policy's keys, with each numeric key the
    operator policy also sets taking the smaller value, plus the operator policy's other keys."""
    out = dict(policy or {})
    for key, op_value in (operator or {}).items():
        if key in out and key in NUMERIC_KEYS and _int(out[key]) is not None and _int(op_value) is not None:
            out[key] = _delivery_limit(out[key], op_value) if key == "delivery-limit" else min(out[key], op_value)
        elif key not in out:
            out[key] = op_value
    return out


def _stricter(arg: Any, pol: Any) -> int | None:
    a, p = _int(arg), _int(pol)
    if a is None:
        return p
    if p is None:
        return a
    return min(a, p)


def _delivery_limit(a: int, b: int) -> int:
    """Two delivery limits that both apply: the stricter one, where a negative one (no limit)
    loses to any limit the other sets."""
    return max(a, b) if a < 0 or b < 0 else min(a, b)


def _argument_first(arg: Any, pol: Any) -> Any:
    arg = _text(arg)
    return arg if arg is not None else pol


def resolve(queue_type: str, arguments: Mapping[str, Any] | None, policy: Mapping[str, Any] | None = None,
            operator: Mapping[str, Any] | None = None, *, name: str = "", vhost: str = "/",
            default_delivery_limit: int | None = DEFAULT_DELIVERY_LIMIT) -> Effective:
    """The effective settings of a queue of `queue_type` ('classic' or 'quorum') declared with
    `arguments` (its `x-` arguments, already validated), matched by a policy with definition
    `policy` and an operator policy with definition `operator` (either may be None).
    `default_delivery_limit` is a quorum queue's limit when neither sets one (None: no limit)."""
    args = arguments or {}
    definition = merge_definitions(policy, operator)
    supported = SUPPORTED_KEYS.get(queue_type, SUPPORTED_KEYS[CLASSIC])
    unsupported = tuple(sorted(k for k in definition if k not in supported and k not in EXCHANGE_KEYS))
    usable = {k: v for k, v in definition.items() if k in supported}

    def numeric(key: str) -> int | None:
        return _stricter(args.get(_ARG[key]), usable.get(key))

    def delivery_limit() -> int | None:
        a, p = _int(args.get("x-delivery-limit")), _int(usable.get("delivery-limit"))
        limit = default_delivery_limit if a is None and p is None else (
            p if a is None else a if p is None else _delivery_limit(a, p))
        return None if limit is None or limit < 0 else limit

    def chosen(key: str) -> Any:
        return _argument_first(args.get(_ARG[key]), usable.get(key))

    warnings: list[str] = []
    rs = f"queue '{name}' in vhost '{vhost}'"
    overflow = chosen("overflow") or DROP_HEAD
    if overflow not in (DROP_HEAD, REJECT_PUBLISH, REJECT_PUBLISH_DLX):
        overflow = DROP_HEAD
    if queue_type == QUORUM and overflow == REJECT_PUBLISH_DLX:
        warnings.append(f'Invalid overflow strategy <<"{overflow}">> for quorum queue: {rs}')
        overflow = DROP_HEAD
    dlx = chosen("dead-letter-exchange")
    dlrk = chosen("dead-letter-routing-key")
    mode = chosen("queue-mode") if queue_type == CLASSIC else None
    if unsupported:
        warnings.append(f"policy keys {', '.join(unsupported)} do not apply to {queue_type} {rs}; ignored")
    return Effective(
        queue_type=queue_type,
        message_ttl_ms=numeric("message-ttl"),
        expires_ms=numeric("expires"),
        max_length=numeric("max-length"),
        max_length_bytes=numeric("max-length-bytes"),
        overflow=overflow,
        dead_letter_exchange=dlx if isinstance(dlx, str) else None,
        dead_letter_routing_key=dlrk if isinstance(dlrk, str) else None,
        delivery_limit=delivery_limit() if queue_type == QUORUM else None,
        consumer_timeout_ms=numeric("consumer-timeout"),
        queue_mode=mode if mode in ("default", "lazy") else "default",
        definition=definition,
        unsupported=unsupported,
        warnings=tuple(warnings),
    )


def exchange_alternate(arguments: Mapping[str, Any] | None, policy: Mapping[str, Any] | None) -> str | None:
    """An exchange's alternate exchange: its `alternate-exchange` argument, else the policy's."""
    alt = _text((arguments or {}).get("alternate-exchange"))
    if alt is None and policy:
        alt = policy.get("alternate-exchange")
    return alt if isinstance(alt, str) else None


def _applies(apply_to: str, kind: str, queue_type: str | None) -> bool:
    if apply_to == "all":
        return True
    if kind == "exchange":
        return apply_to == "exchanges"
    if apply_to == "queues":
        return True
    return queue_type is not None and apply_to == f"{queue_type}_queues"


def match(policies: Iterable[Mapping[str, Any]], vhost: str, name: str, kind: str,
          queue_type: str | None = None) -> Mapping[str, Any] | None:
    """The policy (or operator policy) of `policies` that applies to the queue or exchange `name`
    in `vhost`: its pattern is searched (not anchored) in the name, its apply-to covers `kind`
    ('queue' or 'exchange', and the queue's type for 'classic_queues' / 'quorum_queues'); the
    highest priority wins, and among equal priorities the greatest name."""
    best = None
    for p in policies:
        if p.get("vhost") != vhost or not _applies(p.get("apply-to", "all"), kind, queue_type):
            continue
        try:
            if re.search(p["pattern"], name) is None:
                continue
        except re.error:
            continue
        if best is None or (p.get("priority", 0), p["name"]) > (best.get("priority", 0), best["name"]):
            best = p
    return best


__all__ = ["Effective", "resolve", "merge_definitions", "match", "exchange_alternate", "NUMERIC_KEYS",
           "ARGUMENT_WINS_KEYS", "OPERATOR_POLICY_KEYS", "SUPPORTED_KEYS", "DEFAULT_DELIVERY_LIMIT"]
