"""The CLIs' client of a node's management HTTP API: one request at a time, over urllib.

Which node: `--url` (or the HUTCH_URL environment variable), else the host of `-n NAME@HOST`
on port 15672, else http://localhost:15672. Credentials: `--username/--password` (or
HUTCH_USERNAME / HUTCH_PASSWORD), default guest/guest. Every request has a timeout; a
node that cannot be reached, refuses the credentials or answers an error raises
`CliError` with the exit code rabbitmqctl would use:

    64  usage error          65  data error, no such virtual host      67  no such user
    69  node unavailable     70  internal software error (an HTTP 500)  75  timed out
    77  no permission (credentials refused)
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlsplit

DEFAULT_URL = "http://localhost:15672"
DEFAULT_TIMEOUT_S = 60.0
EX_USAGE = 64
EX_DATAERR = 65
EX_NOUSER = 67
EX_UNAVAILABLE = 69
EX_SOFTWARE = 70
EX_TEMPFAIL = 75
EX_NOPERM = 77


class CliError(Exception):
    def __init__(self, message: str, exit_code: int = EX_UNAVAILABLE, status: int = 0, timed_out: bool = False,
                 body: Any = None):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.status = status
        self.timed_out = timed_out
        self.body = body  # the error answer's JSON document, when it had one


def exit_code_for_status(status: int) -> int:
    """An HTTP error status as rabbitmqctl's exit code for the same failure."""
    if status == 401:
        return EX_NOPERM
    if status >= 500 and status != 503:
        return EX_SOFTWARE
    return EX_UNAVAILABLE


def _timed_out(e: BaseException) -> bool:
    return isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError)


def q(segment: str) -> str:
    """One path segment, percent-encoded ("/" becomes %2F)."""
    return quote(segment, safe="")


def lab_nodes() -> list[dict]:
    """The nodes a `hutch lab` on this machine recorded ($HUTCH_LAB_DIR, default ./var/lab)."""
    path = os.path.join(os.environ.get("HUTCH_LAB_DIR", os.path.join("var", "lab")), "lab.json")
    try:
        with open(path) as f:
            nodes = json.load(f).get("nodes", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [n for n in nodes if isinstance(n, dict) and isinstance(n.get("name"), str)]


def lab_node(node: str | None) -> dict | None:
    """A lab node by name (hutch-2@localhost or hutch-2)."""
    if not node:
        return None
    for n in lab_nodes():
        if n["name"] == node or n["name"].split("@", 1)[0] == node:
            return n
    return None


def resolve_url(url: str | None, node: str | None) -> str:
    if url:
        return url.rstrip("/")
    env = os.environ.get("HUTCH_URL")
    if env:
        return env.rstrip("/")
    lab = lab_node(node)
    if lab is not None and lab.get("mgmt_port"):
        return f"http://127.0.0.1:{lab['mgmt_port']}"
    if node and "@" in node:
        host = node.split("@", 1)[1]
        return f"http://{host}:15672"
    return DEFAULT_URL


class Client:
    def __init__(self, url: str, username: str = "guest", password: str = "guest",
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CliError(f"not an http:// URL: {url!r}", EX_USAGE)
        self.url = url.rstrip("/")
        self.host = parts.hostname
        self.timeout_s = timeout_s
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        self._auth = f"Basic {token}"

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", self._auth)
        req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            err = None
            try:
                err = json.loads(raw)
                reason = err.get("reason", err.get("error", "")) if isinstance(err, dict) else str(err)
            except ValueError:
                reason = raw.decode(errors="replace") or e.reason
            raise CliError(str(reason).strip(), exit_code_for_status(e.code), e.code, body=err) from None
        except (TimeoutError, urllib.error.URLError, ConnectionError, OSError) as e:
            if _timed_out(e):
                raise CliError(f"operation {method} {path} on node at {self.url} timed out. Timeout value used: "
                               f"{int(self.timeout_s * 1000)}", EX_TEMPFAIL, timed_out=True) from None
            why = getattr(e, "reason", e)
            raise CliError(f"unable to perform an operation on node at {self.url}: {why}", EX_UNAVAILABLE) from None
        if not raw.strip():
            return None
        return json.loads(raw)

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def put(self, path: str, body: Any = None) -> Any:
        return self.request("PUT", path, body if body is not None else {})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body if body is not None else {})

    def delete(self, path: str, headers: dict[str, str] | None = None) -> Any:
        return self.request("DELETE", path, headers=headers)
