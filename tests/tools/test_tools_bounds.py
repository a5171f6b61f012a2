"""Every tool's whole answer, as an MCP client receives it, fits 32,000 characters, however large what it
describes (read_metrics' downsampling itself is tested in test_tools_metrics.py).

An answer is the structured content (the result, within `RESULT_CHARS`), a short text summarizing it and the
resource links (`answer_chars`); images are counted apart, at most `MAX_IMAGES` of at most `MAX_IMAGE_BYTES`.
Each case calls the tool through `mcp.Client(build_server(ctx))`.

The big cases are written as files in fresh workspaces: a 2,500-step metrics file with every field set,
a hundred run folders with long ids and reasons, a log of control characters, eight failed runs with the
longest ids for one report, inputs with long names and bad records, a queue of jobs with long names, a
pipeline of hundreds of steps. launch_training and cancel_run return get_run's result, tested here at its
largest; profile_run's result has only numbers and paths; sample_text's text is cut like any string here,
but the tiny test model cannot generate enough text to need it.
"""

import json
import shutil
from typing import get_args

import anyio
import pytest
from mcp import Client
from mcp_helpers import answer_chars, images_of
from runs_helpers import STEPS, metric_rows, write_run

from tradewind.cluster import JobSpec, JobStatus, Resources
from tradewind.runs import RunRecord
from tradewind.server import build_server
from tradewind.tools import TokenizeDatasetRequest, ToolContext, tokenize_dataset
from tradewind.tools.bounds import ANSWER_CHARS, MAX_IMAGE_BYTES, MAX_IMAGES, RESULT_CHARS
from tradewind.tools.comparing import MAX_RUNS
from tradewind.tools.metrics import MAX_POINTS, MetricName

ALL_SERIES = list(get_args(MetricName))


def answer(ctx: ToolContext, tool: str, arguments: dict) -> dict:
    """Call `tool` through the MCP client on `ctx`'s server; check that the whole answer fits `ANSWER_CHARS` (and
    the result `RESULT_CHARS`, its images the image bounds); return the structured result."""

    async def call():
        async with Client(build_server(ctx)) as client:
            return await client.call_tool(tool, arguments)

    result = anyio.run(call)
    assert not result.is_error, result.content
    structured = json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False)
    assert len(structured) <= RESULT_CHARS, (tool, len(structured))
    assert answer_chars(result) <= ANSWER_CHARS, (tool, answer_chars(result))
    images = images_of(result)
    assert len(images) <= MAX_IMAGES and all(len(image) <= MAX_IMAGE_BYTES for image in images)
    return result.structured_content


@pytest.fixture
def fresh(tmp_path) -> ToolContext:
    return ToolContext.open(tmp_path / "workspace")


# read_metrics


def test_read_metrics_of_2500_steps_with_every_field_set_fits_at_the_largest_max_points(fresh):
    write_run(fresh, "run-big", metric_rows(every_field=True))
    for series in (ALL_SERIES[:1], ALL_SERIES[:5], ALL_SERIES):
        result = answer(fresh, "read_metrics", {"run_id": "run-big", "series": series, "max_points": MAX_POINTS})
        points = sum(len(s["steps"]) for s in result["series"].values())
        assert points <= MAX_POINTS and result["truncated"] and result["rows_in_range"] == STEPS + 1
        assert "start_step" in result["hint"] and "tradewind://runs/run-big/metrics" in result["hint"]


# Runs: get_run, wait_for_run, list_runs, tail_logs


def failed_run(ctx: ToolContext, run_id: str) -> None:
    """A run whose trainer failed with a 140k-character reason and a log of long lines of control characters."""
    reason = "a long reason " * 10_000
    record = RunRecord(run_id=run_id, backend="process", status=JobStatus.FAILED, reason=reason)
    layout = write_run(ctx, run_id, metric_rows(steps=20), record)
    layout.log.write_text(('\x1b[31m"quoted" \\ ' * 5_000 + "\n") * 30)


