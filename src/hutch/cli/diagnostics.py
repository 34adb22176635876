"""`hutch-diagnostics`: rabbitmq-diagnostics' commands, as a client of a node's HTTP API.

    hutch-diagnostics ping                       the node's process answers (its app may be stopped)
    hutch-diagnostics status | cluster_status | listeners | alarms | environment
    hutch-diagnostics memory_breakdown [--unit mb]
    hutch-diagnostics log_tail [-N 50]
    hutch-diagnostics await_startup [--timeout 300]
    hutch-diagnostics check_running | check_alarms | check_local_alarms | check_virtual_hosts
    hutch-diagnostics check_port_listener PORT | check_protocol_listener PROTO
    hutch-diagnostics check_port_connectivity
    hutch-diagnostics check_if_node_is_quorum_critical | check_if_node_is_mirror_sync_critical
    hutch-diagnostics list_policies_with_classic_queue_mirroring [-p VHOST]
    hutch-diagnostics check_if_cluster_has_classic_queue_mirroring_policy

Output and exit codes follow rabbitmq-diagnostics: a check that passes prints one line and
exits 0; one that fails prints why on stderr and exits 69, so scripts, container health
checks and upgrade procedures use them as RabbitMQ's are used (classic queue mirroring must
be gone before an upgrade to RabbitMQ 4.x; the last check finds the policies that still ask
for it). The checks read the node's health check endpoints, which answer the truth after
`hutchctl stop_app`; this module never reads a node's files or processes directly.
"""

from __future__ import annotations

import socket

import click

from hutch.cli.common import (
    Session,
    await_startup,
    command,
    global_options,
    ping_node,
    run_cli,
    show_environment,
)
from hutch.cli.ctl import POLICY_COLUMNS, node_status, print_cluster_status, select, status_text
from hutch.cli.http import EX_UNAVAILABLE, CliError, q

CONNECT_TIMEOUT_S = 5.0


@click.group(name="hutch-diagnostics", context_settings={"help_option_names": ["-h", "--help"]})
@global_options
def cli(**_options) -> None:
    """Diagnostics and health checks of a hutch node (rabbitmq-diagnostics' commands)."""


@command(cli, "status")
def status(s: Session) -> None:
    """The node's status: versions, memory, disk, alarms, listeners."""
    overview, node = node_status(s)
    s.printer.document({"overview": overview, "node": node}, status_text(overview, node))


def _state(s: Session) -> dict:
    return s.client.get("/api/hutch/node/state")


@command(cli, "ping")
def ping(s: Session) -> None:
    """Succeeds when the node's process answers, whether or not its app runs."""
    ping_node(s)


@command(cli, "check_running")
def check_running(s: Session) -> None:
    """Succeeds when the node's app (the broker proper) is running; fails after stop_app."""
    state = _state(s)
    node = state.get("node")
    s.info(f"Checking if hutch is running on node {node} ...")
    if not state.get("app_running"):
        raise CliError(f"hutch on node {node} is not running or has not fully booted yet", EX_UNAVAILABLE)
    s.printer.document({"result": "ok", "node": node}, f"hutch on node {node} is fully booted and running")


@command(cli, "await_startup")
def await_startup_command(s: Session) -> None:
    """Wait until the node's app has started (--timeout, default 300 seconds)."""
    await_startup(s)


@command(cli, "cluster_status")
def cluster_status(s: Session) -> None:
    """The cluster's members, running nodes, the catalogue's leader, alarms and listeners."""
    print_cluster_status(s)


def _health(s: Session, check: str) -> tuple[bool, dict]:
    """One of the node's health check endpoints: (passed, its JSON answer)."""
    try:
        return True, s.client.get(f"/api/health/checks/{check}") or {}
    except CliError as e:
        if e.status == 503 and isinstance(e.body, dict):
            return False, e.body
        raise


