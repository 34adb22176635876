"""`hutchctl`: rabbitmqctl's commands, arguments and columns, as a client of a node's HTTP API.

    hutchctl list_queues name policy pid messages consumers
    hutchctl set_policy ha-two "^two\\." '{"ha-mode":"exactly","ha-params":2,"ha-sync-mode":"automatic"}'
    hutchctl --formatter json list_policies -p /

Listings print what rabbitmqctl prints (header lines, then tab-separated columns; see
`hutch.cli.output`); an unknown column is a usage error (exit 64); a refused or failed
operation prints "Error:" and the node's reason on stderr and exits with rabbitmqctl's code
(65 no such vhost, 67 no such user, 69 unavailable, 70 internal error, 75 timeout, 77 bad
credentials). This module never imports the broker: it knows a node only through its API.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

import click

from hutch.cli.common import (
    Session,
    await_startup,
    command,
    lab_peer_address,
    run_cli,
    stop_node,
    usage_error,
)
from hutch.cli.ctl_base import _delete, _password_given, _vhost_option, cli
from hutch.cli.http import EX_DATAERR, EX_NOUSER, EX_SOFTWARE, CliError, q

# ---------------------------------------------------------------- columns


def _nodes_as_pids(v: Any) -> Any:
    if v is None:
        return None
    return [f"<{n}>" for n in v]


QUEUE_COLUMNS: dict[str, Callable[[dict], Any]] = {
    "name": lambda o: o.get("name"),
    "vhost": lambda o: o.get("vhost"),
    "durable": lambda o: o.get("durable"),
    "auto_delete": lambda o: o.get("auto_delete"),
    "exclusive": lambda o: o.get("exclusive"),
    "arguments": lambda o: o.get("arguments", {}),
    "policy": lambda o: o.get("policy"),
    "operator_policy": lambda o: o.get("operator_policy"),
    "effective_policy_definition": lambda o: o.get("effective_policy_definition", {}),
    "pid": lambda o: f"<{o.get('node')}>",
    "leader": lambda o: o.get("leader", o.get("node")),
    "owner_pid": lambda o: (o.get("owner_pid_details") or {}).get("name"),
    "exclusive_consumer_pid": lambda o: None,
    "exclusive_consumer_tag": lambda o: o.get("exclusive_consumer_tag"),
    "messages": lambda o: o.get("messages"),
    "messages_ready": lambda o: o.get("messages_ready"),
    "messages_unacknowledged": lambda o: o.get("messages_unacknowledged"),
    "message_bytes": lambda o: o.get("message_bytes"),
    "message_bytes_ready": lambda o: o.get("message_bytes_ready"),
    "message_bytes_unacknowledged": lambda o: o.get("message_bytes_unacknowledged"),
    "consumers": lambda o: o.get("consumers"),
    "consumer_utilisation": lambda o: o.get("consumer_utilisation"),
    "consumer_capacity": lambda o: o.get("consumer_capacity"),
    "head_message_timestamp": lambda o: o.get("head_message_timestamp"),
    "single_active_consumer_tag": lambda o: o.get("single_active_consumer_tag"),
    "slave_pids": lambda o: _nodes_as_pids(o.get("slave_nodes")),
    "mirror_pids": lambda o: _nodes_as_pids(o.get("slave_nodes")),
    "synchronised_slave_pids": lambda o: _nodes_as_pids(o.get("synchronised_slave_nodes")),
    "synchronised_mirror_pids": lambda o: _nodes_as_pids(o.get("synchronised_slave_nodes")),
    "members": lambda o: o.get("members"),
    "online": lambda o: o.get("online"),
    "state": lambda o: o.get("state"),
    "type": lambda o: o.get("type"),
    "node": lambda o: o.get("node"),
}

EXCHANGE_COLUMNS: dict[str, Callable[[dict], Any]] = {
    k: (lambda key: (lambda o: o.get(key)))(k)
    for k in ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments", "policy")
}

BINDING_COLUMNS: dict[str, Callable[[dict], Any]] = {
    "source_name": lambda o: o.get("source"),
    "source_kind": lambda o: "exchange",
    "destination_name": lambda o: o.get("destination"),
    "destination_kind": lambda o: o.get("destination_type"),
    "routing_key": lambda o: o.get("routing_key"),
    "arguments": lambda o: o.get("arguments", {}),
    "vhost": lambda o: o.get("vhost"),
}

CONNECTION_COLUMNS: dict[str, Callable[[dict], Any]] = {
    **{k: (lambda key: (lambda o: o.get(key)))(k)
       for k in ("name", "vhost", "user", "host", "port", "peer_host", "peer_port", "state", "channels",
                 "protocol", "auth_mechanism", "ssl", "timeout", "frame_max", "channel_max",
                 "client_properties", "connected_at", "user_provided_name", "node", "type", "recv_cnt",
                 "send_cnt")},
    "pid": lambda o: f"<{o.get('node')}.{o.get('name')}>",
}

CHANNEL_COLUMNS: dict[str, Callable[[dict], Any]] = {
    **{k: (lambda key: (lambda o: o.get(key)))(k)
       for k in ("name", "number", "user", "vhost", "transactional", "confirm", "consumer_count",
                 "messages_unacknowledged", "messages_unconfirmed", "messages_uncommitted", "acks_uncommitted",
                 "prefetch_count", "global_prefetch_count", "state", "node")},
    "pid": lambda o: f"<{o.get('node')}.{o.get('name')}>",
    "connection": lambda o: (o.get("connection_details") or {}).get("name"),
}

CONSUMER_COLUMNS: dict[str, Callable[[dict], Any]] = {
    "queue_name": lambda o: (o.get("queue") or {}).get("name"),
    "channel_pid": lambda o: (o.get("channel_details") or {}).get("name"),
    "consumer_tag": lambda o: o.get("consumer_tag"),
    "ack_required": lambda o: o.get("ack_required"),
    "prefetch_count": lambda o: o.get("prefetch_count"),
    "active": lambda o: o.get("active"),
    "activity_status": lambda o: o.get("activity_status"),
    "exclusive": lambda o: o.get("exclusive"),
    "arguments": lambda o: o.get("arguments", {}),
}

USER_COLUMNS: dict[str, Callable[[dict], Any]] = {
    "user": lambda o: o.get("name"),
    "tags": lambda o: o.get("tags", []),
}

VHOST_COLUMNS: dict[str, Callable[[dict], Any]] = {
    k: (lambda key: (lambda o: o.get(key)))(k)
    for k in ("name", "description", "tags", "tracing", "default_queue_type", "cluster_state")
}

PERMISSION_COLUMNS: dict[str, Callable[[dict], Any]] = {
    k: (lambda key: (lambda o: o.get(key)))(k) for k in ("user", "vhost", "configure", "write", "read")
}

POLICY_COLUMNS: dict[str, Callable[[dict], Any]] = {
    k: (lambda key: (lambda o: o.get(key)))(k)
    for k in ("vhost", "name", "pattern", "apply-to", "definition", "priority")
}


def select(objects: list[dict], columns: tuple[str, ...], table: dict[str, Callable], default: tuple[str, ...]
           ) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    cols = columns or default
    unknown = [c for c in cols if c not in table]
    if unknown:
        raise usage_error(f"Info key(s) {','.join(unknown)} are not supported. Valid keys are: "
                          f"{', '.join(table)}")
    return cols, [{c: table[c](o) for c in cols} for o in objects]


# ---------------------------------------------------------------- the group

def _columns(f):
    return click.argument("columns", nargs=-1)(f)


# ---------------------------------------------------------------- listings

@command(cli, "list_queues")
@_vhost_option
@_columns
@click.option("--online", is_flag=True, help="Accepted for rabbitmqctl compatibility (every queue is online).")
@click.option("--offline", is_flag=True, help="List only queues whose node is down (none on one node).")
@click.option("--local", is_flag=True, help="Only queues whose leader is this node.")
def list_queues(s: Session, vhost: str, columns: tuple[str, ...], online: bool, offline: bool, local: bool) -> None:
    """List queues and their properties (default columns: name messages)."""
    select([], columns, QUEUE_COLUMNS, ("name", "messages"))
    objects = s.client.get(f"/api/queues/{q(vhost)}")
    if offline:
        objects = []
    if local:
        objects = [o for o in objects if o.get("node") == s.node]
    cols, rows = select(objects, columns, QUEUE_COLUMNS, ("name", "messages"))
    s.printer.rows(cols, rows, [f"Timeout: {s.timeout:.1f} seconds ...", f"Listing queues for vhost {vhost} ..."])


@command(cli, "list_exchanges")
@_vhost_option
@_columns
def list_exchanges(s: Session, vhost: str, columns: tuple[str, ...]) -> None:
    """List exchanges (default columns: name type)."""
    select([], columns, EXCHANGE_COLUMNS, ("name", "type"))
    cols, rows = select(s.client.get(f"/api/exchanges/{q(vhost)}"), columns, EXCHANGE_COLUMNS, ("name", "type"))
    s.printer.rows(cols, rows, [f"Listing exchanges for vhost {vhost} ..."])


@command(cli, "list_bindings")
@_vhost_option
@_columns
def list_bindings(s: Session, vhost: str, columns: tuple[str, ...]) -> None:
    """List bindings (default: source_name source_kind destination_name destination_kind routing_key arguments)."""
    default = ("source_name", "source_kind", "destination_name", "destination_kind", "routing_key", "arguments")
    select([], columns, BINDING_COLUMNS, default)
    cols, rows = select(s.client.get(f"/api/bindings/{q(vhost)}"), columns, BINDING_COLUMNS, default)
    s.printer.rows(cols, rows, [f"Listing bindings for vhost {vhost}..."])


@command(cli, "list_connections")
@_columns
def list_connections(s: Session, columns: tuple[str, ...]) -> None:
    """List client connections (default columns: user peer_host peer_port state)."""
    default = ("user", "peer_host", "peer_port", "state")
    select([], columns, CONNECTION_COLUMNS, default)
    cols, rows = select(s.client.get("/api/connections"), columns, CONNECTION_COLUMNS, default)
    s.printer.rows(cols, rows, ["Listing connections ..."])


@command(cli, "list_channels")
@_columns
def list_channels(s: Session, columns: tuple[str, ...]) -> None:
    """List channels (default columns: pid user consumer_count messages_unacknowledged)."""
    default = ("pid", "user", "consumer_count", "messages_unacknowledged")
    select([], columns, CHANNEL_COLUMNS, default)
    cols, rows = select(s.client.get("/api/channels"), columns, CHANNEL_COLUMNS, default)
    s.printer.rows(cols, rows, ["Listing channels ..."])


@command(cli, "list_consumers")
@_vhost_option
@_columns
def list_consumers(s: Session, vhost: str, columns: tuple[str, ...]) -> None:
    """List consumers (default: queue_name channel_pid consumer_tag ack_required prefetch_count active arguments)."""
    default = ("queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active", "arguments")
    select([], columns, CONSUMER_COLUMNS, default)
    cols, rows = select(s.client.get(f"/api/consumers/{q(vhost)}"), columns, CONSUMER_COLUMNS, default)
    s.printer.rows(cols, rows, [f"Listing consumers in vhost {vhost} ..."])


@command(cli, "list_users")
@_columns
def list_users(s: Session, columns: tuple[str, ...]) -> None:
    """List users and their tags."""
    select([], columns, USER_COLUMNS, ("user", "tags"))
    cols, rows = select(s.client.get("/api/users"), columns, USER_COLUMNS, ("user", "tags"))
    s.printer.rows(cols, rows, ["Listing users ..."])


@command(cli, "list_vhosts")
@_columns
def list_vhosts(s: Session, columns: tuple[str, ...]) -> None:
    """List virtual hosts (default column: name)."""
    select([], columns, VHOST_COLUMNS, ("name",))
    cols, rows = select(s.client.get("/api/vhosts"), columns, VHOST_COLUMNS, ("name",))
    s.printer.rows(cols, rows, ["Listing vhosts ..."])


@command(cli, "list_permissions")
@_vhost_option
def list_permissions(s: Session, vhost: str) -> None:
    """List the users' permissions in a vhost."""
    cols = ("user", "configure", "write", "read")
    _, rows = select(s.client.get(f"/api/vhosts/{q(vhost)}/permissions"), cols, PERMISSION_COLUMNS, cols)
    s.printer.rows(cols, rows, [f'Listing permissions for vhost "{vhost}" ...'])


