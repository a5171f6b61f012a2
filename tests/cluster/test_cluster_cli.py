import argparse
import json
import subprocess
import sys

from polling import wait_until

from tradewind.cli import main
from tradewind.cluster import JobSpec, JobStatus, LocalBackend
from tradewind.cluster.cli import add_cluster_commands
from tradewind.core.workspace import COMPILE_CACHE_ENV


def run_cli(argv, capsys):
    """`tradewind cluster ...` as the CLI wires it: a common parent parser with --workspace."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workspace")
    parser = argparse.ArgumentParser(prog="tradewind")
    add_cluster_commands(parser.add_subparsers(dest="command", required=True), common)
    args = parser.parse_args(argv)
    code = args.handler(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_registering_the_cluster_commands_loads_neither_pydantic_nor_ray():
    code = (
        "import argparse, sys; from tradewind.cluster.cli import add_cluster_commands\n"
        "p = argparse.ArgumentParser()\n"
        "add_cluster_commands(p.add_subparsers(), argparse.ArgumentParser(add_help=False))\n"
        "print([m for m in ('pydantic', 'ray', 'jax') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


def test_status_logs_and_cancel_from_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(COMPILE_CACHE_ENV)  # the workspace's own cache/xla, not the suite's shared one
    workspace = tmp_path / "ws"
    backend = LocalBackend(workspace / "jobs", cpus=2, memory_gb=4)
    done = backend.wait(backend.submit(JobSpec(name="hello", command=["echo", "hello there"])).id, timeout=30)
    running = backend.submit(JobSpec(name="sleeper", command=["sleep", "300"]))
    wait_until(lambda: backend.status(running.id).status is JobStatus.RUNNING, 30, "the job starting")

    code, out, _ = run_cli(["cluster", "status", "--workspace", str(workspace), "--json"], capsys)
    status = json.loads(out)
    assert code == 0 and status["capacity"]["cpus"] == 2 and [j["id"] for j in status["running"]] == [running.id]
    assert status["compile_cache"] == {"bytes": 0, "files": 0}  # JAX's compiled programs: none in this workspace
    shared = tmp_path / "shared-xla"  # a cache several workspaces share is the one shown
    shared.mkdir()
    (shared / "program-cache").write_bytes(b"x" * 10)
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(shared))
    code, out, _ = run_cli(["cluster", "status", "--workspace", str(workspace), "--json"], capsys)
    assert code == 0 and json.loads(out)["compile_cache"] == {"bytes": 10, "files": 1}

    code, out, err = run_cli(["cluster", "logs", done.id, "--workspace", str(workspace), "--offset", "6"], capsys)
    assert (code, out) == (0, "there\n") and "next offset 12 of 12" in err

    code, out, _ = run_cli(["cluster", "cancel", running.id, "--workspace", str(workspace)], capsys)
    assert code == 0 and running.id in out
    assert backend.wait(running.id, timeout=30).status is JobStatus.CANCELLED


def test_pipeline_plans_by_default_taking_a_relative_file_from_the_workspace(tmp_path, capsys, monkeypatch):
    pipe = tmp_path / "ws" / "pipe.py"
    pipe.parent.mkdir()
    pipe.write_text(
        "from tradewind.cluster import Step\nsteps = [Step('only', lambda out, cfg, inputs: None, {'a': 1})]\n"
    )
    monkeypatch.chdir(tmp_path)  # "pipe.py" here would be nothing: the workspace root is where it starts
    code, out, _ = run_cli(["cluster", "pipeline", "pipe.py", "--workspace", str(tmp_path / "ws")], capsys)
    assert code == 0 and json.loads(out)["action"] == "run"
    code, out, _ = run_cli(["cluster", "pipeline", str(pipe), "--run", "--workspace", str(tmp_path / "ws")], capsys)
    assert code == 0 and json.loads(out)["action"] == "run"
    code, out, _ = run_cli(["cluster", "pipeline", str(pipe), "--workspace", str(tmp_path / "ws")], capsys)
    assert json.loads(out)["action"] == "cached"


def test_a_failing_step_ends_the_pipeline_command_with_the_step_and_its_exception(tmp_path, capsys):
    pipe = tmp_path / "ws" / "pipe.py"
    pipe.parent.mkdir()
    pipe.write_text(
        "from tradewind.cluster import Step\n"
        "def fail(out, cfg, inputs):\n    raise RuntimeError('out of tea')\n"
        "steps = [Step('brew', fail, {})]\n"
    )
    code = main(["cluster", "pipeline", str(pipe), "--run", "--workspace", str(tmp_path / "ws")])
    err = capsys.readouterr().err
    assert code == 2 and "tradewind cluster: step 'brew' failed: RuntimeError: out of tea" in err
    assert "[0/1] step brew" in err  # progress came before the failure


def test_a_pipeline_file_outside_the_workspace_is_refused_naming_the_argument(tmp_path, capsys):
    (tmp_path / "pipe.py").write_text("steps = []\n")
    code = main(["cluster", "pipeline", str(tmp_path / "pipe.py"), "--workspace", str(tmp_path / "ws")])
    assert code == 2 and "argument 'file'" in capsys.readouterr().err
