"""The engine's import graph, read statically from the source (imports inside functions count:
a loop closed there still ties two modules together): no module of ``loomlab.core`` reaches
itself again, and none imports another module's underscore names. import-linter's contracts
keep the floors; this keeps the modules of one floor from looping among themselves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "core"
PACKAGE = "loomlab.core"


def module_name(path: Path) -> str:
    parts = path.relative_to(CORE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


MODULES = {module_name(p): p for p in CORE.rglob("*.py")}


def imported(module: str, node: ast.ImportFrom) -> str:
    """The absolute name an ``import from`` statement of ``module`` reads from."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if MODULES[module].name != "__init__.py":
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def owner(name: str) -> str | None:
    """The module of ``loomlab.core`` that ``name`` (a module or a name in one) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every import in ``module``'s source."""
    out = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.ImportFrom):
            source = imported(module, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in MODULES:
                    out.append((f"{source}.{alias.name}", None))
                else:
                    out.append((source, alias.name))
        elif isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names]
    return out


def edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for name, _ in imports(module):
            target = owner(name)
            # a package's own __init__ runs before its modules: importing it is no edge back
            if target and target != module and not module.startswith(target + "."):
                graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
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
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_loop_and_passes_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_holds_a_known_edge():
    """Read from the source: the network module imports the layers' base class."""
    assert f"{PACKAGE}.layers.base" in edges()[f"{PACKAGE}.network"]


def test_no_module_of_the_engine_imports_itself_back():
    assert cycles(edges()) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_takes_another_modules_underscore_names(module):
    taken = [f"{source}.{name}" for source, name in imports(module)
             if name and name.startswith("_") and not name.startswith("__") and owner(source) != module]
    assert taken == []