@command(cli, "list_user_permissions")
@click.argument("username")
def list_user_permissions(s: Session, username: str) -> None:
    """List one user's permissions in every vhost."""
    cols = ("vhost", "configure", "write", "read")
    _, rows = select(s.client.get(f"/api/users/{q(username)}/permissions"), cols, PERMISSION_COLUMNS, cols)
    s.printer.rows(cols, rows, [f'Listing permissions for user "{username}" ...'])


@command(cli, "list_policies")
@_vhost_option
def list_policies(s: Session, vhost: str) -> None:
    """List the policies of a vhost."""
    cols = ("vhost", "name", "pattern", "apply-to", "definition", "priority")
    _, rows = select(s.client.get(f"/api/policies/{q(vhost)}"), cols, POLICY_COLUMNS, cols)
    s.printer.rows(cols, rows, [f'Listing policies for vhost "{vhost}" ...'])


# ---------------------------------------------------------------- policies

@command(cli, "set_policy")
@_vhost_option
@click.option("--priority", default="0", show_default=True, help="Priority; the highest matching policy applies.")
@click.option("--apply-to", "apply_to", default="all", show_default=True,
              type=click.Choice(["queues", "exchanges", "all"]), help="Which objects the policy matches.")
@click.argument("name")
@click.argument("pattern")
@click.argument("definition")
def set_policy(s: Session, vhost: str, priority: str, apply_to: str, name: str, pattern: str, definition: str) -> None:
    """Set a policy: NAME PATTERN DEFINITION (a JSON object)."""
    s.info(f'Setting policy "{name}" for pattern "{pattern}" to "{definition}" with priority "{priority}" '
           f'for vhost "{vhost}" ...')
    _put_policy(s, "policies", vhost, name, pattern, definition, priority, apply_to)


