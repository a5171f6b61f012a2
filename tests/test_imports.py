"""Start-up stays light: the CLI and the server answer without loading JAX (timing: benchmarks/startup.py)."""

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
