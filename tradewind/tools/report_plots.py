"""The PNG figures of reports: a run's five panels, and several runs' eval bits per byte over tokens seen.

Small files (840 x 480 pixels, a few tens of KB) so that a tool result can carry them as MCP image content.
Figures are built without pyplot, so that nothing is left in its global state between reports.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

from tradewind.runs import MetricRow

FIGSIZE = (8.4, 4.8)  # inches; at DPI, 840 x 480 pixels
DPI = 100
TICK_BINS = 4  # most intervals between round-number ticks on a log axis spanning less than two powers of ten


@dataclass(frozen=True)
class Curve:
    """A run as its plots draw it: its metrics rows, the training tokens of each step, its final val_bpb."""

    rows: Sequence[MetricRow]
    tokens_per_step: int
    val_bpb: float | None = None

    def points(self, name: str, *, by_tokens: bool = False) -> tuple[list[float], list[float]]:
        """The finite values of the rows' field `name`, against step (or tokens seen)."""
        per_step = self.tokens_per_step if by_tokens else 1
        pairs = [
            (row.step * per_step, value)
            for row in self.rows
            if (value := getattr(row, name)) is not None and math.isfinite(value)
        ]
        return [x for x, _ in pairs], [y for _, y in pairs]

    @property
    def last_tokens(self) -> int:
        """Tokens seen at the latest row, where the run's val_bpb was scored."""
        return self.rows[-1].step * self.tokens_per_step


def _figure():
    """A figure on matplotlib's Agg canvas (files only: no display on servers and CI)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _in_view_log_locator():
    """Major ticks for a log axis that always leave labels in view: powers of ten where the view holds two or
    more, else round numbers spread across it. A loss spans less than a decade, where matplotlib's own log
    ticks fall outside the view and leave the axis without a label."""
    from matplotlib.ticker import Locator, LogLocator, MaxNLocator

    # Defined here, not at the top: importing the server must not load matplotlib (tests/test_imports.py).
    class InViewLogLocator(Locator):
        def __call__(self):
            return self.tick_values(*self.axis.get_view_interval())

        def tick_values(self, vmin, vmax):
            low, high = sorted((vmin, vmax))
            decades = [tick for tick in LogLocator().tick_values(low, high) if low <= tick <= high]
            if len(decades) >= 2:
                return decades
            return [tick for tick in MaxNLocator(nbins=TICK_BINS).tick_values(low, high) if tick > 0]

    return InViewLogLocator()


def _log_axis(ax, values: Sequence[float]) -> None:
    """A log y axis, when every value is positive, labelled 2.5, 3, 4 rather than 10^0.4; minor ticks unlabelled
    so that labels never overlap."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    if not values or min(values) <= 0:
        return
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(_in_view_log_locator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def png(fig) -> bytes:
    """`fig` as a 256-colour PNG: a third of the bytes of matplotlib's own, the same to look at."""
    from PIL import Image

    fig.canvas.draw()
    image = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    out = io.BytesIO()
    image.convert("RGB").quantize(256).save(out, format="PNG", optimize=True)
    return out.getvalue()


def run_figure(curve: Curve, title: str):
    """One run's figure: train and eval loss against step (log axis); the eval curve's bits per byte against
    tokens seen, with the final val_bpb marked; and learning rate, gradient norm (log axis) and tokens per
    second against step."""
    fig = _figure()
    grid = fig.add_gridspec(2, 6)
    loss_ax, bpb_ax = fig.add_subplot(grid[0, :3]), fig.add_subplot(grid[0, 3:])
    lr_ax, grad_ax, speed_ax = (
        fig.add_subplot(grid[1, columns]) for columns in (slice(0, 2), slice(2, 4), slice(4, 6))
    )

    losses = []
    for name, style, label, color in (("loss", "-", "train", "tab:blue"), ("eval_loss", "o-", "eval", "tab:orange")):
        steps, values = curve.points(name)
        loss_ax.plot(steps, values, style, label=label, color=color, markersize=3)
        losses += values
    loss_ax.set(title="loss (nats/token)", xlabel="step")
    _log_axis(loss_ax, losses)
    loss_ax.legend(fontsize=7)

    tokens, bits = curve.points("eval_bits_per_byte", by_tokens=True)
    bpb_ax.plot(tokens, bits, "o-", color="tab:orange", markersize=3, label="eval curve (val batches)")
    if curve.val_bpb is not None:
        bpb_ax.plot([curve.last_tokens], [curve.val_bpb], "*", color="tab:red", markersize=10, label="val_bpb")
        bits = [*bits, curve.val_bpb]
    bpb_ax.set(title="eval bits per byte", xlabel="tokens seen")
    _log_axis(bpb_ax, bits)
    bpb_ax.legend(fontsize=7)

    for ax, name, panel_title, log in (
        (lr_ax, "lr", "learning rate", False),
        (grad_ax, "grad_norm", "gradient norm", True),
        (speed_ax, "tokens_per_s", "tokens/s", False),
    ):
        steps, values = curve.points(name)
        ax.plot(steps, values, color="tab:green" if name == "lr" else "tab:purple")
        if log:
            _log_axis(ax, values)
        ax.set(title=panel_title, xlabel="step")
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
        ax.title.set_fontsize(9)
        ax.xaxis.label.set_fontsize(8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def overlay_figure(curves: dict[str, Curve], title: str):
    """Several runs' eval curves in bits per byte against tokens seen (log axis), each run's final val_bpb a
    star of its colour; `curves` maps each run's legend label to its curve."""
    fig = _figure()
    ax = fig.add_subplot()
    values = []
    for index, (label, curve) in enumerate(curves.items()):
        color = f"C{index % 10}"
        tokens, bits = curve.points("eval_bits_per_byte", by_tokens=True)
        ax.plot(tokens, bits, "o-", color=color, markersize=3, label=label)  # a run without points is still named
        if curve.val_bpb is not None:
            ax.plot([curve.last_tokens], [curve.val_bpb], "*", color=color, markersize=10)
            bits = [*bits, curve.val_bpb]
        values += bits
    ax.set(xlabel="tokens seen", ylabel="eval bits per byte", title=title)
    _log_axis(ax, values)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