def _put_policy(s: Session, kind: str, vhost: str, name: str, pattern: str, definition: str, priority: str,
                apply_to: str) -> None:
    """PUT a policy or operator policy (`kind`: the route's word) from the command's text arguments."""
    try:
        parsed = json.loads(definition)
    except ValueError as e:
        raise CliError(f"could not parse JSON document: {e}", EX_DATAERR) from None
    try:
        prio = int(priority)
    except ValueError:
        raise usage_error(f"priority must be an integer, got {priority!r}") from None
    s.client.put(f"/api/{kind}/{q(vhost)}/{q(name)}",
                 {"pattern": pattern, "definition": parsed, "priority": prio, "apply-to": apply_to})


@command(cli, "clear_policy")
@_vhost_option
@click.argument("name")
def clear_policy(s: Session, vhost: str, name: str) -> None:
    """Remove a policy."""
    s.info(f'Clearing policy "{name}" on vhost "{vhost}" ...')
    _delete(s, f"/api/policies/{q(vhost)}/{q(name)}", "Parameter does not exist")


@command(cli, "set_operator_policy")
@_vhost_option
@click.option("--priority", default="0", show_default=True, help="Priority; the highest matching one applies.")
@click.option("--apply-to", "apply_to", default="all", show_default=True,
              type=click.Choice(["queues", "exchanges", "all"]), help="Which objects the policy matches.")
@click.argument("name")
@click.argument("pattern")
@click.argument("definition")
def set_operator_policy(s: Session, vhost: str, priority: str, apply_to: str, name: str, pattern: str,
                        definition: str) -> None:
    """Set an operator policy (limits that override users' policies): NAME PATTERN DEFINITION."""
    s.info(f'Setting operator policy override "{name}" for pattern "{pattern}" to "{definition}" with priority '
           f'"{priority}" for vhost "{vhost}" ...')
    _put_policy(s, "operator-policies", vhost, name, pattern, definition, priority, apply_to)


@command(cli, "clear_operator_policy")
@_vhost_option
@click.argument("name")
def clear_operator_policy(s: Session, vhost: str, name: str) -> None:
    """Remove an operator policy."""
    s.info(f'Clearing operator policy "{name}" on vhost "{vhost}" ...')
    _delete(s, f"/api/operator-policies/{q(vhost)}/{q(name)}", "Parameter does not exist")


