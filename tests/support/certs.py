"""Make a throwaway CA, a server certificate for 127.0.0.1/localhost, and client certificates,
with the openssl command line (present on every Debian machine)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(directory: Path, clients: tuple[str, ...] = ("hutch-client",)) -> dict[str, Path]:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
         "-subj", "/CN=hutch test CA", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
         "-subj", "/CN=localhost", cwd=d)
    _run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.pem", "-days", "2", "-extfile", "server.ext", cwd=d)
    paths = {"ca": d / "ca.pem", "server_cert": d / "server.pem", "server_key": d / "server.key"}
    for name in clients:
        _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/O=hutch/CN={name}", cwd=d)
        _run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", cwd=d)
        paths[f"{name}_cert"] = d / f"{name}.pem"
        paths[f"{name}_key"] = d / f"{name}.key"
    return paths
