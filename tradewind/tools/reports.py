"""The tool that writes a run's report: markdown with its figures and a loss-curve plot."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from tradewind.cluster import JobStatus
from tradewind.core import NotFoundError, atomic_write_text, read_json
from tradewind.tools.context import ToolContext
from tradewind.tools.runs import RunInfo, RunRequest, get_run
from tradewind.trainer import MetricRow, ProfileSummary, RunLayout, TrainConfig
from tradewind.trainer import read_metrics as read_metric_rows


class ReportInfo(BaseModel):
    run_id: str
    status: JobStatus
    report_path: str = Field(description="The markdown report.")
    plot_paths: list[str] = Field(description="PNG plots beside the report.")
    final_loss: float | None
    first_eval_loss: float | None
    final_eval_loss: float | None
    best_eval_loss: float | None
    tokens_per_s: float | None = Field(description="Mean training throughput.")
    report_uri: str = Field(description="The MCP resource that serves the report's text.")


def plot_losses(rows: list[MetricRow], title: str, path: Path) -> None:
    """Draw training and held-out loss against step into a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    train = [(row.step, row.loss) for row in rows if row.loss is not None]
    held_out = [(row.step, row.eval_loss) for row in rows if row.eval_loss is not None]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss", color="tab:blue")
    if held_out:
        ax.plot(*zip(*held_out, strict=True), "o-", label="eval loss", color="tab:orange")
    ax.set(xlabel="step", ylabel="cross-entropy (nats/token)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _figure(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def render_report(info: RunInfo, config: TrainConfig, profile: ProfileSummary | None, plot_name: str) -> str:
    """The markdown text of a run's report."""
    summary = info.summary
    model, optimizer = config.model, config.optimizer
    lines = [
        f"# Training report: {info.run_id}",
        "",
        f"Status: **{info.status.value}**" + (f" ({info.reason})" if info.reason else ""),
        "",
        "## Configuration",
        "",
        "| setting | value |",
        "|---|---|",
        f"| dataset | `{config.dataset}` |",
        f"| model | {model.type}, d_model {model.d_model}, {model.n_layers} layers, {model.n_heads} heads |",
        f"| parameters | {summary.parameters:,} |" if summary else "| parameters | n/a |",
        f"| steps | {config.steps} |",
        f"| batch x sequence | {config.batch_size} x {config.seq_len} |",
        f"| optimizer | {optimizer.type}, learning rate {optimizer.learning_rate:g} "
        f"(warmup {optimizer.warmup_steps}, {optimizer.schedule}) |",
        "",
        "## Results",
        "",
        "| figure | value |",
        "|---|---|",
        f"| final train loss | {_figure(summary.final_loss if summary else info.loss)} |",
        f"| first eval loss | {_figure(summary.first_eval_loss if summary else None)} |",
        f"| final eval loss | {_figure(summary.final_eval_loss if summary else info.eval_loss)} |",
        f"| best eval loss | {_figure(summary.best_eval_loss if summary else None)} |",
        f"| final eval perplexity | {_figure(summary.final_eval_perplexity if summary else None, 2)} |",
        f"| final eval bits per byte | {_figure(summary.final_eval_bits_per_byte if summary else None)} |",
        f"| throughput | {_figure(summary.mean_tokens_per_s if summary else None, 0)} tokens/s |",
        f"| model FLOPs utilisation | {_figure(summary.mfu * 100 if summary and summary.mfu else None, 1)} % "
        f"({summary.peak_flops_source if summary and summary.peak_flops_source else 'peak unknown'}) |",
        f"| wall time | {_figure(summary.wall_s if summary else None, 1)} s |",
        "",
        f"![loss curve]({plot_name})",
        "",
    ]
    if profile:
        lines += [
            "## Profile",
            "",
            f"Compile {profile.compile_s:.2f} s; mean step {profile.mean_step_s * 1000:.1f} ms over "
            f"{profile.steps} steps; {profile.tokens_per_s:,.0f} tokens/s on {profile.backend}. "
            f"Trace: `{profile.trace_dir}`.",
            "",
        ]
    return "\n".join(lines)


def summarize_report(ctx: ToolContext, request: RunRequest) -> ReportInfo:
    """Write a markdown report of a run: config, losses, throughput, loss-curve PNG. Use it to hand a
    run's results to a person.

    Works on finished and running runs alike (a running one is reported as it stands). Takes a
    second; returns the headline figures and where the report is: its path, and the resource
    `tradewind://runs/{run_id}/report` that serves its text.
    """
    info = get_run(ctx, request)
    layout = RunLayout(Path(info.run_dir))
    rows = read_metric_rows(layout.metrics)
    if not rows:
        raise NotFoundError(f"run {request.run_id!r} has logged no metrics yet; wait for it, then ask again")
    config = TrainConfig.model_validate(read_json(layout.config))
    profile_file = layout.profile / "summary.json"
    profile = ProfileSummary.model_validate(read_json(profile_file)) if profile_file.exists() else None

    plot_path = ctx.workspace.reports_dir / f"{request.run_id}-loss.png"
    plot_losses(rows, f"{request.run_id} ({info.status.value.lower()})", plot_path)
    markdown = render_report(info, config, profile, plot_path.name)
    report_path = ctx.workspace.reports_dir / f"{request.run_id}.md"
    atomic_write_text(report_path, markdown)

    summary = info.summary
    return ReportInfo(
        run_id=request.run_id,
        status=info.status,
        report_path=str(report_path),
        plot_paths=[str(plot_path)],
        final_loss=summary.final_loss if summary else info.loss,
        first_eval_loss=summary.first_eval_loss if summary else None,
        final_eval_loss=summary.final_eval_loss if summary else info.eval_loss,
        best_eval_loss=summary.best_eval_loss if summary else None,
        tokens_per_s=summary.mean_tokens_per_s if summary else None,
        report_uri=f"tradewind://runs/{request.run_id}/report",  # served by tradewind.server.resources
    )
