"""The wheel a user installs: lean runtime dependencies, extras for the lab and the checker, and a
node that starts from a fresh virtualenv and answers AMQP (tests/packaging/wheel_check.py)."""

from __future__ import annotations

import zipfile
from email.parser import Parser

import pytest

from tests.packaging import wheel_check


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return wheel_check.check(tmp_path_factory.mktemp("wheel"))


def test_fresh_install_runs_a_node(result):
    log = result["log"]
    assert "started TCP listener" in log
    assert "Server startup complete; node wheel@localhost is ready" in log
    assert "Successfully stopped hutch node wheel@localhost" in log
    # the runtime dependencies came at the pinned versions
    pins = {}
    for line in (wheel_check.ROOT / "constraints.txt").read_text().splitlines():
        spec = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in spec:
            name, version = spec.split("==")
            pins[name.lower()] = version
    for name in ("aiohttp", "click", "msgspec", "pamqp", "psutil", "rich", "prometheus-client"):
        assert result["packages"].get(name) == pins[name], name


def test_wheel_metadata_declares_ranges_and_extras(result):
    with zipfile.ZipFile(result["wheel_path"]) as z:
        names = z.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(z.read(meta_name).decode())
        assert any(n.endswith("licenses/LICENSE") or n.endswith("/LICENSE") for n in names)
        assert "hutch/pipeline/spark_conf/" in "".join(names)
    requires = meta.get_all("Requires-Dist")
    assert set(meta.get_all("Provides-Extra")) >= {"lab", "pipeline", "dev"}
    runtime = [r for r in requires if "extra ==" not in r]
    # ranges, never exact pins (those live in constraints.txt)
    assert runtime and all("==" not in r.split(";")[0] and "<" in r.split(";")[0] for r in requires), requires
    assert not any(r.startswith(("pyarrow", "aiormq", "pyspark")) for r in runtime), runtime
    assert any(r.startswith("pyarrow") and 'extra == "lab"' in r for r in requires)
    assert any(r.startswith("pyspark") and 'extra == "pipeline"' in r for r in requires)
    assert meta["License-Expression"] == "Apache-2.0"
