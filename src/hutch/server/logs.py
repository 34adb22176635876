"""Where a node's log lines go: the console and a log file, each with its own level and format.

RabbitMQ's logging guide (3.9 and later) is the model: `log.console`, `log.console.level`,
`log.console.stdio`, `log.console.formatter`, `log.file` (a name, a path, or `false`),
`log.file.level`, `log.file.formatter`, `log.file.rotation.size` / `.count` and `log.dir`, with
the RABBITMQ_LOGS / RABBITMQ_LOG_BASE environment variables as HUTCH_LOGS / HUTCH_LOG_BASE
(`HUTCH_LOGS=-` means: standard output only). The configuration parser keeps every `log.*` key as
written in `Config.log_settings`; the environment (hutch.server.environment) has already been
folded into those settings when `plan` reads them. Plain-text lines keep hutch's existing shape
(docs/operations.md, "Logs"); the JSON formatter writes one object per line.

What no sink is configured for behaves as hutch always did: the console (standard error) and
DATA_DIR/log/NODE_NAME.log, both at the node's log level. Keys RabbitMQ knows that hutch cannot
honour (syslog, the exchange output, date-based rotation, ...) are reported as warnings, never
silently dropped. This module never opens sockets and never logs a password.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
import time
from dataclasses import dataclass

# RabbitMQ's levels onto Python's; notice sits between info and warning as in syslog
NOTICE = 25
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "notice": NOTICE, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL, "alert": logging.CRITICAL,
          "emergency": logging.CRITICAL}
NONE = "none"
DEFAULT_ROTATION_COUNT = 5

_HONOURED = {"log.dir", "log.console", "log.console.level", "log.console.stdio", "log.console.formatter",
             "log.file", "log.file.level", "log.file.formatter", "log.file.rotation.size",
             "log.file.rotation.count"}


class LogConfigError(ValueError):
    pass


@dataclass
class Sink:
    kind: str  # "console" or "file"
    level: str  # a key of LEVELS
    formatter: str = "plaintext"  # or "json"
    stream: str = "stderr"  # console: stdout or stderr
    path: str | None = None  # file
    rotation_size: int = 0  # bytes; 0: the file is never rotated for its size
    rotation_count: int = DEFAULT_ROTATION_COUNT  # rotated files kept (NAME.log.1 ... NAME.log.N)


@dataclass
class Plan:
    sinks: list[Sink]
    warnings: list[str]


def _level(value: str, key: str) -> str:
    v = value.strip().lower()
    if v != NONE and v not in LEVELS:
        raise LogConfigError(f"{key}: unknown log level '{value}' (expected one of {', '.join([*LEVELS, NONE])})")
    return v


def _flag(value: str, key: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "yes"):
        return True
    if v in ("false", "no"):
        return False
    raise LogConfigError(f"{key}: expected true or false, got '{value}'")


def _formatter(value: str | None, key: str) -> str:
    if value is None:
        return "plaintext"
    if value not in ("plaintext", "json"):
        raise LogConfigError(f"{key}: expected plaintext or json, got '{value}'")
    return value


def _count(value: str | None, key: str, default: int) -> int:
    if value is None:
        return default
    if not value.strip().isdigit():
        raise LogConfigError(f"{key}: expected a non-negative integer, got '{value}'")
    return int(value)


def plan(settings: dict[str, str], level: str, data_dir: str, node_name: str) -> Plan:
    """The sinks for these `log.*` settings. `level` is the node's log level (--log-level, HUTCH_LOG,
    log.console.level, in that order): the console's level, and the file's unless log.file.level."""
    s = dict(settings)
    warnings = [f"'{k} = {v}' is accepted but hutch does not implement it; it has no effect"
                for k, v in sorted(s.items()) if k not in _HONOURED]
    base = _level(level, "log level")
    sinks: list[Sink] = []

    explicit_console = "log.console" in s
    console_on = _flag(s["log.console"], "log.console") if explicit_console else True
    if console_on:
        stdio = s.get("log.console.stdio")
        if stdio is not None and stdio not in ("stdout", "stderr"):
            raise LogConfigError(f"log.console.stdio: expected stdout or stderr, got '{stdio}'")
        # RabbitMQ's console output is standard output; hutch's default console stays on stderr
        stream = stdio or ("stdout" if explicit_console else "stderr")
        sinks.append(Sink("console", base, _formatter(s.get("log.console.formatter"), "log.console.formatter"),
                          stream=stream))

    file_value = s.get("log.file", "")
    if file_value.strip().lower() != "false":
        log_dir = s.get("log.dir") or os.path.join(data_dir, "log")
        name = file_value.strip() or f"{node_name}.log"
        path = name if os.path.isabs(name) else os.path.join(log_dir, name)
        file_level = _level(s["log.file.level"], "log.file.level") if "log.file.level" in s else base
        sinks.append(Sink("file", file_level, _formatter(s.get("log.file.formatter"), "log.file.formatter"),
                          path=path,
                          rotation_size=_count(s.get("log.file.rotation.size"), "log.file.rotation.size", 0),
                          rotation_count=_count(s.get("log.file.rotation.count"), "log.file.rotation.count",
                                                DEFAULT_ROTATION_COUNT)))
    return Plan([k for k in sinks if k.level != NONE], warnings)


class PlainFormatter(logging.Formatter):
    """`2026-11-22 07:09:24.632+00:00 [info] <hutch.node> started TCP listener on 0.0.0.0:5672`"""

    converter = time.gmtime

    def __init__(self) -> None:
        super().__init__("%(asctime)s.%(msecs)03d+00:00 [%(levelname)s] <%(name)s> %(message)s",
                         datefmt="%Y-%m-%d %H:%M:%S")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with RabbitMQ's field names for the time, level and message."""

    converter = time.gmtime

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(record.created))
        msg = record.getMessage()
        if record.exc_info:
            msg = f"{msg}\n{self.formatException(record.exc_info)}"
        return json.dumps({"time": f"{stamp}.{int(record.msecs):03d}+00:00",
                           "level": logging.getLevelName(record.levelno), "msg": msg,
                           "pid": record.process, "component": record.name}, ensure_ascii=False,
                          separators=(",", ":"))


