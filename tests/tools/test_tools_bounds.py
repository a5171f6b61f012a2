"""Every tool's result fits 32,000 characters of compact JSON, however large what it describes; and
read_metrics' downsampling keeps what matters and says what it left out.

The big cases are written as files in fresh workspaces: a 2,500-step metrics file with every field set,
a hundred run folders with long ids and reasons, a log of control characters, inputs with long names and
bad records, a queue of jobs with long names, a pipeline of hundreds of steps. launch_training and
cancel_run return get_run's result, tested here at its largest; profile_run's result has only numbers and
paths; sample_text's text is cut like any string here, but the tiny test model cannot generate enough
text to need it.
"""

import itertools
import json
import math
import shutil
from typing import get_args

import pytest

from tradewind.cluster import JobSpec, JobStatus, Resources
from tradewind.core import atomic_write_json
from tradewind.tools import (
    ClusterStatusRequest,
    InspectDatasetRequest,
    ListDatasetsRequest,
    ListRunsRequest,
    ReadMetricsRequest,
    RunPipelineRequest,
    RunRequest,
    TailLogsRequest,
    TokenizeDatasetRequest,
    ToolContext,
    TrainTokenizerRequest,
    WaitForRunRequest,
    cluster_status,
    get_run,
    inspect_dataset,
    list_datasets,
    list_runs,
    read_metrics,
    run_pipeline,
    summarize_report,
    tail_logs,
    tokenize_dataset,
    train_tokenizer,
    wait_for_run,
)
from tradewind.tools.bounds import RESULT_CHARS
from tradewind.tools.metrics import MAX_POINTS, MetricName
from tradewind.trainer import MetricRow, RunLayout, RunRecord, TrainConfig, write_record

ALL_SERIES = list(get_args(MetricName))
STEPS = 2_500
TOKENS_PER_STEP = 4_096


def size(result) -> int:
    """What the MCP server sends of a result: its compact JSON."""
    return len(result.model_dump_json())


def metric_rows(steps: int = STEPS, eval_every: int = 50, every_field: bool = False) -> list[MetricRow]:
    """A run's rows: a loss that falls with a dip at step 1234, an eval row every `eval_every` steps; with
    `every_field`, every field of every row set to a long-printing number."""
    rows = []
    for step in range(steps + 1):
        step_time_s = 0.1 + (step % 7) * 0.01
        loss = 5.0 / (1 + step / 300) + (step % 11) * 1e-3 - (1.0 if step == 1234 else 0.0)
        fields = {"step": step, "elapsed": step * 0.123456789}
        if step > 0:
            fields.update(
                loss=loss,
                lr=3e-4 * (1 - step / (steps + 1)) + 1.234567e-11,
                grad_norm=1.23456789 + step % 5,
                tokens_per_s=TOKENS_PER_STEP / step_time_s,
                step_time_s=step_time_s,
                mfu=0.1234567891 * (1 + step % 3),
            )
        if step % eval_every == 0 or step == steps or every_field:
            eval_loss = loss + 0.1 - (1.5 if step == 2000 else 0.0)
            fields.update(eval_loss=eval_loss, eval_perplexity=math.exp(eval_loss), eval_bits_per_byte=eval_loss / 5.5)
        if every_field:
            fields.update(param_norm=-1.2345678901e-05 * step, skipped_steps=step, loss=-loss * 1.234567e-7)
        rows.append(MetricRow(**fields))
    return rows


def write_run(ctx: ToolContext, run_id: str, rows: list[MetricRow], record: RunRecord | None = None) -> RunLayout:
    """A run folder with these metrics rows and, given a record, that record and a config: a run as a Python
    call of `train` leaves it (backend 'process', no job)."""
    layout = RunLayout(ctx.workspace.runs_dir / run_id)
    layout.root.mkdir(parents=True)
    layout.metrics.write_text("".join(row.model_dump_json(exclude_none=True) + "\n" for row in rows))
    if record is not None:
        write_record(layout.record, record)
        atomic_write_json(layout.config, TrainConfig(dataset="datasets/ds-gone").model_dump(mode="json"))
    return layout


@pytest.fixture
def fresh(tmp_path) -> ToolContext:
    return ToolContext.open(tmp_path / "workspace")


# read_metrics


def test_read_metrics_of_2500_steps_with_every_field_set_fits_at_the_largest_max_points(fresh):
    write_run(fresh, "run-big", metric_rows(every_field=True))
    for series in (ALL_SERIES[:1], ALL_SERIES[:5], ALL_SERIES):
        result = read_metrics(fresh, ReadMetricsRequest(run_id="run-big", series=series, max_points=MAX_POINTS))
        assert size(result) <= RESULT_CHARS, (len(series), size(result))
        points = sum(len(s.steps) for s in result.series.values())
        assert points <= MAX_POINTS and result.truncated and result.rows_in_range == STEPS + 1
        assert "start_step" in result.hint and "tradewind://runs/run-big/metrics" in result.hint


