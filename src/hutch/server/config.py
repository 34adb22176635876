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
    mirroring_sync_background = false       (hutch's own: a sync that does not stop deliveries)
    mirroring_recover_from_disk = true      (hutch's own: a restarted mirror keeps its copy, syncs the delta)
    cluster_partition_handling = ignore | pause_minority | pause_if_all_down | autoheal
    cluster_partition_handling.pause_if_all_down.nodes.1 = hutch@a
    cluster_partition_handling.pause_if_all_down.recover = ignore | autoheal
    management.tcp.ip = 127.0.0.1           management.ssl.port = 15671
    management.ssl.certfile / keyfile / cacertfile / verify / fail_if_no_peer_cert / password / ip
    log.file = hutch.log | false            log.file.level, log.file.rotation.size, log.file.formatter, ...
    prometheus.tcp.port = 15692 (0: none)   prometheus.tcp.ip = 127.0.0.1
    collect_statistics_interval = 5000 (ms between message rate samples)
    classic_queue.memory_window_messages = 8192   classic_queue.memory_window_bytes = 16MiB
        (disk-first classic queues: ready messages a queue keeps in memory before it pages)
    consumer_timeout = 1800000 (ms a delivery may stay unacknowledged; false: no limit)
    quorum_queue.default_delivery_limit = 20 (unlimited or -1: no default limit, as before RabbitMQ 4.0)
    load_definitions = /etc/hutch/definitions.json (a file, or a directory of .json files, imported at
        every boot; management.load_definitions is the older name; definitions.import_backend =
        local_filesystem with definitions.local.path = FILE the newer form)

Lines are read as RabbitMQ's configuration parser (cuttlefish) reads them: `#` starts a comment
wherever it appears outside single quotes, so `default_pass = pa#ss` sets `pa`; a value in single
quotes (`default_pass = 'pa#ss'`) is taken as it is. A value cut short by a `#` glued to it is
loaded as RabbitMQ loads it, with a warning. Every `log.*` key RabbitMQ knows is accepted and kept
as written in `Config.log_settings` for the logging code to read.

Partition-handling keys that the chosen mode does not use (seed 003, "Deprecated rabbitmq.conf
Keys": accepted but without effect) load with a warning; they never stop a node from starting.

An unknown key or a bad value is an error that names the file, the line and the key. This module
only parses; it must never open sockets or files other than the configuration file itself.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path

from hutch.broker.broker import STREAM_FSYNC_MODES, Config

_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3,
          "k": 1024, "m": 1024**2, "g": 1024**3}


class ConfigError(ValueError):
    """A configuration the node cannot start with; `key` names the setting when the error was
    found after reading (apply_file then names that key's line)."""

    def __init__(self, message: str, key: str | None = None, value: str | None = None):
        super().__init__(message)
        self.key = key
        self.value = value


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


def _ip(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise ValueError(f"not an IP address: {value!r}") from None


def _management_ssl(cfg: Config, key: str, value: str) -> None:
    """management.ssl.*: the HTTPS listener of the management API, with the same certificate
    options as the AMQPS listener (ssl_options.*)."""
    opt = key[len("management.ssl."):]
    if opt == "port":
        cfg.mgmt_ssl_port = int(value)
    elif opt == "ip":
        cfg.mgmt_ssl_host = _ip(value)
    elif opt in ("certfile", "keyfile", "cacertfile", "password"):
        setattr(cfg, f"mgmt_tls_{opt}", value)
    elif opt == "verify":
        if value not in ("verify_peer", "verify_none"):
            raise ValueError("expected verify_peer or verify_none")
        cfg.mgmt_tls_verify_peer = value == "verify_peer"
    elif opt == "fail_if_no_peer_cert":
        cfg.mgmt_tls_fail_if_no_peer_cert = _bool(value)
    else:
        raise ConfigError(f"unknown configuration key '{key}'")


def _listener_port(value: str) -> tuple[str | None, int]:
    if ":" in value:
        host, port = value.rsplit(":", 1)
        return host.strip("[]"), int(port)
    return None, int(value)


QUEUE_MASTER_LOCATORS = ("client-local", "min-masters", "random")
PARTITION_HANDLING = ("ignore", "pause_minority", "pause_if_all_down", "autoheal")
PAUSE_IF_ALL_DOWN_RECOVER = ("ignore", "autoheal")
_PAUSE_IF_ALL_DOWN = "cluster_partition_handling.pause_if_all_down."

_KEY = re.compile(r"(?:\\\.|[A-Za-z0-9_-])+(?:\.(?:\\\.|[A-Za-z0-9_-])+)*")
_LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency", "none")
_LOG_OUTPUTS = ("console", "file", "exchange", "journald", "syslog")
_LOG_CATEGORIES = ("connection", "channel", "mirroring", "queue", "federation", "upgrade", "ra", "default")
_LOG_FORMATTER_KEYS = ("formatter", "formatter.time_format", "formatter.level_format", "formatter.single_line",
                       "formatter.plaintext.format", "formatter.json.field_map", "formatter.json.verbosity_map")
_LOG_ROTATION_KEYS = ("rotation.date", "rotation.compress", "rotation.size", "rotation.count")


def split_line(raw: str) -> tuple[str, str, bool] | None:
    """One line as cuttlefish reads it: None for a blank or comment line, else (key, value,
    cut) where `cut` says a `#` glued to the value ended it. Raises ValueError on a malformed line."""
    line = raw.strip(" \t\r")
    if not line or line.startswith("#"):
        return None
    key, eq, rest = line.partition("=")
    key = key.strip(" \t")
    if not eq:
        raise ValueError(f"expected 'key = value', got {raw.strip()!r}")
    if not _KEY.fullmatch(key):
        raise ValueError(f"'{key}' is not a configuration key (words of letters, digits, '_' and '-' joined by dots)")
    rest = rest.lstrip(" \t")
    if rest.startswith("'"):
        end = rest.find("'", 1)
        if end < 0:
            raise ValueError(f"the quoted value of '{key}' has no closing quote")
        tail = rest[end + 1:].strip(" \t")
        if tail and not tail.startswith("#"):
            raise ValueError(f"unexpected text after the quoted value of '{key}': {tail!r}")
        return key, rest[1:end], False
    value, hash_, _ = rest.partition("#")
    cut = bool(hash_) and value != "" and not value[-1].isspace()
    value = value.rstrip(" \t")
    if not value:
        raise ValueError(f"'{key}' has no value")
    return key, value, cut


def complete_node_name(name: str) -> str:
    """NAME without @HOST gets this machine's short host name, as RabbitMQ completes it."""
    if "@" in name:
        return name
    return f"{name}@{socket.gethostname().split('.')[0]}"


def apply_file(cfg: Config, path: str | Path) -> Config:
    """Read a rabbitmq.conf-style file into `cfg` (later keys win), then check the settings that
    only make sense together; raises ConfigError naming the file, line and key."""
    seen: dict[str, tuple[int, str]] = {}  # key -> (line, value), the last of each
    for lineno, raw in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            parsed = split_line(raw)
        except ValueError as e:
            raise ConfigError(f"{path}:{lineno}: {e}") from None
        if parsed is None:
            continue
        key, value, cut = parsed
        if cut:
            cfg.config_warnings.append(
                f"{path}:{lineno}: the value of '{key}' ends at a '#' (the rest of the line is a comment, as "
                f"RabbitMQ reads it); to keep the '#', put the value in single quotes: {key} = '{raw.split('=', 1)[1].strip()}'")
        seen[key] = (lineno, value)
        try:
            _apply(cfg, key, value)
        except ConfigError as e:
            raise ConfigError(f"{path}:{lineno}: {e}") from None
        except ValueError as e:
            raise ConfigError(f"{path}:{lineno}: bad value for '{key}': {e}") from None
    try:
        check(cfg)
    except ConfigError as e:
        lines = [n for k, (n, v) in seen.items()
                 if k == e.key or (e.key and k.startswith(e.key + ".") and e.value in (None, v))]
        raise ConfigError(f"{path}:{min(lines)}: {e}" if lines else f"{path}: {e}") from None
    return cfg


def check(cfg: Config) -> None:
    """The settings that depend on each other, once every source (file, options) is read.

    pause_if_all_down needs its nodes and its recover strategy (RabbitMQ refuses to start
    without them too). The pause_if_all_down keys under any other mode are legacy settings
    without effect: accepted, with a warning (seed 003)."""
    if cfg.mgmt_ssl_port is not None and not (cfg.mgmt_tls_certfile and cfg.mgmt_tls_keyfile):
        raise ConfigError("management.ssl.port needs management.ssl.certfile and management.ssl.keyfile",
                          key="management.ssl.port")
    mode = cfg.cluster_partition_handling
    if mode == "pause_if_all_down":
        if not cfg.pause_if_all_down_nodes:
            raise ConfigError("cluster_partition_handling = pause_if_all_down needs the nodes to watch: "
                              "cluster_partition_handling.pause_if_all_down.nodes.1 = NAME@HOST ...",
                              key="cluster_partition_handling")
        for node in cfg.pause_if_all_down_nodes:
            if "@" not in node:
                raise ConfigError(f"bad value for '{_PAUSE_IF_ALL_DOWN}nodes': node '{node}' must be NAME@HOST",
                                  key=_PAUSE_IF_ALL_DOWN + "nodes", value=node)
        recover = cfg.pause_if_all_down_recover
        if recover is None:
            raise ConfigError("cluster_partition_handling = pause_if_all_down needs a recover strategy: "
                              f"{_PAUSE_IF_ALL_DOWN}recover = ignore | autoheal", key="cluster_partition_handling")
        if recover not in PAUSE_IF_ALL_DOWN_RECOVER:
            raise ConfigError(f"bad value for '{_PAUSE_IF_ALL_DOWN}recover': expected one of "
                              f"{', '.join(PAUSE_IF_ALL_DOWN_RECOVER)}, got '{recover}'",
                              key=_PAUSE_IF_ALL_DOWN + "recover")
        return
    unused = []
    if cfg.pause_if_all_down_nodes:
        unused.append("cluster_partition_handling.pause_if_all_down.nodes.*")
    if cfg.pause_if_all_down_recover is not None:
        unused.append("cluster_partition_handling.pause_if_all_down.recover")
    for key in unused:
        msg = (f"'{key}' has no effect: cluster_partition_handling is {mode}, not pause_if_all_down "
               f"(a legacy key, accepted and ignored)")
        if msg not in cfg.config_warnings:
            cfg.config_warnings.append(msg)


def _log_key(key: str, value: str) -> None:
    """Validate one log.* key against RabbitMQ's schema (rabbit.schema's log section)."""
    parts = key.split(".", 2)
    if len(parts) < 2:
        raise ConfigError(f"unknown configuration key '{key}'")
    head, rest = parts[1], (parts[2] if len(parts) > 2 else "")
    known = False
    if head == "dir" and not rest:
        known = True
    elif head in _LOG_OUTPUTS:
        extra = {"console": ("stdio", "use_colors") + tuple(f"color_esc_seqs.{lv}" for lv in _LOG_LEVELS[:-1]),
                 "file": _LOG_ROTATION_KEYS, "exchange": (), "journald": ("fields",),
                 "syslog": ("identity", "facility", "multiline_mode", "ip", "host", "port", "transport",
                            "protocol")}[head]
        known = rest in ("", "level") + _LOG_FORMATTER_KEYS + extra or (head == "syslog"
                                                                       and rest.startswith("ssl_options."))
    elif head in _LOG_CATEGORIES:
        known = rest in ("level", "file") + _LOG_ROTATION_KEYS and not (head == "default" and rest == "file")
    if not known:
        raise ConfigError(f"unknown configuration key '{key}'")
    if rest == "level" or (head == "file" and rest == "level"):
        if value.lstrip("=") not in _LOG_LEVELS:
            raise ValueError(f"expected one of {', '.join(_LOG_LEVELS)}")
    elif rest in ("rotation.size", "rotation.count") or (head == "syslog" and rest == "port"):
        if not value.isdigit():
            raise ValueError("expected a non-negative integer")
    elif rest == "formatter" and value not in ("plaintext", "json"):
        raise ValueError("expected plaintext or json")
    elif not rest and head != "dir" and head != "file" and value not in ("true", "false"):
        raise ValueError("expected true or false")
    elif rest in ("rotation.compress", "multiline_mode") and value not in ("true", "false"):
        raise ValueError("expected true or false")


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
    elif key == "vm_memory_high_watermark_paging_ratio":
        cfg.vm_memory_high_watermark_paging_ratio = float(value)
        if cfg.vm_memory_high_watermark_paging_ratio < 0:
            raise ValueError("must be 0 or more")
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
    elif key == "stream.listeners.tcp.default" or key == "stream.listeners.tcp.1":
        _host, port = _listener_port(value)
        cfg.stream_port = port
    elif key == "stream.advertised_host":
        cfg.stream_advertised_host = value
    elif key == "stream.advertised_port":
        cfg.stream_advertised_port = int(value)
    elif key == "stream.frame_max":
        cfg.stream_frame_max = parse_bytes(value)
    elif key == "stream.heartbeat":
        cfg.stream_heartbeat_s = int(value)
    elif key == "stream.fsync":
        if value not in STREAM_FSYNC_MODES:
            raise ValueError(f"expected one of {', '.join(STREAM_FSYNC_MODES)}")
        cfg.stream_fsync = value
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
        cfg.mgmt_tcp_configured = True
    elif key == "prometheus.tcp.port":
        cfg.prometheus_port = int(value)
        if not 0 <= cfg.prometheus_port <= 65535:
            raise ValueError("expected a port number, or 0 for no listener")
    elif key == "prometheus.tcp.ip":
        cfg.prometheus_host = _ip(value)
    elif key == "collect_statistics_interval":
        cfg.collect_statistics_interval_ms = int(value)
        if cfg.collect_statistics_interval_ms < 100:
            raise ValueError("expected milliseconds, at least 100")
    elif key == "management.tcp.ip":
        cfg.mgmt_host = _ip(value)
        cfg.mgmt_tcp_configured = True
    elif key.startswith("management.ssl."):
        _management_ssl(cfg, key, value)
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
    elif key == "classic_queue.memory_window_messages":
        cfg.classic_queue_memory_window_messages = int(value)
        if cfg.classic_queue_memory_window_messages < 0:
            raise ValueError("must be 0 or more")
    elif key == "classic_queue.memory_window_bytes":
        cfg.classic_queue_memory_window_bytes = parse_bytes(value)
    elif key == "mirroring_sync_max_throughput":
        cfg.mirroring_sync_max_throughput = parse_bytes(value)
    elif key == "mirroring_sync_background":
        cfg.mirroring_sync_background = _bool(value)
    elif key == "mirroring_recover_from_disk":
        cfg.mirroring_recover_from_disk = _bool(value)
    elif key == "cluster_partition_handling":
        if value not in PARTITION_HANDLING:
            raise ValueError(f"expected one of {', '.join(PARTITION_HANDLING)}")
        cfg.cluster_partition_handling = value
    # checked by check() once the mode is known: under another mode they are legacy keys that
    # load whatever their value (seed 003)
    elif key.startswith(_PAUSE_IF_ALL_DOWN + "nodes.") and key.count(".") == 3:
        if value not in cfg.pause_if_all_down_nodes:
            cfg.pause_if_all_down_nodes.append(value)
    elif key == _PAUSE_IF_ALL_DOWN + "recover":
        cfg.pause_if_all_down_recover = value
    elif key == "cluster_formation.peer_port" or key == "distribution.listener.port_range.min":
        cfg.peer_port = int(value)
    elif key.startswith("cluster_formation.classic_config.nodes."):
        if value not in cfg.cluster_nodes:
            cfg.cluster_nodes.append(value)
    elif key in ("load_definitions", "management.load_definitions", "definitions.local.path"):
        cfg.load_definitions = value
    elif key == "definitions.import_backend":
        if value not in ("local_filesystem", "rabbit_definitions_import_local_filesystem"):
            raise ValueError("only local_filesystem is supported (definitions.local.path = FILE)")
    elif key == "consumer_timeout":
        # RabbitMQ disables it with advanced.config's `undefined`; here `false` says the same
        if value.lower() in ("false", "undefined"):
            cfg.consumer_timeout_ms = None
        else:
            cfg.consumer_timeout_ms = int(value)
            if cfg.consumer_timeout_ms < 1:
                raise ValueError("expected milliseconds (at least 1), or false for no timeout")
    elif key == "quorum_queue.default_delivery_limit":
        if value.lower() == "unlimited" or value.strip() == "-1":
            cfg.quorum_queue_default_delivery_limit = None
        else:
            cfg.quorum_queue_default_delivery_limit = int(value)
            if cfg.quorum_queue_default_delivery_limit < 0:
                raise ValueError("expected a non-negative integer, or unlimited (-1)")
    elif key == "metadata_store.timeout":
        cfg.metadata_timeout_ms = int(value)
    elif key == "log" or key.startswith("log."):
        _log_key(key, value)
        cfg.log_settings[key] = value
        if key == "log.console.level":
            cfg.log_level = value
    else:
        raise ConfigError(f"unknown configuration key '{key}'")
