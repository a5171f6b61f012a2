"""Every code name the guidance mentions exists: AGENTS.md files, agent skills, prompts, docs and the README.

The guidance is `README.md`, every `AGENTS.md`, `tradewind/prompts/**/*.md` (the skills that `.agents/skills/`
links to, and the prompts) and `docs/**/*.md`. Only inline code (single backticks outside fenced blocks) is
read, and within it only what is unmistakably a name in this repository, so that the test is strict without
false alarms:

1. A dotted name that starts with `tradewind.` (anywhere in the span, so the module of `python -m
   tradewind.runs.reference` counts; `pkg.module:function` is read as `pkg.module.function`) must resolve:
   each part a subpackage, module, or a name the module defines or imports (a function, class, assignment,
   `_LAZY` entry), then members of a class (its methods, fields, class and `self.` attributes, those of its
   bases in this package, and pydantic's own). What follows a name that is not a module or class goes unchecked.
2. A dotted name whose first part is a module (`launching.run_config`, `runs.hf.check_matches_hf`) resolves the
   same way from the package its `AGENTS.md` documents, or from `tradewind`. A config field path
   (`optimizer.bf16_moments`, `model.d_model`: a field of `TrainConfig`, through its sections and every
   architecture's model config) is no module path and passes. A name whose first part is no module is not read.
3. A dotted name whose first part is a class defined in this package (`Workspace.resolve_path`) must name one of
   its members.
4. A path (path characters only) that starts with `tradewind/`, `tests/`, `benchmarks/`, `scripts/`, `docs/` or
   `.agents/`, or ends in `.py`, must exist: from the repository root, from `tradewind/` or from the page's
   folder; a bare file name (`step.py`) as a Python file somewhere in `tradewind/`, `tests/`, `benchmarks/` or
   `scripts/`.
5. In a module table of an `AGENTS.md` (a row whose first cell names `x.py` files), a bare name that looks like
   code (`snake_case` with an underscore, `CamelCase`, `UPPER_CASE`, or `name(...)`) must be defined in one of
   the row's modules (at any depth: a function, class, assignment, parameter or attribute), imported by one, or
   be a field of some class in the package (rows name the fields their modules read and write).

Everything is read with `ast` from the source, never imported (no JAX), except the config models for rule 2.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "tradewind"
PATH_ROOTS = ("tradewind/", "tests/", "benchmarks/", "scripts/", "docs/", ".agents/")
# A span ending so names a file (`config.json`, `supervisor.log`), not a module path.
FILE_ENDINGS = (".py", ".md", ".json", ".jsonl", ".yaml", ".yml", ".txt", ".toml", ".html", ".gz", ".png", ".csv")
FILE_ENDINGS += (".tsv", ".log", ".sqlite", ".db", ".lock", ".sock", ".jinja", ".safetensors", ".parquet", ".pb")
# Attributes every pydantic model has, for members of classes that derive from `BaseModel`.
PYDANTIC_MEMBERS = {"model_fields", "model_validate", "model_dump", "model_copy", "model_json_schema"}


def guidance_files() -> list[Path]:
    files = {ROOT / "README.md", ROOT / "AGENTS.md"}
    files |= set(PACKAGE.glob("*/AGENTS.md"))
    files |= set((PACKAGE / "prompts").rglob("*.md"))
    files |= set((ROOT / "docs").rglob("*.md"))
    # `.agents/skills/*/SKILL.md` are links to the prompts' skills: read once, under their own name.
    files |= {path.resolve() for path in (ROOT / ".agents" / "skills").glob("*/SKILL.md")}
    return sorted(files)


def inline_code(text: str) -> list[tuple[str, str]]:
    """Each inline code span with the line it is on, fenced blocks left out."""
    spans, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            spans += [(span, line) for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", line)]
    return spans


# -- what a module defines, read with ast ------------------------------------------------------------------


def module_file(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def read_module(dotted: str) -> dict[str, ast.AST | str]:
    """The names a module defines or imports: each one's definition, or the dotted name it is imported as."""
    path = module_file(dotted)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: dict[str, ast.AST | str] = {}
    package = dotted if path.name == "__init__.py" else dotted.rsplit(".", 1)[0]

    def top_level(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names[node.name] = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names[name.id] = node
                if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets) and isinstance(
                    node.value, ast.Dict
                ):
                    for key, value in zip(node.value.keys, node.value.values, strict=True):
                        if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                            names[key.value] = f"{value.value}.{key.value}"
            elif isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    source = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], source])
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{source.strip('.')}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    names[alias.asname or alias.name.split(".")[0]] = alias.name
            elif isinstance(node, ast.If | ast.Try):
                top_level(node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body])

    top_level(tree.body)
    return names


