"""summarize_report: a run's markdown report and loss plot, from the files a run leaves in its folder."""

import base64
import os
import re
import socket
from pathlib import Path

import pytest
from runs_helpers import metric_rows

from tradewind.cluster import JobStatus, parse_accelerator
from tradewind.cluster.process import process_start_time
from tradewind.core import NotFoundError, atomic_write_json
from tradewind.runs import MetricRow, ProfileSummary, RunLayout, RunRecord, TrainConfig, TrainSummary, write_record
from tradewind.tools import (
    LaunchTrainingRequest,
    RunRequest,
    SummarizeReportRequest,
    ToolContext,
    WaitForRunRequest,
    launch_training,
    summarize_report,
    wait_for_run,
)
from tradewind.tools.report_data import VAL_BPB_MEANING
from tradewind.tools.reports import accelerator_text

SUMMARY = TrainSummary(
    parameters=12_345,
    steps=30,
    tokens_seen=7_680,
    final_loss=2.5,
    first_eval_loss=5.5,
    final_eval_loss=2.75,
    best_eval_loss=2.625,
    mean_tokens_per_s=4_321.0,
    compile_s=1.0,
    wall_s=12.5,
    mfu=0.0125,
    peak_flops_source="table",
    final_eval_perplexity=15.64,
    final_eval_bits_per_byte=2.3626,
    val_bpb=2.3653,  # on the fixed val tokens: not the eval curve's last point, a different sample
)


def write_run(
    ctx: ToolContext, run_id: str, status: JobStatus, rows: list[MetricRow], summary=None, config=None, **record
) -> RunLayout:
    """A run folder as a Python call of `train` leaves it: record, config (`config` overrides its fields), metrics
    and (at its end) summary."""
    layout = RunLayout(ctx.workspace.runs_dir / run_id)
    layout.root.mkdir(parents=True)
    write_record(layout.record, RunRecord(run_id=run_id, backend="process", status=status, **record))
    config = TrainConfig(**{"dataset": "datasets/ds-x", "steps": 30, "batch_size": 8, "seq_len": 32} | (config or {}))
    atomic_write_json(layout.config, config.model_dump(mode="json"))
    layout.metrics.write_text("".join(row.model_dump_json(exclude_none=True) + "\n" for row in rows))
    if summary is not None:
        atomic_write_json(layout.summary, summary.model_dump(mode="json"))
    return layout


ROWS = [
    MetricRow(step=0, eval_loss=5.5, eval_perplexity=244.69, elapsed=0.5),
    MetricRow(step=10, loss=4.0, lr=1e-3, elapsed=2.0),
    MetricRow(step=20, loss=3.0, eval_loss=3.25, eval_perplexity=25.79, elapsed=4.0),
    MetricRow(step=30, loss=2.5, eval_loss=2.75, eval_perplexity=15.64, eval_bits_per_byte=2.3626, elapsed=6.0),
]


@pytest.fixture
def fresh(tmp_path) -> ToolContext:
    return ToolContext.open(tmp_path / "workspace")