def test_get_run_and_wait_for_run_of_a_run_with_a_huge_reason_and_log_lines_fit(fresh):
    failed_run(fresh, "run-failed")
    info = answer(fresh, "get_run", {"run_id": "run-failed"})
    assert info["status"] == "FAILED" and len(info["log_tail"]) == 20
    assert info["reason"].startswith("a long reason") and info["reason"].endswith("…")
    answer(fresh, "wait_for_run", {"run_id": "run-failed", "timeout_s": 1})


def test_list_runs_pages_a_hundred_long_named_folders_within_the_bound_and_the_cursor_reaches_each_once(fresh):
    names = []
    for index in range(60):
        names.append(f"run-{index:03d}-" + "x" * 119)
        failed_run(fresh, names[-1])
    for index in range(40):  # folders that are not runs, with long names
        names.append(f"junk-{index:03d}-" + "y" * 118)
        (fresh.workspace.runs_dir / names[-1]).mkdir()
    seen, cursor, pages = [], None, 0
    while True:
        page = answer(fresh, "list_runs", {"limit": 200, "cursor": cursor})
        assert page["total"] == len(names)
        seen += [entry["run_id"] for entry in page["runs"]] + [entry["run_id"] for entry in page["unreadable"]]
        pages += 1
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert pages > 1 and sorted(seen) == sorted(names) and len(seen) == len(names)
    runs = [name for name in seen if name.startswith("run-")]
    assert runs == sorted(runs, reverse=True)  # newest (highest id) first, page after page
    assert all(len(run["reason"]) <= 300 for run in answer(fresh, "list_runs", {"limit": 5})["runs"])


def test_tail_logs_of_a_log_of_control_characters_fits_and_pages_through_every_byte(fresh):
    record = RunRecord(run_id="run-noisy", backend="process", status=JobStatus.SUCCEEDED)
    layout = write_run(fresh, "run-noisy", [], record)
    log = ('\x1b[2K\x00"é\\\t' * 20_000).encode("utf-8") + b"\xff\xfe invalid bytes\n"
    layout.log.write_bytes(log)
    pages, cursor = [], 0
    while True:
        page = answer(fresh, "tail_logs", {"run_id": "run-noisy", "cursor": cursor, "limit_bytes": 32_000})
        assert page["next_cursor"] > cursor
        pages.append(page["text"])
        cursor = page["next_cursor"]
        if page["finished"]:
            break
    assert cursor == len(log) and "".join(pages) == log.decode("utf-8", errors="replace")


# Datasets: tokenize_dataset, train_tokenizer, inspect_dataset, list_datasets


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    """A workspace whose input folder holds 30 JSONL files with long names, each with a bad record and long
    documents full of quotes and control characters; tokenized with the byte tokenizer."""
    ctx = ToolContext.open(tmp_path_factory.mktemp("messy") / "workspace")
    folder = ctx.workspace.root / "inputs"
    folder.mkdir()
    for index in range(30):
        text = f"document {index} " + '\x01"\\\x1b' * 3_000
        lines = [json.dumps({"text": text}), "{not json " + "z" * 5_000, json.dumps({"text": text * 2})]
        (folder / (f"{index:02d}-" + "n" * 200 + ".jsonl")).write_text("\n".join(lines) + "\n")
    info = tokenize_dataset(ctx, TokenizeDatasetRequest(input="inputs", workers=1))
    return ctx, info


def test_tokenize_dataset_with_bad_records_in_many_long_named_files_fits(messy):
    ctx, built = messy
    info = answer(ctx, "tokenize_dataset", {"input": "inputs", "workers": 1})  # the same cache, reused
    assert info["dataset_id"] == built.dataset_id and info["reused"]
    bad = info["bad_records"]
    assert bad["skipped"] == 30 and bad["files"] == 30 and len(bad["per_file"]) == 20
    assert all(len(example) <= 300 for example in bad["examples"])


