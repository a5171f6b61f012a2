"""The tool that compares runs: the config fields that differ, each run's figures and anomalies, their eval
curves overlaid against tokens seen, and which is better on val_bpb (or another metric) at equal tokens."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from tradewind.core import InvalidInputError
from tradewind.tools.context import Progress, ToolContext, no_progress
from tradewind.tools.noise import DECISION_METRIC
from tradewind.tools.report_data import (
    EVAL_CURVE_MEANING,
    VAL_BPB_MEANING,
    RunData,
    RunFigures,
    bounded,
    config_differences,
    fmt,
    legend_labels,
    load_run,
    value_at_tokens,
)
from tradewind.tools.report_html import write_report
from tradewind.tools.report_plots import overlay_figure, png
from tradewind.tools.spec import tool

MAX_RUNS = 8
CompareMetric = Literal["val_bpb", "eval_loss", "loss"]
DEFAULT_METRIC: CompareMetric = DECISION_METRIC
# What a comparison's values are: the runs' val_bpb, or a figure of their metrics rows at equal tokens.
Measure = Literal["val_bpb", "eval_bits_per_byte", "eval_loss", "loss"]
MEASURE_WORDS: dict[Measure, str] = {  # the figures of the rows, as a verdict names them
    "eval_bits_per_byte": "the eval curve's bits per byte (eval_bits_per_byte)",
    "eval_loss": "the eval curve's loss (eval_loss)",
    "loss": "the train loss (loss)",
}
OVERLAY_TITLE = "eval bits per byte by tokens seen (stars: val_bpb)"


class CompareRunsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_ids: list[str] = Field(min_length=2, max_length=MAX_RUNS)
    metric: CompareMetric = Field(default=DEFAULT_METRIC, description="Lower wins.")


class Comparison(BaseModel):
    image_fields: ClassVar[tuple[str, ...]] = ("plot_paths",)  # the server sends these PNGs as image content

    report_path: str = Field(description="The markdown comparison.")
    html_path: str = Field(description="The same, one self-contained HTML file.")
    plot_paths: list[str] = Field(description="PNG: the runs' eval bits per byte against tokens seen.")
    config_differences: dict[str, dict[str, Any]] = Field(description="Dotted config field -> run id -> value.")
    compared_on: Measure = Field(
        description="What values are: the metric, or eval_bits_per_byte for val_bpb when runs ended apart."
    )
    at_tokens: int = Field(description="Tokens seen where runs are compared: the most all of them reached.")
    values: dict[str, float | None] = Field(description="Each run's compared_on value at at_tokens.")
    best_run: str | None = Field(description="The run with the lowest value; null if none has one, or on a tie.")
    runs: list[RunFigures]


@dataclass(frozen=True)
class Ranking:
    """Runs side by side on one measure: each run's value at `at_tokens` and the step it is from."""

    measure: Measure
    at_tokens: int
    found: dict[str, tuple[float | None, int | None]]

    @property
    def values(self) -> dict[str, float | None]:
        return {run_id: value for run_id, (value, _) in self.found.items()}

    @property
    def ranked(self) -> list[tuple[float, str]]:
        """The runs that have a value, lowest first, as (value, run id)."""
        return sorted((value, run_id) for run_id, value in self.values.items() if value is not None)

    @property
    def best(self) -> str | None:
        """The run with the lowest value; None when no run has one or two share it."""
        ranked = self.ranked
        if not ranked or (len(ranked) > 1 and ranked[0][0] == ranked[1][0]):
            return None
        return ranked[0][1]


def rank_runs(runs: list[RunData], metric: CompareMetric) -> Ranking:
    """`runs` on `metric` at equal tokens seen.

    On `val_bpb`, the runs' own val_bpb when every run ended with one at the same tokens seen (as a token
    budget makes them end). Otherwise the runs stopped at different points, so the eval curve's bits per byte
    at the most tokens all of them reached stands in for it: a longer run must not win by having trained more.
    Any other metric is read from each run's latest row at or below that count.
    """
    if metric == "val_bpb" and all(data.figures.val_bpb is not None for data in runs) and _same_work(runs):
        found = {data.figures.run_id: (data.figures.val_bpb, data.figures.steps) for data in runs}
        return Ranking("val_bpb", min(data.figures.tokens_seen for data in runs), found)
    measure = "eval_bits_per_byte" if metric == "val_bpb" else metric
    at_tokens = min(data.figures.tokens_seen for data in runs)
    found = {data.figures.run_id: value_at_tokens(data, measure, at_tokens) for data in runs}
    return Ranking(measure, at_tokens, found)


def _same_work(runs: list[RunData]) -> bool:
    """Whether the runs trained the same work: one token or FLOP budget, each met (a batch size that does not
    divide the budget ends a run up to one step past it), or the same tokens seen."""
    budgets = {data.config.budget for data in runs}
    met = all(data.info.summary is None or data.info.summary.budget_met is not False for data in runs)
    same_budget = len(budgets) == 1 and next(iter(budgets)).fixes_work and met
    return same_budget or len({data.figures.tokens_seen for data in runs}) == 1


