"""The tool that compares runs: the config fields that differ, each run's figures and anomalies, their losses
overlaid against tokens seen, and which is better on a metric at equal tokens."""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from tradewind.core import InvalidInputError
from tradewind.tools.context import Progress, ToolContext, no_progress
from tradewind.tools.report_data import (
    RunData,
    RunFigures,
    bounded,
    config_differences,
    fmt,
    load_run,
    value_at_tokens,
)
from tradewind.tools.report_html import write_report
from tradewind.tools.report_plots import plot_overlay
from tradewind.tools.spec import tool

MAX_RUNS = 8
CompareMetric = Literal["eval_loss", "loss"]


class CompareRunsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_ids: list[str] = Field(min_length=2, max_length=MAX_RUNS)
    metric: CompareMetric = Field(default="eval_loss", description="Lower wins.")


class Comparison(BaseModel):
    image_fields: ClassVar[tuple[str, ...]] = ("plot_paths",)  # the server sends these PNGs as image content

    report_path: str = Field(description="The markdown comparison.")
    html_path: str = Field(description="The same, one self-contained HTML file.")
    plot_paths: list[str] = Field(description="PNG: the runs' losses against tokens seen.")
    config_differences: dict[str, dict[str, Any]] = Field(description="Dotted config field -> run id -> value.")
    at_tokens: int = Field(description="Tokens seen where runs are compared: the most all of them reached.")
    values: dict[str, float | None] = Field(description="Each run's metric at the latest row at or below at_tokens.")
    best_run: str | None = Field(description="The run with the lowest value; null if none has one, or on a tie.")
    runs: list[RunFigures]


def report_name(run_ids: list[str]) -> str:
    """The file name (no suffix) of a report on several runs."""
    joined = "compare-" + "-".join(run_ids)
    if len(joined) <= 120:
        return joined
    return f"compare-{run_ids[0]}-and-{len(run_ids) - 1}-more-{hashlib.sha256(joined.encode()).hexdigest()[:8]}"


def comparison_section(
    runs: list[RunData], metric: CompareMetric, plot_name: str
) -> tuple[list[str], int, dict[str, float | None], str | None, dict[str, dict[str, Any]]]:
    """The markdown comparing `runs`, the token count they are compared at, each run's value there, the best
    run, and the config differences."""
    at_tokens = min(data.tokens(data.rows[-1].step) for data in runs)
    found = {data.figures.run_id: value_at_tokens(data, metric, at_tokens) for data in runs}
    values = {run_id: value for run_id, (value, _) in found.items()}
    ranked = sorted((value, run_id) for run_id, value in values.items() if value is not None)
    tied = len(ranked) > 1 and ranked[0][0] == ranked[1][0]
    best = ranked[0][1] if ranked and not tied else None
    differences = config_differences({data.figures.run_id: data.config for data in runs})
    ids = [data.figures.run_id for data in runs]
    if tied:
        level = [run_id for value, run_id in ranked if value == ranked[0][0]]
        verdict = f"Compared on {metric} at {at_tokens:,} tokens seen: {', '.join(level)} tie at {fmt(ranked[0][0])}."
    elif best is None:
        verdict = f"No run has a {metric} at or below {at_tokens:,} tokens, so none is better."
    else:
        others = ", ".join(f"{run_id} {fmt(value)}" for value, run_id in ranked[1:]) or "no other run has one"
        verdict = (
            f"Compared on {metric} at {at_tokens:,} tokens seen (the most all runs reached; each run's latest row at "
            f"or below it): **{best}** is better with {fmt(ranked[0][0])} ({others})."
        )
    lines = [verdict, "", "## Config differences", ""]
    if differences:
        lines += ["| field | " + " | ".join(ids) + " |", "|---|" + "---|" * len(ids)]
        lines += [
            f"| {name} | " + " | ".join(f"`{values_by_run[run_id]}`" for run_id in ids) + " |"
            for name, values_by_run in differences.items()
        ]
    else:
        lines.append("The runs' configs are the same.")
    lines += [
        "",
        "## Results",
        "",
        f"| run | status | steps | tokens seen | final loss | best loss | final eval loss | best eval loss | "
        f"tokens/s | MFU % | {metric} at {at_tokens:,} tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for data in runs:
        f = data.figures
        step = found[f.run_id][1]
        lines.append(
            f"| {f.run_id} | {f.status.value} | {f.steps} | {f.tokens_seen:,} | {fmt(f.final_loss)} | "
            f"{fmt(f.best_loss)} | {fmt(f.final_eval_loss)} | {fmt(f.best_eval_loss)} | {fmt(f.tokens_per_s, 0)} | "
            f"{fmt(f.mfu * 100 if f.mfu is not None else None, 1)} | {fmt(values[f.run_id])}"
            + (f" (step {step})" if step is not None else "")
            + " |"
        )
    lines += ["", f"![losses against tokens seen]({plot_name})", "", "## Anomalies", ""]
    listed = [f"- {data.figures.run_id}: {describe_anomalies(data.figures)}" for data in runs]
    return [*lines, *listed, ""], at_tokens, values, best, differences


def describe_anomalies(figures: RunFigures) -> str:
    if not figures.anomalies:
        return "none"
    return "; ".join(f"step {a.step} {a.kind} ({a.detail})" for a in figures.anomalies)


def load_runs(ctx: ToolContext, run_ids: list[str], *, sample: bool, progress: Progress = no_progress) -> list[RunData]:
    """Each run's data (`load_run`), reporting progress run by run so that a cancelled call stops between them."""
    if len(set(run_ids)) != len(run_ids):
        raise InvalidInputError(f"run_ids: each run once, not {run_ids}")
    runs = []
    for index, run_id in enumerate(run_ids):
        progress(index, len(run_ids), f"reading run {run_id}")
        runs.append(load_run(ctx, run_id, sample=sample, progress=progress))
    return runs


@tool("Compare runs", idempotent=True)
def compare_runs(ctx: ToolContext, request: CompareRunsRequest) -> Comparison:
    """Compare runs: config diff, figures, anomalies, losses at equal tokens. Use it to pick a run.

    Writes `reports/compare-<ids>.md` and a self-contained `.html` beside it. Runs are compared at the most
    tokens all of them reached, each at its latest row at or below that count.
    """
    runs = load_runs(ctx, request.run_ids, sample=False)
    name = report_name(request.run_ids)
    plot_name = f"{name}-loss.png"
    curves = {data.figures.run_id: (data.rows, data.config.tokens_per_step) for data in runs}
    plot = plot_overlay(curves, "loss by tokens seen")
    lines, at_tokens, values, best, differences = comparison_section(runs, request.metric, plot_name)
    title = "Comparison: " + ", ".join(request.run_ids)
    markdown = "\n".join([f"# {title}", "", *lines])
    report_path, html_path, plots = write_report(
        ctx.workspace, name, markdown, title, {plot_name: plot}, argument="run_ids"
    )
    return Comparison(
        report_path=str(report_path),
        html_path=str(html_path),
        plot_paths=[str(path) for path in plots],
        config_differences=differences,
        at_tokens=at_tokens,
        values=values,
        best_run=best,
        runs=[bounded(data.figures) for data in runs],
    )
