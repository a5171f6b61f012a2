"""No module of the package imports itself back through others (the layers contract is in .importlinter)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tradewind"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_at_load(path: Path, known: set[str]) -> set[str]:
    """The package modules `path` imports when it loads: top-level imports, not those inside functions or
    under `if TYPE_CHECKING:` (which never run)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def test_no_import_cycle_among_the_package_modules():
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: imports_at_load(path, set(paths)) - {name} for name, path in paths.items()}
    # A package's __init__ importing its own submodules is how packages are made, not a cycle to report.
    graph = {name: {dep for dep in deps if not dep.startswith(name + ".")} for name, deps in graph.items()}
    cycles = []
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                cycles.append(" -> ".join([*trail[trail.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*trail, dep])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []
