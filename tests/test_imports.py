"""What imports what: the CLI and the server answer without loading JAX (timing: benchmarks/startup.py), the
benchmark scripts import what they use, and the test modules only what the dev extra installs."""

import subprocess
import sys
from pathlib import Path


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_importing_the_server_and_tools_does_not_import_jax():
    result = run_python(
        "import sys, tradewind.server, tradewind.tools, tradewind.cli, tradewind.demo; "
        "loaded = [m for m in ('jax', 'flax', 'optax', 'orbax', 'matplotlib') if m in sys.modules]; "
        "print(loaded)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_cli_help_answers_quickly_without_heavy_imports():
    result = run_python(
        "import sys, time; from tradewind.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('LOADED', [m for m in ('jax', 'pydantic', 'mcp') if m in sys.modules])"
    )
    assert result.returncode == 0, result.stderr
    assert "serve" in result.stdout and "demo" in result.stdout
    assert result.stdout.strip().endswith("LOADED []")


def test_every_benchmark_script_still_imports_what_it_uses():
    # A benchmark is run by hand, so a renamed module would go unnoticed until someone measures; each script's
    # imports (not its main()) run here, in one interpreter apart from the tests.
    script = (
        "import glob, runpy\n"
        "for path in sorted(glob.glob('benchmarks/*.py')):\n"
        "    runpy.run_path(path, run_name='imported_by_a_test')\n"
        "    print(path)\n"
    )
    result = run_python(script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == sorted(str(path) for path in Path("benchmarks").glob("*.py")), result.stdout


def installed_with(distribution: str, extras: frozenset[str] = frozenset()) -> set[str]:
    """The distributions `pip install 'distribution[extras]'` installs (by normalised name), from their metadata."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: set[str] = set()
    pending = [(distribution, extras)]
    while pending:
        name, wanted = pending.pop()
        key = (canonicalize_name(name), wanted)
        if key in found:
            continue
        found.add(key)
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            markers = [{"extra": extra} for extra in wanted or {""}]
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in markers):
                pending.append((requirement.name, frozenset(requirement.extras)))
    return {name for name, _ in found}


def test_every_test_module_imports_only_what_the_dev_extra_installs():
    # `make test` on a fresh clone installs the dev extra alone; CI installs more, so a test module that imports
    # a package only CI's extras bring (httpx, once) is collected there and fails collecting everywhere else.
    # Optional packages are imported inside the tests that need them, which skip where they are missing.
    import ast
    from importlib import metadata

    from packaging.utils import canonicalize_name

    tests = Path(__file__).parent
    ours = {"tradewind", *(path.stem for path in tests.rglob("*.py"))}
    dev = installed_with("tradewind", frozenset({"dev"}))
    providers = metadata.packages_distributions()
    outside = set()
    for path in sorted(tests.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            for top in {name.split(".")[0] for name in names}:
                if top in sys.stdlib_module_names or top in ours:
                    continue
                if not {canonicalize_name(dist) for dist in providers.get(top, [])} & dev:
                    outside.add(f"{path.relative_to(tests)}: {top}")
    assert not outside, sorted(outside)