def _alarm_line(a: dict) -> str:
    what = {"memory": "Memory", "disk": "Free disk space"}.get(a.get("resource"), str(a.get("resource")))
    return f"{what} alarm on node {a.get('node')}"


@command(cli, "alarms")
def alarms(s: Session) -> None:
    """List the resource alarms in effect in the cluster."""
    node = s.node
    found = [{"node": n["name"], "resource": r} for n in s.client.get("/api/nodes") if n.get("running")
             for r, key in (("memory", "mem_alarm"), ("disk", "disk_free_alarm")) if n.get(key)]
    s.info(f"Asking node {node} to report any known resource alarms ...")
    if s.printer.formatter == "json":
        s.printer.document(found, "")
    elif found:
        click.echo("\n".join(_alarm_line(a) for a in found))
    else:
        click.echo(f"Node {node} reported no alarms, local or clusterwide")


def _alarm_check(s: Session, check: str, scope: str) -> None:
    node = s.node
    s.info(f"Asking node {node} to report any {scope} resource alarms ...")
    passed, doc = _health(s, check)
    if not passed:
        lines = [str(doc.get("reason", ""))] + [_alarm_line(a) for a in doc.get("alarms", [])]
        raise CliError("\n".join(lines), EX_UNAVAILABLE)
    text = f"Node {node} reported no alarms, local or clusterwide" if scope == "known" else \
        f"Node {node} reported no local alarms"
    s.printer.document({"result": "ok", "node": node}, text)


@command(cli, "check_alarms")
def check_alarms(s: Session) -> None:
    """Fail (exit 69) when any resource alarm is in effect in the cluster, or the app is stopped."""
    _alarm_check(s, "alarms", "known")


@command(cli, "check_local_alarms")
def check_local_alarms(s: Session) -> None:
    """Fail (exit 69) when a resource alarm is in effect on this node, or its app is stopped."""
    _alarm_check(s, "local-alarms", "local")


@command(cli, "check_port_listener")
@click.argument("port", type=click.IntRange(1, 65535))
def check_port_listener(s: Session, port: int) -> None:
    """Fail (exit 69) when no listener of the node is bound to PORT."""
    node = s.node
    s.info(f"Checking if there are any active listeners on port {port} on node {node} ...")
    passed, doc = _health(s, f"port-listener/{port}")
    if not passed:
        ports = ", ".join(str(p) for p in doc.get("ports", []))
        raise CliError(f"No listener for port {port} is active on node {node}. Found listeners that use the "
                       f"following ports: {ports or '(none)'}", EX_UNAVAILABLE)
    s.printer.document({"result": "ok", "node": node, "port": port},
                       f"A listener for port {port} is running on node {node}.")


@command(cli, "check_protocol_listener")
@click.argument("protocol")
def check_protocol_listener(s: Session, protocol: str) -> None:
    """Fail (exit 69) when the node has no listener for PROTOCOL (amqp, amqp/ssl, http, ...)."""
    node = s.node
    s.info(f"Checking if there are any active listeners for protocol {protocol} on node {node} ...")
    passed, doc = _health(s, f"protocol-listener/{q(protocol)}")
    if not passed:
        found = ", ".join(doc.get("protocols", []))
        raise CliError(f"No listener for protocol {protocol} is active on node {node}. Found listeners for the "
                       f"following protocols: {found or '(none)'}", EX_UNAVAILABLE)
    s.printer.document({"result": "ok", "node": node, "protocol": protocol},
                       f"A listener for protocol {protocol} is running on node {node}.")


@command(cli, "check_virtual_hosts")
def check_virtual_hosts(s: Session) -> None:
    """Fail (exit 69) when any virtual host is down on the node (all are while its app is stopped)."""
    node = s.node
    s.info(f"Checking if all vhosts are running on node {node} ...")
    passed, doc = _health(s, "virtual-hosts")
    if not passed:
        down = ", ".join(doc.get("virtual-hosts", []))
        raise CliError(f"{doc.get('reason')} on node {node}: {down}", EX_UNAVAILABLE)
    s.printer.document({"result": "ok", "node": node}, f"Node {node} reported all vhosts as running")


