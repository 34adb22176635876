"""The node's HUTCH_* environment variables: RabbitMQ's RABBITMQ_* variables under hutch's prefix.

The variables RabbitMQ's scripts and its container image read (rabbitmq-env.conf(5), the
"Configuration" guide's environment variable table) map onto the node's configuration here:
NODENAME, NODE_IP_ADDRESS, NODE_PORT, DIST_PORT, DEFAULT_USER / DEFAULT_PASS / DEFAULT_VHOST,
CONFIG_FILE, MNESIA_BASE / MNESIA_DIR (HUTCH_DATA_BASE / HUTCH_DATA_DIR), LOG_BASE, LOGS and LOG.
The Erlang cookie's counterpart, HUTCH_CLUSTER_SECRET, is read where peers authenticate
(hutch.server.clustering.load_secret).

Precedence, as RabbitMQ's: a command-line option beats the environment, the environment beats
the configuration file, the file beats the built-in default. A variable that is empty counts as
unset (rabbitmq-env.conf(5)). A value that cannot be used (a port that is not a number) is an
error naming the variable; this module never guesses, and never reads anything but the
environment it is handed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from hutch.broker.broker import Config

PREFIX = "HUTCH_"
DIST_PORT_OFFSET = 20000  # RabbitMQ: the distribution port defaults to the AMQP port + 20000

# HUTCH_ name -> (RabbitMQ's name, what it sets); docs/deployment.md has the same table
VARIABLES: dict[str, tuple[str, str]] = {
    "HUTCH_NODENAME": ("RABBITMQ_NODENAME", "node name, NAME@HOST (NAME alone gets the short host name)"),
    "HUTCH_NODE_IP_ADDRESS": ("RABBITMQ_NODE_IP_ADDRESS", "address the AMQP listener binds"),
    "HUTCH_NODE_PORT": ("RABBITMQ_NODE_PORT", "AMQP port"),
    "HUTCH_DIST_PORT": ("RABBITMQ_DIST_PORT", "inter-node (peer) port; default HUTCH_NODE_PORT + 20000"),
    "HUTCH_DEFAULT_USER": ("RABBITMQ_DEFAULT_USER", "user created on the first start"),
    "HUTCH_DEFAULT_PASS": ("RABBITMQ_DEFAULT_PASS", "that user's password"),
    "HUTCH_DEFAULT_VHOST": ("RABBITMQ_DEFAULT_VHOST", "virtual host created on the first start"),
    "HUTCH_CONFIG_FILE": ("RABBITMQ_CONFIG_FILE", "the configuration file (rabbitmq.conf format)"),
    "HUTCH_DATA_BASE": ("RABBITMQ_MNESIA_BASE", "parent of node data directories: data in BASE/NODENAME"),
    "HUTCH_DATA_DIR": ("RABBITMQ_MNESIA_DIR", "this node's data directory (wins over HUTCH_DATA_BASE)"),
    "HUTCH_LOG_BASE": ("RABBITMQ_LOG_BASE", "directory of the log file (default DATA_DIR/log)"),
    "HUTCH_LOGS": ("RABBITMQ_LOGS", "the log file's path; '-' logs to standard output only"),
    "HUTCH_LOG": ("RABBITMQ_LOG", "log level: debug, info, notice, warning, error, critical or none"),
    "HUTCH_CLUSTER_SECRET": ("RABBITMQ_ERLANG_COOKIE", "shared secret peers authenticate with"),
}

_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency", "none")


class EnvVarError(ValueError):
    """A HUTCH_* variable holds a value the node cannot use."""


@dataclass
class Environment:
    """The HUTCH_* variables that are set (non-empty), read once at start."""

    values: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    @property
    def config_file(self) -> str | None:
        return self.values.get("HUTCH_CONFIG_FILE")


def read(environ: Mapping[str, str] | None = None) -> Environment:
    env = os.environ if environ is None else environ
    return Environment({k: v for k, v in env.items() if k in VARIABLES and v != ""})


def _port(env: Environment, name: str) -> int | None:
    value = env.get(name)
    if value is None:
        return None
    if not value.strip().isdigit() or not 0 < int(value) < 65536:
        raise EnvVarError(f"{name}={value!r}: expected a port number (1-65535)")
    return int(value)


def apply(cfg: Config, env: Environment) -> Config:
    """Lay the environment over `cfg` (which holds the configuration file's settings); the
    command-line options go on top afterwards."""
    if (v := env.get("HUTCH_NODENAME")) is not None:
        cfg.node_name = v
    if (v := env.get("HUTCH_NODE_IP_ADDRESS")) is not None:
        cfg.amqp_host = v
    node_port = _port(env, "HUTCH_NODE_PORT")
    if node_port is not None:
        cfg.amqp_port = node_port
    dist_port = _port(env, "HUTCH_DIST_PORT")
    if dist_port is not None:
        cfg.peer_port = dist_port
    elif node_port is not None and cfg.peer_port == Config.peer_port:
        if node_port + DIST_PORT_OFFSET > 65535:
            raise EnvVarError(f"HUTCH_NODE_PORT={node_port}: the peer port would be "
                                    f"{node_port + DIST_PORT_OFFSET}; set HUTCH_DIST_PORT")
        cfg.peer_port = node_port + DIST_PORT_OFFSET
    for var, attr in (("HUTCH_DEFAULT_USER", "default_user"), ("HUTCH_DEFAULT_PASS", "default_pass"),
                      ("HUTCH_DEFAULT_VHOST", "default_vhost")):
        if (v := env.get(var)) is not None:
            setattr(cfg, attr, v)
    if (v := env.get("HUTCH_DATA_DIR")) is not None:
        cfg.data_dir = v
    if (v := env.get("HUTCH_LOG")) is not None:
        if v.lower() not in _LEVELS:
            raise EnvVarError(f"HUTCH_LOG={v!r}: expected one of {', '.join(_LEVELS)}")
        cfg.log_level = v.lower()
    if (v := env.get("HUTCH_LOG_BASE")) is not None:
        cfg.log_settings["log.dir"] = v
    if (v := env.get("HUTCH_LOGS")) is not None:
        # as RABBITMQ_LOGS: it replaces log.file; '-' sends everything to standard output instead
        if v == "-":
            cfg.log_settings["log.file"] = "false"
            cfg.log_settings["log.console"] = "true"
            cfg.log_settings["log.console.stdio"] = "stdout"
        else:
            cfg.log_settings["log.file"] = os.path.abspath(v)  # a path, from the working directory
    return cfg


def finish(cfg: Config, env: Environment, data_dir_option: str | None) -> Config:
    """What depends on the final node name, once the command-line options are in: with
    HUTCH_DATA_BASE (and neither --data-dir nor HUTCH_DATA_DIR) the data lives in BASE/NODENAME,
    as RabbitMQ's MNESIA_DIR defaults to MNESIA_BASE/NODENAME."""
    base = env.get("HUTCH_DATA_BASE")
    if base is not None and data_dir_option is None and env.get("HUTCH_DATA_DIR") is None:
        cfg.data_dir = os.path.join(base, cfg.node_name)
    return cfg


def config_file(env: Environment) -> str | None:
    """HUTCH_CONFIG_FILE, checked: naming a file that is not there is an error (a container that
    mounts its configuration at the wrong place should not start on the defaults)."""
    path = env.config_file
    if path is not None and not os.path.isfile(path):
        raise EnvVarError(f"HUTCH_CONFIG_FILE={path!r}: no such file")
    return path
