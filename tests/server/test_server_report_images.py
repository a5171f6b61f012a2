"""Reports over MCP: summarize_report and compare_runs send their PNG plots as image content beside the
structured result, and refuse bad arguments with errors that name them."""

import base64
from pathlib import Path

import pytest
from mcp import Client
from mcp.types import ImageContent, TextContent

from tradewind.cluster import JobStatus
from tradewind.core import atomic_write_json
from tradewind.runs import MetricRow, RunLayout, RunRecord, TrainConfig, write_record
from tradewind.server import build_server
from tradewind.server.adapter import MAX_IMAGES
from tradewind.tools import ToolContext

pytestmark = pytest.mark.anyio

ROWS = [
    MetricRow(step=0, eval_loss=5.5, elapsed=0.5),
    MetricRow(step=10, loss=4.0, lr=1e-3, grad_norm=1.5, tokens_per_s=900.0, step_time_s=0.25, elapsed=3.0),
    MetricRow(step=20, loss=3.0, eval_loss=3.25, lr=1e-3, grad_norm=1.2, tokens_per_s=1000.0, elapsed=5.0),
]


@pytest.fixture
def workspace(tmp_path) -> ToolContext:
    """A workspace with two finished runs' folders, run-a and run-b (learning rates 1e-3 and 3e-3)."""
    ctx = ToolContext.open(tmp_path / "workspace")
    for run_id, learning_rate in (("run-a", 1e-3), ("run-b", 3e-3)):
        layout = RunLayout(ctx.workspace.runs_dir / run_id)
        layout.root.mkdir(parents=True)
        write_record(layout.record, RunRecord(run_id=run_id, backend="process", status=JobStatus.SUCCEEDED))
        config = TrainConfig(dataset="datasets/ds-x", steps=20, optimizer={"learning_rate": learning_rate})
        atomic_write_json(layout.config, config.model_dump(mode="json"))
        layout.metrics.write_text("".join(row.model_dump_json(exclude_none=True) + "\n" for row in ROWS))
    return ctx


def images(result) -> list[bytes]:
    return [base64.b64decode(item.data) for item in result.content if isinstance(item, ImageContent)]


async def test_summarize_report_sends_its_plot_as_png_image_content(workspace):
    async with Client(build_server(workspace)) as client:
        result = await client.call_tool("summarize_report", {"run_id": "run-a"})
    assert not result.is_error, result.content
    assert isinstance(result.content[0], TextContent)
    (png,) = images(result)
    (plot,) = result.structured_content["plot_paths"]
    assert png == Path(plot).read_bytes() and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(item.mime_type == "image/png" for item in result.content if isinstance(item, ImageContent))


async def test_a_report_on_several_runs_sends_its_first_plots_the_overlay_first(workspace):
    async with Client(build_server(workspace)) as client:
        result = await client.call_tool("summarize_report", {"run_ids": ["run-a", "run-b"], "sample": False})
    assert not result.is_error, result.content
    plots = result.structured_content["plot_paths"]
    assert Path(plots[0]).name == "compare-run-a-run-b-loss.png" and len(plots) == 3
    assert images(result) == [Path(plot).read_bytes() for plot in plots[:MAX_IMAGES]]


async def test_compare_runs_sends_the_overlay_and_names_the_differing_field(workspace):
    async with Client(build_server(workspace)) as client:
        result = await client.call_tool("compare_runs", {"run_ids": ["run-a", "run-b"], "metric": "loss"})
    assert not result.is_error, result.content
    assert result.structured_content["config_differences"] == {
        "optimizer.learning_rate": {"run-a": 0.001, "run-b": 0.003}
    }
    (png,) = images(result)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


async def test_other_tools_send_no_images(workspace):
    async with Client(build_server(workspace)) as client:
        result = await client.call_tool("read_metrics", {"run_id": "run-a"})
    assert not result.is_error and images(result) == []
    assert result.structured_content["summary"]["anomalies"] == []


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("compare_runs", {"run_ids": ["run-a"]}, "run_ids"),
        ("compare_runs", {"run_ids": ["run-a", "run-nope"]}, "unknown run id"),
        ("compare_runs", {"run_ids": ["run-a", "run-b"], "metric": "accuracy"}, "metric"),
        ("summarize_report", {}, "give run_id or run_ids"),
        ("summarize_report", {"run_ids": ["run-a"], "run_id": "run-b"}, "give run_id or run_ids"),
    ],
)
async def test_bad_report_arguments_are_error_results_naming_them(workspace, tool, arguments, expected):
    async with Client(build_server(workspace)) as client:
        result = await client.call_tool(tool, arguments)
    assert result.is_error
    assert expected in result.content[0].text, result.content[0].text