@command(cli, "list_operator_policies")
@_vhost_option
def list_operator_policies(s: Session, vhost: str) -> None:
    """List the operator policies of a vhost."""
    cols = ("vhost", "name", "pattern", "apply-to", "definition", "priority")
    _, rows = select(s.client.get(f"/api/operator-policies/{q(vhost)}"), cols, POLICY_COLUMNS, cols)
    s.printer.rows(cols, rows, [f'Listing operator policy overrides for vhost "{vhost}" ...'])


# ---------------------------------------------------------------- users, vhosts, permissions

@command(cli, "add_user")
@click.argument("username")
@click.argument("password", required=False)
@click.option("--tags", default="", help="Comma-separated user tags.")
def add_user(s: Session, username: str, password: str | None, tags: str) -> None:
    """Create a user (the password is read from stdin when not given; a blank one disables
    password login)."""
    if not username:
        raise usage_error("user cannot be an empty string")
    s.info(f'Adding user "{username}" ...')
    password = _password_given(password)
    if _exists(s, f"/api/users/{q(username)}"):
        raise CliError(f'User "{username}" already exists', EX_SOFTWARE)
    s.client.put(f"/api/users/{q(username)}", {"password": password, "tags": tags})
    s.info("Done. Don't forget to grant the user permissions to some virtual hosts! "
           "See 'hutchctl help set_permissions' to learn more.")


def _exists(s: Session, path: str) -> dict | None:
    try:
        return s.client.get(path)
    except CliError as e:
        if e.status == 404:
            return None
        raise


def _user(s: Session, username: str) -> dict:
    u = _exists(s, f"/api/users/{q(username)}")
    if u is None:
        raise CliError(f'User "{username}" does not exist', EX_NOUSER)
    return u


@command(cli, "delete_user")
@click.argument("username")
def delete_user(s: Session, username: str) -> None:
    """Delete a user."""
    s.info(f'Deleting user "{username}" ...')
    _delete(s, f"/api/users/{q(username)}", f'User "{username}" does not exist')


@command(cli, "change_password")
@click.argument("username")
@click.argument("password", required=False)
def change_password(s: Session, username: str, password: str | None) -> None:
    """Change a user's password (read from stdin when not given)."""
    password = _password_given(password)
    s.info(f'Changing password for user "{username}" ...')
    u = _user(s, username)
    s.client.put(f"/api/users/{q(username)}", {"password": password, "tags": u.get("tags", [])})


@command(cli, "clear_password")
@click.argument("username")
def clear_password(s: Session, username: str) -> None:
    """Clear a user's password: password login is disabled for it."""
    s.info(f'Clearing password for user "{username}" ...')
    u = _user(s, username)
    s.client.put(f"/api/users/{q(username)}", {"password": "", "tags": u.get("tags", [])})


@command(cli, "set_topic_permissions")
@_vhost_option
@click.argument("username")
@click.argument("exchange")
@click.argument("write")
@click.argument("read")
def set_topic_permissions(s: Session, vhost: str, username: str, exchange: str, write: str, read: str) -> None:
    """Set a user's topic permissions on an exchange: routing key regexes to publish (write) and
    bind (read); {username} and {vhost} are expanded."""
    s.info(f'Setting topic permissions on "{exchange}" for user "{username}" in vhost "{vhost}" ...')
    s.client.put(f"/api/topic-permissions/{q(vhost)}/{q(username)}",
                 {"exchange": exchange, "write": write, "read": read})


@command(cli, "clear_topic_permissions")
@_vhost_option
@click.argument("username")
@click.argument("exchange", required=False)
def clear_topic_permissions(s: Session, vhost: str, username: str, exchange: str | None) -> None:
    """Clear a user's topic permissions in a vhost (on one exchange, or on all)."""
    if exchange is None:
        s.info(f'Clearing topic permissions for user "{username}" in vhost "{vhost}" ...')
        path = f"/api/topic-permissions/{q(vhost)}/{q(username)}"
    else:
        s.info(f'Clearing topic permissions on "{exchange}" for user "{username}" in vhost "{vhost}" ...')
        path = f"/api/topic-permissions/{q(vhost)}/{q(username)}?exchange={q(exchange)}"
    try:
        s.client.delete(path)
    except CliError as e:
        if e.status != 404:  # nothing to clear is not an error, as in rabbitmqctl
            raise


TOPIC_PERMISSION_COLUMNS: dict[str, Callable[[dict], Any]] = {
    k: (lambda key: (lambda o: o.get(key)))(k) for k in ("user", "vhost", "exchange", "write", "read")
}


@command(cli, "list_topic_permissions")
@_vhost_option
def list_topic_permissions(s: Session, vhost: str) -> None:
    """List the users' topic permissions in a vhost."""
    cols = ("user", "exchange", "write", "read")
    _, rows = select(s.client.get(f"/api/vhosts/{q(vhost)}/topic-permissions"), cols, TOPIC_PERMISSION_COLUMNS, cols)
    s.printer.rows(cols, rows, [f'Listing topic permissions for vhost "{vhost}" ...'])


@command(cli, "list_user_topic_permissions")
@click.argument("username")
def list_user_topic_permissions(s: Session, username: str) -> None:
    """List one user's topic permissions in every vhost."""
    cols = ("vhost", "exchange", "write", "read")
    _, rows = select(s.client.get(f"/api/users/{q(username)}/topic-permissions"), cols, TOPIC_PERMISSION_COLUMNS,
                     cols)
    if s.printer.formatter == "json":
        s.printer.rows(cols, rows)
        return
    s.info(f'Listing topic permissions for user "{username}" ...')
    for r in rows:  # rabbitmqctl 3.10 prints this listing without its column header
        click.echo("\t".join(str(r[c]) for c in cols))


