"""What hutchctl, hutch-diagnostics and hutch-queues share: global options, the node, errors.

Global options are accepted before or after the command name, as rabbitmqctl accepts them
(`hutchctl -q list_queues` and `hutchctl list_queues -q` are the same):

    -n, --node NAME@HOST     the node to talk to (its host gives the URL when --url is not set)
    --url URL                the node's management API (env HUTCH_URL; default http://localhost:15672)
    --username, --password   credentials (env HUTCH_USERNAME / HUTCH_PASSWORD; default guest)
    -q, --quiet  -s, --silent    fewer informational lines
    -t, --timeout SECONDS    per request (default 60)
    --formatter table|json|pretty_table

Failures exit with rabbitmqctl's codes (see `hutch.cli.http`): a usage error, click's own
included, is 64; a command whose vhost or user does not exist names it and exits 65 or 67;
a request that outlives --timeout exits 75. `run_cli` is the entry point of every tool.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import sys
import time
from typing import Any

import click
import psutil

from hutch.cli.http import (
    DEFAULT_TIMEOUT_S,
    EX_DATAERR,
    EX_NOUSER,
    EX_SOFTWARE,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    EX_USAGE,
    Client,
    CliError,
    lab_node,
    q,
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
    def timeout(self) -> float:
        """Seconds each request may take (--timeout)."""
        return self.options.get("timeout") or DEFAULT_TIMEOUT_S

    @property
    def client(self) -> Client:
        if self._client is None:
            username = self.options.get("api_username") or os.environ.get("HUTCH_USERNAME") or "guest"
            password = self.options.get("api_password") or os.environ.get("HUTCH_PASSWORD") or "guest"
            self._client = Client(self.url, username, password, self.timeout)
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
                self._client = Client(self.url, username, password, self.timeout)
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
                e = _explain(s, name, params, e)
                click.echo(f"Error:\n{e.message}", err=True)
                sys.exit(e.exit_code)
        return run
    return decorate


def _missing(s: Session, path: str) -> bool:
    try:
        s.client.get(path)
    except CliError as e:
        return e.status == 404
    return False


def _explain(s: Session, name: str, params: dict[str, Any], e: CliError) -> CliError:
    """A failure in rabbitmqctl's words: a timeout names the command, and a "Not Found" names the
    virtual host or user of the command's arguments that does not exist."""
    if e.timed_out:
        return CliError(f"operation {name} on node {s.node_option or s.url} timed out. Timeout value used: "
                        f"{int(s.timeout * 1000)}", e.exit_code, timed_out=True)
    if e.status != 404 and not (e.status == 400 and "not_found" in e.message):  # vhost_or_user_not_found
        return e
    vhost, user = params.get("vhost"), params.get("username")
    if isinstance(vhost, str) and _missing(s, f"/api/vhosts/{q(vhost)}"):
        return CliError(f"Virtual host '{vhost}' does not exist", EX_DATAERR, 404)
    if isinstance(user, str) and _missing(s, f"/api/users/{q(user)}"):
        return CliError(f'User "{user}" does not exist', EX_NOUSER, 404)
    return e


def run_cli(group: click.Group, prog_name: str) -> None:
    """Run a tool: click's usage errors exit 64 (EX_USAGE) as rabbitmqctl's do, not click's 2, and
    an exception nobody expected exits 70 (EX_SOFTWARE) with its message."""
    try:
        rv = group.main(prog_name=prog_name, standalone_mode=False)
    except click.UsageError as e:
        e.show()
        sys.exit(EX_USAGE)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(1)
    except Exception as e:  # the tool's own failure: rabbitmqctl's "internal software error"
        click.echo(f"Error:\n{type(e).__name__}: {e}", err=True)
        sys.exit(EX_SOFTWARE)
    sys.exit(rv if isinstance(rv, int) else 0)


def usage_error(message: str) -> CliError:
    return CliError(f"(argument validation): {message}", EX_USAGE)


AWAIT_STARTUP_TIMEOUT_S = 300.0  # rabbitmq-diagnostics await_startup's default
POLL_S = 0.2


