"""The tool that writes reports: one run's, or several runs' side by side, as markdown with PNG figures and as
one self-contained HTML file, under the workspace's `reports/`.

Every figure comes from the runs' `metrics.jsonl` (see `report_data`) but `val_bpb`, which a run scores at its
end into `summary.json`; anomalies from the shared detector (`anomalies`); a failed run's cause from its log.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tradewind.cluster import Accelerator, JobStatus
from tradewind.core.buckets import join_url, upload_files
from tradewind.runs import ModelConfig, ProfileSummary, TrainConfig, TrainSummary
from tradewind.runs.config import LoraConfig
from tradewind.runs.layout import run_url
from tradewind.tools.anomalies import MAX_ANOMALIES, Anomaly
from tradewind.tools.comparing import (
    DEFAULT_METRIC,
    MAX_RUNS,
    comparison_section,
    load_runs,
    overlay_plot,
    rank_runs,
    report_name,
)
from tradewind.tools.context import Progress, ToolContext, no_progress
from tradewind.tools.profiling import describe_profile
from tradewind.tools.report_data import (
    EVAL_CURVE_MEANING,
    SAMPLE_PROMPT,
    SAMPLE_TOKENS,
    VAL_BPB_MEANING,
    RunData,
    RunFigures,
    bounded,
    config_differences,
    fmt,
)
from tradewind.tools.report_html import write_report
from tradewind.tools.report_plots import png, run_figure
from tradewind.tools.runs import RunRequest
from tradewind.tools.spec import tool

EVAL_TABLE_ROWS = 20  # eval points listed in a report; the plot shows every one


class SummarizeReportRequest(RunRequest):
    model_config = ConfigDict(extra="forbid")

    run_id: str | None = None
    run_ids: list[str] | None = Field(default=None, min_length=1, max_length=MAX_RUNS)
    sample: bool | None = Field(default=None, description="Sample checkpoints (null: one run only).")

    @model_validator(mode="after")
    def _one_way(self) -> SummarizeReportRequest:
        if (self.run_id is None) == (self.run_ids is None):
            raise ValueError("give run_id or run_ids (not both)")
        return self


class ReportInfo(BaseModel):
    """Where the report is, and the first run's figures (the only run's, usually)."""

    image_fields: ClassVar[tuple[str, ...]] = ("plot_paths",)  # the server sends these PNGs as image content

    run_id: str
    status: JobStatus
    report_path: str = Field(description="The markdown report.")
    html_path: str = Field(description="The same, one self-contained HTML file.")
    plot_paths: list[str] = Field(description="PNG plots beside the report.")
    report_id: str = Field(description="The report's name: the run id, or compare-... for several runs.")
    report_uri: str = Field(description="The resource serving the report's text (its plot: report_uri + '/plot').")
    val_bpb: float | None = Field(description="The first run's; the metric to decide on.")
    final_loss: float | None
    final_eval_loss: float | None = Field(description="The first run's eval curve's last point.")
    anomalies: list[Anomaly] = Field(description=f"The first run's (the first {MAX_ANOMALIES}).")
    runs: list[RunFigures] = Field(description="Each run's figures, anomalies, cause of failure and sample.")


def accelerator_text(accelerator: Accelerator, platform: str | None) -> str:
    """Where a run trained: `tpu-v5litepod-1 (1 chip of TPU v5 lite), on tpu`."""
    chips = ""
    if accelerator.tpu is not None:
        count = accelerator.chips
        chips = f" ({count} chip{'' if count == 1 else 's'} of {accelerator.tpu.chip.device_kind})"
    return f"{accelerator}{chips}, on {platform or 'n/a'}"


def lora_text(lora: LoraConfig, model: ModelConfig) -> str:
    """A LoRA run's adapters in words."""
    return (
        f"LoRA rank {lora.rank}, alpha {lora.alpha:g}, dropout {lora.dropout:g} on {', '.join(lora.targets)} "
        f"({lora.count_params(model):,} adapter parameters trained; the base frozen)"
    )


