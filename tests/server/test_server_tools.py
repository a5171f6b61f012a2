"""Every tool through the real MCP client, connected in memory to the real server."""

import itertools
import json
import struct

import anyio
import pytest
from mcp import Client
from mcp_helpers import call
from polling import wait_until

from tradewind.tools import TOOLS, RunRequest, get_run

pytestmark = pytest.mark.anyio


def error_text(result) -> str:
    assert result.is_error, result.structured_content
    return " ".join(block.text for block in result.content)


async def test_every_tool_is_listed_with_input_and_output_schemas(server):
    async with Client(server) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert client.instructions and "tokenize_dataset" in client.instructions
    assert list(listed) == [tool.__name__ for tool in TOOLS]
    for name, tool in listed.items():
        assert tool.description, name
        assert tool.input_schema["type"] == "object", name
        assert tool.output_schema == {"type": "object"}, name  # the result's fields are named in the result
    tokenize = listed["tokenize_dataset"].input_schema
    assert tokenize["required"] == ["input"]
    assert "builtin:tinyshakespeare" in tokenize["properties"]["input"]["description"]
    assert "mcp_context" not in json.dumps(tokenize)
    launch = listed["launch_training"].input_schema
    assert {"dataset", "model", "optimizer", "steps", "batch_size", "seq_len"} <= set(launch["properties"])


async def test_tokenize_dataset_builds_a_cache_then_reuses_it(server, ctx):
    async with Client(server) as client:
        first = await call(client, "tokenize_dataset", {"input": "corpus.txt", "val_fraction": 0.2})
        second = await call(client, "tokenize_dataset", {"input": "corpus.txt", "val_fraction": 0.2})
    assert first["reused"] is False and second["reused"] is True
    assert first["dataset_id"] == second["dataset_id"]
    assert first["vocab_size"] == 258 and first["tokenizer"] == "byte"
    assert first["documents"]["train"] + first["documents"]["val"] == 600
    assert first["path"] == str(ctx.workspace.datasets_dir / first["dataset_id"])


async def test_tokenize_dataset_sends_progress_notifications_up_to_the_input_size(server, ctx):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))

    async with Client(server) as client:
        info = await call(
            client, "tokenize_dataset", {"input": "corpus.txt", "val_fraction": 0.3}, progress_callback=on_progress
        )
    size = (ctx.workspace.root / "corpus.txt").stat().st_size
    assert info["reused"] is False and info["bad_records"] == {"skipped": 0, "files": 0, "per_file": {}, "examples": []}
    assert seen and seen[-1] == (size, size, "input bytes tokenized")
    assert [p for p, _, _ in seen] == sorted(p for p, _, _ in seen)


async def test_train_tokenizer_trains_a_bpe_tokenizer_that_tokenize_dataset_accepts(server, ctx):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total))

    async with Client(server) as client:
        trained = await call(
            client, "train_tokenizer", {"input": "corpus.txt", "vocab_size": 300}, progress_callback=on_progress
        )
        info = await call(client, "tokenize_dataset", {"input": "corpus.txt", "tokenizer": trained["tokenizer"]})
    assert trained["vocab_size"] == 300 and trained["eos_id"] == 0 and trained["reused"] is False
    assert trained["tokenizer"].startswith(str(ctx.workspace.root / "tokenizers" / "tok-"))
    assert info["vocab_size"] == 300 and info["tokenizer"] == trained["tokenizer"]
    assert seen and seen[-1][0] == seen[-1][1]


async def test_progress_from_the_tokenizer_trainers_own_threads_reaches_the_client(server):
    # The Rust BPE trainer pulls documents (and so reports progress) from threads the tool did not start.
    # Its threads report the same value more than once; only increases may reach the client (MCP spec).
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total))

    async with Client(server) as client:
        trained = await call(
            client,
            "train_tokenizer",
            {"input": "builtin:tinyshakespeare", "vocab_size": 300, "max_documents": 3000},
            progress_callback=on_progress,
        )
    assert trained["vocab_size"] == 300
    done = [progress for progress, _ in seen]
    assert len(done) >= 2 and all(a < b for a, b in itertools.pairwise(done))
    assert seen[-1][0] == seen[-1][1]  # up to the whole input


