"""Start-up stays light: the CLI and the server answer without loading JAX (timing: benchmarks/startup.py)."""

import subprocess
import sys


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