def _compact(doc: dict) -> str:
    """A limits object as rabbitmqctl prints it: compact JSON, keys sorted."""
    return json.dumps(dict(sorted(doc.items())), separators=(",", ":"))


def _limits_json(definition: str, allowed: tuple[str, ...]) -> dict[str, int]:
    try:
        parsed = json.loads(definition)
    except ValueError as e:
        raise CliError(f"JSON decoding error. Reason: {e}", EX_DATAERR) from None
    if not isinstance(parsed, dict):
        raise CliError("limit definitions must be a JSON object", EX_DATAERR)
    for k, v in parsed.items():
        if k not in allowed:
            raise CliError(f"Unrecognised terms [{k}] in limits (valid limits: {', '.join(allowed)})", EX_DATAERR)
        if not isinstance(v, int) or isinstance(v, bool):
            raise CliError(f"{k} must be an integer, got {v!r}", EX_DATAERR)
    return parsed


@command(cli, "set_user_limits")
@click.argument("username")
@click.argument("definition")
def set_user_limits(s: Session, username: str, definition: str) -> None:
    """Set a user's limits: a JSON object with max-connections and/or max-channels (-1: no limit)."""
    s.info(f'Setting user limits to "{definition}" for user "{username}" ...')
    limits = _limits_json(definition, ("max-connections", "max-channels"))
    _user(s, username)
    for name, value in limits.items():
        s.client.put(f"/api/user-limits/{q(username)}/{q(name)}", {"value": value})


@command(cli, "clear_user_limits")
@click.argument("username")
@click.argument("limit_type")
def clear_user_limits(s: Session, username: str, limit_type: str) -> None:
    """Clear one of a user's limits (max-connections, max-channels) or all of them."""
    if limit_type == "all":
        s.info(f'Clearing all limits for user "{username}" ...')
    else:
        s.info(f'Clearing "{limit_type}" limit for user "{username}" ...')
    _user(s, username)
    s.client.delete(f"/api/user-limits/{q(username)}/{q(limit_type)}")


@command(cli, "list_user_limits")
@click.option("--user", "username", default=None, help="The user (default: the one the CLI authenticates as).")
@click.option("--global", "all_users", is_flag=True, help="List the limits of every user.")
def list_user_limits(s: Session, username: str | None, all_users: bool) -> None:
    """Show a user's limits, or with --global every user's."""
    if all_users:
        json_out = s.printer.formatter == "json"
        rows = [{"user": o["user"], "limits": o["value"] if json_out else _compact(o["value"])}
                for o in s.client.get("/api/user-limits")]
        s.printer.rows(("user", "limits"), rows, ["Listing limits for all users ..."])
        return
    username = username or s.options.get("api_username") or "guest"
    found = s.client.get(f"/api/user-limits/{q(username)}")
    s.info(f'Listing limits for user "{username}" ...')
    limits = found[0]["value"] if found else {}
    s.printer.document(limits, _compact(limits))


@command(cli, "set_vhost_limits")
@_vhost_option
@click.argument("definition")
def set_vhost_limits(s: Session, vhost: str, definition: str) -> None:
    """Set a vhost's limits: a JSON object with max-connections and/or max-queues (-1: no limit,
    0: none allowed); it replaces the vhost's limits."""
    s.info(f'Setting vhost limits to "{definition}" for vhost "{vhost}" ...')
    limits = _limits_json(definition, ("max-connections", "max-queues"))
    current = s.client.get(f"/api/vhost-limits/{q(vhost)}")
    for name in (current[0]["value"] if current else {}):
        if name not in limits:
            s.client.delete(f"/api/vhost-limits/{q(vhost)}/{q(name)}")
    for name, value in limits.items():
        s.client.put(f"/api/vhost-limits/{q(vhost)}/{q(name)}", {"value": value})


@command(cli, "clear_vhost_limits")
@_vhost_option
def clear_vhost_limits(s: Session, vhost: str) -> None:
    """Clear all of a vhost's limits."""
    s.info(f'Clearing vhost "{vhost}" limits ...')
    s.client.delete(f"/api/vhost-limits/{q(vhost)}/all")


@command(cli, "list_vhost_limits")
@_vhost_option
@click.option("--global", "all_vhosts", is_flag=True, help="List the limits of every vhost.")
def list_vhost_limits(s: Session, vhost: str, all_vhosts: bool) -> None:
    """Show a vhost's limits, or with --global every vhost's."""
    if all_vhosts:
        json_out = s.printer.formatter == "json"
        rows = [{"vhost": o["vhost"], "limits": o["value"] if json_out else _compact(o["value"])}
                for o in s.client.get("/api/vhost-limits")]
        s.printer.rows(("vhost", "limits"), rows, ["Listing limits for all vhosts ..."])
        return
    found = s.client.get(f"/api/vhost-limits/{q(vhost)}")
    s.info(f'Listing limits for vhost "{vhost}" ...')
    limits = found[0]["value"] if found else {}
    s.printer.document(limits, _compact(limits))


@command(cli, "set_user_tags")
@click.argument("username")
@click.argument("tags", nargs=-1)
def set_user_tags(s: Session, username: str, tags: tuple[str, ...]) -> None:
    """Set a user's tags (none clears them)."""
    s.info(f'Setting tags for user "{username}" to [{", ".join(tags)}] ...')
    u = _user(s, username)
    s.client.put(f"/api/users/{q(username)}", {"password_hash": u["password_hash"], "tags": list(tags)})


@command(cli, "add_vhost")
@click.argument("vhost")
@click.option("--description", default=None, help="Description.")
@click.option("--tags", default=None, help="Comma-separated tags.")
@click.option("--default-queue-type", "default_queue_type", default=None,
              type=click.Choice(["quorum", "classic", "stream"]),
              help="Queue type to use if no type is explicitly provided by the client.")
