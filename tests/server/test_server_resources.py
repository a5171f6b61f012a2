"""Resources (a run's files, the run list, a sweep, a dataset's manifest, the skills) and prompts through the real
in-memory client."""

import base64
import json
import shutil

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS
from runs_helpers import metric_rows, write_run, write_sweep

from tradewind.prompts import load_skill, skill_names
from tradewind.runs import RunRecord
from tradewind.server import build_server
from tradewind.server.resources import MAX_RESOURCE_CHARS, result_links
from tradewind.tools import (
    ListRunsRequest,
    RunRequest,
    SweepRequest,
    ToolContext,
    get_sweep,
    list_runs,
    summarize_report,
)
from tradewind.tools.bounds import SUMMARY_CHARS

pytestmark = pytest.mark.anyio

RUN_PARTS = {
    "config": "application/json",
    "metrics": "text/plain",
    "logs": "text/plain",
    "report": "text/markdown",
    "plot": "image/png",
    "profile": "application/json",
}
PROMPT_ARGUMENTS = {
    "train_on_text": {"input": False, "steps": False},
    "plan-experiment": {"goal": True, "dataset": False, "budget": False},
    "debug-run": {"run_id": True},
    "compare-runs": {"run_ids": True},
    "scale-out": {"run_id": True, "accelerator": False, "backend": False},
}


async def read(client, uri: str):
    (content,) = (await client.read_resource(uri)).contents
    return content


async def read_error(client, uri: str) -> MCPError:
    with pytest.raises(MCPError) as caught:
        await client.read_resource(uri)
    return caught.value


async def test_every_resource_template_is_listed_with_its_mime_type(server):
    async with Client(server) as client:
        templates = {t.uri_template: t for t in (await client.list_resource_templates()).resource_templates}
    expected = {f"tradewind://runs/{{run_id}}/{part}": mime for part, mime in RUN_PARTS.items()}
    expected["tradewind://datasets/{dataset_id}/manifest"] = "application/json"
    expected["tradewind://skills/{name}"] = "text/markdown"
    expected["tradewind://schema/{tool}"] = "application/json"
    expected["tradewind://reports/{report_id}"] = "text/markdown"
    expected["tradewind://reports/{report_id}/plot"] = "image/png"
    expected["tradewind://sweeps/{sweep_id}"] = "application/json"
    assert {uri: t.mime_type for uri, t in templates.items()} == expected
    assert all(t.description for t in templates.values())


async def test_the_run_list_and_each_skill_are_listed_as_resources(server):
    async with Client(server) as client:
        listed = {resource.uri: resource for resource in (await client.list_resources()).resources}
    skills = {f"tradewind://skills/{name}" for name in skill_names()}
    assert set(listed) == {"tradewind://runs", "ui://tradewind/dashboard", *skills}
    assert listed["tradewind://runs"].mime_type == "application/json"
    debug = listed["tradewind://skills/debug-a-diverging-run"]
    assert debug.title == "Debug a diverging run" and debug.mime_type == "text/markdown"
    assert debug.description.startswith("Diagnose a Tradewind training run whose loss blew up")
    assert all(listed[uri].title and "Use when" in listed[uri].description for uri in skills)


async def test_the_run_list_reads_as_what_list_runs_returns(tmp_path):
    ctx = ToolContext.open(tmp_path / "ws")
    write_run(ctx, "run-1", metric_rows(steps=20), RunRecord(run_id="run-1", backend="process"))
    (ctx.workspace.runs_dir / "not-a-run").mkdir()
    async with Client(build_server(ctx)) as client:
        content = await read(client, "tradewind://runs")
    listed = json.loads(content.text)
    assert content.mime_type == "application/json" and [run["run_id"] for run in listed["runs"]] == ["run-1"]
    assert listed == list_runs(ctx, ListRunsRequest()).model_dump(mode="json")


async def test_a_sweep_reads_as_what_get_sweep_returns_and_an_unknown_one_is_a_readable_error(tmp_path):
    ctx = ToolContext.open(tmp_path / "ws")
    write_sweep(ctx, "sweep-done", [], status="succeeded")
    async with Client(build_server(ctx)) as client:
        content = await read(client, "tradewind://sweeps/sweep-done")
        missing = await read_error(client, "tradewind://sweeps/no-such-sweep")
    expected = get_sweep(ctx, SweepRequest(sweep_id="sweep-done")).model_dump(mode="json")
    assert content.mime_type == "application/json" and json.loads(content.text) == expected
    assert expected["status"] == "succeeded"
    assert missing.error.code == INVALID_PARAMS and "no-such-sweep" in missing.error.message


