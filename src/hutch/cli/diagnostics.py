"""`hutch-diagnostics`: rabbitmq-diagnostics' health checks, as a client of a node's HTTP API.

    hutch-diagnostics status
    hutch-diagnostics check_running
    hutch-diagnostics check_port_connectivity
    hutch-diagnostics list_policies_with_classic_queue_mirroring [-p VHOST]
    hutch-diagnostics check_if_cluster_has_classic_queue_mirroring_policy

A check that fails prints why on stderr and exits 69, so scripts and upgrade procedures can
use it as RabbitMQ's are used (classic queue mirroring must be gone before an upgrade to
RabbitMQ 4.x; the last check finds the policies that still ask for it).
"""

from __future__ import annotations

import socket

import click

from hutch.cli.common import Session, command, global_options
from hutch.cli.ctl import POLICY_COLUMNS, node_status, select, status_text
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


@command(cli, "check_running")
def check_running(s: Session) -> None:
    """Succeeds when the node's broker is running and answers its API."""
    node = s.overview().get("node")
    s.info(f"Checking if hutch is running on node {node} ...")
    s.printer.document({"result": "ok", "node": node}, f"hutch on node {node} is fully booted and running")


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


def main() -> None:
    cli(prog_name="hutch-diagnostics")


if __name__ == "__main__":
    main()