def test_a_finished_runs_report_has_its_config_figures_and_a_png_plot(fresh):
    write_run(fresh, "run-done", JobStatus.SUCCEEDED, ROWS, SUMMARY)
    report = summarize_report(fresh, RunRequest(run_id="run-done"))
    assert report.status is JobStatus.SUCCEEDED and report.report_uri == "tradewind://reports/run-done"
    assert (report.final_loss, report.final_eval_loss) == (2.5, 2.75)
    (figures,) = report.runs  # from the metrics rows, not summary.json
    assert (figures.first_eval_loss, figures.best_eval_loss, figures.best_eval_step) == (5.5, 2.75, 30)
    assert figures.tokens_seen == 30 * 8 * 32 and figures.tokens_per_s is None and figures.checkpoints == []
    markdown = fresh.workspace.reports_dir.joinpath("run-done.md").read_text(encoding="utf-8")
    assert report.report_path == str(fresh.workspace.reports_dir / "run-done.md")
    assert markdown.startswith("# Training report: run-done\n\nStatus: **SUCCEEDED**\n")
    for line in (
        "| dataset | `datasets/ds-x` |",
        "| parameters | 12,345 |",
        "| budget | 30 steps |",
        "| batch x sequence | 8 x 32 |",
        "| accelerator | cpu, on n/a |",
        "| eval curve: best loss | 2.7500 |",
        "| tokens seen | 7,680 |",
        "| eval curve: last perplexity | 15.64 |",
        "| throughput | n/a tokens/s |",
        "| model FLOPs utilisation | n/a % (table) |",
        "| wall time | 12.5 s |",
        "| checkpoints kept | none |",
        "![training curves](run-done-loss.png)",
        "The run has no checkpoint, so there is no sample.",
    ):
        assert line in markdown.splitlines(), line
    assert "## Profile" not in markdown
    (plot,) = report.plot_paths
    assert plot == str(fresh.workspace.reports_dir / "run-done-loss.png")
    assert Path(plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_running_run_is_reported_as_it_stands_from_its_latest_rows(fresh):
    # Trained by a Python call in this (live) process, so the run is still RUNNING.
    this = {"pid": os.getpid(), "pid_start": process_start_time(os.getpid()), "host": socket.gethostname()}
    write_run(fresh, "run-going", JobStatus.RUNNING, ROWS[:3], **this)
    report = summarize_report(fresh, RunRequest(run_id="run-going"))
    markdown = Path(report.report_path).read_text(encoding="utf-8")
    assert report.status is JobStatus.RUNNING and "Status: **RUNNING**" in markdown
    assert report.final_loss == 3.0 and report.final_eval_loss == 3.25
    assert report.runs[0].first_eval_loss == 5.5 and report.runs[0].best_eval_loss == 3.25
    assert "| parameters | n/a |" in markdown and "| eval curve: last loss | 3.2500 |" in markdown
    assert report.val_bpb is None and "| val_bpb | n/a until the run ends |" in markdown


def test_a_profiled_run_gets_a_profile_section(fresh):
    layout = write_run(fresh, "run-prof", JobStatus.SUCCEEDED, ROWS, SUMMARY)
    layout.profile.mkdir()
    profile = ProfileSummary(
        steps=5, compile_s=1.5, mean_step_s=0.0125, tokens_per_s=20_480, parameters=12_345, trace_dir="t", backend="cpu"
    )
    atomic_write_json(layout.profile / "summary.json", profile.model_dump(mode="json"))
    markdown = Path(summarize_report(fresh, RunRequest(run_id="run-prof")).report_path).read_text(encoding="utf-8")
    assert "## Profile" in markdown
    assert "Compile 1.50 s; mean step 12.5 ms over 5 steps; 20,480 tokens/s on cpu. Trace: `t`." in markdown


def test_a_run_with_no_metrics_yet_is_not_found_saying_to_wait(fresh):
    write_run(fresh, "run-new", JobStatus.PENDING, [])
    with pytest.raises(NotFoundError, match="run 'run-new' has logged no metrics yet; wait for it"):
        summarize_report(fresh, RunRequest(run_id="run-new"))
    assert not (fresh.workspace.reports_dir / "run-new.md").exists()


def cell(markdown: str, figure: str) -> str:
    """The value cell of the results-table row `figure`."""
    (line,) = [line for line in markdown.splitlines() if line.startswith(f"| {figure} |")]
    return line.split("|")[2].strip()


def test_every_number_in_a_report_is_the_metrics_files(fresh):
    rows = metric_rows(steps=300)
    write_run(fresh, "run-long", JobStatus.SUCCEEDED, rows, SUMMARY)
    report = summarize_report(fresh, RunRequest(run_id="run-long"))
    markdown = Path(report.report_path).read_text(encoding="utf-8")
    losses = [row.loss for row in rows if row.loss is not None]
    evals = [(row.eval_loss, row.step) for row in rows if row.eval_loss is not None]
    assert float(cell(markdown, "final train loss")) == round(losses[-1], 4)
    assert float(cell(markdown, "best train loss")) == round(min(losses), 4)
    assert float(cell(markdown, "eval curve: best loss")) == round(min(evals)[0], 4)
    assert int(cell(markdown, "eval curve: best step")) == min(evals)[1]
    assert float(cell(markdown, "eval curve: first loss")) == round(evals[0][0], 4)
    assert int(cell(markdown, "tokens seen").replace(",", "")) == rows[-1].step * 8 * 32
    assert int(cell(markdown, "last step")) == rows[-1].step
    # Every eval point in the eval-curve table is a row's eval loss at that step.
    by_step = {row.step: row.eval_loss for row in rows}
    table = markdown.split("## Eval curve")[1].split("## Anomalies")[0]
    points = [line.split("|")[1:4] for line in table.splitlines() if line.startswith("| ") and "step" not in line]
    assert points and all(float(loss) == round(by_step[int(step)], 4) for step, _, loss in points)
    assert report.final_loss == losses[-1] and report.runs[0].best_eval_loss == min(evals)[0]


def test_the_html_report_is_one_self_contained_file_with_the_png_inlined(fresh):
    write_run(fresh, "run-html", JobStatus.SUCCEEDED, metric_rows(steps=100), SUMMARY)
    report = summarize_report(fresh, RunRequest(run_id="run-html"))
    page = Path(report.html_path).read_text(encoding="utf-8")
    assert report.html_path == str(fresh.workspace.reports_dir / "run-html.html")
    assert page.startswith("<!DOCTYPE html>") and "<table>" in page and "Training report: run-html" in page
    assert 'src="http' not in page and 'href="' not in page and "<link" not in page and "<script" not in page
    (inlined,) = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    (plot,) = report.plot_paths
    assert base64.b64decode(inlined) == Path(plot).read_bytes()
    png = Path(plot).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) <= 120_000


