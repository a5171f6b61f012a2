"""The dashboard's front page, a runs table, and the comparison page it opens, for the people watching runs.

The runs are folders as the trainer leaves them (`table_run`: record, config, metrics, log, summary); the one
still training is trained, as far as the server can tell, by this test's process (its pid in the record, as a
Python call of `train` writes it), so that the test decides when its next metrics row comes. The browser test
drives Debian's chromium through Playwright against a real `tradewind serve --transport http`.
"""

import csv
import io
import json
import os
import shutil

import pytest
from http_helpers import running_server
from runs_helpers import metric_rows, table_run, write_run

from tradewind.cluster import JobStatus, Placement
from tradewind.core import atomic_write_json
from tradewind.runs import MetricRow, RunLayout, RunRecord, read_metrics, read_record, read_summary, write_record
from tradewind.runs.metrics import Diagnosis, ProfileSummary
from tradewind.tools import ToolContext
from tradewind.tools.metrics import ReadMetricsRequest
from tradewind.tools.metrics import read_metrics as read_metrics_tool
from tradewind.tools.runs_table import runs_table

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BASE, LR_LOW, LR_HIGH, WIDE, LIVE = (
    "20261206-100000-base",
    "20261206-100100-lr-low",
    "20261206-100200-lr-high",
    "20261206-100300-wide",
    "20261206-100400-live",
)


def workspace_of_runs(ctx: ToolContext) -> None:
    table_run(ctx, BASE, 2.5, note="baseline")
    table_run(ctx, LR_LOW, 2.2, sweep_id="sweep-1", note="lr 1e-3", decision="kept", decision_reason="beyond noise")
    table_run(ctx, LR_HIGH, 2.9, sweep_id="sweep-1", note="lr 3e-2", decision="discarded", decision_reason="worse")
    table_run(ctx, WIDE, 2.35, note="d_model 256")
    table_run(ctx, LIVE, 2.4, running=True, steps=100, note="longer run")


def train_on(ctx: ToolContext, run_id: str, step: int) -> None:
    """The running run logs its next row, as its trainer would."""
    with RunLayout(ctx.workspace.run_dir(run_id)).metrics.open("a") as metrics:
        row = MetricRow(step=step, loss=3.0, lr=1e-4, tokens_per_s=4e4, mfu=0.3, elapsed=step * 0.2)
        metrics.write(row.model_dump_json(exclude_none=True) + "\n")


def test_the_table_has_a_row_a_run_newest_first_and_follows_a_running_one_and_a_changed_record(tmp_path):
    ctx = ToolContext.open(tmp_path / "ws")
    workspace_of_runs(ctx)
    (ctx.workspace.runs_dir / "20261206-100500-junk").mkdir()  # a folder that is no run
    table = runs_table(ctx)
    assert [row.run_id for row in table.rows] == [LIVE, WIDE, LR_HIGH, LR_LOW, BASE]
    assert [entry.run_id for entry in table.unreadable] == ["20261206-100500-junk"]
    assert "run.json" in table.unreadable[0].reason

    rows = {row.run_id: row for row in table.rows}
    summary = read_summary(RunLayout(ctx.workspace.run_dir(LR_LOW)).summary)
    low = rows[LR_LOW]
    assert (low.status.value, low.step, low.tokens, low.parameters) == ("SUCCEEDED", 300, summary.tokens_seen, 123_456)
    assert (low.final_eval_loss, low.best_eval_loss, low.bits_per_byte) == (2.2, summary.best_eval_loss, 2.2 / 5.5)
    assert (low.mfu, low.wall_s, low.sweep_id, low.note) == (0.25, 300.0, "sweep-1", "lr 1e-3")
    assert (low.decision, low.decision_reason, str(low.accelerator), low.devices) == ("kept", "beyond noise", "cpu", 1)

    live = rows[LIVE]
    so_far = read_metrics_tool(ctx, ReadMetricsRequest(run_id=LIVE)).summary
    assert (live.status.value, live.step, live.tokens) == ("RUNNING", 100, 100 * live.tokens_per_step)
    assert (live.best_eval_loss, live.mfu, live.final_eval_loss) == (so_far.best_eval_loss, so_far.mean_mfu, 2.4)
    assert live.parameters is None and live.wall_s > 0  # no summary yet; the clock runs

    crashed = "20261206-100450-crashed"  # killed at step 40: no summary, a record that says why
    write_run(ctx, crashed, metric_rows(40), RunRecord(run_id=crashed, backend="process", status=JobStatus.FAILED))
    row = next(row for row in runs_table(ctx).rows if row.run_id == crashed)
    assert (row.status, row.step, row.parameters) == (JobStatus.FAILED, 40, None)

    train_on(ctx, LIVE, 110)
    decided = read_record(RunLayout(ctx.workspace.run_dir(BASE)).record)
    write_record(RunLayout(ctx.workspace.run_dir(BASE)).record, decided.model_copy(update={"decision": "discarded"}))
    again = {row.run_id: row for row in runs_table(ctx).rows}
    assert again[LIVE].step == 110 and again[BASE].decision == "discarded"


