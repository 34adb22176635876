"""systemd's readiness protocol (sd_notify(3)) for a `Type=notify` unit, in a few lines.

When systemd starts a service with `Type=notify` it passes the path of a datagram socket in
$NOTIFY_SOCKET; the service sends newline-separated `KEY=VALUE` assignments to it: `READY=1`
once it is fully up (the unit turns "active" and units ordered after it start), `STOPPING=1`
when it begins to shut down, `STATUS=...` for `systemctl status`. A path starting with `@` names
a socket in the abstract namespace. RabbitMQ's own unit uses the same protocol.

Without $NOTIFY_SOCKET (not under systemd) every call does nothing. A failure to send is logged
and otherwise ignored: telling systemd must never stop or crash a node.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("hutch.node")


def notify(*assignments: str, environ: dict[str, str] | None = None) -> bool:
    """Send `KEY=VALUE` lines to $NOTIFY_SOCKET; True when a datagram was sent."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall("\n".join(assignments).encode())
        return True
    except OSError as e:
        log.warning("could not notify systemd through %s: %s", env.get("NOTIFY_SOCKET"), e)
        return False


def ready(status: str) -> bool:
    return notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")


def stopping(status: str) -> bool:
    return notify("STOPPING=1", f"STATUS={status}")