async def test_inspect_dataset_reports_counts_histogram_and_decoded_samples(server, dataset_id):
    async with Client(server) as client:
        report = await call(client, "inspect_dataset", {"dataset_id": dataset_id, "split": "val", "samples": 2})
    assert report["dataset_id"] == dataset_id and report["tokenizer"] == "byte"
    assert sum(report["histogram"]["counts"]) == report["documents"]["val"]
    assert len(report["samples"]) == 2 and report["samples"][0]["index"] == 0
    assert report["samples"][0]["tokens"] == len(report["samples"][0]["text"].encode()) + 1  # bytes and EOS
    assert report["bad_records"]["skipped"] == 0


async def test_list_datasets_includes_a_tokenized_dataset(server, dataset_id):
    async with Client(server) as client:
        listed = await call(client, "list_datasets", {"limit": 100})
    ids = [d["dataset_id"] for d in listed["datasets"]]
    assert dataset_id in ids and listed["total"] == len(ids)
    assert all(d["tokens"] > d["documents"] > 0 for d in listed["datasets"])


@pytest.mark.slow
async def test_launch_then_wait_reports_progress_and_success(server, dataset_id, tiny_run_settings):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total))

    async with Client(server) as client:
        run = await call(
            client,
            "launch_training",
            {"dataset": dataset_id, "steps": 12, **tiny_run_settings},
        )
        assert run["status"] in ("PENDING", "RUNNING") and run["total_steps"] == 12
        # The server answers other calls while the run trains in its own process.
        listed = await call(client, "list_runs")
        assert run["run_id"] in [r["run_id"] for r in listed["runs"]]
        done = await call(
            client, "wait_for_run", {"run_id": run["run_id"], "timeout_s": 240}, progress_callback=on_progress
        )
    assert done["timed_out"] is False
    assert done["status"] == "SUCCEEDED", done["log_tail"]
    assert done["step"] == 12 and done["exit_code"] == 0
    assert done["summary"]["steps"] == 12 and done["summary"]["parameters"] > 0
    assert seen and seen[-1] == (12, 12)
    assert [p for p, _ in seen] == sorted(p for p, _ in seen)


@pytest.mark.slow
async def test_a_call_that_continues_a_run_inherits_every_field_it_leaves_out(server, finished_run):
    # The SDK fills in every default; the run must still take seed, model, batch shape... from its parent.
    async with Client(server) as client:
        child = await call(client, "launch_training", {"resume_from": finished_run.run_id, "steps": 33})
        done = await call(client, "wait_for_run", {"run_id": child["run_id"], "timeout_s": 240})
    assert done["status"] == "SUCCEEDED", done["log_tail"]
    assert done["parent"] == finished_run.run_id and done["summary"]["resumed_from_step"] == 30
    assert done["summary"]["parameters"] == finished_run.summary.parameters and done["step"] == 33


@pytest.mark.slow
async def test_wait_for_run_times_out_without_stopping_the_run(server, ctx, dataset_id, tiny_run_settings):
    async with Client(server) as client:
        run = await call(client, "launch_training", {"dataset": dataset_id, "steps": 100_000, **tiny_run_settings})
        run_id = run["run_id"]
        try:
            waited = await call(client, "wait_for_run", {"run_id": run_id, "timeout_s": 1})
            # The run goes on after the wait gave up: it logs steps past those the wait saw.
            trained_on = await anyio.to_thread.run_sync(
                lambda: wait_until(
                    lambda: (info := get_run(ctx, RunRequest(run_id=run_id))).step > waited["step"] and info,
                    240,
                    "the run logging a step after the wait timed out",
                )
            )
        finally:
            cancelled = await call(client, "cancel_run", {"run_id": run_id})
    assert waited["timed_out"] is True and waited["status"] in ("PENDING", "RUNNING")
    assert waited["run_id"] == run_id and waited["total_steps"] == 100_000 and waited["step"] < 100_000
    assert trained_on.status == "RUNNING"
    assert cancelled["status"] == "CANCELLED" and cancelled["reason"] == "cancelled on request"


@pytest.mark.slow
async def test_get_run_reports_the_final_state(server, finished_run):
    async with Client(server) as client:
        run = await call(client, "get_run", {"run_id": finished_run.run_id})
    assert run["status"] == "SUCCEEDED" and run["step"] == 30 == run["total_steps"]
    summary = run["summary"]
    assert summary["final_eval_loss"] < summary["first_eval_loss"]
    assert run["eval_loss"] == summary["final_eval_loss"]
    assert run["log_tail"] == []


@pytest.mark.slow
async def test_the_ledger_lists_and_keeps_a_finished_run_and_estimate_run_times_its_shape(server, finished_run):
    async with Client(server) as client:
        listed = await call(client, "list_experiments", {"limit": 100})
        kept = await call(
            client, "set_experiment_status", {"run_id": finished_run.run_id, "status": "kept", "reason": "baseline"}
        )
        estimate = await call(client, "estimate_run", {"run_id": finished_run.run_id, "probe": False})
    entry = next(entry for entry in listed["experiments"] if entry["run_id"] == finished_run.run_id)
    assert entry["val_bpb"] == finished_run.summary.val_bpb is not None
    assert (kept["status"], kept["reason"]) == ("kept", "baseline")
    assert estimate["parameters"] == finished_run.summary.parameters
    assert estimate["step_time_source"].startswith("run ") and estimate["step_time_s"] > 0


@pytest.mark.slow
async def test_list_runs_is_newest_first_and_bounded(server, finished_run, ctx):
    async with Client(server) as client:
        everything = await call(client, "list_runs", {"limit": 200})
        one = await call(client, "list_runs", {"limit": 1})
    ids = [run["run_id"] for run in everything["runs"]]
    assert finished_run.run_id in ids and ids == sorted(ids, reverse=True)
    assert everything["total"] == len(ids) == len(list(ctx.workspace.runs_dir.iterdir()))
    assert [run["run_id"] for run in one["runs"]] == ids[:1]


@pytest.mark.slow
async def test_read_metrics_returns_every_row_of_a_short_run_as_series_and_a_summary(server, finished_run):
    async with Client(server) as client:
        metrics = await call(client, "read_metrics", {"run_id": finished_run.run_id})
        zoomed = await call(
            client, "read_metrics", {"run_id": finished_run.run_id, "start_step": 10, "end_step": 20, "series": ["lr"]}
        )
    assert not metrics["truncated"] and metrics["rows_kept"] == metrics["rows_in_range"] == metrics["summary"]["rows"]
    assert metrics["series"]["eval_loss"]["steps"] == [0, 10, 20, 30]
    assert metrics["series"]["loss"]["steps"] == [5, 10, 15, 20, 25, 30]
    assert metrics["summary"]["last_step"] == 30 and metrics["summary"]["best_eval_loss"] == pytest.approx(
        finished_run.summary.best_eval_loss, rel=1e-5
    )
    assert list(zoomed["series"]) == ["lr"] and zoomed["series"]["lr"]["steps"] == [10, 15, 20]


@pytest.mark.slow
async def test_profile_run_times_steps_and_writes_a_trace(server, finished_run, tiny_run_settings):
    async with Client(server) as client:
        profile = await call(client, "profile_run", {"run_id": finished_run.run_id, "steps": 3})
    assert profile["steps"] == 3 and profile["compile_s"] > 0 and profile["mean_step_s"] > 0
    tokens_per_step = tiny_run_settings["batch_size"] * tiny_run_settings["seq_len"]
    assert profile["tokens_per_s"] == pytest.approx(tokens_per_step / profile["mean_step_s"], rel=1e-6)
    from pathlib import Path

    assert any(p.is_file() for p in Path(profile["trace_dir"]).rglob("*"))


@pytest.mark.slow
async def test_summarize_report_writes_markdown_and_a_png(server, finished_run):
    async with Client(server) as client:
        report = await call(client, "summarize_report", {"run_id": finished_run.run_id})
        served = await client.read_resource(report["report_uri"])
    from pathlib import Path

    path = Path(report["report_path"])
    markdown = path.read_text()
    assert served.contents[0].text == markdown and "markdown" not in report
    summary = finished_run.summary
    assert report["final_eval_loss"] == summary.final_eval_loss
    assert f"{summary.final_eval_loss:,.4f}" in markdown
    assert f"{summary.parameters:,}" in markdown
    (plot,) = report["plot_paths"]
    png = Path(plot).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (840, 480)
    assert Path(plot).parent == path.parent and Path(plot).name in markdown


@pytest.mark.slow
async def test_sample_text_continues_a_prompt_from_the_runs_checkpoint(server, finished_run):
    arguments = {"run_id": finished_run.run_id, "prompt": "ROMEO:", "max_tokens": 24, "seed": 3}
    async with Client(server) as client:
        first = await call(client, "sample_text", arguments)
        again = await call(client, "sample_text", arguments)
    assert first["tokens"] == 24 and first["step"] == 30 and first["prompt"] == "ROMEO:"
    assert first["text"] == again["text"]  # same seed and settings, same text
    from pathlib import Path

    assert json.loads(Path(first["output_file"]).read_text())["text"] == first["text"]


BAD_CALLS = [
    ("tokenize_dataset", {"input": "../../etc/passwd"}, "argument 'input'"),
    ("tokenize_dataset", {"input": "/etc/passwd"}, "is outside the workspace"),
    ("tokenize_dataset", {"input": "missing.txt"}, "no file or folder at 'missing.txt'"),
    ("tokenize_dataset", {"input": "corpus.txt", "val_fraction": "lots"}, "val_fraction"),
    ("tokenize_dataset", {"input": "corpus.txt", "tokenizer": "nowhere/tokenizer.json"}, "argument 'tokenizer'"),
    ("tokenize_dataset", {}, "input"),
    (
        "tokenize_dataset",
        {"input": "corpus.txt", "output": "datasets"},
        "argument 'output': 'datasets' is not a bucket",
    ),
    ("tokenize_dataset", {"input": "corpus.txt", "workers": 0}, "workers"),
    ("train_tokenizer", {"input": "corpus.txt", "vocab_size": 10}, "vocab_size"),
    ("train_tokenizer", {"input": "../outside.txt"}, "argument 'input'"),
    ("inspect_dataset", {"dataset_id": "ds-0000"}, "unknown dataset id 'ds-0000'"),
    ("inspect_dataset", {"dataset_id": "DATASET", "split": "test"}, "split"),
    ("list_datasets", {"limit": 0}, "limit"),
    ("launch_training", {"dataset": "ds-0000"}, "unknown dataset id 'ds-0000'"),
    ("launch_training", {"dataset": "../outside"}, "argument 'dataset'"),
    ("launch_training", {"dataset": "DATASET", "steps": "many"}, "steps"),
    ("launch_training", {"dataset": "DATASET", "batch_size": 1000, "seq_len": 32}, "split 'val'"),
    ("launch_training", {"dataset": "DATASET", "model": {"d_model": 30, "n_heads": 4}}, "n_heads"),
    ("launch_training", {"dataset": "DATASET", "init_from": "/etc"}, "argument 'init_from'"),
    ("launch_training", {"dataset": "DATASET", "accelerator": "tpu-v9-8"}, "unknown TPU type 'v9-8'"),
    ("launch_training", {"dataset": "DATASET", "accelerator": "gpu:2", "slices": 2}, "slices=2 needs a TPU"),
    ("launch_training", {"dataset": "DATASET", "backend": "slurm"}, "backend"),
    ("launch_training", {"resume_from": "run-nope", "steps": 60}, "unknown run id 'run-nope'"),
    ("launch_training", {"resume_from": "RUN", "steps": 10}, "must exceed the 30 steps"),
    ("launch_training", {"steps": 10}, "give 'dataset'"),
    ("launch_training", {"dataset": "DATASET", "time_budget_s": 0}, "time_budget_s"),
    ("launch_training", {"dataset": "DATASET", "parent_run": "run-nope"}, "unknown run id 'run-nope'"),
    ("estimate_run", {}, "config"),
    ("estimate_run", {"run_id": "run-nope"}, "unknown run id 'run-nope'"),
    ("estimate_run", {"config": {"dataset": "ds-0000", "steps": 10}, "probe": False}, "unknown dataset id 'ds-0000'"),
    ("list_experiments", {"status": "great"}, "status"),
    ("list_experiments", {"export": "xlsx"}, "export"),
    ("set_experiment_status", {"run_id": "RUN", "status": "kept"}, "reason"),
    ("set_experiment_status", {"run_id": "RUN", "status": "maybe", "reason": "x"}, "status"),
    ("set_experiment_status", {"run_id": "run-nope", "status": "kept", "reason": "x"}, "unknown run id 'run-nope'"),
    ("rerun_baseline", {"run_id": "run-nope"}, "unknown run id 'run-nope'"),
    ("rerun_baseline", {"run_id": "RUN", "count": 0}, "count"),
    ("launch_sweep", {"base": {"dataset": "DATASET"}, "space": {}}, "space"),
    ("launch_sweep", {"base": {"steps": 10}, "space": {"optimizer.learning_rate": [-1]}}, "optimizer.learning_rate"),
    ("get_sweep", {"sweep_id": "sweep-nope"}, "sweep-nope"),
    ("cancel_sweep", {"sweep_id": "../x"}, "not a valid id"),
    ("get_run", {"run_id": "run-nope"}, "unknown run id 'run-nope'"),
    ("get_run", {"run_id": "../etc"}, "not a valid id"),
    ("wait_for_run", {"run_id": "run-nope"}, "unknown run id"),
    ("wait_for_run", {"run_id": "RUN", "timeout_s": -1}, "timeout_s"),
    ("list_runs", {"limit": 0}, "limit"),
    ("cancel_run", {"run_id": "run-nope"}, "unknown run id 'run-nope'"),
    ("cancel_run", {"run_id": "../x"}, "not a valid id"),
    ("read_metrics", {"run_id": "run-nope"}, "unknown run id"),
    ("read_metrics", {"run_id": "RUN", "max_points": "all"}, "max_points"),
    ("read_metrics", {"run_id": "RUN", "start_step": 9, "end_step": 3}, "start_step 9 is after end_step 3"),
    ("read_metrics", {"run_id": "RUN", "series": ["perplexity"]}, "series"),
    ("list_runs", {"cursor": "../x"}, "not a valid id"),
    ("tail_logs", {"run_id": "RUN", "limit_bytes": 64_000}, "limit_bytes"),
    ("profile_run", {"run_id": "run-nope"}, "unknown run id"),
    ("profile_run", {"run_id": "RUN", "steps": 0}, "steps"),
    ("profile_run", {"run_id": "RUN", "start_step": 1}, "start_step"),
    ("summarize_report", {"run_id": "run-nope"}, "unknown run id"),
    ("compare_runs", {"run_ids": ["RUN"]}, "run_ids"),
    ("summarize_report", {"run_id": 42}, "run_id"),
    ("sample_text", {"run_id": "run-nope"}, "unknown run id"),
    ("export_model", {"run_id": "run-nope"}, "unknown run id"),
    ("export_model", {"run_id": "RUN", "format": "onnx"}, "argument 'format'"),
    ("sample_text", {"run_id": "RUN", "top_p": 0}, "top_p"),
    ("cluster_status", {"backend": "slurm"}, "backend"),
    ("launch_training", {"dataset": "DATASET", "wandb_project": "p\x00"}, "argument 'wandb_project'"),
    ("launch_training", {"dataset": "DATASET", "model": {"preset": "\x1b[2J"}}, "argument 'model"),
    ("list_experiments", {"changed": "x" * 5_000}, "argument 'changed'"),
    ("set_experiment_status", {"run_id": "RUN", "status": "kept", "reason": "  "}, "reason"),
    ("sample_text", {"run_id": "RUN", "prompt": "ROMEO:\x00"}, "argument 'prompt'"),
    ("sample_text", {"run_id": "RUN", "messages": [{"role": "user", "content": "hi\x1b[2J"}]}, "'messages[0].content'"),
    ("sample_text", {"run_id": "RUN", "prompt": "A", "messages": [{"role": "user", "content": "B"}]}, "not both"),
    ("run_pipeline", {"pipeline": "../outside.py"}, "argument 'pipeline'"),
]


@pytest.mark.parametrize(("tool", "arguments", "expected"), BAD_CALLS)
@pytest.mark.slow
async def test_bad_input_is_an_error_result_and_the_server_keeps_serving(
    server, finished_run, dataset_id, tool, arguments, expected
):
    placeholders = {"DATASET": dataset_id, "RUN": finished_run.run_id}
    arguments = {
        key: placeholders.get(value, value) if isinstance(value, str) else value for key, value in arguments.items()
    }
    async with Client(server) as client:
        message = error_text(await client.call_tool(tool, arguments))
        assert expected in message
        assert "Traceback" not in message
        after = await call(client, "get_run", {"run_id": finished_run.run_id})
    assert after["status"] == "SUCCEEDED"


def test_every_tool_has_a_bad_input_case():
    assert {tool.__name__ for tool in TOOLS} == {tool for tool, _, _ in BAD_CALLS}
