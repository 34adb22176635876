"""More of rabbitmqctl 3.10's commands for `hutchctl`: passwords, runtime parameters, closing
connections in bulk, the cluster name, and the node's lifecycle and health.

    hutchctl hash_password PASSWORD             hutchctl authenticate_user USER PASSWORD
    hutchctl close_all_connections [-p VHOST] [--global] [--limit N] [--per-connection-delay MS] WHY
    hutchctl list_global_parameters | set_global_parameter NAME JSON | clear_global_parameter NAME
    hutchctl list_parameters [-p VHOST]          hutchctl set_cluster_name NAME
    hutchctl shutdown [--no-wait] | ping | environment | await_online_nodes N | node_health_check
    hutchctl rotate_logs                         (refused, as rabbitmqctl 3.10 refuses it)

Names, arguments, banners, output and exit codes are rabbitmqctl 3.10.8's (compared with
a RabbitMQ node; docs/cli.md lists where hutchctl differs). The commands register
themselves on `hutch.cli.ctl_base.cli`; `hutch.cli.ctl` imports this module so they are
there. Like the rest of the CLI, this module reaches a node only through its management HTTP API: it never imports the
broker, and `hash_password` computes RabbitMQ's documented hash itself for that reason.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from typing import Any

import click

from hutch.cli.common import (
    Session,
    command,
    ping_node,
    request_stop,
    show_environment,
    wait_for_exit,
)
from hutch.cli.ctl_base import _delete, _password_given, _vhost_option, cli
from hutch.cli.http import EX_DATAERR, EX_SOFTWARE, EX_UNAVAILABLE, Client, CliError, q

AWAIT_ONLINE_TIMEOUT_S = 300.0  # rabbitmqctl await_online_nodes' default
NODE_HEALTH_CHECK_TIMEOUT_S = 70.0  # what rabbitmqctl node_health_check announces
POLL_S = 0.2
SALT_BYTES = 4


def bad_argument(message: str) -> CliError:
    """rabbitmqctl's validation failure for a well-formed but unacceptable value (exit 65)."""
    return CliError(f"(argument validation): Bad argument: {message}", EX_DATAERR)


