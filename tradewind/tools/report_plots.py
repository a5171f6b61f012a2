"""The PNG figures of reports: a run's four curves, and several runs' losses over tokens seen.

Small files (840 x 480 pixels, a few tens of KB) so that a tool result can carry them as MCP image content.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

from tradewind.trainer import MetricRow

FIGSIZE = (8.4, 4.8)  # inches; at DPI, 840 x 480 pixels
DPI = 100

MINOR_LABELS = 4  # most labelled minor ticks on a log axis


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def _points(rows: Sequence[MetricRow], name: str, x=lambda row: row.step) -> tuple[list, list]:
    pairs = [(x(row), value) for row in rows if (value := getattr(row, name)) is not None and math.isfinite(value)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _plain_log(ax) -> None:
    """A log y axis labelled 2.5, 3, 4 rather than 10^0.4 (losses span less than a decade). Minor ticks are
    labelled only while at most `MINOR_LABELS` of them are in view, so that labels never overlap."""
    from matplotlib.ticker import FuncFormatter

    def minor_label(value: float, _) -> str:
        low, high = ax.get_ylim()
        in_view = [tick for tick in ax.yaxis.get_minorticklocs() if low <= tick <= high]
        return f"{value:g}" if len(in_view) <= MINOR_LABELS else ""

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(minor_label))


def _png(fig) -> bytes:
    """`fig` as a 256-colour PNG: a third of the bytes of matplotlib's own, the same to look at."""
    from PIL import Image

    fig.canvas.draw()
    image = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    out = io.BytesIO()
    image.convert("RGB").quantize(256).save(out, format="PNG", optimize=True)
    return out.getvalue()


def plot_run(rows: Sequence[MetricRow], title: str) -> bytes:
    """Four panels against step as a PNG: train and eval loss (log axis), learning rate, gradient norm (log axis)
    and tokens per second. The caller writes it (through the workspace's confined write)."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=FIGSIZE, dpi=DPI, sharex=True)
    (loss_ax, lr_ax), (grad_ax, speed_ax) = axes
    for name, style, label, color in (("loss", "-", "train", "tab:blue"), ("eval_loss", "o-", "eval", "tab:orange")):
        steps, values = _points(rows, name)
        if values:
            loss_ax.plot(steps, values, style, label=label, color=color, markersize=3)
    loss_ax.set_title("loss (nats/token)")
    _plain_log(loss_ax)
    loss_ax.legend(fontsize=8)
    for ax, name, panel_title, log in (
        (lr_ax, "lr", "learning rate", False),
        (grad_ax, "grad_norm", "gradient norm", True),
        (speed_ax, "tokens_per_s", "tokens/s", False),
    ):
        steps, values = _points(rows, name)
        if values:
            ax.plot(steps, values, color="tab:green" if name == "lr" else "tab:purple")
            if log and min(values) > 0:
                _plain_log(ax)
        ax.set_title(panel_title)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        ax.title.set_fontsize(9)
    for ax in axes[1]:
        ax.set_xlabel("step", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    png = _png(fig)
    plt.close(fig)
    return png


def plot_overlay(curves: dict[str, tuple[list[MetricRow], int]], title: str) -> bytes:
    """Each run's train loss (line) and eval loss (dots) against tokens seen, log loss axis, as a PNG; `curves`
    maps a run id to its rows and its tokens per step."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    for index, (run_id, (rows, tokens_per_step)) in enumerate(curves.items()):
        color = f"C{index % 10}"
        for name, style, label in (("loss", "-", "train"), ("eval_loss", "o--", "eval")):
            tokens, values = _points(rows, name, x=lambda row, per_step=tokens_per_step: row.step * per_step)
            if values:
                ax.plot(tokens, values, style, color=color, markersize=3, label=f"{run_id} {label}")
    ax.set(xlabel="tokens seen", ylabel="loss (nats/token)", title=title)
    _plain_log(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    png = _png(fig)
    plt.close(fig)
    return png