def _critical_check(s: Session, check: str, what: str) -> None:
    node = s.node
    s.info(f"Checking if node {node} is critical for {what} ...")
    passed, doc = _health(s, check)
    if not passed:
        names = ", ".join(qu.get("readable_name", qu.get("name", "")) for qu in doc.get("queues", []))
        raise CliError(f"{doc.get('reason')}" + (f": {names}" if names else ""), EX_UNAVAILABLE)
    s.printer.document({"result": "ok", "node": node}, f"Node {node} reported no queues for which it is critical")


# hutch-queues offers these two checks too (rabbitmq-queues has them as well): the same commands
@command(cli, "check_if_node_is_quorum_critical")
def check_if_node_is_quorum_critical(s: Session) -> None:
    """Fail (exit 69) when stopping this node would leave a quorum queue or a stream without a majority."""
    _critical_check(s, "node-is-quorum-critical", "quorum of any quorum queues")


@command(cli, "check_if_node_is_mirror_sync_critical")
def check_if_node_is_mirror_sync_critical(s: Session) -> None:
    """Fail (exit 69) when this node has the only synchronised replica of a mirrored classic queue."""
    _critical_check(s, "node-is-mirror-sync-critical", "data safety of mirrored queues")


LISTENER_PURPOSES = {"amqp": "AMQP 0-9-1", "amqp/ssl": "AMQP 0-9-1 over TLS", "http": "HTTP API",
                     "https": "HTTP API over TLS", "clustering": "inter-node communication",
                     "stream": "stream protocol"}


@command(cli, "listeners")
def listeners(s: Session) -> None:
    """The node's active listeners: interface, port, protocol and purpose."""
    overview = s.overview()
    node = overview.get("node")
    found = [{**ln, "purpose": LISTENER_PURPOSES.get(ln.get("protocol"), ln.get("protocol"))}
             for ln in overview.get("listeners", []) if ln.get("node", node) == node]
    s.info(f"Asking node {node} to report its protocol listeners ...")
    s.printer.document(found, "\n".join(f"Interface: {ln.get('ip_address')}, port: {ln.get('port')}, protocol: "
                                        f"{ln.get('protocol')}, purpose: {ln['purpose']}" for ln in found))


UNITS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000 ** 2, "mib": 1024 ** 2, "gb": 1000 ** 3, "gib": 1024 ** 3}


@command(cli, "memory_breakdown")
@click.option("--unit", type=click.Choice(sorted(UNITS), case_sensitive=False), default="gb", show_default=True,
              help="The unit of the amounts.")
def memory_breakdown(s: Session, unit: str) -> None:
    """The node's memory use by category, largest first, with each one's share of the total."""
    doc = s.client.get("/api/hutch/node/memory")
    node = doc.get("node")
    total = (doc.get("total") or {}).get("rss") or 0
    rows = sorted((doc.get("breakdown") or {}).items(), key=lambda kv: -kv[1])
    s.info(f"Reporting memory breakdown on node {node}...")
    div = UNITS[unit.lower()]
    lines = [f"{k}: {v / div:.4f} {unit.lower()} ({(100.0 * v / total) if total else 0.0:.2f}%)" for k, v in rows]
    lines.append(f"total (resident set size): {total / div:.4f} {unit.lower()}")
    s.printer.document(doc, "\n".join(lines))


@command(cli, "environment")
def environment(s: Session) -> None:
    """The node's effective settings (secrets are shown as ********)."""
    show_environment(s)


