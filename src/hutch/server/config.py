"""Node configuration: a file in rabbitmq.conf's `key = value` format, then command-line options.

Known keys (RabbitMQ's names where RabbitMQ has the setting):

    listeners.tcp.default = 5672            heartbeat = 60
    frame_max = 131072                      channel_max = 2047
    max_message_size = 134217728            cluster_name = my-cluster
    vm_memory_high_watermark.relative = 0.4 vm_memory_high_watermark.absolute = 2GB
    disk_free_limit.absolute = 50MB
    default_user = guest                    default_pass = guest
    default_vhost = /                       loopback_users.guest = true | false
    log.console.level = info                node_name = hutch@localhost
    data_dir = ./var/hutch                  management.tcp.port = 15672 (0: no HTTP API)
    listeners.ssl.default = 5671            ssl_options.certfile = server.pem
    ssl_options.keyfile = server.key        ssl_options.cacertfile = ca.pem
    ssl_options.verify = verify_peer        ssl_options.fail_if_no_peer_cert = true
    auth_mechanisms.1 = PLAIN               auth_mechanisms.2 = EXTERNAL
    ssl_cert_login_from = common_name
    mirroring_sync_batch_size = 4096        mirroring_sync_max_throughput = 0 (bytes/s, 0 = no limit)
    cluster_partition_handling = ignore | pause_minority | autoheal

An unknown key or a bad value is an error that names the line.
"""

from __future__ import annotations

import re
from pathlib import Path

from hutch.broker.broker import Config

_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3,
          "k": 1024, "m": 1024**2, "g": 1024**3}


class ConfigError(ValueError):
    pass


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _bool(value: str) -> bool:
    if value.lower() in ("true", "yes"):
        return True
    if value.lower() in ("false", "no"):
        return False
    raise ValueError("expected true or false")


def _listener_port(value: str) -> tuple[str | None, int]:
    if ":" in value:
        host, port = value.rsplit(":", 1)
        return host.strip("[]"), int(port)
    return None, int(value)


QUEUE_MASTER_LOCATORS = ("client-local", "min-masters", "random")
PARTITION_HANDLING = ("ignore", "pause_minority", "autoheal")


def apply_file(cfg: Config, path: str | Path) -> Config:
    for lineno, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "=" not in line:
            raise ConfigError(f"{path}:{lineno}: expected 'key = value', got {raw!r}")
        key, value = (p.strip() for p in line.split("=", 1))
        try:
            _apply(cfg, key, value)
        except ConfigError as e:
            raise ConfigError(f"{path}:{lineno}: {e}") from None
        except ValueError as e:
            raise ConfigError(f"{path}:{lineno}: bad value for '{key}': {e}") from None
    return cfg


def _apply(cfg: Config, key: str, value: str) -> None:
    if key == "listeners.tcp.default":
        host, port = _listener_port(value)
        cfg.amqp_port = port
        if host is not None:
            cfg.amqp_host = host
    elif key in ("heartbeat", "frame_max", "channel_max"):
        setattr(cfg, "heartbeat_s" if key == "heartbeat" else key, int(value))
    elif key == "max_message_size":
        cfg.max_message_size = parse_bytes(value)
    elif key == "vm_memory_high_watermark.relative":
        cfg.vm_memory_high_watermark = float(value)
    elif key == "disk_free_limit.absolute":
        cfg.disk_free_limit_bytes = parse_bytes(value)
    elif key == "vm_memory_high_watermark.absolute":
        cfg.vm_memory_high_watermark_bytes = parse_bytes(value)
    elif key in ("default_user", "default_pass", "default_vhost", "cluster_name", "node_name", "data_dir"):
        setattr(cfg, key, value)
    elif key.startswith("loopback_users."):
        user = key.split(".", 1)[1]
        if value.lower() in ("true", "yes"):
            if user not in cfg.loopback_users:
                cfg.loopback_users.append(user)
        elif value.lower() in ("false", "no"):
            cfg.loopback_users = [u for u in cfg.loopback_users if u != user]
        else:
            raise ValueError("expected true or false")
    elif key == "loopback_users" and value.lower() == "none":
        cfg.loopback_users = []
    elif key == "listeners.ssl.default":
        host, port = _listener_port(value)
        cfg.amqps_port = port
    elif key == "ssl_options.certfile":
        cfg.tls_certfile = value
    elif key == "ssl_options.keyfile":
        cfg.tls_keyfile = value
    elif key == "ssl_options.cacertfile":
        cfg.tls_cacertfile = value
    elif key == "ssl_options.verify":
        if value not in ("verify_peer", "verify_none"):
            raise ValueError("expected verify_peer or verify_none")
        cfg.tls_verify_peer = value == "verify_peer"
    elif key == "ssl_options.fail_if_no_peer_cert":
        cfg.tls_fail_if_no_peer_cert = _bool(value)
    elif key == "ssl_cert_login_from":
        if value not in ("distinguished_name", "common_name"):
            raise ValueError("expected distinguished_name or common_name")
        cfg.ssl_cert_login_from = value
    elif key.startswith("auth_mechanisms."):
        if value not in ("PLAIN", "AMQPLAIN", "EXTERNAL"):
            raise ValueError(f"unknown mechanism {value}")
        if key == "auth_mechanisms.1":
            cfg.auth_mechanisms = []
        if value not in cfg.auth_mechanisms:
            cfg.auth_mechanisms.append(value)
    elif key == "management.tcp.port":
        cfg.mgmt_port = int(value)
    elif key == "net_ticktime":
        cfg.net_ticktime_s = float(value)
        if cfg.net_ticktime_s <= 0:
            raise ValueError("must be positive")
    elif key == "queue_master_locator":
        if value not in QUEUE_MASTER_LOCATORS:
            raise ValueError(f"expected one of {', '.join(QUEUE_MASTER_LOCATORS)}")
        cfg.queue_master_locator = value
    elif key == "mirroring_sync_batch_size":
        cfg.mirroring_sync_batch_size = int(value)
        if cfg.mirroring_sync_batch_size < 1:
            raise ValueError("must be at least 1")
    elif key == "mirroring_sync_max_throughput":
        cfg.mirroring_sync_max_throughput = parse_bytes(value)
    elif key == "cluster_partition_handling":
        if value not in PARTITION_HANDLING:
            raise ValueError(f"expected one of {', '.join(PARTITION_HANDLING)}")
        cfg.cluster_partition_handling = value
    elif key == "cluster_formation.peer_port" or key == "distribution.listener.port_range.min":
        cfg.peer_port = int(value)
    elif key.startswith("cluster_formation.classic_config.nodes."):
        if value not in cfg.cluster_nodes:
            cfg.cluster_nodes.append(value)
    elif key == "metadata_store.timeout":
        cfg.metadata_timeout_ms = int(value)
    elif key == "log.console.level":
        cfg.log_level = value
    else:
        raise ConfigError(f"unknown configuration key '{key}'")