def verdict(ranking: Ranking) -> str:
    """Which run is better, on what and where, in one sentence."""
    if ranking.measure == "val_bpb":
        basis = f"Compared on val_bpb: every run trained the same work ({ranking.at_tokens:,} tokens or more)"
    else:
        basis = (
            f"Compared on {MEASURE_WORDS[ranking.measure]} at {ranking.at_tokens:,} tokens seen (the most all runs "
            "reached; each run's latest row at or below it)"
        )
    if ranking.measure == "eval_bits_per_byte":  # only ever standing in for val_bpb
        basis += ", not on val_bpb: the runs did not all train the same work to a val_bpb"
    ranked, best = ranking.ranked, ranking.best
    if not ranked:
        return f"{basis}: no run has a value there, so none is better."
    if best is None:
        level = [run_id for value, run_id in ranked if value == ranked[0][0]]
        return f"{basis}: {', '.join(level)} tie at {fmt(ranked[0][0])}."
    others = ", ".join(f"{run_id} {fmt(value)}" for value, run_id in ranked[1:]) or "no other run has one"
    return f"{basis}: **{best}** is better with {fmt(ranked[0][0])} ({others})."


def report_name(run_ids: list[str]) -> str:
    """The file name (no suffix) of a report on several runs."""
    joined = "compare-" + "-".join(run_ids)
    if len(joined) <= 120:
        return joined
    return f"compare-{run_ids[0]}-and-{len(run_ids) - 1}-more-{hashlib.sha256(joined.encode()).hexdigest()[:8]}"


def comparison_section(
    runs: list[RunData], ranking: Ranking, differences: dict[str, dict[str, Any]], plot_name: str
) -> list[str]:
    """The markdown comparing `runs`: the verdict, what val_bpb is, the config `differences`, each run's figures
    and the value compared, the overlay plot `plot_name`, and the anomalies."""
    ids = [data.figures.run_id for data in runs]
    lines = [verdict(ranking), "", f"{VAL_BPB_MEANING} {EVAL_CURVE_MEANING}", "", "## Config differences", ""]
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
        f"| run | status | steps | tokens seen | val_bpb | final loss | best loss | eval curve: last loss | "
        f"eval curve: best loss | tokens/s | MFU % | {ranking.measure} at {ranking.at_tokens:,} tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for data in runs:
        f = data.figures
        value, step = ranking.found[f.run_id]
        lines.append(
            f"| {f.run_id} | {f.status.value} | {f.steps} | {f.tokens_seen:,} | {fmt(f.val_bpb)} | "
            f"{fmt(f.final_loss)} | {fmt(f.best_loss)} | {fmt(f.final_eval_loss)} | {fmt(f.best_eval_loss)} | "
            f"{fmt(f.tokens_per_s, 0)} | {fmt(f.mfu * 100 if f.mfu is not None else None, 1)} | {fmt(value)}"
            + (f" (step {step})" if step is not None else "")
            + " |"
        )
    lines += ["", f"![eval bits per byte against tokens seen]({plot_name})", "", "## Anomalies", ""]
    listed = [f"- {data.figures.run_id}: {describe_anomalies(data.figures)}" for data in runs]
    return [*lines, *listed, ""]


def overlay_plot(ctx: ToolContext, runs: list[RunData]) -> bytes:
    """The runs' eval curves in bits per byte against tokens seen as a PNG, each named by what it changes."""
    labels = legend_labels(ctx, runs)
    return png(overlay_figure({labels[data.figures.run_id]: data.curve for data in runs}, OVERLAY_TITLE))


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
    """Compare runs: config diff, figures, anomalies, val_bpb at equal tokens. Use it to pick a run.

    Writes `reports/compare-<ids>.md` and a self-contained `.html` beside it. On `val_bpb` (the default), runs
    that all ended at the same tokens seen (token budgets) are compared on their val_bpb; otherwise on the eval
    curve's bits per byte at the most tokens all of them reached, as `compared_on` says. `eval_loss` and `loss`
    are compared at that point too, each run at its latest row at or below it.
    """
    runs = load_runs(ctx, request.run_ids, sample=False)
    ranking = rank_runs(runs, request.metric)
    differences = config_differences({data.figures.run_id: data.config for data in runs})
    name = report_name(request.run_ids)
    plot_name = f"{name}-loss.png"
    title = "Comparison: " + ", ".join(request.run_ids)
    markdown = "\n".join([f"# {title}", "", *comparison_section(runs, ranking, differences, plot_name)])
    report_path, html_path, plots = write_report(
        ctx.workspace, name, markdown, title, {plot_name: overlay_plot(ctx, runs)}, argument="run_ids"
    )
    return Comparison(
        report_path=str(report_path),
        html_path=str(html_path),
        plot_paths=[str(path) for path in plots],
        config_differences=differences,
        compared_on=ranking.measure,
        at_tokens=ranking.at_tokens,
        values=ranking.values,
        best_run=ranking.best,
        runs=[bounded(data.figures) for data in runs],
    )
