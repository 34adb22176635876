"""Policies: validation of a policy as RabbitMQ checks it, and which policy applies to a queue.

A policy is (vhost, name, pattern, apply-to, priority, definition). Its pattern is a regular
expression searched (not anchored) in queue or exchange names of its vhost; `apply-to` says
which kinds it matches (`queues`, `exchanges` or `all`); of the policies that match one
object, the one with the highest priority applies (RabbitMQ breaks ties by name, the
greatest name winning — `match` does the same, so every node picks the same policy).

`validate_policy` turns a request body into the stored record or raises `PolicyError` with
a reason that names what is wrong ("Validation failed\\n\\nha-mode=\\"exactly\\" takes an
integer, \\"two\\" given"); nothing is stored for an invalid policy. Keys and checks follow
RabbitMQ 3.10's own validators (rabbit_mirror_queue_misc, rabbit_policies); the messages say
the same thing with JSON values instead of Erlang terms. `max-priority` is not a policy key,
as in RabbitMQ: it is accepted only as the queue argument `x-max-priority`.

Everything here is pure (no broker, no I/O), so the broker and the mirroring layer can use
the same decision: `match(policies, vhost, name, kind)`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hutch.queues.effective import HA_KEYS, OPERATOR_POLICY_KEYS, match  # one definition of each
from hutch.streams.config import parse_age

APPLY_TO = ("queues", "exchanges", "all")
HA_MODES = ("all", "exactly", "nodes")
QUEUE_MASTER_LOCATORS = ("min-masters", "client-local", "random")
# 3.13 accepts client-local and balanced; random and least-leaders are older names for balanced
QUEUE_LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")
OVERFLOW_VALUES = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_MODES = ("default", "lazy")
PROMOTE_VALUES = ("always", "when-synced")
SYNC_MODES = ("manual", "automatic")
POLICY_NAME_MAX = 255


class PolicyError(ValueError):
    """An invalid policy; `str()` is the reason to give the client."""


def _show(v: Any) -> str:
    return json.dumps(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _non_negative_int(what: str) -> Any:
    def check(v: Any) -> None:
        if not _is_int(v) or v < 0:
            raise PolicyError(f"{_show(v)} is not a valid {what}")
    return check


def _integer(what: str) -> Any:
    def check(v: Any) -> None:
        if not _is_int(v):
            raise PolicyError(f"{_show(v)} is not a valid {what}")
    return check


def _positive_int(what: str) -> Any:
    def check(v: Any) -> None:
        if not _is_int(v) or v < 1:
            raise PolicyError(f"{_show(v)} is not a valid {what}")
    return check


def _string(what: str) -> Any:
    def check(v: Any) -> None:
        if not isinstance(v, str):
            raise PolicyError(f"{_show(v)} is not a valid {what}")
    return check


def _one_of(values: tuple[str, ...], what: str) -> Any:
    def check(v: Any) -> None:
        if v not in values:
            raise PolicyError(f"{_show(v)} is not a valid {what} value (one of {', '.join(values)})")
    return check


def _ha_sync_batch_size(v: Any) -> None:
    if not _is_int(v) or v < 1:
        raise PolicyError(f"ha-sync-batch-size takes an integer greater than 0, {_show(v)} given")


def _ha_sync_mode(v: Any) -> None:
    if v not in SYNC_MODES:
        raise PolicyError(f'ha-sync-mode must be "manual" or "automatic", got {_show(v)}')


def _ha_sync_background(v: Any) -> None:
    if not isinstance(v, bool):
        raise PolicyError(f"ha-sync-background must be true or false, got {_show(v)}")


def _promote(key: str) -> Any:
    def check(v: Any) -> None:
        if v not in PROMOTE_VALUES:
            raise PolicyError(f'{key} must be "always" or "when-synced", got {_show(v)}')
    return check


def _queue_master_locator(v: Any) -> None:
    if v not in QUEUE_MASTER_LOCATORS:
        raise PolicyError(f"{_show(v)} invalid queue-master-locator value (one of {', '.join(QUEUE_MASTER_LOCATORS)})")


def _queue_leader_locator(v: Any) -> None:
    if v not in QUEUE_LEADER_LOCATORS:
        raise PolicyError(f"{_show(v)} is not a valid queue leader locator value (one of "
                          f"{', '.join(QUEUE_LEADER_LOCATORS)})")


def _max_age(v: Any) -> None:
    if parse_age(v) is None:
        raise PolicyError(f"{_show(v)} is not a valid max age")


def _segment_size(v: Any) -> None:
    if not _is_int(v) or v < 0:
        raise PolicyError(f"{_show(v)} is not a valid segment size")


# key -> check of its value; ha-mode / ha-params are checked together below
_CHECKS: dict[str, Any] = {
    "ha-mode": lambda v: None,
    "ha-params": lambda v: None,
    "ha-sync-mode": _ha_sync_mode,
    "ha-sync-batch-size": _ha_sync_batch_size,
    "ha-sync-background": _ha_sync_background,
    "ha-promote-on-shutdown": _promote("ha-promote-on-shutdown"),
    "ha-promote-on-failure": _promote("ha-promote-on-failure"),
    "queue-master-locator": _queue_master_locator,
    "queue-leader-locator": _queue_leader_locator,
    "message-ttl": _non_negative_int("message TTL"),
    "expires": _positive_int("queue expiry"),
    "max-length": _non_negative_int("maximum length"),
    "max-length-bytes": _non_negative_int("maximum length in bytes"),
    "overflow": _one_of(OVERFLOW_VALUES, "overflow"),
    "dead-letter-exchange": _string("dead letter exchange name"),
    "dead-letter-routing-key": _string("dead letter routing key"),
    "delivery-limit": _integer("delivery limit"),  # RabbitMQ 4.0: negative means no limit
    "consumer-timeout": _non_negative_int("consumer timeout"),
    "queue-mode": _one_of(QUEUE_MODES, "queue-mode"),
    "alternate-exchange": _string("alternate exchange name"),
    "max-age": _max_age,  # streams' retention (hutch.streams.config)
    "stream-max-segment-size-bytes": _segment_size,
}
POLICY_KEYS = tuple(_CHECKS)


def _check_ha(definition: dict[str, Any]) -> None:
    mode = definition.get("ha-mode")
    if mode is None:
        if any(k in definition for k in ("ha-params", "ha-sync-mode", "ha-promote-on-shutdown",
                                         "ha-promote-on-failure", "ha-sync-batch-size", "ha-sync-background")):
            raise PolicyError("ha-mode must be specified to specify ha-params, ha-sync-mode or "
                              "ha-promote-on-shutdown")
        return
    if mode not in HA_MODES:
        raise PolicyError(f"{_show(mode)} is not a valid ha-mode value (one of {', '.join(HA_MODES)})")
    has_params = "ha-params" in definition
    params = definition.get("ha-params")
    if mode == "all":
        if has_params:
            raise PolicyError('ha-mode="all" does not take parameters')
    elif mode == "exactly":
        if not has_params:
            raise PolicyError('ha-mode="exactly" takes an integer, none given')
        if not _is_int(params) or params < 1:
            raise PolicyError(f'ha-mode="exactly" takes an integer, {_show(params)} given')
    else:  # nodes
        if not has_params:
            raise PolicyError('ha-mode="nodes" takes a list, none given')
        if not isinstance(params, list):
            raise PolicyError(f'ha-mode="nodes" takes a list, {_show(params)} given')
        if not params:
            raise PolicyError('ha-mode="nodes" list must be non-empty')
        for p in params:
            if not isinstance(p, str):
                raise PolicyError(f'ha-mode="nodes" takes a list of strings, {_show(p)} was not a string')


def validate_definition(definition: Any, operator: bool = False) -> dict[str, Any]:
    """A policy definition, checked key by key. Raises PolicyError naming the first problem.
    `operator`: an operator policy's, which may only set OPERATOR_POLICY_KEYS."""
    if not isinstance(definition, dict):
        raise PolicyError(f"Validation failed\n\ndefinition must be a JSON object, got {_show(definition)}\n")
    if not definition:
        raise PolicyError("Validation failed\n\nno policy provided\n")
    known = OPERATOR_POLICY_KEYS if operator else POLICY_KEYS
    unknown = sorted(k for k in definition if k not in known)
    try:
        if unknown:
            names = ", ".join(_show(k) for k in unknown)
            what = "operator policy setting" if operator else "policy setting"
            verb = f"is not a recognised {what}" if len(unknown) == 1 else f"are not recognised {what}s"
            raise PolicyError(f"{names} {verb} (known: {', '.join(known)})")
        _check_ha(definition)
        for key in sorted(definition):
            _CHECKS[key](definition[key])
    except PolicyError as e:
        raise PolicyError(f"Validation failed\n\n{e}\n") from None
    return dict(definition)


