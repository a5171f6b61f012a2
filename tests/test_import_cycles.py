"""No module of the package imports itself back through others (the layers contract is in pyproject.toml).

Every import of a package module counts: at the top, inside a function (an import deferred until a call) and
under `if TYPE_CHECKING:` (one only type checkers follow). A deferred import is fine when it only postpones
loading something heavy (JAX in the CLI and the job entries); it must not close a circle, which would only hide
that two modules need each other: their shared part belongs in a module both import at the top.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tradewind"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The package modules `path` imports anywhere: at the top, in functions, under `if TYPE_CHECKING:`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: imported_modules(path, set(paths)) - {name} for name, path in paths.items()}
    # A package's __init__ importing its own submodules is how packages are made, not a circle to report.
    return {name: {dep for dep in deps if not dep.startswith(name + ".")} for name, deps in graph.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
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
            name, deps = work[-1]
            dep = next(deps, None)
            if dep is not None:
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    on_stack.add(dep)
                    work.append((dep, iter(sorted(graph[dep]))))
                elif dep in on_stack:
                    low[name] = min(low[name], index[dep])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[name])
            if low[name] == index[name]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == name:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_circles_finds_a_loop_through_a_function_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]


def test_imports_in_functions_and_under_type_checking_count(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "import tradewind.a\n"
        "if TYPE_CHECKING:\n"
        "    from tradewind.b import B\n"
        "def f():\n"
        "    from tradewind import c\n"
    )
    known = {"tradewind", "tradewind.a", "tradewind.b", "tradewind.c", "tradewind.d"}
    assert imported_modules(module, known) == {"tradewind", "tradewind.a", "tradewind.b", "tradewind.c"}


def test_no_import_circle_among_the_package_modules():
    found = circles(import_graph())
    assert found == [], "modules that import each other (move what they share to a module both import):\n" + "\n".join(
        " <-> ".join(circle) for circle in found
    )