@pytest.mark.slow
async def test_a_finished_runs_config_metrics_logs_and_report_read_as_resources(server, ctx, finished_run):
    run_id = finished_run.run_id
    async with Client(server) as client:
        config = await read(client, f"tradewind://runs/{run_id}/config")
        assert config.mime_type == "application/json" and json.loads(config.text)["steps"] == 30
        metrics = await read(client, f"tradewind://runs/{run_id}/metrics")
        rows = [json.loads(line) for line in metrics.text.splitlines()]
        assert rows and rows[-1]["step"] == 30 and metrics.mime_type == "text/plain"
        logs = await read(client, f"tradewind://runs/{run_id}/logs")
        assert logs.text.strip() and not logs.text.startswith("# cut")
        summarize_report(ctx, RunRequest(run_id=run_id))
        report = await read(client, f"tradewind://runs/{run_id}/report")
        assert report.mime_type == "text/markdown" and report.text.startswith(f"# Training report: {run_id}")


async def links_of(result) -> dict[str, str]:
    assert not result.is_error, result.content
    return {block.name.split(" ", 1)[1]: block.uri for block in result.content if block.type == "resource_link"}


@pytest.mark.slow
async def test_tool_results_link_the_resources_that_hold_more_and_each_link_reads(server, finished_run):
    run_id = finished_run.run_id
    async with Client(server) as client:
        run_links = await links_of(await client.call_tool("get_run", {"run_id": run_id}))
        report_links = await links_of(await client.call_tool("summarize_report", {"run_id": run_id}))
        assert run_links == {part: f"tradewind://runs/{run_id}/{part}" for part in ("logs", "metrics")}
        assert report_links == {
            "report": f"tradewind://reports/{run_id}",
            "report plot": f"tradewind://reports/{run_id}/plot",
        }
        assert (await read(client, run_links["logs"])).text.strip()
        assert (await read(client, report_links["report"])).text.startswith(f"# Training report: {run_id}")
        plot = await read(client, report_links["report plot"])
    assert plot.mime_type == "image/png" and base64.b64decode(plot.blob).startswith(b"\x89PNG")


def test_a_dataset_written_to_a_bucket_links_no_workspace_resource():
    # tokenize_dataset with `output`: the cache is in the bucket only, where no workspace resource reads it.
    local = result_links(("manifest",), {"dataset_id": "ds-1", "path": "/ws/datasets/ds-1"})
    assert [link.uri for link in local] == ["tradewind://datasets/ds-1/manifest"]
    assert result_links(("manifest",), {"dataset_id": "ds-1", "path": "gs://bucket/caches/ds-1"}) == []


@pytest.mark.slow
async def test_a_result_is_sent_as_a_one_line_summary_beside_its_structured_content(server, finished_run):
    # Issue 23 item 12: the data travels once, in structured content; the text only says what it holds.
    async with Client(server) as client:
        result = await client.call_tool("get_run", {"run_id": finished_run.run_id})
    text = result.content[0].text
    assert result.structured_content["run_id"] == finished_run.run_id
    assert text.startswith("get_run result (whole in structured content): ")
    assert f'run_id="{finished_run.run_id}"' in text and 'status="SUCCEEDED"' in text
    assert len(text) <= SUMMARY_CHARS and "\n" not in text


