"""`hutch-queues`: rabbitmq-queues' checks of what losing a node would do to its queues.

    hutch-queues check_if_node_is_mirror_sync_critical
        fails (exit 69) when this node holds the only synchronised replica of a mirrored
        classic queue: stopping it would lose that queue's messages
    hutch-queues check_if_node_is_quorum_critical
        fails when stopping this node would leave a quorum queue without a majority

Both read the queues' replica fields (`slave_nodes`, `synchronised_slave_nodes`, `members`,
`online`) from the node's HTTP API; a queue without them is not replicated.
"""

from __future__ import annotations

import click

from hutch.cli.common import Session, command, global_options
from hutch.cli.http import EX_UNAVAILABLE, CliError


@click.group(name="hutch-queues", context_settings={"help_option_names": ["-h", "--help"]})
@global_options
def cli(**_options) -> None:
    """Replica health of a hutch node's queues (rabbitmq-queues' checks)."""


def mirror_sync_critical(queues: list[dict], node: str) -> list[dict]:
    """Mirrored classic queues led by `node` that have no other synchronised replica."""
    out = []
    for qu in queues:
        if qu.get("type", "classic") != "classic" or not qu.get("slave_nodes"):
            continue
        if qu.get("node") != node:
            continue
        if not [n for n in qu.get("synchronised_slave_nodes") or [] if n != node]:
            out.append(qu)
    return out


def quorum_critical(queues: list[dict], node: str) -> list[dict]:
    """Quorum queues with a replica on `node` that would lose their majority without it."""
    out = []
    for qu in queues:
        if qu.get("type") != "quorum":
            continue
        members = qu.get("members") or []
        online = [n for n in qu.get("online") or [] if n != node]
        if node in members and len(online) < len(members) // 2 + 1:
            out.append(qu)
    return out


def _check(s: Session, what: str, pick) -> None:
    node = s.node
    s.info(f"Checking if node {node} is critical for {what} ...")
    critical = pick(s.client.get("/api/queues"), node)
    if critical:
        names = ", ".join(f"'{qu['name']}' in vhost '{qu['vhost']}'" for qu in critical)
        raise CliError(f"There are queues for which node {node} is critical ({what}): {names}", EX_UNAVAILABLE)
    s.printer.document({"result": "ok", "node": node}, f"Node {node} reported no queues for which it is critical")


@command(cli, "check_if_node_is_mirror_sync_critical")
def check_if_node_is_mirror_sync_critical(s: Session) -> None:
    """Fail when this node has the only synchronised replica of a mirrored classic queue."""
    _check(s, "the data safety of mirrored classic queues", mirror_sync_critical)


@command(cli, "check_if_node_is_quorum_critical")
def check_if_node_is_quorum_critical(s: Session) -> None:
    """Fail when stopping this node would leave a quorum queue without a majority."""
    _check(s, "the availability of quorum queues", quorum_critical)


def main() -> None:
    cli(prog_name="hutch-queues")


if __name__ == "__main__":
    main()
