"""The import-cycle check that `make lint` runs (tools/import_cycles.py), on graphs made by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "tools" / "import_cycles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_chain_has_no_cycle_and_a_loop_of_three_is_one_cycle():
    t = _tool()
    assert t.cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert t.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_two_separate_loops_are_two_cycles():
    t = _tool()
    got = t.cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}})
    assert sorted(got) == [["a", "b"], ["c", "d"]]


def test_imports_inside_functions_and_type_checking_blocks_count(tmp_path):
    t = _tool()
    pkg = tmp_path / "hutch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hutch.two import X\n")
    (pkg / "two.py").write_text("def f():\n    from . import one\n    return one\n")
    known = t.module_files(tmp_path, "hutch")
    graph = {n: t.imports_of(n, p, known) for n, p in known.items()}
    assert graph["hutch.one"] == {"hutch.two"} and graph["hutch.two"] == {"hutch.one"}
    assert t.cycles(graph) == [["hutch.one", "hutch.two"]]


def test_hutch_has_no_import_cycles():
    t = _tool()
    known = t.module_files(ROOT / "src", "hutch")
    graph = {n: t.imports_of(n, p, known) for n, p in known.items()}
    assert t.cycles(graph) == []