def test_read_metrics_keeps_the_first_last_lowest_loss_and_every_eval_row_and_is_deterministic(fresh):
    rows = metric_rows()
    write_run(fresh, "run-curve", rows)
    request = ReadMetricsRequest(run_id="run-curve", series=["loss", "eval_loss"], max_points=200)
    result = read_metrics(fresh, request)
    assert result == read_metrics(fresh, request)
    loss_steps = result.series["loss"].steps
    assert len(loss_steps) <= 200 and result.rows_kept == 200 and result.truncated
    assert result.start_step == 0 and result.end_step == STEPS
    assert loss_steps[0] == 1 and loss_steps[-1] == STEPS and 1234 in loss_steps  # first logged, last, lowest
    eval_steps = [row.step for row in rows if row.eval_loss is not None]
    assert result.series["eval_loss"].steps == eval_steps  # every eval row
    assert result.series["loss"].values[loss_steps.index(1234)] == pytest.approx(rows[1234].loss, rel=1e-5)
    # The rest are spread over the whole run, not bunched at its start.
    assert max(b - a for a, b in itertools.pairwise(loss_steps)) <= 2 * STEPS // 200


def test_read_metrics_with_more_eval_rows_than_max_points_keeps_evenly_spaced_ones_and_the_best(fresh):
    rows = metric_rows(eval_every=1)
    write_run(fresh, "run-evals", rows)
    result = read_metrics(fresh, ReadMetricsRequest(run_id="run-evals", series=["eval_loss"], max_points=50))
    steps = result.series["eval_loss"].steps
    assert len(steps) == 50 and {0, 1234, 2000, STEPS} <= set(steps)  # first, lowest loss, best eval, last


def test_read_metrics_zoomed_into_a_step_range_returns_every_row_there(fresh):
    rows = metric_rows()
    write_run(fresh, "run-zoom", rows)
    result = read_metrics(
        fresh, ReadMetricsRequest(run_id="run-zoom", series=ALL_SERIES[:5], start_step=1000, end_step=1150)
    )
    assert not result.truncated and result.hint is None and result.rows_in_range == result.rows_kept == 151
    assert result.series["loss"].steps == list(range(1000, 1151))
    assert result.series["lr"].values == [float(f"{row.lr:.6g}") for row in rows[1000:1151]]


def test_read_metrics_summary_is_what_the_raw_rows_say(fresh):
    rows = metric_rows()
    write_run(fresh, "run-summary", rows)
    summary = read_metrics(fresh, ReadMetricsRequest(run_id="run-summary", start_step=10, end_step=20)).summary
    best = min((row for row in rows if row.eval_loss is not None), key=lambda row: row.eval_loss)
    logged = [row for row in rows if row.step_time_s is not None]  # one update per row here
    seconds = sum(row.step_time_s for row in logged)
    assert summary.rows == len(rows) and summary.last_step == STEPS
    assert summary.last_loss == pytest.approx(rows[-1].loss, rel=1e-5)
    assert summary.best_eval_step == best.step == 2000
    assert summary.best_eval_loss == pytest.approx(best.eval_loss, rel=1e-5)
    assert summary.mean_tokens_per_s == pytest.approx(len(logged) * TOKENS_PER_STEP / seconds, rel=1e-5)
    assert summary.mean_mfu == pytest.approx(sum(r.mfu * r.step_time_s for r in logged) / seconds, rel=1e-5)


@pytest.mark.slow
def test_read_metrics_summary_agrees_with_the_trainers_summary_of_a_finished_run(ctx, finished_run):
    summary = read_metrics(ctx, ReadMetricsRequest(run_id=finished_run.run_id)).summary
    assert summary.mean_tokens_per_s == pytest.approx(finished_run.summary.mean_tokens_per_s, rel=1e-5)
    assert summary.mean_mfu == pytest.approx(finished_run.summary.mfu, rel=1e-5)
    assert summary.best_eval_loss == pytest.approx(finished_run.summary.best_eval_loss, rel=1e-5)
    assert summary.last_step == finished_run.total_steps


def test_read_metrics_refuses_a_step_range_that_ends_before_it_starts():
    with pytest.raises(ValueError, match="start_step 9 is after end_step 3"):
        ReadMetricsRequest(run_id="run-x", start_step=9, end_step=3)


# Runs: get_run, wait_for_run, list_runs, tail_logs


def failed_run(ctx: ToolContext, run_id: str) -> None:
    """A run whose trainer failed with a 140k-character reason and a log of long lines of control characters."""
    reason = "a long reason " * 10_000
    record = RunRecord(run_id=run_id, backend="process", status=JobStatus.FAILED, reason=reason)
    layout = write_run(ctx, run_id, metric_rows(steps=20), record)
    layout.log.write_text(('\x1b[31m"quoted" \\ ' * 5_000 + "\n") * 30)


