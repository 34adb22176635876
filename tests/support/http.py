"""A small client of a node's management HTTP API for tests: (status, decoded body) per request."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

TIMEOUT_S = 20.0


class Http:
    """One node's API as one user: (status, decoded body) for a request."""

    def __init__(self, port: int, user: str = "guest", password: str = "guest"):
        self.base = f"http://127.0.0.1:{port}"
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def __call__(self, method: str, path: str, body=None, raw: bytes | None = None) -> tuple[int, object]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", self.auth)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                status, text = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        return status, (json.loads(text) if text.strip() else None)

    def get(self, path: str):
        status, out = self("GET", path)
        assert status == 200, (path, status, out)
        return out