def validate_policy(vhost: str, name: str, body: Any, operator: bool = False) -> dict[str, Any]:
    """The policy record to store for `PUT /api/policies/{vhost}/{name}` with `body` (with
    `operator`: for `PUT /api/operator-policies/{vhost}/{name}`)."""
    if not isinstance(body, dict):
        raise PolicyError("policy must be a JSON object")
    for key in ("pattern", "definition"):
        if key not in body:
            raise PolicyError(f"[{{key_missing,{key}}}] (a policy needs 'pattern' and 'definition')")
    if not name or len(name) > POLICY_NAME_MAX:
        raise PolicyError(f"Validation failed\n\npolicy name must be 1 to {POLICY_NAME_MAX} characters\n")
    pattern = body["pattern"]
    if not isinstance(pattern, str):
        raise PolicyError(f"Validation failed\n\npattern should be a string but was {_show(pattern)}\n")
    try:
        re.compile(pattern)
    except re.error as e:
        raise PolicyError(f"Validation failed\n\npattern should be regular expression but is invalid: {e}\n") \
            from None
    apply_to = body.get("apply-to", "all")
    if apply_to not in APPLY_TO:
        raise PolicyError(f"Validation failed\n\napply-to {_show(apply_to)} unrecognised; should be 'queues', "
                          "'exchanges' or 'all'\n")
    priority = body.get("priority", 0)
    if isinstance(priority, str) and re.fullmatch(r"-?\d+", priority.strip()):
        priority = int(priority)
    if not _is_int(priority):
        raise PolicyError(f"Validation failed\n\npriority should be a number, actually was {_show(priority)}\n")
    definition = body["definition"]
    if isinstance(definition, str):  # the management UI and rabbitmqctl may send it as JSON text
        try:
            definition = json.loads(definition)
        except ValueError:
            raise PolicyError(f"Validation failed\n\ndefinition is not valid JSON: {definition!r}\n") from None
    definition = validate_definition(definition, operator)
    return {"vhost": vhost, "name": name, "pattern": pattern, "apply-to": apply_to, "definition": definition,
            "priority": priority}


__all__ = ["PolicyError", "validate_policy", "validate_definition", "match", "POLICY_KEYS",
           "OPERATOR_POLICY_KEYS", "HA_KEYS"]
