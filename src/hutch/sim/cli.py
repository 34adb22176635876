"""`hutch sim`: the deterministic simulators, from the cores' (`raft`) to the whole cluster's
(`cluster`). The cluster simulator loads the node runtime, so it is imported only when asked for."""

from __future__ import annotations

import click

from hutch.raft.sim import cli as _cores


class _SimGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*_cores.commands, "cluster"})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "cluster":
            from hutch.sim.cluster import cluster_cmd
            return cluster_cmd
        return _cores.commands.get(name)


@click.group(cls=_SimGroup)
def cli() -> None:
    """Deterministic simulation of hutch: its cores, and whole clusters."""