def hash_password(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's rabbit_password_hashing_sha256 as stored: base64(salt + sha256(salt + password)),
    with a random 4-byte salt."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def _json_text(value: Any) -> str:
    """A parameter's value as rabbitmqctl prints it: compact JSON."""
    return json.dumps(value, separators=(",", ":"))


# ---------------------------------------------------------------- users

@command(cli, "hash_password")
@click.argument("password", required=False)
def hash_password_command(s: Session, password: str | None) -> None:
    """Print the salted SHA-256 hash of a password as a node stores it (read from stdin when not
    given); computed here, no node is asked."""
    s.info(f"Will hash password {password}" if password is not None else "Will hash provided password")
    password = _password_given(password)
    if password == "":
        raise bad_argument("password cannot be an empty string")
    hashed = hash_password(password)
    s.printer.document({"hash": hashed}, hashed)


@command(cli, "authenticate_user")
@click.argument("username")
@click.argument("password", required=False)
def authenticate_user(s: Session, username: str, password: str | None) -> None:
    """Check a user's credentials against the node (the password is read from stdin when not given)."""
    s.info(f'Authenticating user "{username}" ...')
    password = _password_given(password)
    try:
        Client(s.url, username, password, s.timeout).get("/api/whoami")
    except CliError as e:
        # 401 "Login failed" is a refusal of the credentials; a user they identify that may not use
        # the management API ("Not management user") has authenticated all the same
        if e.status == 401 and "Login failed" in e.message:
            raise CliError(f'Error: failed to authenticate user "{username}"\n'
                           f"user '{username}' - invalid credentials", EX_DATAERR) from None
        if e.status != 401:
            raise
    s.printer.document({"result": "ok", "user": username}, "Success")


# ---------------------------------------------------------------- connections

@command(cli, "close_all_connections")
@_vhost_option
@click.option("--global", "all_vhosts", is_flag=True, help="Every connection to this node, in every vhost.")
@click.option("--per-connection-delay", "delay_ms", type=click.IntRange(min=0), default=0, show_default=True,
              help="Milliseconds to wait between two closures.")
@click.option("--limit", type=click.IntRange(min=0), default=0, show_default=True,
              help="Close at most this many of the vhost's connections (0: all).")
@click.argument("explanation")
def close_all_connections(s: Session, vhost: str, all_vhosts: bool, delay_ms: int, limit: int,
                          explanation: str) -> None:
    """Close every client connection of a vhost (in the whole cluster), or with --global every
    connection to this node; clients see CONNECTION_FORCED with the explanation."""
    conns = s.client.get("/api/connections")
    if all_vhosts:
        node = s.overview().get("node")
        s.info(f"Closing all connections to node {node} (across all vhosts), reason: {explanation}...")
        targets = [c for c in conns if c.get("node") == node]
    else:
        s.info(f"Closing {limit if limit else 'all'} connections in vhost {vhost}, reason: {explanation}...")
        targets = [c for c in conns if c.get("vhost") == vhost]
        if limit:
            targets = targets[:limit]
    closed = 0
    for i, c in enumerate(targets):
        if i and delay_ms:
            time.sleep(delay_ms / 1000)
        try:
            s.client.delete(f"/api/connections/{q(c['name'])}",
                            headers={"X-Reason": f"Closed via hutchctl: {explanation}"})
        except CliError as e:
            if e.status != 404:  # gone since the listing: nothing left to close
                raise
            continue
        closed += 1
    s.printer.document({"closed": closed}, f"Closed {closed} connections")


# ---------------------------------------------------------------- runtime parameters

@command(cli, "list_global_parameters")
def list_global_parameters(s: Session) -> None:
    """List the global runtime parameters (name, value as JSON)."""
    rows = [{"name": p.get("name"), "value": _json_text(p.get("value"))}
            for p in sorted(s.client.get("/api/global-parameters"), key=lambda p: p.get("name", ""))]
    s.printer.rows(("name", "value"), rows, ["Listing global runtime parameters ..."])


@command(cli, "set_global_parameter")
@click.argument("name")
@click.argument("value")
def set_global_parameter(s: Session, name: str, value: str) -> None:
    """Set a global runtime parameter: NAME VALUE (a JSON document)."""
    s.info(f'Setting global runtime parameter "{name}" to "{value}" ...')
    try:
        parsed = json.loads(value)
    except ValueError as e:
        raise CliError(f"JSON decoding error. Reason: {e}", EX_UNAVAILABLE) from None
    s.client.put(f"/api/global-parameters/{q(name)}", {"value": parsed})


@command(cli, "clear_global_parameter")
@click.argument("name")
def clear_global_parameter(s: Session, name: str) -> None:
    """Clear a global runtime parameter."""
    s.info(f'Clearing global runtime parameter "{name}" ...')
    _delete(s, f"/api/global-parameters/{q(name)}", "Parameter does not exist")


@command(cli, "list_parameters")
@_vhost_option
def list_parameters(s: Session, vhost: str) -> None:
    """List a vhost's runtime parameters (component, name, value as JSON)."""
    s.info(f'Listing runtime parameters for vhost "{vhost}" ...')
    s.client.get(f"/api/vhosts/{q(vhost)}")  # a vhost that does not exist is named, exit 65
    rows = [{"component": p.get("component"), "name": p.get("name"), "value": _json_text(p.get("value"))}
            for p in s.client.get("/api/parameters") if p.get("vhost") == vhost]
    s.printer.rows(("component", "name", "value"), rows)


@command(cli, "set_cluster_name")
@click.argument("name")
def set_cluster_name(s: Session, name: str) -> None:
    """Set the cluster's name (the `cluster_name` global parameter, shown by cluster_status)."""
    s.info(f"Setting cluster name to {name} ...")
    if not name:
        raise bad_argument("cluster name cannot be an empty string")
    s.client.put("/api/cluster-name", {"name": name})


# ---------------------------------------------------------------- the node

@command(cli, "shutdown")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the node's process has exited (its API stops answering when it is remote).")
def shutdown(s: Session, wait: bool) -> None:
    """Stop the node's app and its process, and wait until the process has exited."""
    state = s.client.get("/api/hutch/node/state")
    node, pid = state.get("node"), state.get("os_pid")
    s.info(f"Shutting down hutch node {node} running at PID {pid}")
    answered = request_stop(s) or int(pid or 0)
    if not wait:
        return
    s.info(f"Waiting for PID {pid} to terminate")
    wait_for_exit(s, answered)
    s.info(f"hutch node {node} running at PID {pid} successfully shut down")


@command(cli, "ping")
def ping(s: Session) -> None:
    """Succeed when the node's process answers, whether or not its app runs."""
    ping_node(s)


@command(cli, "environment")
def environment(s: Session) -> None:
    """The node's effective settings (secrets are shown as ********)."""
    show_environment(s)


@command(cli, "await_online_nodes")
@click.argument("count")
def await_online_nodes(s: Session, count: str) -> None:
    """Wait until COUNT nodes of the cluster are running (--timeout, default 300 seconds)."""
    try:
        wanted = int(count)
    except ValueError:
        wanted = 0
    if wanted <= 0:
        raise bad_argument("Argument must be a positive integer")
    limit = s.options.get("timeout") or AWAIT_ONLINE_TIMEOUT_S
    deadline = time.monotonic() + limit
    node = s.overview().get("node")
    s.info(f"Will wait for at least {wanted} nodes to join the cluster of {node}. Timeout: {limit:g} seconds.")
    while True:
        running = s.client.get("/api/hutch/cluster").get("running_nodes") or []
        if len(running) >= wanted:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise CliError(f"Error: timed out while waiting. Not enough nodes joined {node}'s cluster.", EX_SOFTWARE)
        time.sleep(min(POLL_S, left))


@command(cli, "node_health_check")
def node_health_check(s: Session) -> None:
    """DEPRECATED, as in RabbitMQ: fails when the node's app is stopped or a resource alarm is in
    effect (hutch-diagnostics check_running and check_local_alarms say which)."""
    for line in ("This command is DEPRECATED and will be removed in a future version.",
                 "It performs intrusive, opinionated health checks and requires a fully booted node.",
                 "Use one of the options covered in https://www.rabbitmq.com/monitoring.html#health-checks "
                 "instead.",
                 f"Timeout: {s.options.get('timeout') or NODE_HEALTH_CHECK_TIMEOUT_S:g} seconds ...",
                 f"Checking health of node {s.node} ..."):
        s.info(line)
    result = s.client.get("/api/healthchecks/node")
    if result.get("status") != "ok":
        raise CliError(f"Error: health check failed. Message: {result.get('reason')}", EX_SOFTWARE)
    s.printer.document({"result": "ok"}, "Health check passed")


@command(cli, "rotate_logs")
def rotate_logs(s: Session) -> None:
    """Refused, as rabbitmqctl 3.10 refuses it: logs are rotated by the logging setup, not on demand."""
    raise CliError("This command does not rotate logs anymore [deprecated]", EX_UNAVAILABLE)