def add_vhost(s: Session, vhost: str, description: str | None, tags: str | None,
              default_queue_type: str | None = None) -> None:
    """Create a virtual host."""
    s.info(f'Adding vhost "{vhost}" ...')
    body: dict[str, Any] = {}
    if description is not None:
        body["description"] = description
    if tags is not None:
        body["tags"] = tags
    if default_queue_type is not None:
        body["default_queue_type"] = default_queue_type
    s.client.put(f"/api/vhosts/{q(vhost)}", body)


@command(cli, "delete_vhost")
@click.argument("vhost")
def delete_vhost(s: Session, vhost: str) -> None:
    """Delete a virtual host with everything in it."""
    s.info(f'Deleting vhost "{vhost}" ...')
    _delete(s, f"/api/vhosts/{q(vhost)}", f'Virtual host "{vhost}" does not exist')


@command(cli, "set_permissions")
@_vhost_option
@click.argument("username")
@click.argument("conf")
@click.argument("write")
@click.argument("read")
def set_permissions(s: Session, vhost: str, username: str, conf: str, write: str, read: str) -> None:
    """Set a user's configure, write and read permissions (regular expressions) in a vhost."""
    s.info(f'Setting permissions for user "{username}" in vhost "{vhost}" ...')
    s.client.put(f"/api/permissions/{q(vhost)}/{q(username)}", {"configure": conf, "write": write, "read": read})


@command(cli, "clear_permissions")
@_vhost_option
@click.argument("username")
def clear_permissions(s: Session, vhost: str, username: str) -> None:
    """Revoke a user's permissions in a vhost."""
    s.info(f'Clearing permissions for user "{username}" in vhost "{vhost}" ...')
    _delete(s, f"/api/permissions/{q(vhost)}/{q(username)}",
            f'User "{username}" has no permissions in vhost "{vhost}"')


# ---------------------------------------------------------------- queues, connections

@command(cli, "purge_queue")
@_vhost_option
@click.argument("queue")
def purge_queue(s: Session, vhost: str, queue: str) -> None:
    """Remove every ready message from a queue."""
    s.info(f"Purging queue '{queue}' in vhost '{vhost}' ...")
    _delete(s, f"/api/queues/{q(vhost)}/{q(queue)}/contents", f"Queue '{queue}' in vhost '{vhost}' does not exist")


def _queue_action(s: Session, vhost: str, queue: str, action: str) -> None:
    s.client.post(f"/api/queues/{q(vhost)}/{q(queue)}/actions", {"action": action})


@command(cli, "sync_queue")
@_vhost_option
@click.argument("queue")
def sync_queue(s: Session, vhost: str, queue: str) -> None:
    """Synchronise a mirrored queue's mirrors (the queue serves nothing else while it runs)."""
    s.info(f"Synchronising queue '{queue}' in vhost '{vhost}' ...")
    _queue_action(s, vhost, queue, "sync")


@command(cli, "cancel_sync_queue")
@_vhost_option
@click.argument("queue")
def cancel_sync_queue(s: Session, vhost: str, queue: str) -> None:
    """Stop a mirrored queue's synchronisation in progress."""
    s.info(f"Stopping synchronising queue '{queue}' in vhost '{vhost}' ...")
    _queue_action(s, vhost, queue, "cancel_sync")


@command(cli, "delete_queue")
@_vhost_option
@click.argument("queue")
@click.option("-e", "--if-empty", is_flag=True, help="Only if the queue has no messages.")
@click.option("-u", "--if-unused", is_flag=True, help="Only if the queue has no consumers.")
def delete_queue(s: Session, vhost: str, queue: str, if_empty: bool, if_unused: bool) -> None:
    """Delete a queue."""
    s.info(f"Deleting queue '{queue}' on vhost '{vhost}' ...")
    found = _exists(s, f"/api/queues/{q(vhost)}/{q(queue)}")
    if found is None:
        raise CliError(f"Queue '{queue}' in vhost '{vhost}' does not exist")
    flags = "&".join(f for f, on in (("if-empty=true", if_empty), ("if-unused=true", if_unused)) if on)
    s.client.delete(f"/api/queues/{q(vhost)}/{q(queue)}" + (f"?{flags}" if flags else ""))
    s.info(f"Queue was successfully deleted with {found.get('messages', 0)} messages")


@command(cli, "close_connection")
@click.argument("connection_name")
@click.argument("explanation")
def close_connection(s: Session, connection_name: str, explanation: str) -> None:
    """Close a client connection (its name as list_connections name shows it)."""
    s.info(f'Closing connection "{connection_name}", reason: {explanation}...')
    s.client.delete(f"/api/connections/{q(connection_name)}", headers={"X-Reason": explanation})


# ---------------------------------------------------------------- node

def _mib(n: Any) -> str:
    return f"{(n or 0) / 1024 / 1024:.1f} MiB"


