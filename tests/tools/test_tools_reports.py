"""summarize_report: a run's markdown report and loss plot, from the files a run leaves in its folder."""

import os
import socket
from pathlib import Path

import pytest

from tradewind.cluster import JobStatus
from tradewind.cluster.process import process_start_time
from tradewind.core import NotFoundError, atomic_write_json
from tradewind.tools import RunRequest, ToolContext, summarize_report
from tradewind.trainer import MetricRow, ProfileSummary, RunLayout, RunRecord, TrainConfig, TrainSummary, write_record

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
    final_eval_bits_per_byte=0.5,
)


def write_run(
    ctx: ToolContext, run_id: str, status: JobStatus, rows: list[MetricRow], summary=None, **record
) -> RunLayout:
    """A run folder as a Python call of `train` leaves it: record, config, metrics and (at its end) summary."""
    layout = RunLayout(ctx.workspace.runs_dir / run_id)
    layout.root.mkdir(parents=True)
    write_record(layout.record, RunRecord(run_id=run_id, backend="process", status=status, **record))
    config = TrainConfig(dataset="datasets/ds-x", steps=30, batch_size=8, seq_len=32)
    atomic_write_json(layout.config, config.model_dump(mode="json"))
    layout.metrics.write_text("".join(row.model_dump_json(exclude_none=True) + "\n" for row in rows))
    if summary is not None:
        atomic_write_json(layout.summary, summary.model_dump(mode="json"))
    return layout


ROWS = [
    MetricRow(step=0, eval_loss=5.5, elapsed=0.5),
    MetricRow(step=10, loss=4.0, lr=1e-3, elapsed=2.0),
    MetricRow(step=20, loss=3.0, eval_loss=3.25, elapsed=4.0),
    MetricRow(step=30, loss=2.5, eval_loss=2.75, elapsed=6.0),
]


@pytest.fixture
def fresh(tmp_path) -> ToolContext:
    return ToolContext.open(tmp_path / "workspace")


def test_a_finished_runs_report_has_its_config_figures_and_a_png_plot(fresh):
    write_run(fresh, "run-done", JobStatus.SUCCEEDED, ROWS, SUMMARY)
    report = summarize_report(fresh, RunRequest(run_id="run-done"))
    assert report.status is JobStatus.SUCCEEDED and report.report_uri == "tradewind://runs/run-done/report"
    assert (report.final_loss, report.first_eval_loss, report.final_eval_loss) == (2.5, 5.5, 2.75)
    assert (report.best_eval_loss, report.tokens_per_s) == (2.625, 4_321.0)
    markdown = fresh.workspace.reports_dir.joinpath("run-done.md").read_text(encoding="utf-8")
    assert report.report_path == str(fresh.workspace.reports_dir / "run-done.md")
    assert markdown.startswith("# Training report: run-done\n\nStatus: **SUCCEEDED**\n")
    for line in (
        "| dataset | `datasets/ds-x` |",
        "| parameters | 12,345 |",
        "| steps | 30 |",
        "| batch x sequence | 8 x 32 |",
        "| best eval loss | 2.6250 |",
        "| final eval perplexity | 15.64 |",
        "| throughput | 4,321 tokens/s |",
        "| model FLOPs utilisation | 1.2 % (table) |",
        "| wall time | 12.5 s |",
        "![loss curve](run-done-loss.png)",
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
    assert report.first_eval_loss is None and report.best_eval_loss is None and report.tokens_per_s is None
    assert "| parameters | n/a |" in markdown and "| final eval loss | 3.2500 |" in markdown


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