def render_run(data: RunData, plot_name: str, level: str = "#") -> list[str]:
    """The markdown lines of one run's report; `level` is its heading (sections are one deeper)."""
    info, config, figures = data.info, data.config, data.figures
    summary, model, optimizer = info.summary, config.model, config.optimizer
    sub = level + "#"
    evals = [row for row in data.rows if row.eval_loss is not None]
    if len(evals) > EVAL_TABLE_ROWS:
        evals = [evals[i * (len(evals) - 1) // (EVAL_TABLE_ROWS - 1)] for i in range(EVAL_TABLE_ROWS)]
    last_eval = next((row for row in reversed(data.rows) if row.eval_loss is not None), None)
    wall_s = summary.wall_s if summary else data.rows[-1].elapsed
    peak = summary.peak_flops_source if summary and summary.peak_flops_source else "peak unknown"
    lines = [
        f"{level} Training report: {info.run_id}",
        "",
        f"Status: **{info.status.value}**" + (f" ({info.reason})" if info.reason else ""),
        "",
        *([f"Cause: {figures.cause}", ""] if figures.cause else []),
        f"{sub} Configuration",
        "",
        "| setting | value |",
        "|---|---|",
        f"| dataset | `{config.dataset}` |",
        *(
            [f"| storage | `{run_url(info.storage, info.run_id)}` (checkpoints, metrics, summary, log, report) |"]
            if info.storage
            else []
        ),
        f"| model | {model.type}, d_model {model.d_model}, {model.n_layers} layers, {model.n_heads} heads |",
        *([f"| base model | `{config.init_from}` |"] if config.init_from else []),
        *([f"| fine-tuning | {lora_text(config.lora, model)} |"] if config.lora else []),
        f"| parameters | {summary.parameters:,} |" if summary else "| parameters | n/a |",
        f"| budget | {budget_text(config, summary)} |",
        f"| batch x sequence | {config.batch_size} x {config.seq_len} |",
        f"| accelerator | {accelerator_text(info.accelerator, info.platform)} |",
        f"| optimizer | {optimizer.type}, learning rate {optimizer.learning_rate:g} "
        f"(warmup {optimizer.warmup_steps}, {optimizer.schedule}) |",
        "",
        f"{sub} Results",
        "",
        # A report on several runs defines them once, above, in its comparison.
        *([f"{VAL_BPB_MEANING} {EVAL_CURVE_MEANING}", ""] if level == "#" else []),
        "| figure | value |",
        "|---|---|",
        f"| val_bpb | {_val_bpb_text(figures)} |",
        f"| last step | {figures.steps} |",
        f"| tokens seen | {figures.tokens_seen:,} |",
        f"| final train loss | {fmt(figures.final_loss)} |",
        f"| best train loss | {fmt(figures.best_loss)} |",
        f"| eval curve: first loss | {fmt(figures.first_eval_loss)} |",
        f"| eval curve: last loss | {fmt(figures.final_eval_loss)} |",
        f"| eval curve: best loss | {fmt(figures.best_eval_loss)} |",
        f"| eval curve: best step | {figures.best_eval_step if figures.best_eval_step is not None else 'n/a'} |",
        f"| eval curve: last perplexity | {fmt(last_eval.eval_perplexity if last_eval else None, 2)} |",
        f"| eval curve: last bits per byte | {fmt(last_eval.eval_bits_per_byte if last_eval else None)} |",
        f"| throughput | {fmt(figures.tokens_per_s, 0)} tokens/s |",
        f"| model FLOPs utilisation | {fmt(figures.mfu * 100 if figures.mfu else None, 1)} % ({peak}) |",
        f"| wall time | {fmt(wall_s, 1)} s |",
        f"| checkpoints kept | {', '.join(map(str, figures.checkpoints)) or 'none'} |",
        "",
        f"![training curves]({plot_name})",
        "",
        f"{sub} Eval curve (val batches)",
        "",
        "| step | tokens seen | eval loss | eval bits per byte |",
        "|---|---|---|---|",
        *[
            f"| {row.step} | {data.tokens(row.step):,} | {fmt(row.eval_loss)} | {fmt(row.eval_bits_per_byte)} |"
            for row in evals
        ],
        "",
        f"{sub} Anomalies",
        "",
        *(
            [f"- step {a.step}: {a.kind} ({a.detail})" for a in figures.anomalies]
            or ["None found: no loss spike, non-finite value, stall or restart."]
        ),
        "",
        f"{sub} Sample",
        "",
        *_sample_lines(figures),
    ]
    if data.profile:
        lines += [f"{sub} Profile", "", *_profile_lines(data.profile), ""]
    return lines


def budget_text(config: TrainConfig, summary: TrainSummary | None) -> str:
    """What fixed the run's length, in words, with the time cap beside a work budget and whether it was met."""
    budget = config.budget
    text = budget.describe()
    if budget.fixes_work and config.time_budget_s:
        text += f", capped at {config.time_budget_s:g} s"
    if summary and summary.budget_met is False:
        text += " (not met: the time cap ran out first)"
    return text


def _val_bpb_text(figures: RunFigures) -> str:
    if figures.val_bpb is not None:
        return fmt(figures.val_bpb)
    return "n/a (the run ended without one)" if figures.status.finished else "n/a until the run ends"


def _sample_lines(figures: RunFigures) -> list[str]:
    if not figures.checkpoints:
        return ["The run has no checkpoint, so there is no sample.", ""]
    if figures.sample is None:
        return ["Not sampled (sample=false, the default for several runs).", ""]
    return [
        f"{SAMPLE_TOKENS} tokens from checkpoint {figures.checkpoints[-1]}, prompt `{SAMPLE_PROMPT}`:",
        "",
        "```text",
        figures.sample.replace("```", "'''"),
        "```",
        "",
    ]


@tool("Write a run report", idempotent=True, links=("report", "report_plot"))
def summarize_report(ctx: ToolContext, request: SummarizeReportRequest, progress: Progress = no_progress) -> ReportInfo:
    """Write a report on runs (markdown, HTML, PNG plots). Use it to hand results to a person.

    Works on finished, failed and running runs (a running one is reported as it stands). Figures come from
    the metrics file, `val_bpb` (the metric to decide on) from the summary a run writes at its end; a failed
    run's cause from its log. Several runs get `compare_runs`' section on `val_bpb` first, and are not sampled
    unless `sample` is true (sampling takes seconds a run). Returns the first run's figures and the report's
    paths; `report_uri` (`tradewind://reports/{report_id}`) serves the report's text, one run's or several's.
    """
    run_ids = getattr(request, "run_ids", None) or [request.run_id]
    sample = getattr(request, "sample", None)
    if sample is None:  # seconds a run: worth it in one run's report, not in a comparison of several
        sample = len(run_ids) == 1
    runs = load_runs(ctx, run_ids, sample=sample, progress=progress)
    images: dict[str, bytes] = {}
    if len(runs) == 1:
        (data,) = runs
        name, lines = data.figures.run_id, []
    else:
        name = report_name(run_ids)
        overlay = f"{name}-loss.png"
        images[overlay] = overlay_plot(ctx, runs)
        differences = config_differences({data.figures.run_id: data.config for data in runs})
        section = comparison_section(runs, rank_runs(runs, DEFAULT_METRIC), differences, overlay)
        lines = [f"# Report: {', '.join(run_ids)}", "", *section]
    for data in runs:
        progress(len(runs), len(runs), f"drawing run {data.figures.run_id}")
        plot = f"{data.figures.run_id}-loss.png"
        images[plot] = png(run_figure(data.curve, f"{data.figures.run_id} ({data.info.status.value.lower()})"))
        lines += render_run(data, plot, "#" if len(runs) == 1 else "##")
    title = f"Training report: {', '.join(run_ids)}"
    argument = "run_id" if len(runs) == 1 else "run_ids"
    report_path, html_path, plots = write_report(
        ctx.workspace, name, "\n".join(lines), title, images, argument=argument
    )
    for data in runs:
        if data.info.storage is not None:  # the report goes beside the run's other files
            files = tuple(path.name for path in (report_path, html_path, *plots))
            upload_files(report_path.parent, join_url(run_url(data.info.storage, data.info.run_id), "report"), files)
    figures = [bounded(data.figures) for data in runs]
    first = figures[0]
    return ReportInfo(
        run_id=first.run_id,
        status=first.status,
        report_path=str(report_path),
        html_path=str(html_path),
        plot_paths=[str(plot) for plot in plots],
        report_id=name,
        report_uri=f"tradewind://reports/{name}",  # served by tradewind.server.resources from reports/<name>.md
        val_bpb=first.val_bpb,
        final_loss=first.final_loss,
        final_eval_loss=first.final_eval_loss,
        anomalies=first.anomalies,
        runs=figures,
    )


def _profile_lines(profile: ProfileSummary) -> list[str]:
    """What `profile_run` found: the step split, top ops and verdict (`describe_profile`), and the trace."""
    if profile.diagnosis is not None:
        return ["```text", describe_profile(profile), "```", "", f"Trace: `{profile.trace_dir}`."]
    # A summary written before profile_run gave verdicts has only the timing.
    return [
        f"Compile {profile.compile_s:.2f} s; mean step {profile.mean_step_s * 1000:.1f} ms over {profile.steps} "
        f"steps; {profile.tokens_per_s:,.0f} tokens/s on {profile.backend}. Trace: `{profile.trace_dir}`."
    ]