def status_text(overview: dict, node: dict) -> str:
    alarms = [a for a, on in (("memory", node.get("mem_alarm")), ("disk", node.get("disk_free_alarm"))) if on]
    lines = [
        f"Status of node {node.get('name')} ...",
        "Runtime", "",
        f"OS PID: {node.get('os_pid')}",
        f"Product name: {overview.get('product_name')}",
        f"Product version: {overview.get('product_version')}",
        f"RabbitMQ version (API compatibility): {overview.get('rabbitmq_version')}",
        f"Python version: {overview.get('python_version', '')}",
        f"Uptime (seconds): {int((node.get('uptime') or 0) / 1000)}",
        "", "Cluster", "",
        f"Cluster name: {overview.get('cluster_name')}",
        "", "Resource Usage", "",
        f"Memory used: {_mib(node.get('mem_used'))}, limit (high watermark): {_mib(node.get('mem_limit'))}",
        f"Free disk space: {_mib(node.get('disk_free'))}, low watermark: {_mib(node.get('disk_free_limit'))}",
        f"File descriptors: {node.get('fd_used')} used, {node.get('fd_total')} total",
        "", "Alarms", "",
        "\n".join(f"{a} resource limit alarm is in effect" for a in alarms) or "(none)",
        "", "Listeners", "",
    ]
    for ln in overview.get("listeners", []):
        lines.append(f"Interface: {ln.get('ip_address')}, port: {ln.get('port')}, protocol: {ln.get('protocol')}")
    totals = overview.get("object_totals", {})
    lines += ["", "Totals", "",
              f"Connection count: {totals.get('connections', 0)}",
              f"Queue count: {totals.get('queues', 0)}",
              f"Exchange count: {totals.get('exchanges', 0)}"]
    return "\n".join(lines)


def node_status(s: Session) -> tuple[dict, dict]:
    overview = s.overview()
    name = overview.get("node")
    node = s.client.get(f"/api/nodes/{q(name)}")
    return overview, node


@command(cli, "status")
def status(s: Session) -> None:
    """The node's status: versions, memory, disk, alarms, listeners."""
    overview, node = node_status(s)
    s.printer.document({"overview": overview, "node": node}, status_text(overview, node))


def partition_lines(cluster: dict) -> list[str]:
    """cluster_status's Network Partitions section: who cannot reach whom (and when this node
    last saw each of its own)."""
    seen = cluster.get("last_seen") or {}
    out = []
    for node, peers in sorted((cluster.get("partitions") or {}).items()):
        mine = node == cluster.get("node")
        names = ", ".join(f"{p} (last seen {seen[p]})" if mine and p in seen else p for p in peers)
        out.append(f"Node {node} cannot communicate with {names}")
    return out


@command(cli, "cluster_status")
def cluster_status(s: Session) -> None:
    """The cluster's members, running nodes, the catalogue's leader, alarms and listeners."""
    print_cluster_status(s)


def print_cluster_status(s: Session) -> None:
    """What `cluster_status` prints (hutch-diagnostics has the command too)."""
    overview = s.overview()
    cluster = s.client.get("/api/hutch/cluster")
    nodes = {n["name"]: n for n in s.client.get("/api/nodes")}
    names = cluster.get("disk_nodes") or list(nodes)
    running = cluster.get("running_nodes") or [n for n, o in nodes.items() if o.get("running")]
    alarms = [{"node": n["name"], "resource": r} for n in nodes.values()
              for r, on in (("memory", n.get("mem_alarm")), ("disk", n.get("disk_free_alarm"))) if on]
    doc = {"cluster_name": overview.get("cluster_name"), "disk_nodes": names, "ram_nodes": [],
           "running_nodes": running, "leader": cluster.get("leader"), "alarms": alarms,
           "partitions": cluster.get("partitions", {}),
           "listeners": {n: [ln for ln in overview.get("listeners", []) if ln.get("node") == n] for n in names},
           "versions": {n: {"hutch_version": overview.get("product_version"),
                            "rabbitmq_version": overview.get("rabbitmq_version")} for n in names}}
    lines = [f"Cluster status of node {overview.get('node')} ...", "Basics", "",
             f"Cluster name: {overview.get('cluster_name')}", "", "Disk Nodes", "", *names, "",
             "Running Nodes", "", *running, "", "Metadata store leader", "", cluster.get("leader") or "(none)",
             "", "Versions", ""]
    lines += [f"{n}: {overview.get('product_name')} {overview.get('product_version')} (RabbitMQ API "
              f"{overview.get('rabbitmq_version')})" for n in names]
    lines += ["", "Alarms", ""]
    lines += [f"Node {a['node']}: {a['resource']} alarm" for a in alarms] or ["(none)"]
    lines += ["", "Network Partitions", ""]
    lines += partition_lines(cluster) or ["(none)"]
    lines += ["", "Listeners", ""]
    lines += [f"Node: {ln.get('node')}, interface: {ln.get('ip_address')}, port: {ln.get('port')}, "
              f"protocol: {ln.get('protocol')}" for ln in overview.get("listeners", [])]
    s.printer.document(doc, "\n".join(lines))


@command(cli, "stop_app")
def stop_app(s: Session) -> None:
    """Stop the hutch application on the node (its HTTP API stays up)."""
    s.info(f"Stopping hutch application on node {s.node} ...")
    s.client.post("/api/hutch/app/stop", {})


@command(cli, "start_app")
def start_app(s: Session) -> None:
    """Start the hutch application on the node."""
    s.info(f"Starting node {s.node} ...")
    s.client.post("/api/hutch/app/start", {})


@command(cli, "stop")
def stop(s: Session) -> None:
    """Stop the node's process (its app first); waits until it has exited when it runs on this host."""
    stop_node(s)


@command(cli, "await_startup")
def await_startup_command(s: Session) -> None:
    """Wait until the node's app has started (--timeout, default 300 seconds)."""
    await_startup(s)


@command(cli, "reset")
def reset(s: Session) -> None:
    """Return a stopped node to a blank state: it leaves its cluster, its data is deleted."""
    s.info(f"Resetting node {s.node} ...")
    s.client.post("/api/hutch/app/reset", {})


@command(cli, "join_cluster")
@click.argument("seed")
@click.option("--address", default=None, help="The seed's peer address HOST:PORT (default: its host, port 25672, "
                                              "or what `hutch lab` recorded for it).")
