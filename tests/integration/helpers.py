"""Helpers the integration tests share: connecting, unique names, waiting on conditions.

Waiting is always on a condition with a deadline, never a fixed sleep; pika's
BlockingConnection is pumped while waiting so that its callbacks run.
"""

from __future__ import annotations

import contextlib
import time

import pika
import pika.exceptions
import pytest


def connect(broker, **params) -> pika.BlockingConnection:
    """A pika BlockingConnection to the broker; keyword arguments go to ConnectionParameters."""
    params.setdefault("credentials", pika.PlainCredentials("guest", "guest"))
    params.setdefault("connection_attempts", 1)
    params.setdefault("blocked_connection_timeout", None)
    return pika.BlockingConnection(pika.ConnectionParameters(host=broker.host, port=broker.port, **params))


class Names:
    """Unique names for one test's queues and exchanges, deleted when the test ends."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def queue(self, suffix: str = "q") -> str:
        name = f"{self.prefix}.{suffix}"
        self.queues.append(name)
        return name

    def exchange(self, suffix: str = "x") -> str:
        name = f"{self.prefix}.{suffix}"
        self.exchanges.append(name)
        return name

    def queue_and_exchange(self, suffix: str = "q") -> str:
        """One name used for both a queue and an exchange (kombu's SimpleQueue does that)."""
        name = self.queue(suffix)
        self.exchanges.append(name)
        return name

    def cleanup(self, broker) -> None:
        if not (self.queues or self.exchanges):
            return
        conn = connect(broker)
        try:
            for name in self.queues:
                with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                    conn.channel().queue_delete(name)
            for name in self.exchanges:
                with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                    conn.channel().exchange_delete(name)
        finally:
            if conn.is_open:
                conn.close()


def wait_until(cond, timeout_s: float = 5.0, what: str = "condition", interval_s: float = 0.02):
    """Poll `cond` until it is truthy; its value. Fails the test at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not true after {timeout_s}s")
        time.sleep(interval_s)


def drain(conn: pika.BlockingConnection, cond, timeout_s: float = 5.0, what: str = "condition"):
    """Run pika's I/O until `cond()` is truthy (callbacks fire meanwhile); its value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not true after {timeout_s}s")
        conn.process_data_events(time_limit=0.05)


REPLY_TEXT_MAX = 255  # reply-text is a shortstr


def shortstr_reply_text(text: str) -> str:
    """A reply text as the broker sends it: cut to 252 characters and '...' when too long."""
    if len(text.encode()) <= REPLY_TEXT_MAX:
        return text
    return text.encode()[:REPLY_TEXT_MAX - 3].decode(errors="ignore") + "..."


def channel_error(fn, *args, **kwargs) -> tuple[int, str]:
    """Call fn, which must make the broker close the channel; (reply code, reply text)."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        fn(*args, **kwargs)
    return info.value.reply_code, info.value.reply_text


def connection_error(fn, *args, **kwargs) -> tuple[int, str]:
    """Call fn, which must make the broker close the connection; (reply code, reply text)."""
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        fn(*args, **kwargs)
    return info.value.reply_code, info.value.reply_text