def is_module(dotted: str) -> bool:
    return dotted.split(".")[0] == "tradewind" and module_file(dotted) is not None


def class_members(node: ast.ClassDef, module: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """A class's members: methods, nested classes, fields, class and `self.` attributes, and its bases'."""
    members = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            members.add(item.name)
        elif isinstance(item, ast.Assign | ast.AnnAssign):
            for target in item.targets if isinstance(item, ast.Assign) else [item.target]:
                members |= {name.id for name in ast.walk(target) if isinstance(name, ast.Name)}
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.ctx, ast.Store)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == "self"
        ):
            members.add(sub.attr)
    for base in node.bases:
        name = ast.unparse(base).split("[")[0]
        if name.split(".")[-1] == "BaseModel":
            members |= PYDANTIC_MEMBERS
        target = resolve_name(module, name.split("."))
        if isinstance(target, tuple) and isinstance(target[0], ast.ClassDef) and target[1] not in seen:
            members |= class_members(target[0], target[1], seen | {target[1]})
    return members


def resolve_name(module: str, parts: list[str]) -> tuple[ast.AST, str] | str | None:
    """The definition that `parts` names in `module`: (node, module it is in), a module name, or None."""
    name, rest = parts[0], parts[1:]
    if is_module(f"{module}.{name}"):
        return resolve_dotted(f"{module}.{name}", rest)
    found = read_module(module).get(name)
    if found is None:
        return None
    if isinstance(found, str):  # imported, or a lazy export: follow it into this package
        source, _, imported = found.rpartition(".")
        if is_module(found):
            return resolve_dotted(found, rest)
        if not is_module(source):
            return found  # from outside the package: not checked further
        return resolve_name(source, [imported, *rest])
    if not rest:
        return found, module
    if isinstance(found, ast.ClassDef):
        if rest[0] not in class_members(found, module):
            return None
        nested = next((n for n in found.body if isinstance(n, ast.ClassDef) and n.name == rest[0]), None)
        if nested is not None and len(rest) > 1:
            return (nested, module) if rest[1] in class_members(nested, module) else None
    return found, module  # an attribute of a function or value: not checked further


def resolve_dotted(module: str, rest: list[str]) -> tuple[ast.AST, str] | str | None:
    return module if not rest else resolve_name(module, rest)


# -- config field paths (rule 2) ------------------------------------------------------------------------------


@cache
def config_fields() -> set[str]:
    """Every field path of a training config: `steps`, `optimizer.bf16_moments`, `model.d_model`, ..."""
    from pydantic import BaseModel

    from tradewind.runs.config import TrainConfig
    from tradewind.runs.models.configs import ARCHITECTURES

    paths = set()

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            paths.add(prefix + name)
            if name == "model" and not prefix:
                for architecture in ARCHITECTURES.values():
                    walk(architecture, "model.")
                continue
            for candidate in getattr(info.annotation, "__args__", ()) or (info.annotation,):
                if isinstance(candidate, type) and issubclass(candidate, BaseModel) and prefix.count(".") < 3:
                    walk(candidate, f"{prefix}{name}.")

    walk(TrainConfig, "")
    return paths


@cache
def class_index() -> dict[str, list[tuple[ast.ClassDef, str]]]:
    """Every class defined at the top level of a module of the package, by name."""
    index: dict[str, list[tuple[ast.ClassDef, str]]] = {}
    for path in PACKAGE.rglob("*.py"):
        dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for name, node in read_module(dotted).items():
            if isinstance(node, ast.ClassDef):
                index.setdefault(name, []).append((node, dotted))
    return index


@cache
def source_words(module: str) -> set[str]:
    """Every word of a module's source: its names, and those its docstrings and comments name."""
    return set(re.findall(r"\w+", module_file(module).read_text(encoding="utf-8")))


@cache
def python_files() -> set[str]:
    """The names of the repository's Python files, for a file named without its folder."""
    return {path.name for top in ("tradewind", "tests", "benchmarks", "scripts") for path in (ROOT / top).rglob("*.py")}


@cache
def top_level_names() -> set[str]:
    """Every name defined at the top level of a module of the package."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        names |= {name for name, node in read_module(dotted).items() if not isinstance(node, str)}
    return names


@cache
def all_fields() -> set[str]:
    """Every member of every class of the package: the fields a table row names beside its modules' functions."""
    return {
        member
        for entries in class_index().values()
        for node, module in entries
        for member in class_members(node, module)
    }


# -- the rules --------------------------------------------------------------------------------------------------

