"""The `hutch` command: one entry point whose subcommands live in their own layers.

This module is the composition root and belongs to no layer: it only names where each
subcommand lives and imports it when it is asked for, so `hutch perf` never loads the
broker and `hutch server` never loads PySpark.
"""

from __future__ import annotations

import importlib

import click

# subcommand -> (module, attribute holding a click command, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "server": ("hutch.server.cli", "cli", "Run a hutch node."),
    "perf": ("hutch.lab.perf", "cli", "PerfTest-like load tool (producers, consumers, confirms, recording)."),
    "check": ("hutch.pipeline.check", "cli", "Check a recorded history with PySpark."),
    "sim": ("hutch.sim.cli", "cli", "Deterministic simulation of hutch: its cores and whole clusters."),
    "lab": ("hutch.lab.cli", "cli", "Local clusters and fault injection."),
    "definitions": ("hutch.cli.definitions", "cli", "Export and import definitions as JSON."),
}

# subcommands whose third-party packages come with an extra (`pip install 'hutch[lab]'`)
EXTRAS: dict[str, str] = {"check": "pipeline", "lab": "lab", "perf": "lab"}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx, name):
        spec = SUBCOMMANDS.get(name)
        if spec is None:
            return None
        module, attr, _ = spec
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                raise click.ClickException(f"'hutch {name}' is not available in this installation") from e
            extra = EXTRAS.get(name)
            if extra and e.name and not e.name.startswith("hutch"):
                raise click.ClickException(f"'hutch {name}' needs the {extra} extra ({e.name} is not installed): "
                                           f"pip install 'hutch[{extra}]'") from e
            raise
        return getattr(mod, attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, SUBCOMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hutch")
def main() -> None:
    """hutch: a clustered AMQP 0-9-1 message broker."""