@pytest.mark.slow
async def test_long_metrics_and_logs_are_cut_to_their_last_part_with_a_note(server, ctx, finished_run):
    folder = ctx.workspace.runs_dir / "long-log-run"
    shutil.copytree(ctx.workspace.run_dir(finished_run.run_id), folder, dirs_exist_ok=True)
    with open(folder / "train.log", "a", encoding="utf-8") as log:
        log.writelines(f"line {i} {'x' * 60}\n" for i in range(3000))
    row = (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[-1]
    (folder / "metrics.jsonl").write_text(f"{row}\n" * 2000, encoding="utf-8")
    async with Client(server) as client:
        logs = (await read(client, "tradewind://runs/long-log-run/logs")).text
        metrics = (await read(client, "tradewind://runs/long-log-run/metrics")).text
    assert len(logs) <= MAX_RESOURCE_CHARS and logs.startswith("# cut: the last part of train.log")
    assert logs.endswith(f"line 2999 {'x' * 60}\n") and logs.splitlines()[1].startswith("line ")
    assert len(metrics) <= MAX_RESOURCE_CHARS and "`read_metrics` tool" in metrics.splitlines()[0]
    assert all(json.loads(line) for line in metrics.splitlines()[1:])


@pytest.mark.slow
async def test_a_report_not_yet_written_says_to_call_summarize_report(server, ctx, finished_run):
    folder = ctx.workspace.runs_dir / "unreported-run"
    shutil.copytree(ctx.workspace.run_dir(finished_run.run_id), folder, dirs_exist_ok=True)
    async with Client(server) as client:
        error = await read_error(client, "tradewind://runs/unreported-run/report")
    assert error.error.code == INVALID_PARAMS and "call the `summarize_report` tool" in error.error.message


async def test_an_unknown_run_or_a_bad_id_is_a_readable_error(server):
    async with Client(server) as client:
        missing = await read_error(client, "tradewind://runs/no-such-run/logs")
        bad = await read_error(client, "tradewind://runs/..%2Fetc/config")
    assert missing.error.code == INVALID_PARAMS and "no-such-run" in missing.error.message
    assert bad.error.code == INVALID_PARAMS and "Error reading resource" not in bad.error.message


async def test_a_datasets_manifest_reads_as_json(server, dataset_id):
    async with Client(server) as client:
        manifest = await read(client, f"tradewind://datasets/{dataset_id}/manifest")
        missing = await read_error(client, "tradewind://datasets/no-such-dataset/manifest")
    assert manifest.mime_type == "application/json" and isinstance(json.loads(manifest.text), dict)
    assert missing.error.code == INVALID_PARAMS and "no-such-dataset" in missing.error.message


async def test_a_tools_whole_input_schema_reads_as_json_and_an_unknown_tool_names_the_tools(server):
    async with Client(server) as client:
        content = await read(client, "tradewind://schema/launch_training")
        error = await read_error(client, "tradewind://schema/no_such_tool")
    assert content.mime_type == "application/json" and len(content.text) <= MAX_RESOURCE_CHARS
    schema = json.loads(content.text)
    assert schema["additionalProperties"] is False and "distributed" not in schema["properties"]
    assert schema["properties"]["model"]["properties"]["n_layers"]["default"] == 4
    assert schema["properties"]["optimizer"] == {
        "$ref": "#/$defs/OptimizerConfig",
        "description": "Optimizer and LR schedule.",
    }
    assert "no tool 'no_such_tool'" in error.error.message and "launch_training" in error.error.message


async def test_a_read_only_server_serves_the_schemas_of_its_tools_only(ctx):
    async with Client(build_server(ctx, read_only=True)) as client:
        assert "run_id" in json.loads((await read(client, "tradewind://schema/get_run")).text)["properties"]
        error = await read_error(client, "tradewind://schema/launch_training")
    assert "no tool 'launch_training'" in error.error.message


async def test_every_shipped_skill_reads_as_markdown(server):
    assert {"train-with-tradewind", "autoresearch-loop", "debug-a-diverging-run"} <= set(skill_names())
    async with Client(server) as client:
        for name in skill_names():
            skill = await read(client, f"tradewind://skills/{name}")
            assert skill.mime_type == "text/markdown" and skill.text == load_skill(name)
            assert skill.text.startswith(f"---\nname: {name}\n")
        unknown = await read_error(client, "tradewind://skills/nope")
    assert unknown.error.code == INVALID_PARAMS
    assert "known skills: " + ", ".join(skill_names()) in unknown.error.message


async def test_every_prompt_is_listed_with_described_arguments(server):
    async with Client(server) as client:
        prompts = {prompt.name: prompt for prompt in (await client.list_prompts()).prompts}
    assert set(prompts) == set(PROMPT_ARGUMENTS)
    for name, arguments in PROMPT_ARGUMENTS.items():
        assert prompts[name].description, name
        assert {a.name: a.required for a in prompts[name].arguments} == arguments, name
        assert all(a.description for a in prompts[name].arguments), name


async def test_every_prompt_renders_with_its_arguments(server):
    async with Client(server) as client:
        texts = {
            name: (await client.get_prompt(name, arguments)).messages[0].content.text
            for name, arguments in {
                "train_on_text": {"steps": "50"},
                "plan-experiment": {"goal": "Does a wider model help?"},
                "debug-run": {"run_id": "run-1"},
                "compare-runs": {"run_ids": "run-1, run-2"},
                "scale-out": {"run_id": "run-1", "accelerator": "tpu-v5litepod-8"},
            }.items()
        }
    assert "50 steps" in texts["train_on_text"]
    assert (
        "Does a wider model help?" in texts["plan-experiment"] and "builtin:tinyshakespeare" in texts["plan-experiment"]
    )
    assert "tradewind://runs/run-1/logs" in texts["debug-run"]
    assert "`run-1`, `run-2`" in texts["compare-runs"]
    assert "`tpu-v5litepod-8`" in texts["scale-out"] and "`ray`" in texts["scale-out"]


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("nope", {}, "unknown prompt 'nope'; known prompts: compare-runs, debug-run"),
        ("debug-run", {}, "prompt 'debug-run' needs argument(s): run_id (The run to debug"),
        ("debug-run", {"run_id": "a", "runid": "b"}, "takes no argument(s) runid; it takes: run_id"),
        ("train_on_text", {"steps": "many"}, "prompt 'train_on_text': steps: Input should be a valid integer"),
        ("compare-runs", {"run_ids": "only-one"}, "two or more run ids"),
    ],
)
async def test_a_bad_prompt_request_is_an_invalid_params_error(server, name, arguments, message):
    async with Client(server) as client:
        with pytest.raises(MCPError) as caught:
            await client.get_prompt(name, arguments)
    assert caught.value.error.code == INVALID_PARAMS
    assert message in caught.value.error.message
