"""`hutch-queues`: rabbitmq-queues' commands for replicated queues.

    hutch-queues quorum_status QUEUE [-p VHOST]     each member's Raft state of a quorum queue
    hutch-queues add_member QUEUE NODE [-p VHOST]   a new member (a learner until it has caught up)
    hutch-queues delete_member QUEUE NODE [-p VHOST]
    hutch-queues grow NODE all|even [--vhost-pattern P] [--queue-pattern P]
    hutch-queues shrink NODE [--errors-only]
    hutch-queues rebalance quorum|all [--vhost-pattern P] [--queue-pattern P]
        moves quorum queue leaders so the running nodes lead about as many each

    hutch-queues check_if_node_is_mirror_sync_critical
        fails (exit 69) when this node holds the only synchronised replica of a mirrored
        classic queue: stopping it would lose that queue's messages
    hutch-queues check_if_node_is_quorum_critical
        fails when stopping this node would leave a quorum queue or a stream without a majority

The two checks are hutch-diagnostics' commands of the same names (one implementation: the
node's health check endpoints), as rabbitmq-queues and rabbitmq-diagnostics share them.
"""

from __future__ import annotations

import click

from hutch.cli import diagnostics
from hutch.cli.common import Session, command, global_options, run_cli
from hutch.cli.http import EX_UNAVAILABLE, EX_USAGE, CliError, q


@click.group(name="hutch-queues", context_settings={"help_option_names": ["-h", "--help"]})
@global_options
def cli(**_options) -> None:
    """Replica health of a hutch node's queues (rabbitmq-queues' checks)."""


# The node checks, one implementation with hutch-diagnostics' (the node's health check endpoints)
cli.add_command(diagnostics.check_if_node_is_mirror_sync_critical)
cli.add_command(diagnostics.check_if_node_is_quorum_critical)

STATUS_COLUMNS = (("Node Name", "node"), ("Raft State", "raft_state"), ("Membership", "membership"),
                  ("Last Log Index", "last_log_index"), ("Last Written", "last_written"),
                  ("Last Applied", "last_applied"), ("Commit Index", "commit_index"),
                  ("Snapshot Index", "snapshot_index"), ("Term", "term"), ("Machine Version", "machine_version"))


def _vhost_option(f):
    return click.option("-p", "--vhost", default="/", show_default=True, help="Virtual host.")(f)


@command(cli, "quorum_status")
@_vhost_option
@click.argument("queue")
def quorum_status(s: Session, vhost: str, queue: str) -> None:
    """Each member's view of a quorum queue's Raft group (state, term, log, commit, applied)."""
    s.info(f"Status of quorum queue {queue} on node {s.node} ...")
    rows = _api(s, "GET", f"/api/hutch/quorum/{q(vhost)}/{q(queue)}/status", None, queue, vhost)
    s.printer.rows([h for h, _k in STATUS_COLUMNS], [{h: r.get(k) for h, k in STATUS_COLUMNS} for r in rows])


def _api(s: Session, method: str, path: str, body, queue: str, vhost: str):
    try:
        return s.client.request(method, path, body)
    except CliError as e:
        if e.status == 404:
            raise CliError(f"{{:error, :not_found}}: queue '{queue}' in vhost '{vhost}' does not exist",
                           EX_UNAVAILABLE, 404) from None
        raise


@command(cli, "add_member")
@_vhost_option
@click.argument("queue")
@click.argument("node_name", metavar="NODE")
def add_member(s: Session, vhost: str, queue: str, node_name: str) -> None:
    """Add a replica of a quorum queue on NODE."""
    s.info(f"Adding a replica for queue {queue} on node {node_name}...")
    _api(s, "POST", f"/api/hutch/quorum/{q(vhost)}/{q(queue)}/members", {"node": node_name}, queue, vhost)


@command(cli, "delete_member")
@_vhost_option
@click.argument("queue")
@click.argument("node_name", metavar="NODE")
def delete_member(s: Session, vhost: str, queue: str, node_name: str) -> None:
    """Remove the replica of a quorum queue on NODE."""
    s.info(f"Removing a replica of queue {queue} on node {node_name}...")
    _api(s, "DELETE", f"/api/hutch/quorum/{q(vhost)}/{q(queue)}/members/{q(node_name)}", None, queue, vhost)


def _membership_table(s: Session, rows: list[dict], errors_only: bool) -> None:
    if errors_only:
        rows = [r for r in rows if r.get("result") != "ok"]
    s.printer.rows(["vhost", "name", "size", "result"],
                   [{**r, "result": r["result"] if r["result"] == "ok" else f"error: {r.get('reason')}"} for r in rows])


@command(cli, "grow")
@click.argument("node_name", metavar="NODE")
@click.argument("strategy", type=click.Choice(["all", "even"]))
@click.option("--vhost-pattern", default=".*", show_default=True)
@click.option("--queue-pattern", default=".*", show_default=True)
@click.option("--errors-only", is_flag=True)
def grow(s: Session, node_name: str, strategy: str, vhost_pattern: str, queue_pattern: str, errors_only: bool) -> None:
    """Add a replica on NODE to every matching quorum queue (`even`: only those with an even count)."""
    s.info(f"Growing {strategy} quorum queues matching {queue_pattern!r} in vhosts {vhost_pattern!r} to "
           f"{node_name}...")
    rows = s.client.post("/api/hutch/quorum/grow", {"node": node_name, "strategy": strategy,
                                                   "vhost_pattern": vhost_pattern, "queue_pattern": queue_pattern})
    _membership_table(s, rows, errors_only)


@command(cli, "shrink")
@click.argument("node_name", metavar="NODE")
@click.option("--errors-only", is_flag=True)
def shrink(s: Session, node_name: str, errors_only: bool) -> None:
    """Remove NODE's replica from every quorum queue it is a member of (never the last one)."""
    s.info(f"Shrinking all quorum queues on {node_name}...")
    _membership_table(s, s.client.post("/api/hutch/quorum/shrink", {"node": node_name}), errors_only)


@command(cli, "rebalance")
@click.argument("queue_type", metavar="TYPE", type=click.Choice(["quorum", "all", "classic"]))
@click.option("--vhost-pattern", default=".*", show_default=True)
@click.option("--queue-pattern", default=".*", show_default=True)
def rebalance(s: Session, queue_type: str, vhost_pattern: str, queue_pattern: str) -> None:
    """Move quorum queue leaders so that the running nodes lead about as many queues each
    (`all` is the same here: classic queues have no leaders to move)."""
    if queue_type == "classic":
        raise CliError("classic queues are not rebalanced: only quorum queues have leaders to move "
                       "(use 'quorum' or 'all')", EX_USAGE)
    s.info("Re-balancing leaders of quorum queues...")
    out = s.client.post("/api/hutch/quorum/rebalance", {"vhost_pattern": vhost_pattern,
                                                        "queue_pattern": queue_pattern})
    for m in out["moves"]:
        done = "moved" if m["result"] == "ok" else f"not moved ({m.get('reason')})"
        s.info(f"Leader of quorum queue '{m['name']}' in vhost '{m['vhost']}' {done}: {m['from']} -> {m['to']}")
    s.printer.rows(["Node name", "Number of quorum queue leaders"],
                   [{"Node name": r["node"], "Number of quorum queue leaders": r["count"]} for r in out["leaders"]])


def main() -> None:
    run_cli(cli, "hutch-queues")


if __name__ == "__main__":
    main()