def join_cluster(s: Session, seed: str, address: str | None) -> None:
    """Make the (stopped) node join SEED's cluster; start_app then completes the join."""
    if "@" not in seed:
        raise usage_error(f"'{seed}' is not a node name (NAME@HOST)")
    if address is None:
        address = lab_peer_address(seed)
    s.info(f"Clustering node {s.node} with {seed}")
    s.client.post("/api/hutch/cluster/join", {"node": seed, **({"address": address} if address else {})})


@command(cli, "forget_cluster_node")
@click.argument("node_name")
@click.option("--offline", is_flag=True, help="Not supported: run this on a running member.")
def forget_cluster_node(s: Session, node_name: str, offline: bool) -> None:
    """Remove a stopped node from the cluster; its queues are deleted."""
    if offline:
        raise usage_error("--offline is not supported: run forget_cluster_node against a running member")
    s.info(f"Removing node {node_name} from the cluster")
    s.client.post("/api/hutch/cluster/forget", {"node": node_name})


# ---------------------------------------------------------------- the way to quorum queues

@command(cli, "migrate_to_quorum")
@_vhost_option
@click.argument("queue", required=False)
@click.option("--all-matching", "pattern", default=None, metavar="PATTERN",
              help="Every durable classic queue of the vhost whose name matches this regular expression.")
@click.option("--migration-timeout", default=60.0, show_default=True,
              help="Seconds to wait for consumers to settle what they hold and for confirms.")
def migrate_to_quorum(s: Session, vhost: str, queue: str | None, pattern: str | None,
                      migration_timeout: float) -> None:
    """Turn a classic (mirrored) queue into a quorum queue of the same name, with its bindings
    and messages (docs/migration.md)."""
    if (queue is None) == (pattern is None):
        raise usage_error("give a QUEUE or --all-matching PATTERN")
    if pattern is not None:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise usage_error(f"invalid pattern: {e}") from None
        names = [qu["name"] for qu in s.client.get(f"/api/queues/{q(vhost)}")
                 if qu.get("type", "classic") == "classic" and qu.get("durable") and not qu.get("exclusive")
                 and rx.search(qu["name"])]
    else:
        names = [queue]
    rows = []
    for name in names:
        s.info(f'Migrating queue "{name}" in vhost "{vhost}" to a quorum queue ...')
        try:
            r = s.client.post(f"/api/hutch/migrate/{q(vhost)}/{q(name)}",
                              {"timeout_ms": int(migration_timeout * 1000)})
            rows.append({"name": name, "result": "ok", "moved": r.get("moved"), "members": r.get("members"),
                         "dropped_arguments": r.get("dropped_arguments"),
                         "policies_changed": r.get("policies_changed")})
        except CliError as e:
            if queue is not None:
                raise
            rows.append({"name": name, "result": f"error: {e}"})
    cols = ("name", "result", "moved", "members", "dropped_arguments", "policies_changed")
    s.printer.rows(cols, rows)


# ---------------------------------------------------------------- definitions

@command(cli, "export_definitions")
@click.argument("path")
def export_definitions(s: Session, path: str) -> None:
    """Export definitions (users, vhosts, permissions, policies, topology) as JSON to PATH ("-": stdout)."""
    doc = s.client.get("/api/definitions")
    text = json.dumps(doc, indent=2, sort_keys=True)
    if path == "-":
        click.echo(text)
        return
    s.info(f'Exporting definitions in JSON to a file at "{path}" ...')
    with open(path, "w") as f:
        f.write(text + "\n")


@command(cli, "import_definitions")
@click.argument("path")
@click.option("--skip-unsupported", is_flag=True,
              help="Import what the node can honour and list what it left out (default: refuse the whole file).")
def import_definitions(s: Session, path: str, skip_unsupported: bool = False) -> None:
    """Import definitions from a JSON file at PATH ("-": stdin). A file with anything the node
    cannot honour (a stream queue, a plugin's exchange type, ...) is refused whole, naming each
    such item; --skip-unsupported imports the rest and lists what was skipped."""
    s.info(f'Importing definitions in JSON from a file at "{path}" ...')
    try:
        raw = sys.stdin.read() if path == "-" else open(path).read()
    except OSError as e:
        raise CliError(f"could not read {path}: {e}", EX_DATAERR) from None
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise CliError(f"{path} is not valid JSON: {e}", EX_DATAERR) from None
    if not skip_unsupported:
        s.client.post("/api/definitions", doc)
        s.info("Successfully imported definitions")
        return
    report = s.client.post("/api/definitions?skip_unsupported=true", doc) or {}
    skipped = report.get("skipped", [])
    for item in skipped:
        click.echo(f"Skipped {item}")
    s.info(f"Successfully imported definitions; {len(skipped)} item(s) the node cannot honour were skipped"
           if skipped else "Successfully imported definitions")


@cli.command(name="help")
@click.argument("command_name", required=False)
@click.pass_context
def help_command(ctx: click.Context, command_name: str | None) -> None:
    """Show help for a command."""
    group = ctx.parent.command
    cmd = group.get_command(ctx, command_name) if command_name else None
    if cmd is None:
        click.echo(group.get_help(ctx.parent))
        return
    with click.Context(cmd, info_name=command_name, parent=ctx.parent) as sub:
        click.echo(cmd.get_help(sub))


# more of rabbitmqctl's commands (passwords, parameters, the node's lifecycle) register on `cli`
from hutch.cli import ctl_more as _ctl_more  # noqa: E402,F401


def main() -> None:
    run_cli(cli, "hutchctl")


if __name__ == "__main__":
    main()