def test_a_failed_runs_report_names_the_cause_from_its_log_and_the_step_it_stopped_at(fresh):
    layout = write_run(fresh, "run-nan", JobStatus.FAILED, ROWS[:2], reason="exited with code 1")
    layout.log.write_text(
        "step 5 loss 3.1\nTraceback (most recent call last):\ntradewind.core.errors.TradewindError: training loss "
        "became nan at step 7; lower optimizer.learning_rate, add warmup\n"
    )
    report = summarize_report(fresh, RunRequest(run_id="run-nan"))
    markdown = Path(report.report_path).read_text(encoding="utf-8")
    assert [(a.kind, a.step) for a in report.anomalies] == [("non_finite", 7)]
    assert "NaN or infinite" in report.runs[0].cause and "at step 7" in report.runs[0].cause
    assert "Cause: the training loss became NaN or infinite" in markdown
    assert "- step 7: non_finite (training loss became nan)" in markdown


def test_a_report_on_several_runs_compares_them_and_has_each_runs_section(fresh):
    write_run(fresh, "run-a", JobStatus.SUCCEEDED, ROWS, SUMMARY)
    write_run(fresh, "run-b", JobStatus.SUCCEEDED, ROWS[:3])
    report = summarize_report(fresh, SummarizeReportRequest(run_ids=["run-a", "run-b"], sample=False))
    markdown = Path(report.report_path).read_text(encoding="utf-8")
    assert report.report_uri == "tradewind://reports/compare-run-a-run-b" and [run.run_id for run in report.runs] == [
        "run-a",
        "run-b",
    ]
    assert Path(report.report_path).name == "compare-run-a-run-b.md"
    assert "## Training report: run-a" in markdown and "## Training report: run-b" in markdown
    assert "The runs' configs are the same." in markdown and "at 5,120 tokens seen" in markdown
    # run-b has no summary, so the runs are compared on the eval curve's bits per byte, and the report says so.
    assert "Compared on the eval curve's bits per byte (eval_bits_per_byte)" in markdown
    assert "not on val_bpb" in markdown
    assert markdown.count(VAL_BPB_MEANING) == 1  # defined once, in the comparison, not again in each run's section
    assert len(report.plot_paths) == 3 and all(Path(plot).is_file() for plot in report.plot_paths)


def test_a_report_gives_val_bpb_from_the_summary_and_calls_the_periodic_evals_the_eval_curve(fresh):
    write_run(fresh, "run-done", JobStatus.SUCCEEDED, ROWS, SUMMARY)
    report = summarize_report(fresh, RunRequest(run_id="run-done"))
    assert report.val_bpb == report.runs[0].val_bpb == SUMMARY.val_bpb
    markdown = Path(report.report_path).read_text(encoding="utf-8")
    assert cell(markdown, "val_bpb") == "2.3653"
    assert cell(markdown, "eval curve: last bits per byte") == "2.3626"  # the curve's point, named as such
    assert "final eval bits per byte" not in markdown and "final eval loss" not in markdown
    assert VAL_BPB_MEANING in markdown and VAL_BPB_MEANING in Path(report.html_path).read_text(encoding="utf-8")


def test_a_failed_run_has_no_val_bpb_and_the_report_says_it_ended_without_one(fresh):
    write_run(fresh, "run-failed", JobStatus.FAILED, ROWS[:2], reason="exited with code 1")
    report = summarize_report(fresh, RunRequest(run_id="run-failed"))
    assert report.val_bpb is None
    assert cell(Path(report.report_path).read_text(encoding="utf-8"), "val_bpb") == "n/a (the run ended without one)"