NAME = r"[A-Za-z_]\w*"
DOTTED = re.compile(rf"^{NAME}(\.{NAME})+$")
QUALIFIED = re.compile(rf"(?<![\w./:-])tradewind(\.{NAME})+(:{NAME})?")
CODE_WORD = re.compile(r"^(?:[a-z_]\w*_\w*|_\w+|[A-Z][a-z0-9]+[A-Z]\w*|[A-Z][A-Z0-9]*_[A-Z0-9_]+)$")


def anchors(page: Path) -> list[str]:
    """The packages a page's relative module names are read from: its own layer's, then `tradewind`."""
    relative = page.relative_to(ROOT).parts
    own = [f"tradewind.{relative[1]}"] if relative[0] == "tradewind" and len(relative) > 2 else []
    return [*own, "tradewind"]


def plain(span: str) -> str:
    """The name a span writes as a call (`name(...)`) or with a trailing dot or colon, bare."""
    return re.sub(r"\(.*\)$", "", span.strip()).rstrip(".:,")


def check_span(page: Path, span: str, row_modules: list[str]) -> tuple[list[str], int]:
    """What in `span` does not resolve, and how many names were checked."""
    problems, checked = [], 0
    name = plain(span)
    for match in QUALIFIED.finditer(span):  # rule 1
        checked += 1
        dotted = match.group(0).replace(":", ".")
        if resolve_dotted("tradewind", dotted.split(".")[1:]) is None:
            problems.append(dotted)
    if QUALIFIED.search(span):
        return problems, checked
    if DOTTED.match(name) and not name.endswith(FILE_ENDINGS):
        parts = name.split(".")
        if name in config_fields():  # rule 2: a config field path
            return problems, checked + 1
        roots = [anchor for anchor in anchors(page) if is_module(f"{anchor}.{parts[0]}")]
        if roots:  # rule 2: a module path
            checked += 1
            if all(resolve_dotted(anchor, parts) is None for anchor in roots):
                problems.append(name)
        elif parts[0] in class_index():  # rule 3
            checked += 1
            if not any(resolve_name(module, parts) for _, module in class_index()[parts[0]]):
                problems.append(name)
        return problems, checked
    path = span.strip().rstrip(".,")
    if re.fullmatch(r"[\w./-]+", path) and (path.startswith(PATH_ROOTS) or path.endswith(".py")):  # rule 4
        if "/" in path:
            found = any((place / path).exists() for place in (ROOT, PACKAGE, page.parent))
        else:
            found = path in python_files()
        if not found:
            problems.append(path)
        return problems, checked + 1
    if row_modules and CODE_WORD.match(name):  # rule 5
        checked += 1
        defined = set().union(*(source_words(module) for module in row_modules))
        if name not in defined and name not in all_fields() and name not in top_level_names():
            problems.append(f"{name} (row of {', '.join(m.rsplit('.', 1)[-1] + '.py' for m in row_modules)})")
    return problems, checked


def row_modules(page: Path, line: str) -> list[str]:
    """The modules a table row of an `AGENTS.md` is about (its first cell's `x.py` files), or none."""
    if page.name != "AGENTS.md" or not line.startswith("|"):
        return []
    first = line.split("|")[1]
    modules = []
    for file in re.findall(r"`([\w/]+)\.py`", first):
        for anchor in anchors(page):
            dotted = f"{anchor}.{file.replace('/', '.')}"
            if module_file(dotted) is not None:
                modules.append(dotted)
                break
    return modules


def stale_names() -> tuple[list[str], int]:
    problems, checked = [], 0
    for page in guidance_files():
        text = page.read_text(encoding="utf-8")
        for span, line in inline_code(text):
            found, count = check_span(page, span, row_modules(page, line))
            checked += count
            problems += [f"{page.relative_to(ROOT)}: `{name}`" for name in found]
    return problems, checked


def test_every_code_name_the_guidance_mentions_exists():
    problems, checked = stale_names()
    assert checked > 500, f"only {checked} names checked: the rules no longer find the guidance's names"
    assert not problems, "names in the guidance that do not exist:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("span", "stale"),
    [
        ("tradewind.tools.launching.run_config", True),
        ("tradewind.tools.launching.read_run_config", False),
        ("tradewind.trainer.compile:compile_job", False),
        ("python -m tradewind.runs.reference", False),
        ("tradewind.runs.no_such_module", True),
        ("Workspace.resolve_path", False),
        ("Workspace.no_such_method", True),
        ("optimizer.bf16_moments", False),
        ("tradewind/runs/config.py", False),
        ("tradewind/runs/no_such_file.py", True),
    ],
)
def test_the_rules_tell_a_stale_name_from_a_live_one(span, stale):
    problems, checked = check_span(ROOT / "AGENTS.md", span, [])
    assert checked == 1
    assert bool(problems) == stale