def test_inspect_dataset_with_the_most_and_longest_samples_fits_and_says_they_are_cut(messy):
    ctx, info = messy
    report = answer(ctx, "inspect_dataset", {"dataset_id": info.dataset_id, "samples": 20, "sample_chars": 10_000})
    assert len(report["samples"]) == 20 and all(sample["truncated"] for sample in report["samples"])
    assert len(report["sources"]) == 20 and report["sources_total"] == 30


def test_train_tokenizer_on_files_with_bad_records_fits(messy):
    ctx, _ = messy
    trained = answer(ctx, "train_tokenizer", {"input": "inputs", "vocab_size": 260, "max_documents": 5})
    assert trained["bad_records"]["files"] >= 1


def test_list_datasets_pages_a_hundred_datasets_within_the_bound(messy, fresh):
    ctx, info = messy
    for index in range(100):
        shutil.copytree(ctx.workspace.dataset_dir(info.dataset_id), fresh.workspace.datasets_dir / f"ds-{index:04d}")
    seen, cursor = [], None
    while True:
        page = answer(fresh, "list_datasets", {"limit": 500, "cursor": cursor})
        assert page["total"] == 100
        seen += [summary["dataset_id"] for summary in page["datasets"]]
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert sorted(seen) == [f"ds-{index:04d}" for index in range(100)] and len(seen) == len(set(seen))


# Reports, the cluster and pipelines


def test_a_report_on_the_most_failed_runs_with_the_longest_ids_fits_with_its_images_apart(fresh):
    run_ids = [f"run-{index}-" + "x" * 122 for index in range(MAX_RUNS)]
    for run_id in run_ids:
        failed_run(fresh, run_id)
    for arguments in ({"run_ids": run_ids, "sample": False}, {"run_id": run_ids[0], "sample": False}):
        report = answer(fresh, "summarize_report", arguments)
        assert report["status"] == "FAILED" and len(report["runs"]) == len(arguments.get("run_ids", [None]))


@pytest.mark.slow
def test_summarize_report_names_the_report_resource_instead_of_inlining_it(ctx, finished_run):
    report = answer(ctx, "summarize_report", {"run_id": finished_run.run_id})
    assert report["report_uri"] == f"tradewind://reports/{finished_run.run_id}" and "markdown" not in report


def test_cluster_status_with_dozens_of_long_named_queued_jobs_fits(fresh, tmp_path):
    release = tmp_path / "release"
    hold = JobSpec(
        name="hold",
        command=["bash", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"],
        resources=Resources(cpus=fresh.backend.capacity.cpus),
    )
    held = fresh.backend.submit(hold)
    queued = [
        fresh.backend.submit(JobSpec(name="wait " + "w" * 5_000, command=["true"], resources=Resources(cpus=1)))
        for _ in range(60)
    ]
    try:
        status = answer(fresh, "cluster_status", {"backend": "local", "limit": 500})
    finally:
        for record in queued:
            fresh.backend.cancel(record.id)
        release.touch()
        fresh.backend.wait(held.id, timeout=30)
    (local,) = status["backends"]
    assert local["queued_count"] + local["running_count"] == 61  # the hold job too
    assert 0 < len(local["queued"]) < local["queued_count"]


def test_run_pipeline_dry_run_of_hundreds_of_long_named_steps_fits(tmp_path):
    root = tmp_path / "workspace"
    granted = ToolContext.open(root, allowed_code=(root / "pipelines",))
    granted.workspace.pipelines_dir.mkdir()
    (granted.workspace.pipelines_dir / "many.py").write_text(
        "from tradewind.cluster import Step\n\n"
        "def write(out, config, inputs):\n    (out / 'out.txt').write_text('x')\n\n"
        "steps = [Step(f'step{i:03d}' + 's' * 150, write, {'i': i}) for i in range(400)]\n"
    )
    result = answer(granted, "run_pipeline", {"pipeline": "pipelines/many.py"})
    assert result["steps_total"] == 400 and 0 < len(result["steps"]) < 400