@command(cli, "log_tail")
@click.option("-N", "--number", "number", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="How many of the last lines.")
def log_tail(s: Session, number: int) -> None:
    """The last lines of the node's log file."""
    doc = s.client.get(f"/api/hutch/node/log?lines={number}")
    s.info(f"Last {number} log lines on node {doc.get('node')} ...")
    lines = doc.get("lines") or []
    s.printer.document(lines, "\n".join(lines))


def _listener_host(ip: str, fallback: str) -> str:
    return fallback if ip in ("0.0.0.0", "::", "", None) else ip


@command(cli, "check_port_connectivity")
def check_port_connectivity(s: Session) -> None:
    """Open a TCP connection to every listener of the node."""
    overview = s.overview()
    node = overview.get("node")
    s.info(f"Testing TCP connections to all active listeners on node {node} ...")
    ok, failed = [], []
    for ln in overview.get("listeners", []):
        host = _listener_host(ln.get("ip_address"), s.client.host)
        port = ln.get("port")
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
                ok.append(port)
        except OSError as e:
            failed.append(f"{host}:{port} ({ln.get('protocol')}): {e}")
    if failed:
        raise CliError("Connection to the following listeners failed:\n" + "\n".join(failed), EX_UNAVAILABLE)
    s.printer.document({"result": "ok", "ports": ok},
                       f"Successfully connected to ports {', '.join(str(p) for p in ok)} on node {node}.")


MIGRATION_HINT = ("Classic queue mirroring is deprecated (seed 000): move the queues these policies match to "
                  "quorum queues with 'hutchctl migrate_to_quorum QUEUE' or 'hutchctl migrate_to_quorum "
                  "--all-matching PATTERN' (docs/migration.md).")


def _mirroring_policies(s: Session, vhost: str | None) -> list[dict]:
    path = "/api/policies" if vhost is None else f"/api/policies/{q(vhost)}"
    return [p for p in s.client.get(path) if "ha-mode" in (p.get("definition") or {})]


@command(cli, "list_policies_with_classic_queue_mirroring")
@click.option("-p", "--vhost", default="/", show_default=True, help="Virtual host.")
def list_policies_with_classic_queue_mirroring(s: Session, vhost: str) -> None:
    """List the policies that enable classic queue mirroring (ha-mode) in a vhost."""
    cols = ("vhost", "name", "pattern", "apply-to", "definition", "priority")
    _, rows = select(_mirroring_policies(s, vhost), cols, POLICY_COLUMNS, cols)
    s.printer.rows(cols, rows, [f'Listing policies with classic queue mirroring for vhost "{vhost}" ...'])
    if rows:
        s.info(MIGRATION_HINT)


@command(cli, "check_if_cluster_has_classic_queue_mirroring_policy")
def check_if_cluster_has_classic_queue_mirroring_policy(s: Session) -> None:
    """Fail (exit 69) when any vhost has a policy that enables classic queue mirroring."""
    s.info("Checking if cluster has any classic queue mirroring policy ...")
    found = _mirroring_policies(s, None)
    if found:
        names = ", ".join(f"'{p['name']}' in vhost '{p['vhost']}'" for p in found)
        raise CliError(f"Cluster reported classic queue mirroring policies: {names}\n{MIGRATION_HINT}",
                       EX_UNAVAILABLE)
    s.printer.document({"result": "ok"}, "Cluster reported no classic queue mirroring policies")


@cli.command(name="help")
@click.argument("command_name", required=False)
@click.pass_context
def help_command(ctx: click.Context, command_name: str | None) -> None:
    """Show help for a command."""
    group = ctx.parent.command
    cmd = group.get_command(ctx, command_name) if command_name else None
    if command_name and cmd is None:
        raise click.UsageError(f"no such command: {command_name}")
    if cmd is None:
        click.echo(group.get_help(ctx.parent))
        return
    with click.Context(cmd, info_name=command_name, parent=ctx.parent) as sub:
        click.echo(cmd.get_help(sub))


def main() -> None:
    run_cli(cli, "hutch-diagnostics")


if __name__ == "__main__":
    main()
