"""Import cycles among hutch's modules: `python tools/import_cycles.py [SRC]` prints each cycle
and exits 1 when there is one (`make lint` runs it).

Every import counts — at module level, inside functions and under `if TYPE_CHECKING:` — because
a cycle in the types is still a cycle in the design. A module importing its own package's
`__init__` is not a cycle. Cycles are the strongly connected components of the import graph
with more than one module (Tarjan's algorithm, iterative so deep graphs cannot overflow).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_files(src: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules `name` imports (a name imported from a module counts as that module)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            candidates = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for c in candidates:
            while c and c not in known:
                c = c.rpartition(".")[0]
            if c and c != name and not (known[c].name == "__init__.py" and name.startswith(c + ".")):
                found.add(c)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            advanced = False
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def main(argv: list[str]) -> int:
    src = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "src"
    known = module_files(src, "hutch")
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    found = cycles(graph)
    for c in found:
        print(f"import cycle of {len(c)} modules: {', '.join(c)}")
    print(f"{len(found)} import cycle(s) among {len(known)} modules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
