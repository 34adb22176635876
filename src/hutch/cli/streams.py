"""`hutch-streams`: rabbitmq-streams' commands, against a node's HTTP API.

    hutch-streams stream_status STREAM [-p VHOST] [--tracking]
        one row per member: role (writer = the leader), node, epoch (Raft term), offset,
        committed_offset, first_offset, readers, segments, bytes; --tracking: the stored
        consumer offsets and the writers' publishing sequences
    hutch-streams add_replica STREAM NODE [-p VHOST]     a new member, caught up from the others
    hutch-streams delete_replica STREAM NODE [-p VHOST]
    hutch-streams add_super_stream NAME [-p VHOST] [--partitions N | --binding-keys a,b]
        [--max-length-bytes 20gb] [--max-age PT10M] [--stream-max-segment-size-bytes 500mb]
        [--leader-locator client-local|balanced] [--initial-cluster-size N]
    hutch-streams delete_super_stream NAME [-p VHOST]
    hutch-streams list_stream_connections [COLUMN ...]
    hutch-streams list_stream_consumers [-p VHOST] [COLUMN ...]
    hutch-streams list_stream_publishers [-p VHOST] [COLUMN ...]
    hutch-streams list_stream_group_consumers --stream S --reference R [-p VHOST] [COLUMN ...]
    hutch-streams list_stream_consumer_groups [-p VHOST] [COLUMN ...]
        stream, reference, partition_index, consumers: the single-active-consumer groups
    hutch-streams list_stream_tracking STREAM [--all | --offset | --writer] [-p VHOST]
        type (offset or writer), name, tracking_value: the stored consumer offsets and the
        publishers' last publishing ids

Banners, messages, columns and errors are rabbitmq-streams' (RabbitMQ 3.13). This module never
imports the broker: it knows a node only through its API (hutch.control.streams).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import click

from hutch.cli.common import Session, command, global_options, run_cli, usage_error
from hutch.cli.ctl import select
from hutch.cli.http import EX_SOFTWARE, EX_UNAVAILABLE, CliError, q


@click.group(name="hutch-streams", context_settings={"help_option_names": ["-h", "--help"]})
@global_options
def cli(**_options) -> None:
    """Streams of a hutch node (rabbitmq-streams' commands)."""


def _vhost_option(f):
    return click.option("-p", "--vhost", default="/", show_default=True, help="Virtual host.")(f)


def _columns(f):
    return click.argument("columns", nargs=-1)(f)


def _api(s: Session, method: str, path: str, body: Any, stream: str, vhost: str,
         not_a_stream: Callable[[str], str] | None = None) -> Any:
    try:
        return s.client.request(method, path, body)
    except CliError as e:
        if e.status == 404 and "/streams/" in path:
            raise CliError(f"{{:error, :not_found}}: queue '{stream}' in vhost '{vhost}' does not exist",
                           EX_UNAVAILABLE, 404) from None
        error = (e.body or {}).get("error", "") if isinstance(e.body, dict) else ""
        if not_a_stream is not None and error.endswith("_queue_not_supported"):
            raise CliError(not_a_stream(error.removesuffix("_queue_not_supported")), e.exit_code, e.status) from None
        raise


# ---------------------------------------------------------------- status and replicas

STATUS_COLUMNS = ("role", "node", "epoch", "offset", "committed_offset", "first_offset", "readers", "segments",
                  "bytes")
TRACKING_COLUMNS = ("type", "reference", "value")


@command(cli, "stream_status")
@_vhost_option
@click.option("--tracking", is_flag=True, help="The stored offsets and writer sequences instead.")
@click.argument("stream")
def stream_status(s: Session, vhost: str, tracking: bool, stream: str) -> None:
    """Displays the status of a stream (one row per member)."""
    s.info(f"Status of stream {stream} on node {s.node} ...")
    path = f"/api/hutch/streams/{q(vhost)}/{q(stream)}/status" + ("?tracking=true" if tracking else "")
    rows = _api(s, "GET", path, None, stream, vhost, lambda t: f"Cannot get stream status of a {t} queue")
    s.printer.rows(TRACKING_COLUMNS if tracking else STATUS_COLUMNS, rows)


@command(cli, "add_replica")
@_vhost_option
@click.argument("stream")
@click.argument("node_name", metavar="NODE")
def add_replica(s: Session, vhost: str, stream: str, node_name: str) -> None:
    """Adds a stream queue replica on the given node."""
    s.info(f"Adding a replica for queue {stream} on node {node_name}...")
    _api(s, "POST", f"/api/hutch/streams/{q(vhost)}/{q(stream)}/replicas", {"node": node_name}, stream, vhost,
         lambda t: f"Cannot add replicas to a {t} queue")


@command(cli, "delete_replica")
@_vhost_option
@click.argument("stream")
@click.argument("node_name", metavar="NODE")
def delete_replica(s: Session, vhost: str, stream: str, node_name: str) -> None:
    """Removes a stream queue replica on the given node."""
    s.info(f"Removing a replica of queue {stream} on node {node_name}...")
    _api(s, "DELETE", f"/api/hutch/streams/{q(vhost)}/{q(stream)}/replicas/{q(node_name)}", None, stream, vhost,
         lambda t: f"Cannot delete replicas from a {t} queue")


# ---------------------------------------------------------------- super streams

_UNITS = {"": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1024 ** 2, "mib": 1024 ** 2, "mb": 1000 ** 2,
          "g": 1024 ** 3, "gib": 1024 ** 3, "gb": 1000 ** 3, "t": 1024 ** 4, "tib": 1024 ** 4, "tb": 1000 ** 4}
_DURATION = re.compile(r"^P(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")


def information_unit(value: str) -> int | None:
    """"20gb", "500mb", "1GiB", "1024" as bytes (rabbit_resource_monitor_misc's units); None
    when it is none of them."""
    m = re.match(r"^(\d+)([a-zA-Z]*)$", value.strip())
    if m is None or m.group(2).lower() not in _UNITS:
        return None
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def duration_s(value: str) -> int | None:
    """An ISO 8601 duration ("PT10M30S", "P5DT8H") in seconds, a year 365 days and a month 30
    as RabbitMQ counts them; None when it is not one."""
    m = _DURATION.match(value.strip().upper())
    if m is None or value.strip().upper() in ("P", "PT") or value.strip().upper().endswith("T"):
        return None
    y, mo, d, h, mi, sec = (int(x or 0) for x in m.groups())
    return y * 365 * 86400 + mo * 30 * 86400 + d * 86400 + h * 3600 + mi * 60 + sec


def super_stream_arguments(max_length_bytes: str | None, max_age: str | None, segment_bytes: str | None,
                           leader_locator: str | None, initial_cluster_size: int | None) -> dict[str, Any]:
    """The options as the super stream's `arguments`, checked as rabbitmq-streams checks them."""
    args: dict[str, Any] = {}
    if max_length_bytes is not None:
        n = information_unit(max_length_bytes)
        if n is None:
            raise usage_error("Invalid value for --max-length-bytes, valid example values: 100gb, 50mb")
        args["max-length-bytes"] = n
    if max_age is not None:
        secs = duration_s(max_age)
        if secs is None:
            raise usage_error("Invalid value for --max-age, the value must a ISO 8601 duration, e.g. e.g. "
                              "PT10M30S for 10 minutes 30 seconds, P5DT8H for 5 days 8 hours.")
        args["max-age"] = f"{secs}s"
    if segment_bytes is not None:
        n = information_unit(segment_bytes)
        if n is None:
            raise usage_error("Invalid value for --stream-max-segment-size-bytes, valid example values: 100gb, 50mb")
        args["stream-max-segment-size-bytes"] = n
    if leader_locator is not None:
        if leader_locator not in ("client-local", "balanced", "random", "least-leaders"):
            raise usage_error("Invalid value for --leader-locator, valid values are client-local, balanced.")
        args["queue-leader-locator"] = "balanced" if leader_locator in ("random", "least-leaders") else leader_locator
    if initial_cluster_size is not None:
        if initial_cluster_size <= 0:
            raise usage_error("Invalid value for --initial-cluster-size, the value must be positive.")
        args["initial-cluster-size"] = initial_cluster_size
    return args


@command(cli, "add_super_stream")
@_vhost_option
@click.option("--partitions", type=int, default=None, help="The number of partitions, default is 3.")
@click.option("--binding-keys", default=None, help="Comma-separated list of binding keys.")
@click.option("--routing-keys", default=None, hidden=True)
@click.option("--max-length-bytes", default=None, help="The maximum size of partition streams, e.g. 20gb.")
@click.option("--max-age", default=None, help="The maximum age of partition stream segments, e.g. PT10M30S.")
@click.option("--stream-max-segment-size-bytes", default=None, help="The maximum size of segments, e.g. 500mb.")
@click.option("--leader-locator", default=None, help="client-local or balanced.")
@click.option("--initial-cluster-size", type=int, default=None, help="The initial cluster size of partitions.")
@click.argument("name")
def add_super_stream(s: Session, vhost: str, partitions: int | None, binding_keys: str | None,
                     routing_keys: str | None, max_length_bytes: str | None, max_age: str | None,
                     stream_max_segment_size_bytes: str | None, leader_locator: str | None,
                     initial_cluster_size: int | None, name: str) -> None:
    """Add a super stream: a direct exchange and a stream per partition bound to it."""
    if routing_keys is not None and binding_keys is not None:
        raise usage_error("Specify --binding-keys only.")
    binding_keys = binding_keys if binding_keys is not None else routing_keys
    if partitions is not None and binding_keys is not None:
        raise usage_error("Specify --partitions or --binding-keys, not both.")
    if partitions is not None and partitions < 1:
        raise usage_error("The partition number must be greater than 0")
    args = super_stream_arguments(max_length_bytes, max_age, stream_max_segment_size_bytes, leader_locator,
                                  initial_cluster_size)
    body: dict[str, Any] = {"arguments": args}
    if binding_keys is not None:
        body["binding-keys"] = binding_keys
    else:
        body["partitions"] = partitions if partitions is not None else 3
    s.info("Adding a super stream...")
    try:
        s.client.put(f"/api/stream/super-streams/{q(vhost)}/{q(name)}", body)
    except CliError as e:
        if e.status == 400:
            raise CliError(e.message, EX_SOFTWARE, e.status) from None
        raise
    click.echo(f"Super stream {name} has been created")


@command(cli, "delete_super_stream")
@_vhost_option
@click.argument("name")
def delete_super_stream(s: Session, vhost: str, name: str) -> None:
    """Delete a super stream: its exchange and its partition streams."""
    s.info("Deleting a super stream...")
    try:
        s.client.delete(f"/api/stream/super-streams/{q(vhost)}/{q(name)}")
    except CliError as e:
        if e.status == 404:
            raise CliError("{:error, :stream_not_found}", EX_SOFTWARE, 404) from None
        raise
    click.echo(f"Super stream {name} has been deleted")


# ---------------------------------------------------------------- connections, consumers, publishers

def _pid(o: dict) -> str:
    d = o.get("connection_details") or {}
    return f"<{d.get('node')}.{d.get('name')}>"


def _get(key: str) -> Callable[[dict], Any]:
    return lambda o: o.get(key)


CONNECTION_COLUMNS: dict[str, Callable[[dict], Any]] = {
    "conn_name": _get("name"), "port": _get("port"), "peer_port": _get("peer_port"), "host": _get("host"),
    "peer_cert_issuer": lambda o: None, "peer_cert_subject": lambda o: None, "peer_cert_validity": lambda o: None,
    "peer_host": _get("peer_host"), "user": _get("user"), "vhost": _get("vhost"),
    "subscriptions": _get("subscriptions"), "ssl": _get("ssl"), "ssl_cipher": lambda o: None,
    "ssl_hash": lambda o: None, "ssl_key_exchange": lambda o: None, "ssl_protocol": lambda o: None,
    "connection_state": _get("state"), "auth_mechanism": _get("auth_mechanism"), "heartbeat": _get("timeout"),
    "frame_max": _get("frame_max"), "client_properties": _get("client_properties"),
    "connected_at": _get("connected_at"), "node": _get("node"),
}
CONSUMER_COLUMNS: dict[str, Callable[[dict], Any]] = {
    "connection_pid": _pid, "node": lambda o: (o.get("connection_details") or {}).get("node"),
    "subscription_id": _get("subscription_id"), "stream": lambda o: (o.get("queue") or {}).get("name"),
    "messages_consumed": _get("consumed"), "offset": _get("offset"), "offset_lag": _get("offset_lag"),
    "credits": _get("credits"), "active": _get("active"), "activity_status": _get("activity_status"),
    "properties": _get("properties"),
}
PUBLISHER_COLUMNS: dict[str, Callable[[dict], Any]] = {
    "connection_pid": _pid, "node": lambda o: (o.get("connection_details") or {}).get("node"),
    "publisher_id": _get("publisher_id"), "stream": lambda o: (o.get("queue") or {}).get("name"),
    "reference": _get("reference"), "messages_published": _get("published"),
    "messages_confirmed": _get("confirmed"), "messages_errored": _get("errored"),
}
GROUP_CONSUMER_COLUMNS: dict[str, Callable[[dict], Any]] = {
    k: _get(k) for k in ("subscription_id", "connection_name", "state")}
CONSUMER_GROUP_COLUMNS: dict[str, Callable[[dict], Any]] = {
    k: _get(k) for k in ("stream", "reference", "partition_index", "consumers")}


def _listing(s: Session, path: str, columns: tuple[str, ...], table: dict, default: tuple[str, ...],
             verbose: bool, banner: str) -> None:
    select([], columns, table, default)  # an unknown column is a usage error before any request
    cols, rows = select(s.client.get(path), tuple(table) if verbose else columns, table, default)
    s.printer.rows(cols, rows, [banner])


def _verbose_option(f):
    return click.option("-V", "--verbose", is_flag=True, help="Every column.")(f)


@command(cli, "list_stream_connections")
@_verbose_option
@_columns
def list_stream_connections(s: Session, verbose: bool, columns: tuple[str, ...]) -> None:
    """Lists stream connections (default column: conn_name)."""
    _listing(s, "/api/stream/connections", columns, CONNECTION_COLUMNS, ("conn_name",), verbose,
             "Listing stream connections ...")


@command(cli, "list_stream_consumers")
@_vhost_option
@_verbose_option
@_columns
def list_stream_consumers(s: Session, vhost: str, verbose: bool, columns: tuple[str, ...]) -> None:
    """Lists all stream consumers for a vhost."""
    _listing(s, f"/api/stream/consumers/{q(vhost)}", columns, CONSUMER_COLUMNS, tuple(CONSUMER_COLUMNS), verbose,
             "Listing stream consumers ...")


@command(cli, "list_stream_publishers")
@_vhost_option
@_verbose_option
@_columns
def list_stream_publishers(s: Session, vhost: str, verbose: bool, columns: tuple[str, ...]) -> None:
    """Lists all stream publishers for a vhost."""
    default = tuple(c for c in PUBLISHER_COLUMNS if c not in ("connection_pid", "node"))
    _listing(s, f"/api/stream/publishers/{q(vhost)}", columns, PUBLISHER_COLUMNS, default, verbose,
             "Listing stream publishers ...")


@command(cli, "list_stream_group_consumers")
@_vhost_option
@_verbose_option
@click.option("--stream", "stream", default=None, help="The stream of the group.")
@click.option("--reference", default=None, help="The group's name (its consumers' reference).")
@_columns
def list_stream_group_consumers(s: Session, vhost: str, verbose: bool, stream: str | None, reference: str | None,
                                columns: tuple[str, ...]) -> None:
    """Lists consumers of a stream consumer group in a vhost."""
    if stream is None or reference is None:
        raise usage_error("not enough arguments: --stream and --reference are required")
    select([], columns, GROUP_CONSUMER_COLUMNS, tuple(GROUP_CONSUMER_COLUMNS))
    try:
        rows = s.client.get(f"/api/hutch/streams/{q(vhost)}/{q(stream)}/groups/{q(reference)}")
    except CliError as e:
        if e.status == 404:
            raise CliError("The group does not exist", EX_SOFTWARE, 404) from None
        raise
    cols, out = select(rows, tuple(GROUP_CONSUMER_COLUMNS) if verbose else columns, GROUP_CONSUMER_COLUMNS,
                       tuple(GROUP_CONSUMER_COLUMNS))
    s.printer.rows(cols, out, ["Listing group consumers ..."])


@command(cli, "list_stream_consumer_groups")
@_vhost_option
@_verbose_option
@_columns
def list_stream_consumer_groups(s: Session, vhost: str, verbose: bool, columns: tuple[str, ...]) -> None:
    """Lists groups of stream single active consumers for a vhost."""
    _listing(s, f"/api/hutch/streams/{q(vhost)}/consumer-groups", columns, CONSUMER_GROUP_COLUMNS,
             tuple(CONSUMER_GROUP_COLUMNS), verbose, "Listing stream consumer groups ...")


TRACKING_LIST_COLUMNS = ("type", "name", "tracking_value")


@command(cli, "list_stream_tracking")
@_vhost_option
@click.option("--all", "all_", is_flag=True, help="List offset and writer tracking information.")
@click.option("--offset", is_flag=True, help="List only offset tracking information.")
@click.option("--writer", is_flag=True, help="List only writer deduplication tracking information.")
@click.argument("stream")
def list_stream_tracking(s: Session, vhost: str, all_: bool, offset: bool, writer: bool, stream: str) -> None:
    """Lists tracking information for a stream."""
    if all_ + offset + writer > 1:
        raise usage_error("Specify only one of --all, --offset, --writer.")
    kinds = ("offset",) if offset else ("writer",) if writer else ("writer", "offset")
    s.info(f"Listing tracking information for stream {stream} ...")
    try:
        rows = s.client.get(f"/api/hutch/streams/{q(vhost)}/{q(stream)}/status?tracking=true")
    except CliError as e:
        if e.status == 404:
            raise CliError("The stream does not exist.", EX_SOFTWARE, 404) from None
        if e.status == 503:
            raise CliError("The stream is not available.", EX_SOFTWARE, 503) from None
        raise
    out = [{"type": kind, "name": r.get("reference"), "tracking_value": r.get("value")}
           for kind in kinds for r in rows if ("writer" if r.get("type") == "sequence" else r.get("type")) == kind]
    s.printer.rows(TRACKING_LIST_COLUMNS, out)


def main() -> None:
    run_cli(cli, "hutch-streams")


if __name__ == "__main__":
    main()