def test_the_configuration_shows_the_budget_that_fixed_the_runs_length(fresh):
    capped = {"token_budget": 7_680, "time_budget_s": 60}
    write_run(fresh, "run-tokens", JobStatus.SUCCEEDED, ROWS, SUMMARY.model_copy(update={"budget_met": False}), capped)
    write_run(fresh, "run-timed", JobStatus.SUCCEEDED, ROWS, SUMMARY, {"time_budget_s": 90})
    tokens, timed = (
        Path(summarize_report(fresh, RunRequest(run_id=run_id)).report_path).read_text(encoding="utf-8")
        for run_id in ("run-tokens", "run-timed")
    )
    assert "| budget | 7,680 tokens, capped at 60 s (not met: the time cap ran out first) |" in tokens.splitlines()
    assert "| budget | 90 s |" in timed.splitlines()


def test_a_report_on_several_runs_samples_none_by_default_and_one_runs_report_does(fresh):
    for run_id in ("run-a", "run-b"):
        layout = write_run(fresh, run_id, JobStatus.SUCCEEDED, ROWS, SUMMARY)
        (layout.checkpoints / "30").mkdir(parents=True)  # a checkpoint to sample: its dataset is missing
    several = summarize_report(fresh, SummarizeReportRequest(run_ids=["run-a", "run-b"]))
    assert [run.sample for run in several.runs] == [None, None]  # no sampling tried: it would have failed
    assert Path(several.report_path).read_text(encoding="utf-8").count("Not sampled") == 2
    (one,) = summarize_report(fresh, SummarizeReportRequest(run_id="run-a")).runs
    assert one.sample is not None and one.sample.startswith("(sampling failed")


def test_a_report_takes_run_id_or_run_ids_not_both():
    for bad in ({}, {"run_id": "a", "run_ids": ["b"]}):
        with pytest.raises(ValueError, match="give run_id or run_ids"):
            SummarizeReportRequest(**bad)


@pytest.mark.slow
def test_a_real_run_stopped_by_a_non_finite_loss_is_reported_at_that_step(ctx, dataset_id, tiny_run_settings):
    settings = {**tiny_run_settings, "log_every": 1, "optimizer": {"learning_rate": 1e10, "warmup_steps": 0}}
    run = launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, steps=6, checkpoint=False, **settings))
    done = wait_for_run(ctx, WaitForRunRequest(run_id=run.run_id, timeout_s=240))
    assert done.status is JobStatus.FAILED, done.log_tail
    log = RunLayout(Path(done.run_dir)).log.read_text(encoding="utf-8")
    step = int(re.search(r"loss became \S+ at step (\d+)", log).group(1))
    report = summarize_report(ctx, RunRequest(run_id=run.run_id))
    markdown = Path(report.report_path).read_text(encoding="utf-8")
    assert ("non_finite", step) in [(a.kind, a.step) for a in report.anomalies]
    assert f"at step {step}" in report.runs[0].cause and "NaN or infinite" in report.runs[0].cause
    assert f"- step {step}: non_finite" in markdown and "Cause: " in markdown
    assert "The run has no checkpoint, so there is no sample." in markdown


@pytest.mark.slow
def test_a_finished_runs_report_lists_its_checkpoints_and_a_sample_from_the_last(ctx, constant_run):
    done, _ = constant_run
    report = summarize_report(ctx, SummarizeReportRequest(run_id=done.run_id))  # one run: sampled by default
    markdown = Path(report.report_path).read_text(encoding="utf-8")
    figures = report.runs[0]
    assert figures.checkpoints == [25, 30]  # keep_last 2 of every 5 steps
    assert "| checkpoints kept | 25, 30 |" in markdown
    assert figures.sample and figures.sample.startswith("The") and "(sampling failed" not in figures.sample
    assert "60 tokens from checkpoint 30" in markdown and figures.sample in markdown


def test_a_tpu_runs_report_names_its_chips_and_what_jax_trained_on():
    assert (
        accelerator_text(parse_accelerator("tpu-v4-8"), "tpu") == "tpu-v4-8 (4 chips of TPU v4), on tpu"
    )  # v4 types count cores
    assert accelerator_text(parse_accelerator("tpu-v5e-1"), "tpu") == "tpu-v5litepod-1 (1 chip of TPU v5 lite), on tpu"
