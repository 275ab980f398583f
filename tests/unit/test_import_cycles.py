"""No import cycles in equipoise or the benchmarks.

The module graph is read with `ast` (no module is imported): every import statement
counts, including those inside functions (lazy imports) and under ``TYPE_CHECKING``,
because a cycle broken only by import timing is still a cycle.  Edges:

* ``import a.b`` -> ``a.b``;
* ``from pkg import name`` -> ``pkg`` (its ``__init__`` runs), and ``pkg.name`` too if
  that is a module;
* relative imports are resolved against the importing module's package
  (``from ..x import y`` in ``equipoise.worker.loop`` -> ``equipoise.x``;
  ``from . import y`` in ``equipoise.wire.transport`` -> ``equipoise.wire`` and, if
  ``y`` is a submodule, ``equipoise.wire.y``).

Importing a submodule also runs its parents' ``__init__``, but that is not counted
as an edge (else every package containing a submodule that imports anything from the
package would be a cycle); only imports written in the code are.  Only edges between
modules of the scanned trees are kept.  A cycle is a strongly connected component of
more than one module; a module naming itself (``from . import x`` inside a package's
``__init__`` when ``x`` is not a submodule) is not one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

Edge = tuple[str, int]  # (target module, line of the import)


def module_files(base: Path, package: str) -> dict[str, Path]:
    """Module name -> file for every .py under ``base/package``."""
    out = {}
    for path in sorted((base / package).rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imports_of(module: str, path: Path, modules: set[str]) -> dict[str, int]:
    """Modules of ``modules`` that ``module`` (read from ``path``) imports -> first line."""
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target in modules and target != module:
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(module, path).split(".")
                up = node.level - 1
                if up >= len(base):
                    raise ValueError(f"{path}:{node.lineno}: relative import beyond the top package")
                base = base[:len(base) - up]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            add(source, node.lineno)
            for alias in node.names:
                add(f"{source}.{alias.name}", node.lineno)
    return found


def import_graph(trees: list[tuple[Path, str]]) -> dict[str, dict[str, int]]:
    """Module -> {imported module: line} over every (base, package) tree."""
    files: dict[str, Path] = {}
    for base, package in trees:
        files.update(module_files(base, package))
    names = set(files)
    return {m: imports_of(m, p, names) for m, p in files.items()}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), each
    sorted, the list sorted by first member."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return sorted(out)


def describe(graph: dict[str, dict[str, int]], found: list[list[str]]) -> str:
    """One paragraph per cycle: its modules and the imports (with lines) between them."""
    parts = []
    for component in found:
        members = set(component)
        edges = [f"    {m}:{line} imports {t}" for m in component
                 for t, line in sorted(graph[m].items()) if t in members]
        parts.append(f"cycle of {len(component)}: {', '.join(component)}\n" + "\n".join(edges))
    return "\n".join(parts)


@pytest.mark.parametrize("base,package", [(ROOT / "src", "equipoise"), (ROOT, "benchmarks")])
def test_no_import_cycles(base, package):
    graph = import_graph([(base, package)])
    assert len(graph) > 3, f"found no modules under {base / package}"
    found = cycles(graph)
    assert not found, f"{len(found)} import cycle(s) in {package}:\n" + describe(graph, found)


def test_the_graph_sees_lazy_relative_and_type_checking_imports(tmp_path):
    """A made-up package whose cycles hide in each kind of import the test must see."""
    files = {
        "pkg/__init__.py": "from .a import A\n",
        "pkg/a.py": "def f():\n    from .b import g\n",               # lazy: a -> b
        "pkg/b.py": "from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from pkg.a import A\n",      # b -> a
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from .. import d\n",                            # c -> pkg, pkg.d
        "pkg/d.py": "import pkg.sub.c\n",                                # d -> c
        "pkg/e.py": "from . import e_helper\n",                          # e -> pkg only
        "pkg/f.py": "from .sub import c\n",                              # f -> sub, sub.c
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph([(tmp_path, "pkg")])
    assert graph["pkg.sub.c"] == {"pkg": 1, "pkg.d": 1}
    assert graph["pkg.e"] == {"pkg": 1}
    assert graph["pkg.f"] == {"pkg.sub": 1, "pkg.sub.c": 1}
    assert cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.d", "pkg.sub.c"]]
    assert "pkg.a:2 imports pkg.b" in describe(graph, cycles(graph))


def test_no_cycle_in_a_chain():
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) == []
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == [["a", "b", "c"]]


ROLES = ("coordinator", "server", "worker")


def test_the_role_packages_import_no_other_role_package():
    """The coordinator, the server and the worker are packages that import only shared
    layers (protocol, policy, wire, data, models, ...), never one another; only launch/
    imports all three."""
    graph = import_graph([(ROOT / "src", "equipoise")])
    crossings = []
    for module, targets in sorted(graph.items()):
        parts = module.split(".")
        if len(parts) < 2 or parts[1] not in ROLES:
            continue
        for target, line in sorted(targets.items()):
            other = target.split(".")
            if len(other) > 1 and other[1] in ROLES and other[1] != parts[1]:
                crossings.append(f"{module}:{line} imports {target}")
    assert not crossings, "\n".join(crossings)


def test_no_module_is_over_500_lines():
    """A module a newcomer can read whole: none of src/ over 500 lines."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "src" / "equipoise"
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, long