def test_get_run_and_wait_for_run_of_a_run_with_a_huge_reason_and_log_lines_fit(fresh):
    failed_run(fresh, "run-failed")
    info = get_run(fresh, RunRequest(run_id="run-failed"))
    assert info.status is JobStatus.FAILED and len(info.log_tail) == 20 and size(info) <= RESULT_CHARS
    assert info.reason.startswith("a long reason") and info.reason.endswith("…")
    waited = wait_for_run(fresh, WaitForRunRequest(run_id="run-failed", timeout_s=1))
    assert size(waited) <= RESULT_CHARS


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
        page = list_runs(fresh, ListRunsRequest(limit=200, cursor=cursor))
        assert size(page) <= RESULT_CHARS and page.total == len(names)
        seen += [entry.run_id for entry in page.runs] + [entry.run_id for entry in page.unreadable]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert pages > 1 and sorted(seen) == sorted(names) and len(seen) == len(names)
    runs = [name for name in seen if name.startswith("run-")]
    assert runs == sorted(runs, reverse=True)  # newest (highest id) first, page after page
    assert all(len(run.reason) <= 300 for run in list_runs(fresh, ListRunsRequest(limit=5)).runs)


def test_tail_logs_of_a_log_of_control_characters_fits_and_pages_through_every_byte(fresh):
    record = RunRecord(run_id="run-noisy", backend="process", status=JobStatus.SUCCEEDED)
    layout = write_run(fresh, "run-noisy", [], record)
    log = ('\x1b[2K\x00"é\\\t' * 20_000).encode("utf-8") + b"\xff\xfe invalid bytes\n"
    layout.log.write_bytes(log)
    pages, cursor = [], 0
    while True:
        page = tail_logs(fresh, TailLogsRequest(run_id="run-noisy", cursor=cursor, limit_bytes=32_000))
        assert size(page) <= RESULT_CHARS and page.next_cursor > cursor
        pages.append(page.text)
        cursor = page.next_cursor
        if page.finished:
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
    _, info = messy
    assert size(info) <= RESULT_CHARS
    assert info.bad_records.skipped == 30 and info.bad_records.files == 30 and len(info.bad_records.per_file) == 20
    assert all(len(example) <= 300 for example in info.bad_records.examples)


def test_inspect_dataset_with_the_most_and_longest_samples_fits_and_says_they_are_cut(messy):
    ctx, info = messy
    report = inspect_dataset(ctx, InspectDatasetRequest(dataset_id=info.dataset_id, samples=20, sample_chars=10_000))
    assert size(report) <= RESULT_CHARS
    assert len(report.samples) == 20 and all(sample.truncated for sample in report.samples)
    assert len(report.sources) == 20 and report.sources_total == 30


def test_train_tokenizer_on_files_with_bad_records_fits(messy):
    ctx, _ = messy
    trained = train_tokenizer(ctx, TrainTokenizerRequest(input="inputs", vocab_size=260, max_documents=5))
    assert size(trained) <= RESULT_CHARS and trained.bad_records.files >= 1


def test_list_datasets_pages_a_hundred_datasets_within_the_bound(messy, fresh):
    ctx, info = messy
    for index in range(100):
        shutil.copytree(ctx.workspace.dataset_dir(info.dataset_id), fresh.workspace.datasets_dir / f"ds-{index:04d}")
    seen, cursor = [], None
    while True:
        page = list_datasets(fresh, ListDatasetsRequest(limit=500, cursor=cursor))
        assert size(page) <= RESULT_CHARS and page.total == 100
        seen += [summary.dataset_id for summary in page.datasets]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(seen) == [f"ds-{index:04d}" for index in range(100)] and len(seen) == len(set(seen))


# Reports, the cluster and pipelines


@pytest.mark.slow
def test_summarize_report_names_the_report_resource_instead_of_inlining_it(ctx, finished_run):
    report = summarize_report(ctx, RunRequest(run_id=finished_run.run_id))
    assert report.report_uri == f"tradewind://runs/{finished_run.run_id}/report"
    assert "markdown" not in report.model_dump() and size(report) <= RESULT_CHARS


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
        status = cluster_status(fresh, ClusterStatusRequest(backend="local", limit=500))
    finally:
        for record in queued:
            fresh.backend.cancel(record.id)
        release.touch()
        fresh.backend.wait(held.id, timeout=30)
    (local,) = status.backends
    assert size(status) <= RESULT_CHARS and local.queued_count + local.running_count == 61  # the hold job too
    assert 0 < len(local.queued) < local.queued_count


def test_run_pipeline_dry_run_of_hundreds_of_long_named_steps_fits(fresh):
    fresh.workspace.pipelines_dir.mkdir()
    (fresh.workspace.pipelines_dir / "many.py").write_text(
        "from tradewind.cluster import Step\n\n"
        "def write(out, config, inputs):\n    (out / 'out.txt').write_text('x')\n\n"
        "steps = [Step(f'step{i:03d}' + 's' * 150, write, {'i': i}) for i in range(400)]\n"
    )
    result = run_pipeline(fresh, RunPipelineRequest(pipeline="pipelines/many.py"))
    assert size(result) <= RESULT_CHARS and result.steps_total == 400 and 0 < len(result.steps) < 400
