"""`hutch lab`: start a local cluster on loopback and break it on purpose.

A thin command-line layer over `hutch.lab.cluster.Lab`: every command names the lab by its
directory (``--dir``, default ./var/lab, or $HUTCH_LAB_DIR) and leaves the work to the lab's
controller process. Nodes are named as ``hutch-2``, ``hutch-2@localhost`` or by their 1-based
index ``2``. See docs/lab.md.
"""

from __future__ import annotations

import functools
import json

import click

from hutch.lab.campaign import campaign_cli
from hutch.lab.campaign_long import campaign_long_cli
from hutch.lab.cluster import (
    BASE_PORT_DEFAULT,
    LAB_DIR_DEFAULT,
    METADATA_TIMEOUT_MS_DEFAULT,
    NET_TICKTIME_S_DEFAULT,
    NODE_START_TIMEOUT_S_DEFAULT,
    PARTITION_MODE_DEFAULT,
    PARTITION_MODES,
    STOP_TIMEOUT_S_DEFAULT,
    UP_TIMEOUT_S_DEFAULT,
    ClockSkew,
    Lab,
    LabError,
)

dir_option = click.option("--dir", "lab_dir", default=LAB_DIR_DEFAULT, show_default=True, envvar="HUTCH_LAB_DIR",
                          type=click.Path(file_okay=False), help="The lab's directory [env HUTCH_LAB_DIR].")


def lab_errors(f):
    """Report a LabError as a one-paragraph error and exit status 1, without a traceback."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except LabError as e:
            raise click.ClickException(str(e)) from None
    return wrapper


def _fault_line(rec: dict) -> str:
    what = " ".join(rec.get("nodes") or [])
    return f"{rec['fault']} {what}".rstrip() + f"  (recorded at {rec['time_ms']} ms)"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Local clusters and fault injection.

    `hutch lab up 3` starts hutch-1..hutch-3@localhost on AMQP ports 5672.., HTTP 15672.. and
    peer 25672.., every peer link passing through a fault proxy; then partition, cut, heal, delay,
    kill, stop, start, suspend and resume break it, and faults.jsonl records what was done when.
    """


def _clock_skews(_ctx, _param, values: tuple[str, ...]) -> dict[str, ClockSkew]:
    out = {}
    for v in values:
        node, sep, rest = v.partition("=")
        parts = rest.split(",")
        try:
            if not sep or not node or len(parts) > 2:
                raise ValueError
            out[node] = ClockSkew(float(parts[0]), float(parts[1]) if len(parts) == 2 else 0.0)
        except ValueError:
            raise click.BadParameter(f"{v!r} is not NODE=WALL_MS or NODE=WALL_MS,BOOT_S") from None
    return out


@cli.command(short_help="Start an N-node lab and wait until it is healthy.")
@click.argument("count", type=click.IntRange(1, 16))
@click.option("--base-port", type=int, default=BASE_PORT_DEFAULT, show_default=True,
              help="Node i gets AMQP P+i, HTTP P+10000+i, peer P+20000+i.")
@dir_option
@click.option("--net-ticktime", type=float, default=NET_TICKTIME_S_DEFAULT, show_default=True,
              help="Seconds of peer silence before a node is down.")
@click.option("--metadata-timeout", type=int, default=METADATA_TIMEOUT_MS_DEFAULT, show_default=True,
              help="Milliseconds a catalogue change may wait for a majority.")
