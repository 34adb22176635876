"""What hutchctl, hutch-diagnostics and hutch-queues share: global options, the node, errors.

Global options are accepted before or after the command name, as rabbitmqctl accepts them
(`hutchctl -q list_queues` and `hutchctl list_queues -q` are the same):

    -n, --node NAME@HOST     the node to talk to (its host gives the URL when --url is not set)
    --url URL                the node's management API (env HUTCH_URL; default http://localhost:15672)
    --username, --password   credentials (env HUTCH_USERNAME / HUTCH_PASSWORD; default guest)
    -q, --quiet  -s, --silent    fewer informational lines
    -t, --timeout SECONDS    per request (default 60)
    --formatter table|json|pretty_table
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import click

from hutch.cli.http import (
    DEFAULT_TIMEOUT_S,
    EX_UNAVAILABLE,
    EX_USAGE,
    Client,
    CliError,
    lab_node,
    resolve_url,
)
from hutch.cli.output import FORMATTERS, Printer

_GLOBALS = ("node", "url", "api_username", "api_password", "quiet", "silent", "timeout", "formatter")


def global_options(f):
    """Add the global options to a group or a command (a command's values win)."""
    opts = [
        click.option("-n", "--node", default=None, help="Node name, NAME@HOST."),
        click.option("--url", default=None, help="Management API URL (env HUTCH_URL)."),
        click.option("--username", "api_username", default=None, help="User name (env HUTCH_USERNAME; default guest)."),
        click.option("--password", "api_password", default=None, help="Password (env HUTCH_PASSWORD; default guest)."),
        click.option("-q", "--quiet", is_flag=True, default=None, help="Fewer informational messages."),
        click.option("-s", "--silent", is_flag=True, default=None, help="No informational messages or headers."),
        click.option("-t", "--timeout", type=float, default=None, help="Request timeout, seconds (default 60)."),
        click.option("--formatter", type=click.Choice(FORMATTERS), default=None, help="Output format."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def lab_peer_address(node: str) -> str | None:
    """HOST:PORT of a node's peer listener when `hutch lab` started it here."""
    n = lab_node(node)
    return f"127.0.0.1:{n['peer_port']}" if n is not None and n.get("peer_port") else None


class Session:
    """One CLI invocation: options, the HTTP client and the printer."""

    def __init__(self, options: dict[str, Any]):
        self.options = options
        self.node_option = options.get("node")
        lab = lab_node(self.node_option)
        if lab is not None:
            self.node_option = lab["name"]  # hutch-2 names hutch-2@localhost of the local lab
        self.url = resolve_url(options.get("url"), self.node_option)
        self.printer = Printer(options.get("formatter") or "table", bool(options.get("quiet")),
                               bool(options.get("silent")))
        self._client: Client | None = None
        self._overview: dict | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            username = self.options.get("api_username") or os.environ.get("HUTCH_USERNAME") or "guest"
            password = self.options.get("api_password") or os.environ.get("HUTCH_PASSWORD") or "guest"
            self._client = Client(self.url, username, password, self.options.get("timeout") or DEFAULT_TIMEOUT_S)
            if self.node_option:
                node = self.overview().get("node")
                if node != self.node_option:
                    raise CliError(f"the node at {self.url} is '{node}', not '{self.node_option}'", EX_UNAVAILABLE)
        return self._client

    def overview(self) -> dict:
        if self._overview is None:
            if self._client is None:
                username = self.options.get("api_username") or os.environ.get("HUTCH_USERNAME") or "guest"
                password = self.options.get("api_password") or os.environ.get("HUTCH_PASSWORD") or "guest"
                self._client = Client(self.url, username, password,
                                      self.options.get("timeout") or DEFAULT_TIMEOUT_S)
            self._overview = self._client.get("/api/overview")
        return self._overview

    @property
    def node(self) -> str:
        return self.node_option or self.overview().get("node", "?")

    def info(self, line: str) -> None:
        self.printer.info(line)


def session(ctx: click.Context, local: dict[str, Any]) -> Session:
    merged: dict[str, Any] = {}
    for c in reversed(list(_contexts(ctx))):
        merged.update({k: v for k, v in c.params.items() if k in _GLOBALS and v is not None})
    merged.update({k: v for k, v in local.items() if k in _GLOBALS and v is not None})
    return Session(merged)


def _contexts(ctx: click.Context):
    c = ctx
    while c is not None:
        yield c
        c = c.parent


def command(group: click.Group, name: str, **kwargs):
    """Register a command that gets a `Session` as its first argument and the global options."""
    def decorate(f):
        @group.command(name=name, **kwargs)
        @global_options
        @click.pass_context
        @functools.wraps(f)
        def run(ctx: click.Context, **params):
            glob = {k: params.pop(k) for k in _GLOBALS}
            s = session(ctx, glob)
            try:
                f(s, **params)
            except CliError as e:
                click.echo(f"Error:\n{e.message}", err=True)
                sys.exit(e.exit_code)
        return run
    return decorate


def usage_error(message: str) -> CliError:
    return CliError(f"(argument validation): {message}", EX_USAGE)
