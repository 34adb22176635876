"""The `hutchctl` command group and the small helpers its command modules share.

`hutch.cli.ctl` and `hutch.cli.ctl_more` both register their commands on `cli`; keeping the group
here lets both import it without importing each other. Like the rest of the CLI it talks to a
node only through its HTTP API.
"""

from __future__ import annotations

import sys

import click

from hutch.cli.common import Session, global_options
from hutch.cli.http import EX_DATAERR, CliError


@click.group(name="hutchctl", context_settings={"help_option_names": ["-h", "--help"]})
@global_options
def cli(**_options) -> None:
    """Manage a hutch node through its management HTTP API (rabbitmqctl's commands)."""


def _vhost_option(f):
    return click.option("-p", "--vhost", default="/", show_default=True, help="Virtual host.")(f)


def _delete(s: Session, path: str, missing: str) -> None:
    try:
        s.client.delete(path)
    except CliError as e:
        if e.status == 404:
            raise CliError(missing, e.exit_code, 404) from None
        raise


def _password_given(password: str | None) -> str:
    """The password argument, else one line of stdin; nothing at all is refused as rabbitmqctl
    refuses it (a blank line is a blank password: password login disabled)."""
    if password is not None:
        return password
    line = sys.stdin.readline() if sys.stdin is not None else ""
    if not line:
        raise CliError("Password is not provided via argument or stdin", EX_DATAERR)
    return line.rstrip("\r\n")