@click.option("--secret", default=None, help="The cluster secret (default: random).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False))
@click.option("--wait", type=click.Choice(["healthy", "http", "none"]), default="healthy", show_default=True,
              help="Return when the cluster is healthy, when every node's HTTP API answers, or at once.")
@click.option("--timeout", "timeout_s", type=float, default=UP_TIMEOUT_S_DEFAULT, show_default=True,
              help="Seconds to wait for it.")
@click.option("--clock", "clocks", multiple=True, metavar="NODE=WALL_MS[,BOOT_S]", callback=_clock_skews,
              help="Give NODE another host's clock: its wall clock WALL_MS ahead (negative: behind) and, "
                   "optionally, a boot BOOT_S seconds earlier. Repeatable.")
@lab_errors
def up(count, base_port, lab_dir, net_ticktime, metadata_timeout, secret, log_level, wait, timeout_s, clocks):
    """Start a COUNT-node cluster in the background and wait until it is healthy."""
    lab = Lab.up(count, lab_dir, base_port=base_port, net_ticktime_s=net_ticktime, secret=secret,
                 metadata_timeout_ms=metadata_timeout, log_level=log_level.lower(), wait=wait, timeout_s=timeout_s,
                 clocks=clocks)
    how = {"healthy": f"healthy, catalogue leader {lab.leader()}", "http": "every HTTP API answers",
           "none": "started, not waited for"}[wait]
    click.echo(f"Lab of {count} node(s) is up in {lab.dir} ({how}).")
    for n in lab.nodes:
        click.echo(f"  {n.name:<20} {n.amqp_url}  {n.http_url}/  peer {n.peer_port}")
    click.echo(f"Faults are recorded in {lab.dir / 'faults.jsonl'}.")
    click.echo(f"Stop it with: hutch lab down --dir {lab_dir}")


@cli.command(short_help="Nodes: pid, state, ports, HTTP; --links: proxies.")
@dir_option
@click.option("--links", "show_links", is_flag=True, help="Also list every proxied peer link.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@lab_errors
def status(lab_dir, show_links, as_json):
    """Every node: pid, state (running/stopped/suspended), ports, whether its HTTP API answers."""
    from rich.console import Console
    from rich.table import Table

    lab = Lab(lab_dir)
    rows = lab.status()
    running = lab.controller_running()
    links = lab.links() if show_links and running else []
    if as_json:
        click.echo(json.dumps({"controller_running": running, "nodes": rows, "links": links}, indent=2))
        return
    console = Console()
    table = Table(title=f"lab {lab.dir}")
    for col in ("node", "pid", "state", "amqp", "http", "peer", "http answers"):
        table.add_column(col)
    colour = {"running": "green", "stopped": "red", "suspended": "yellow"}
    for r in rows:
        table.add_row(r["name"], str(r["pid"] or "-"), f"[{colour[r['state']]}]{r['state']}[/]", str(r["amqp_port"]),
                      str(r["mgmt_port"]), str(r["peer_port"]), "yes" if r["http"] else "no")
    console.print(table)
    if links:
        lt = Table(title="peer links (from dials to, through the proxy)")
        for col in ("from", "to", "proxy port", "state", "delay ms", "connections", "bytes"):
            lt.add_column(col)
        for link in links:
            state = f"[red]cut ({link['partitioned']})[/]" if link["partitioned"] else "[green]open[/]"
            lt.add_row(link["from"].split("@")[0], link["to"].split("@")[0], str(link["listen_port"]), state, f"{link['delay_ms']:g}",
                       str(link["connections_accepted"]), str(link["bytes_forwarded"]))
        console.print(lt)
    if not running:
        console.print(f"[yellow]The lab controller is not running[/] (start a lab with `hutch lab up N --dir {lab_dir}`).")


@cli.command(short_help="Stop the nodes and the controller.")
@dir_option
@click.option("--wipe", is_flag=True, help="Also delete the lab directory (data, logs, faults.jsonl).")
@click.option("--timeout", "timeout_s", type=float, default=STOP_TIMEOUT_S_DEFAULT, show_default=True,
              help="Seconds a node has to stop after SIGTERM before it is killed.")
@lab_errors
def down(lab_dir, wipe, timeout_s):
    """Stop every node (SIGTERM, then SIGKILL) and the controller; keep the data unless --wipe."""
    done = Lab(lab_dir).down(wipe=wipe, timeout_s=timeout_s)
    for line in done or ["nothing was running"]:
        click.echo(line)


def _node_command(action: str, doc: str):
    @cli.command(name=action, help=doc)
    @click.argument("node")
    @dir_option
    @lab_errors
    def command(node, lab_dir):
        click.echo(_fault_line(getattr(Lab(lab_dir), action)(node)))
    return command


kill = _node_command("kill", "SIGKILL a node (kill -9).")
suspend = _node_command("suspend", "SIGSTOP a node: it keeps its sockets but answers nothing.")
resume = _node_command("resume", "SIGCONT a suspended node.")


@cli.command()
@click.argument("node")
@dir_option
@click.option("--timeout", "timeout_s", type=float, default=STOP_TIMEOUT_S_DEFAULT, show_default=True,
              help="Seconds to wait for it to exit before it is killed.")
@lab_errors
def stop(node, lab_dir, timeout_s):
    """Stop a node gracefully (SIGTERM) and wait for it to exit."""
    rec = Lab(lab_dir).stop(node, timeout_s=timeout_s)
    click.echo(_fault_line(rec) + ("" if rec.get("graceful") else f"; it did not stop in {timeout_s:g} s and was killed"))


@cli.command(short_help="Start a stopped node again.")
@click.argument("node")
@dir_option
@click.option("--timeout", "timeout_s", type=float, default=NODE_START_TIMEOUT_S_DEFAULT, show_default=True,
              help="Seconds to wait for its HTTP API to answer.")
@lab_errors
def start(node, lab_dir, timeout_s):
    """Start a stopped or killed node again (same command line) and wait until its HTTP API answers."""
    click.echo(_fault_line(Lab(lab_dir).start(node, timeout_s=timeout_s)))


@cli.command(short_help="Isolate NODES from the other nodes.")
@click.argument("nodes", nargs=-1, required=True)
@dir_option
@click.option("--mode", type=click.Choice(PARTITION_MODES), default=PARTITION_MODE_DEFAULT, show_default=True,
              help="blackhole: nothing passes, peers find out by net_ticktime; reset: links are reset at once.")
@lab_errors
def partition(nodes, lab_dir, mode):
    """Isolate NODES from the others: every link between a named and an unnamed node is cut, both ways."""
    rec = Lab(lab_dir).partition(*nodes, mode=mode)
    click.echo(_fault_line(rec) + f" | {' '.join(rec['rest'])}: {len(rec['links'])} directed links cut ({mode})")


@cli.command(short_help="Cut only the link between A and B: a partial partition.")
@click.argument("a")
@click.argument("b")
@dir_option
@click.option("--mode", type=click.Choice(PARTITION_MODES), default=PARTITION_MODE_DEFAULT, show_default=True,
              help="blackhole: nothing passes, peers find out by net_ticktime; reset: links are reset at once.")
@lab_errors
def cut(a, b, lab_dir, mode):
    """Cut the link between nodes A and B, both ways, and no other: each still reaches the rest
    (a partial partition, which pause_minority detects)."""
    rec = Lab(lab_dir).cut(a, b, mode=mode)
    click.echo(_fault_line(rec) + f": {len(rec['links'])} directed links cut ({mode})")


@cli.command()
@dir_option
@lab_errors
def heal(lab_dir):
    """Restore every link: no partition, no delay."""
    rec = Lab(lab_dir).heal()
    click.echo(_fault_line(rec) + f": {len(rec['links'])} cut and {len(rec['delayed_links'])} delayed links restored")


@cli.command(short_help="Delay the link between A and B by MS each way.")
@click.argument("a")
@click.argument("b")
@click.argument("ms", type=click.FloatRange(0, 600_000))
@dir_option
@lab_errors
def delay(a, b, ms, lab_dir):
    """Delay the link between nodes A and B by MS milliseconds each way (0 removes the delay)."""
    click.echo(_fault_line(Lab(lab_dir).delay(a, b, ms)) + f": {ms:g} ms each way")


@cli.command(short_help="Reproduce seed 002's gotchas of mirrored queues on a lab.")
@click.argument("name", required=False)
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and exit.")
@click.option("--dir", "lab_dir", default=None, type=click.Path(file_okay=False),
              help="The scenario's lab directory (default ./var/scenario/NAME); an earlier run's lab there "
                   "is removed first.")
@click.option("--base-port", type=int, default=BASE_PORT_DEFAULT, show_default=True,
              help="Base port of the scenario's lab (AMQP P+i, HTTP P+10000+i, peer P+20000+i).")
@click.option("--messages", type=click.IntRange(100, 10_000_000), default=200_000, show_default=True,
              help="sync-blocks: messages in the queue when the mirrors join.")
@click.option("--net-ticktime", type=click.FloatRange(1, 600), default=NET_TICKTIME_S_DEFAULT, show_default=True,
              help="Seconds of peer silence before a node is declared down.")
def scenario(name, list_only, lab_dir, base_port, messages, net_ticktime):
    """Run scenario NAME: start a 3-node lab, reproduce one behaviour of classic mirrored queues
    that seed 002 (the blog "RabbitMQ Mirrored Queues Gotchas") reports, print what happened with
    the node log lines that explain it, stop the lab. Exit status 0 when the behaviour matches
    the blog, 1 when it does not, 2 when the scenario could not run. See docs/lab.md."""
    from pathlib import Path

    from hutch.lab import scenarios

    if list_only:
        for sc in scenarios.SCENARIOS.values():
            click.echo(f"{sc.name:<22} {sc.title}")
        return
    if not name:
        raise click.UsageError(f"name a scenario ({', '.join(scenarios.SCENARIOS)}) or give --list")
    if name not in scenarios.SCENARIOS:
        raise click.UsageError(f"no scenario {name!r}; one of {', '.join(scenarios.SCENARIOS)}")
    opts = scenarios.Options(lab_dir=Path(lab_dir) if lab_dir else scenarios.default_dir(name), base_port=base_port,
                             messages=messages, net_ticktime_s=net_ticktime)
    raise SystemExit(scenarios.run(name, opts, echo=click.echo))


cli.add_command(campaign_cli)
cli.add_command(campaign_long_cli)