def last_points(page, chart: str) -> dict[str, list[float]]:
    return json.loads(page.get_attribute(f"#chart-{chart}", "data-last"))


def shown_runs(page) -> list[str]:
    return page.eval_on_selector_all("#runs tbody tr[data-run]", "rows => rows.map(row => row.dataset.run)")


def ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing, as the page draws it: an EMA corrected for its start."""
    average, smoothed = 0.0, []
    for count, value in enumerate(values, start=1):
        average = average * weight + value * (1 - weight)
        smoothed.append(average / (1 - weight**count))
    return smoothed


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="needs chromium (.ci/run installs it)")
def test_a_person_sorts_filters_ticks_three_runs_and_compares_them_with_hover_values_and_smoothing(tmp_path):
    from playwright.sync_api import sync_playwright

    ctx = ToolContext.open(tmp_path / "ws")
    workspace_of_runs(ctx)
    with running_server(ctx.workspace.root) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        page.goto(f"http://127.0.0.1:{server.port}/dashboard?token={server.token()}")
        assert "token=" not in page.url
        page.wait_for_selector("body[data-ready]")
        assert shown_runs(page) == [LIVE, WIDE, LR_HIGH, LR_LOW, BASE]  # newest first

        # Sort by eval loss: a number column sorts largest first, then smallest first; a sweep's runs stay
        # together, where its first run comes.
        page.click('th[data-key="final_eval_loss"]')
        assert shown_runs(page) == [LR_HIGH, LR_LOW, BASE, LIVE, WIDE]
        page.click('th[data-key="final_eval_loss"]')
        assert shown_runs(page) == [LR_LOW, LR_HIGH, WIDE, LIVE, BASE]
        page.click('tr.group[data-sweep="sweep-1"]')  # the sweep folds away, and opens again
        assert shown_runs(page) == [WIDE, LIVE, BASE]
        page.click('tr.group[data-sweep="sweep-1"]')

        page.fill("#filter", "d_model")  # a word of the note
        assert shown_runs(page) == [WIDE]
        page.fill("#filter", "beyond noise")  # the ledger's reason
        assert shown_runs(page) == [LR_LOW]
        page.fill("#filter", "")
        page.select_option("#status", "RUNNING")
        assert shown_runs(page) == [LIVE]
        page.select_option("#status", "")

        # The running row moves on as its run logs rows.
        steps_cell = f'tr[data-run="{LIVE}"] td[data-key="step"]'
        assert page.inner_text(steps_cell).startswith("100/")
        train_on(ctx, LIVE, 120)
        page.wait_for_function(f"() => document.querySelector('{steps_cell}').textContent.startsWith('120/')")

        for run_id in (BASE, LR_LOW, WIDE):
            page.check(f'tr[data-run="{run_id}"] input[type=checkbox]')
        assert page.inner_text("#compare") == "compare selected (3)"
        page.click("#compare")
        page.wait_for_url(f"**/dashboard/runs/{BASE},{LR_LOW},{WIDE}")
        page.wait_for_selector("#chart-loss canvas")

        # Hover: the legend shows each line's value at the step under the cursor, as the metrics file has it.
        box = page.locator("#chart-loss .u-over").bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.4, box["y"] + box["height"] / 2)
        legend = dict(
            zip(
                page.locator("#chart-loss .u-legend .u-series .u-label").all_inner_texts(),
                page.locator("#chart-loss .u-legend .u-series .u-value").all_inner_texts(),
                strict=True,
            )
        )
        step = int(legend["step"])
        file_rows = {row.step: row for row in read_metrics(RunLayout(ctx.workspace.run_dir(LR_LOW)).metrics)}
        assert 0 < step < 300 and float(legend[f"{LR_LOW} loss (raw)"]) == pytest.approx(file_rows[step].loss, 1e-4)

        # The chart's data as CSV: the raw line is read_metrics' series, the smoothed line its EMA.
        with page.expect_download() as download:
            page.click("#chart-loss button.csv")
        table = list(csv.DictReader(io.StringIO(download.value.path().read_text())))
        metrics = read_metrics_tool(ctx, ReadMetricsRequest(run_id=LR_LOW, series=["loss"], max_points=166))
        raw = [(int(row["step"]), float(row[f"{LR_LOW} loss (raw)"])) for row in table if row[f"{LR_LOW} loss (raw)"]]
        assert raw == list(zip(metrics.series["loss"].steps, metrics.series["loss"].values, strict=True))
        smoothed = [float(row[f"{LR_LOW} loss (smoothed)"]) for row in table if row[f"{LR_LOW} loss (smoothed)"]]
        assert smoothed == pytest.approx(ema([value for _, value in raw], 0.6), rel=1e-12)

        # The x-axis: tokens (steps x tokens a step), then the wall time the rows logged.
        page.select_option("#x-axis", "tokens")
        tokens_per_step = runs_table(ctx).rows[-1].tokens_per_step
        assert last_points(page, "loss")[f"{BASE} loss"][0] == 300 * tokens_per_step
        page.select_option("#x-axis", "time")
        assert last_points(page, "loss")[f"{BASE} loss"][0] == pytest.approx(file_rows[300].elapsed, rel=1e-5)
        page.select_option("#x-axis", "step")

        # Zoom by dragging across the chart, back out with a double-click; log scale off and on.
        full = float(page.get_attribute("#chart-loss", "data-x-max"))
        page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + 20)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + 20, steps=5)
        page.mouse.up()
        zoomed = float(page.get_attribute("#chart-loss", "data-x-max"))
        assert zoomed < full * 0.6
        page.mouse.dblclick(box["x"] + box["width"] * 0.5, box["y"] + 20)
        assert float(page.get_attribute("#chart-loss", "data-x-max")) == full
        assert page.get_attribute("#chart-loss", "data-log") == "true"
        page.uncheck("#chart-loss input.log")
        assert page.get_attribute("#chart-loss", "data-log") == "false"

        # A narrower window narrows the charts (each as wide as its figure), a wider one widens them again.
        width = "document.querySelector('#chart-loss canvas').getBoundingClientRect().width"
        wide = page.evaluate(width)
        page.set_viewport_size({"width": 1100, "height": 1000})  # two columns still, each narrower
        page.wait_for_function(f"{width} < {wide} - 100", timeout=5000)
        figure = page.evaluate("document.querySelector('#chart-loss').getBoundingClientRect().width")
        assert page.evaluate(width) <= figure
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.wait_for_function(f"Math.abs({width} - {wide}) < 2", timeout=5000)
        browser.close()


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="needs chromium (.ci/run installs it)")
def test_a_tpu_runs_page_says_what_the_chip_did_and_a_cpu_runs_page_has_no_such_row(tmp_path):
    """A TPU run's folder as the trainer leaves it on a v5e chip (made here: this machine has none), profiled."""
    from playwright.sync_api import sync_playwright

    ctx = ToolContext.open(tmp_path / "ws")
    chip = "20261206-110000-chip"
    layout = table_run(ctx, chip, 2.1, platform="tpu", placement=Placement(accelerator="tpu-v5litepod-1"))
    summary = read_summary(layout.summary).model_copy(
        update={
            "step_memory_bytes": int(13.55 * 2**30),
            "device_memory_bytes": int(15.75 * 2**30),
            "compile_s": 41.2,
            "first_update_s": 55.3,
            "mfu": 0.525,
            "peak_flops": 197e12,
        }
    )
    atomic_write_json(layout.summary, summary.model_dump(mode="json"))
    diagnosis = Diagnosis(verdict="compute-bound", evidence="94% of the step on the chip", suggestion="batch 16")
    layout.profile.mkdir()
    profiled = ProfileSummary(
        steps=5,
        compile_s=41.0,
        mean_step_s=0.39,
        tokens_per_s=4e4,
        parameters=123_456,
        trace_dir="trace",
        backend="tpu",
        diagnosis=diagnosis,
    )
    atomic_write_json(layout.profile / "summary.json", profiled.model_dump(mode="json"))
    table_run(ctx, BASE, 2.5)  # a CPU run

    with running_server(ctx.workspace.root) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{server.port}/dashboard/runs/{chip},{BASE}?token={server.token()}")
        page.wait_for_selector("#chart-loss canvas")
        cells = page.locator(f'#chip tr[data-run="{chip}"] td').all_inner_texts()
        cpu_rows = page.locator(f'#chip tr[data-run="{BASE}"]').count()
        browser.close()
    assert cells == [
        chip,
        "tpu-v5litepod-1 \u00d7 1",
        "13.55 of 15.75 GiB (86%)",
        "41.2 s",
        "55.3 s",
        "52.5% of 197 TFLOP/s",
        "compute-bound: batch 16",
    ]
    assert cpu_rows == 0
