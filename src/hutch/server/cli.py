"""`hutch server`: run one node."""

from __future__ import annotations

import sys

import click

from hutch.broker.broker import Config
from hutch.server import environment, logs
from hutch.server.config import ConfigError, apply_file, check, complete_node_name, parse_bytes


@click.command(name="server")
@click.option("--node-name", default=None,
              help="Node name, NAME@HOST (default hutch@localhost); NAME alone gets this machine's short host name.")
@click.option("--amqp-port", type=int, default=None, help="AMQP listener port (default 5672).")
@click.option("--amqp-host", default=None, help="Address to listen on (default all interfaces).")
@click.option("--mgmt-port", type=int, default=None,
              help="Management HTTP API port (default 15672; 0 disables it).")
@click.option("--data-dir", default=None, help="Where the node keeps its data (default ./var/hutch).")
@click.option("--log-level", default=None,
              type=click.Choice(["debug", "info", "warning", "error", "critical", "none"], case_sensitive=False))
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="A configuration file in rabbitmq.conf's key = value format.")
@click.option("--heartbeat", type=int, default=None, help="Heartbeat timeout offered to clients, seconds.")
@click.option("--amqps-port", type=int, default=None, help="AMQPS (TLS) listener port (default 5671).")
@click.option("--stream-port", type=int, default=None,
              help="RabbitMQ stream protocol listener port (default 5552; 0: none).")
@click.option("--tls-cert", default=None, help="Server certificate (PEM); enables the AMQPS listener.")
@click.option("--tls-key", default=None, help="Server private key (PEM).")
@click.option("--tls-ca", default=None, help="CA certificates (PEM) to verify client certificates.")
@click.option("--tls-verify-peer/--no-tls-verify-peer", default=None, help="Ask clients for a certificate.")
@click.option("--tls-fail-if-no-peer-cert/--no-tls-fail-if-no-peer-cert", default=None,
              help="With --tls-verify-peer: refuse clients without a certificate.")
@click.option("--disk-free-limit", default=None, help="Disk alarm threshold: free bytes (e.g. 1GB).")
@click.option("--vm-memory-high-watermark-bytes", default=None,
              help="Memory alarm threshold, absolute (e.g. 2GB); overrides the relative one.")
@click.option("--prometheus-port", type=int, default=None,
              help="Prometheus metrics listener port (default 15692; 0: none).")
@click.option("--collect-statistics-interval", type=int, default=None,
              help="Milliseconds between message rate samples (default 5000).")
@click.option("--peer-port", type=int, default=None, help="Inter-node (peer) listener port (default 25672).")
@click.option("--cluster-nodes", default=None,
              help="Form a cluster of these nodes at first start: NAME@HOST[:PEER_PORT],... (this node included).")
@click.option("--peer-address", "peer_addresses", multiple=True, metavar="NAME@HOST=ADDR:PORT",
              help="Reach that peer at this address instead (repeatable; the lab routes links through proxies).")
@click.option("--cluster-secret-file", default=None,
              help="File holding the shared cluster secret (default $HUTCH_CLUSTER_SECRET, else ~/.hutch.cookie).")
@click.option("--net-ticktime", type=float, default=None, help="Seconds of peer silence before it is down (60).")
@click.option("--metadata-timeout", type=int, default=None,
              help="Milliseconds a catalogue change may wait for a majority before it fails (15000).")
@click.option("--queue-master-locator", default=None, type=click.Choice(["client-local", "min-masters", "random"]),
              help="Where new classic queues live (default client-local).")
@click.option("--cluster-partition-handling", default=None,
              type=click.Choice(["ignore", "pause_minority", "pause_if_all_down", "autoheal"]),
              help="What a node does when it is cut off from its cluster (default ignore); pause_if_all_down "
                   "takes its nodes and recover strategy from the configuration file.")
def cli(node_name, amqp_port, amqp_host, mgmt_port, data_dir, log_level, config_file, heartbeat, amqps_port, tls_cert,
        tls_key, tls_ca, tls_verify_peer, tls_fail_if_no_peer_cert, disk_free_limit, vm_memory_high_watermark_bytes,
        peer_port, cluster_nodes, peer_addresses, cluster_secret_file, net_ticktime, metadata_timeout,
        queue_master_locator, cluster_partition_handling, prometheus_port=None,
        collect_statistics_interval=None, stream_port=None) -> None:
    """Run a hutch node."""
    from hutch.server.runtime import run_node

    cfg = Config()
    env = environment.read()  # HUTCH_* variables: over the configuration file, under the options
    try:
        if config_file is None:
            config_file = environment.config_file(env)
        if config_file:
            apply_file(cfg, config_file)
        environment.apply(cfg, env)
        if disk_free_limit is not None:
            cfg.disk_free_limit_bytes = parse_bytes(disk_free_limit)
        if vm_memory_high_watermark_bytes is not None:
            cfg.vm_memory_high_watermark_bytes = parse_bytes(vm_memory_high_watermark_bytes)
    except (ConfigError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    for attr, value in (("node_name", node_name), ("amqp_port", amqp_port), ("amqp_host", amqp_host),
                        ("mgmt_port", mgmt_port), ("prometheus_port", prometheus_port),
                        ("collect_statistics_interval_ms", collect_statistics_interval),
                        ("data_dir", data_dir), ("log_level", log_level), ("heartbeat_s", heartbeat),
                        ("amqps_port", amqps_port), ("stream_port", stream_port), ("tls_certfile", tls_cert), ("tls_keyfile", tls_key),
                        ("tls_cacertfile", tls_ca), ("tls_verify_peer", tls_verify_peer),
                        ("tls_fail_if_no_peer_cert", tls_fail_if_no_peer_cert), ("peer_port", peer_port),
                        ("cluster_secret_file", cluster_secret_file), ("net_ticktime_s", net_ticktime),
                        ("metadata_timeout_ms", metadata_timeout), ("queue_master_locator", queue_master_locator),
                        ("cluster_partition_handling", cluster_partition_handling)):
        if value is not None:
            setattr(cfg, attr, value)
    if mgmt_port is not None:
        cfg.mgmt_tcp_configured = True
    if cluster_nodes:
        cfg.cluster_nodes = [n.strip() for n in cluster_nodes.split(",") if n.strip()]
    for spec in peer_addresses:
        name, sep, addr = spec.partition("=")
        host, _, port = addr.rpartition(":")
        if not sep or "@" not in name or not host or not port.isdigit():
            raise click.ClickException(f"--peer-address {spec!r}: expected NAME@HOST=ADDR:PORT")
        cfg.peer_addresses[name] = (host, int(port))
    cfg.node_name = complete_node_name(cfg.node_name)
    environment.finish(cfg, env, data_dir)
    name, _, host = cfg.node_name.partition("@")
    if not name or not host:
        raise click.ClickException(f"node name '{cfg.node_name}' must be NAME@HOST or NAME")
    try:
        check(cfg)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    try:
        logs.plan(cfg.log_settings, cfg.log_level, cfg.data_dir, cfg.node_name)
    except logs.LogConfigError as e:
        raise click.ClickException(str(e)) from None
    try:
        sys.exit(run_node(cfg))
    except OSError as e:
        raise click.ClickException(f"cannot start node {cfg.node_name}: {e}") from None
