"""`hutch definitions export|import FILE`: a node's definitions as RabbitMQ's JSON document.

    hutch definitions export defs.json [--url http://host:15672]
    hutch definitions import defs.json [--skip-unsupported]

The same document as `GET /api/definitions` and `rabbitmqctl export_definitions`: users,
vhosts with their metadata, permissions, policies, operator policies, runtime parameters,
exchanges, queues and bindings, so definitions move between RabbitMQ and hutch. "-" is
stdout / stdin. An import is checked whole by the node before anything is applied: a file
with items the node cannot honour is refused, naming each, unless --skip-unsupported is
given, which imports the rest and prints what was skipped.
"""

from __future__ import annotations

import click

from hutch.cli.common import global_options
from hutch.cli.ctl import export_definitions, import_definitions


@click.group(name="definitions", context_settings={"help_option_names": ["-h", "--help"]})
@global_options
def cli(**_options) -> None:
    """Export and import definitions as JSON (over the node's HTTP API)."""


cli.add_command(export_definitions, name="export")
cli.add_command(import_definitions, name="import")