def _is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def await_startup(s: Session) -> None:
    """Wait until the node answers and its app runs; retries a node that is not up yet. Exits 69
    when the node never answered, 75 when it answered but its app did not start in time."""
    limit = s.options.get("timeout") or AWAIT_STARTUP_TIMEOUT_S
    deadline = time.monotonic() + limit
    s.info(f"Waiting for {s.node_option or s.url} to start up (timeout: {limit:g} seconds) ...")
    answered, last = False, None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            client = Client(s.url, *_credentials(s), min(left, s.timeout))
            state = client.get("/api/hutch/node/state")
            answered = True
            if state.get("app_running"):
                s.printer.document({"result": "ok", "node": state.get("node")},
                                   f"Node {state.get('node')} has started up")
                return
        except CliError as e:
            if e.status:  # the node answered with an error (credentials, permissions): no point waiting
                answered = True
                if e.status in (401, 403):
                    raise
            last = e
        time.sleep(min(POLL_S, max(deadline - time.monotonic(), 0)))
    if not answered:
        raise CliError(last.message if last is not None else f"no answer from {s.url}", EX_UNAVAILABLE)
    raise CliError(f"hutch on node {s.node_option or s.url} did not start within {limit:g} seconds",
                   EX_TEMPFAIL, timed_out=False)


def _credentials(s: Session) -> tuple[str, str]:
    return (s.options.get("api_username") or os.environ.get("HUTCH_USERNAME") or "guest",
            s.options.get("api_password") or os.environ.get("HUTCH_PASSWORD") or "guest")


def stop_node(s: Session) -> None:
    """Ask the node to stop its process, then wait (up to --timeout) until its API stops answering
    and, when it runs on this host, until the process has exited (rabbitmqctl stop)."""
    s.info(f"Stopping and halting node {s.node} ...")
    wait_for_exit(s, request_stop(s))


def request_stop(s: Session) -> int:
    """Ask the node to stop its process; its OS pid as it answered (0 when it did not say)."""
    answer = s.client.post("/api/hutch/node/stop", {}) or {}
    return int(answer.get("os_pid") or 0)


def wait_for_exit(s: Session, pid: int) -> None:
    """Wait (up to --timeout) until a node asked to stop no longer answers its API and, when it
    runs on this host, until process `pid` has exited; exits 75 when it outlives the wait."""
    deadline = time.monotonic() + s.timeout
    while time.monotonic() < deadline:
        try:
            Client(s.url, *_credentials(s), min(1.0, s.timeout)).get("/api/hutch/node/state")
        except CliError as e:
            if not e.status:
                break
        time.sleep(POLL_S)
    else:
        raise CliError(f"node {s.node} still answers after {s.timeout:g} seconds", EX_TEMPFAIL)
    if pid and _is_local(s.client.host):
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    return  # exited; its parent has not collected it yet
            except psutil.NoSuchProcess:
                return
            time.sleep(POLL_S / 4)
        raise CliError(f"node {s.node} (OS pid {pid}) has not exited after {s.timeout:g} seconds", EX_TEMPFAIL)


def ping_node(s: Session) -> None:
    """rabbitmqctl's and rabbitmq-diagnostics' `ping`: succeeds when the node's process answers,
    whether or not its app runs; 69 when it does not answer (77 when it refuses the credentials)."""
    target = s.node_option or s.url
    s.info(f"Will ping {target}. This only checks if the node's process is running and answers its API. "
           f"Timeout: {int(s.timeout * 1000)} ms.")
    try:
        state = s.client.get("/api/hutch/node/state")
    except CliError as e:
        if e.status in (401, 403):
            raise
        raise CliError(f"Failed to connect and authenticate to {target} in {int(s.timeout * 1000)} ms\n{e.message}",
                       EX_UNAVAILABLE) from None
    s.printer.document({"result": "ok", "node": state.get("node")}, "Ping succeeded")


def show_environment(s: Session) -> None:
    """`environment`: the node's effective settings, one `key = JSON value` a line (secrets as ********)."""
    doc = s.client.get("/api/hutch/node/environment")
    s.info(f"Application environment of node {doc.get('node')} ...")
    settings = doc.get("hutch") or {}
    s.printer.document(doc, "\n".join(f"{k} = {json.dumps(v)}" for k, v in sorted(settings.items())))