def _handler(sink: Sink) -> logging.Handler:
    if sink.kind == "console":
        handler: logging.Handler = logging.StreamHandler(sys.stdout if sink.stream == "stdout" else sys.stderr)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(sink.path)), exist_ok=True)
        if sink.rotation_size > 0:
            handler = logging.handlers.RotatingFileHandler(sink.path, maxBytes=sink.rotation_size,
                                                           backupCount=sink.rotation_count, encoding="utf-8")
        else:
            # WatchedFileHandler: an external logrotate may move the file away
            handler = logging.handlers.WatchedFileHandler(sink.path, encoding="utf-8")
    handler.setFormatter(JsonFormatter() if sink.formatter == "json" else PlainFormatter())
    handler.setLevel(LEVELS[sink.level])
    return handler


def install(p: Plan) -> None:
    """Replace the root logger's handlers with the plan's sinks."""
    for name, value in LEVELS.items():
        if name not in ("alert", "emergency"):
            logging.addLevelName(value, name)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    handlers = [_handler(s) for s in p.sinks]
    for h in handlers:
        root.addHandler(h)
    # the root lets through what the most verbose sink wants; no sink at all: nothing is logged
    root.setLevel(min((h.level for h in handlers), default=logging.CRITICAL + 10))
    log = logging.getLogger("hutch.node")
    for w in p.warnings:
        log.warning("%s", w)


def configure(settings: dict[str, str], level: str, data_dir: str, node_name: str) -> Plan:
    p = plan(settings, level, data_dir, node_name)
    install(p)
    return p
