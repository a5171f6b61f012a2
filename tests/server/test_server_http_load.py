"""Many agents at once over HTTP: 16 concurrent MCP sessions x 50 read-only calls on `tradewind serve`, no errors.

The server is the real `tradewind serve --transport http` subprocess on a free loopback port with
`$TRADEWIND_TOKEN` set; each client is the SDK's streamable HTTP client sending the bearer token. The workspace
holds the suite's dataset and a few runs. Every answer must be the one a lone client gets for the same call.

Bad Origin and Host headers with `--host 0.0.0.0` are covered by
`test_server_http_security.py::test_binding_all_interfaces_with_auth_still_checks_token_host_and_origin`.
"""

import secrets
import shutil
from pathlib import Path

import anyio
import httpx2
import pytest
from http_helpers import running_server, server_env
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tradewind.core.workspace import COMPILE_CACHE_ENV
from tradewind.runs.layout import RunLayout
from tradewind.runs.record import read_record, write_record

pytestmark = pytest.mark.anyio

CLIENTS = 16
CALLS_PER_CLIENT = 50
RUNS = 4
DEADLINE_S = 240  # for all 800 calls; on 2 busy cores they take a few seconds


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, ctx, dataset_id, finished_run) -> Path:
    """A fresh workspace with the suite's dataset and RUNS copies of its finished run.

    Each copy's record says a Python `train` call ran it (backend 'process', no job), as the trainer leaves such a
    run: the copies then need no job in this workspace's job database, and read as the finished runs they are.
    """
    root = tmp_path_factory.mktemp("load-workspace")
    shutil.copytree(ctx.workspace.dataset_dir(dataset_id), root / "datasets" / dataset_id)
    source = RunLayout(Path(finished_run.run_dir))
    record = read_record(source.record)
    for index in range(RUNS):
        run_id = f"load-{index}"
        copy = RunLayout(root / "runs" / run_id)
        shutil.copytree(source.root, copy.root, ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
        write_record(copy.record, record.model_copy(update={"run_id": run_id, "backend": "process", "job_id": None}))
    (root / "settings.yaml").write_text("backend: local\n", encoding="utf-8")
    return root


def read_only_calls(run_ids: list[str]) -> list[tuple[str, dict]]:
    """The calls the clients take turns at: every run's get_run and read_metrics, and the listings."""
    calls = [("list_runs", {"limit": 20}), ("list_datasets", {}), ("cluster_status", {"backend": "local"})]
    for run_id in run_ids:
        calls += [("get_run", {"run_id": run_id}), ("read_metrics", {"run_id": run_id})]
    return calls


def session(url: str, token: str):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return http, Client(streamable_http_client(url, http_client=http))


@pytest.mark.slow
async def test_sixteen_concurrent_clients_make_fifty_read_only_calls_each_with_no_error_and_right_answers(
    workspace, dataset_id, finished_run
):
    run_ids = [f"load-{index}" for index in range(RUNS)]
    calls = read_only_calls(run_ids)
    token = secrets.token_urlsafe(32)
    # cluster_status describes the compile cache: the workspace's own, not the one the suite's jobs share (the other
    # pytest process's runs write to that one while these clients compare their answers).
    env = {key: value for key, value in server_env(token).items() if key != COMPILE_CACHE_ENV}
    with running_server(workspace, "--host", "127.0.0.1", env=env) as server:
        # What a lone client is told: the answer every concurrent call must match.
        http, client = session(server.url, token)
        with anyio.fail_after(60):
            async with http, client:
                expected = {}
                for name, arguments in calls:
                    result = await client.call_tool(name, arguments)
                    assert not result.is_error, (name, result.content)
                    expected[name, repr(arguments)] = result.structured_content

        answers: list[tuple[str, dict, object]] = []
        failures: list[str] = []

        async def one_client(index: int) -> None:
            http, client = session(server.url, token)
            try:
                async with http, client:
                    for turn in range(CALLS_PER_CLIENT):
                        name, arguments = calls[(index + turn) % len(calls)]
                        result = await client.call_tool(name, arguments)
                        answers.append((name, arguments, result))
            except Exception as error:  # one client's failure is reported with everyone's, not instead of them
                failures.append(f"client {index}: {type(error).__name__}: {error}")

        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as group:
                for index in range(CLIENTS):
                    group.start_soon(one_client, index)

    assert not failures, failures
    assert len(answers) == CLIENTS * CALLS_PER_CLIENT
    errors = [(name, arguments, result.content) for name, arguments, result in answers if result.is_error]
    assert not errors, errors[:5]
    wrong = [
        (name, arguments)
        for name, arguments, result in answers
        if result.structured_content != expected[name, repr(arguments)]
    ]
    assert not wrong, f"{len(wrong)} answers differ from a lone client's, e.g. {wrong[:5]}"

    # And the lone client's answers are the right ones: each run asked for, the workspace's runs and dataset.
    for run_id in run_ids:
        run = expected["get_run", repr({"run_id": run_id})]
        assert run["run_id"] == run_id and run["status"] == "SUCCEEDED" and run["step"] == finished_run.step
        assert expected["read_metrics", repr({"run_id": run_id})]["run_id"] == run_id
    listed = expected["list_runs", repr({"limit": 20})]
    assert listed["total"] == RUNS and sorted(run["run_id"] for run in listed["runs"]) == run_ids
    assert [dataset["dataset_id"] for dataset in expected["list_datasets", repr({})]["datasets"]] == [dataset_id]
    assert [backend["name"] for backend in expected["cluster_status", repr({"backend": "local"})]["backends"]] == [
        "local"
    ]
