"""The reports' figures: every axis labelled whatever the range of its values, the final val_bpb marked on the
eval curve, and overlays of several runs in eval bits per byte named by their legend labels."""

import math

import pytest

from tradewind.runs import MetricRow
from tradewind.tools.report_plots import Curve, overlay_figure, png, run_figure


def rows(steps: int, loss, bits) -> list[MetricRow]:
    """A run's rows: train figures every step from 1, an eval every 10 steps from 0."""
    return [
        MetricRow(
            step=step,
            loss=loss(step) if step else None,
            lr=1e-3 * min(1.0, step / 10),
            grad_norm=loss(step) / 2 if step else None,
            tokens_per_s=1_000.0 + step,
            eval_loss=loss(step) if step % 10 == 0 else None,
            eval_bits_per_byte=bits(step) if step % 10 == 0 else None,
            elapsed=float(step),
        )
        for step in range(steps + 1)
    ]


CURVES = {
    # Within one decade and no power of ten in view: matplotlib's own log ticks leave such an axis unlabelled.
    "narrow": Curve(rows(30, lambda s: 2.42 - s / 1000, lambda s: 2.37 - s / 2000), 256, 2.3653),
    "several decades": Curve(
        rows(300, lambda s: 0.05 + 80 * math.exp(-s / 30), lambda s: 1 + 8 * math.exp(-s / 60)), 256
    ),
    "one eval": Curve([MetricRow(step=0, eval_loss=5.5, eval_bits_per_byte=7.9, elapsed=0.5)], 256),
}


def labels_in_view(ax, axis: str) -> list[str]:
    """The tick labels a reader sees on `ax`'s `axis` ("x" or "y"), major and minor: matplotlib also lays out
    labels for ticks beyond the view, which are never drawn."""
    low, high = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    ticks = [tick for minor in (False, True) for tick in getattr(ax, f"get_{axis}ticklabels")(minor=minor)]
    where = 0 if axis == "x" else 1
    return [
        tick.get_text()
        for tick in ticks
        if tick.get_visible() and tick.get_text() and low <= tick.get_position()[where] <= high
    ]


@pytest.mark.parametrize("figure", ["run", "overlay"])
@pytest.mark.parametrize("name", list(CURVES))
def test_every_axis_of_every_panel_has_at_least_two_labelled_ticks_in_view(figure, name):
    curve = CURVES[name]
    fig = run_figure(curve, name) if figure == "run" else overlay_figure({"run-a": curve, "run-b": curve}, name)
    fig.canvas.draw()
    for ax in fig.axes:
        for axis in ("x", "y"):
            assert len(labels_in_view(ax, axis)) >= 2, f"{ax.get_title()!r} {axis} axis: {labels_in_view(ax, axis)}"


def test_a_runs_figure_marks_its_val_bpb_at_its_last_tokens_on_the_eval_bits_per_byte_curve():
    curve = CURVES["narrow"]
    fig = run_figure(curve, "run-a")
    (panel,) = [ax for ax in fig.axes if ax.get_title() == "eval bits per byte"]
    lines = {line.get_label(): line for line in panel.get_lines()}
    assert list(lines["val_bpb"].get_xdata()) == [30 * 256] and list(lines["val_bpb"].get_ydata()) == [2.3653]
    evals = [row for row in curve.rows if row.eval_bits_per_byte is not None]
    curve_line = lines["eval curve (val batches)"]
    assert list(curve_line.get_xdata()) == [row.step * 256 for row in evals]
    assert list(curve_line.get_ydata()) == [row.eval_bits_per_byte for row in evals]


def test_an_overlay_draws_eval_bits_per_byte_against_tokens_under_the_legend_labels_it_is_given():
    labels = {"run-a: optimizer.learning_rate=0.001": CURVES["narrow"], "run-b: seed=1": CURVES["several decades"]}
    fig = overlay_figure(labels, "overlay")
    (ax,) = fig.axes
    assert [text.get_text() for text in ax.get_legend().get_texts()] == list(labels)
    assert ax.get_ylabel() == "eval bits per byte" and ax.get_xlabel() == "tokens seen"
    first = ax.get_lines()[0]
    assert list(first.get_ydata()) == [
        row.eval_bits_per_byte for row in CURVES["narrow"].rows if row.eval_bits_per_byte
    ]
    assert png(fig)[:8] == b"\x89PNG\r\n\x1a\n"
