"""sample_text: text from a finished run's checkpoint, through the Python API and a real MCP client."""

import json
import shutil
from pathlib import Path

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from polling import wait_until
from runs_helpers import CancelAtFirstReport

from tradewind.cli import main
from tradewind.cluster import JobSpec, JobStatus
from tradewind.core import InvalidInputError, NotFoundError, PathEscapeError
from tradewind.runs import RunLayout
from tradewind.runs.jobs import SAMPLE_CALLABLE, SampleJob, SampleOptions, write_sample
from tradewind.runs.sample_client import socket_path
from tradewind.server.adapter import as_mcp_tool
from tradewind.tools import ToolContext
from tradewind.tools.context import Cancelled
from tradewind.tools.sampling import SampleTextRequest, sample_text


@pytest.mark.slow
def test_sample_text_continues_the_prompt_with_max_tokens_bytes_and_is_repeatable(trained_ctx):
    request = SampleTextRequest(run_id="r1", prompt="ROMEO:", max_tokens=20, temperature=0.9, top_k=40, seed=3)
    first = sample_text(trained_ctx, request)
    assert first.tokens == 20 and first.step == 10 and first.prompt == "ROMEO:"
    saved = json.loads(Path(first.output_file).read_text(encoding="utf-8"))
    assert len(saved["tokens"]) == 20 and all(0 <= t < 258 for t in saved["tokens"])
    assert sample_text(trained_ctx, request).text == first.text


@pytest.mark.slow
def test_sample_text_gives_the_text_of_the_sample_job_for_the_same_options(trained_ctx):
    options = {"prompt": "KING:", "max_tokens": 8, "temperature": 0.9, "top_k": 30, "top_p": 0.9, "seed": 7}
    result = sample_text(trained_ctx, SampleTextRequest(run_id="r1", step=10, **options))
    assert Path(result.output_file).with_suffix(".log").read_text(encoding="utf-8") == "KING:" + result.text + "\n"

    # The process-per-call path sample_text took before the warm worker: a callable job on the local backend.
    output = Path(result.output_file).with_name("by-job.json")
    job = SampleJob(run_dir=str(trained_ctx.workspace.run_dir("r1")), output_file=str(output), **options)
    spec = JobSpec(name="sample by job", callable=SAMPLE_CALLABLE, kwargs=job.model_dump())
    record = trained_ctx.backend.submit(spec)
    assert trained_ctx.backend.wait(record.id, timeout=120).status is JobStatus.SUCCEEDED
    by_job = json.loads(output.read_text(encoding="utf-8"))
    assert by_job == json.loads(Path(result.output_file).read_text(encoding="utf-8"))
    assert (by_job["text"], by_job["step"]) == (result.text, 10)


@pytest.mark.slow
def test_sampling_a_step_without_a_checkpoint_fails_with_the_saved_steps_in_the_error(trained_ctx):
    with pytest.raises(NotFoundError, match=r"no checkpoint for step 7 in .*; saved steps: \[10\]"):
        sample_text(trained_ctx, SampleTextRequest(run_id="r1", step=7, max_tokens=2))
    with pytest.raises(InvalidInputError, match="exceeds the model's max_seq_len"):
        sample_text(trained_ctx, SampleTextRequest(run_id="r1", prompt="x" * 60, max_tokens=10))
    assert sample_text(trained_ctx, SampleTextRequest(run_id="r1", prompt="A", max_tokens=2)).tokens == 2  # serving


@pytest.mark.slow
@pytest.mark.anyio
async def test_sample_text_through_mcp_returns_the_structured_result(trained_ctx):
    server = MCPServer(name="sampling-tools")
    server.add_tool(as_mcp_tool(sample_text, trained_ctx), name="sample_text", structured_output=True)
    async with Client(server) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert listed["sample_text"].input_schema["required"] == ["run_id"]
        result = await client.call_tool(
            "sample_text", {"run_id": "r1", "prompt": "A", "max_tokens": 5, "temperature": 0}
        )
        bad = await client.call_tool("sample_text", {"run_id": "r1", "top_p": 0})
    assert not result.is_error
    data = result.structured_content
    assert {k: data[k] for k in ("run_id", "prompt", "tokens", "step")} == {
        "run_id": "r1",
        "prompt": "A",
        "tokens": 5,
        "step": 10,
    }
    assert len(data["text"]) > 0 and data["output_file"].endswith(".json")
    assert bad.is_error and "top_p" in " ".join(block.text for block in bad.content)


def test_sample_text_on_a_run_without_checkpoints_says_so(tmp_path):
    ctx = ToolContext.open(tmp_path / "workspace")
    ctx.workspace.run_dir("empty", must_exist=False).mkdir(parents=True)
    with pytest.raises(NotFoundError, match="no checkpoints yet"):
        sample_text(ctx, SampleTextRequest(run_id="empty"))
    shutil.rmtree(ctx.workspace.run_dir("empty"))


def test_every_sampling_option_is_a_cli_option_of_tradewind_sample(capsys):
    with pytest.raises(SystemExit):
        main(["sample", "--help"])
    shown = capsys.readouterr().out

    assert "run_id" in shown
    for name in [*SampleOptions.model_fields, "timeout_s"]:
        assert "--" + name.replace("_", "-") in shown, name


@pytest.mark.slow
def test_the_default_empty_prompt_samples_from_the_start_token(trained_ctx):
    result = sample_text(trained_ctx, SampleTextRequest(run_id="r1", max_tokens=12, seed=2))
    assert (result.prompt, result.tokens, result.step) == ("", 12, 10)
    saved = json.loads(Path(result.output_file).read_text(encoding="utf-8"))
    assert saved["prompt"] == "" and len(saved["tokens"]) == 12


def test_sample_text_refuses_checkpoints_that_link_outside_before_a_worker_reads_them(hand_made, tmp_path):
    (tmp_path / "secret").mkdir()
    layout = RunLayout(hand_made.workspace.run_dir("r1"))
    (layout.checkpoints / "10" / "state").symlink_to(tmp_path / "secret")
    with pytest.raises(PathEscapeError, match=r"argument 'run_id': .*checkpoints/10/state"):
        sample_text(hand_made, SampleTextRequest(run_id="r1"))
    assert hand_made.backend.list() == []


def test_sample_text_never_writes_through_a_samples_folder_that_links_outside(hand_made, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    RunLayout(hand_made.workspace.run_dir("r1")).samples.symlink_to(outside)
    with pytest.raises(PathEscapeError, match=r"argument 'run_id': .*samples"):
        sample_text(hand_made, SampleTextRequest(run_id="r1"))
    assert list(outside.iterdir()) == [] and hand_made.backend.list() == []


def test_the_sample_worker_writes_only_inside_the_run_folder(hand_made, tmp_path):
    job = SampleJob(run_dir=str(hand_made.workspace.run_dir("r1")), output_file=str(tmp_path / "out.json"))
    with pytest.raises(PathEscapeError, match=r"argument 'run_id'"):
        write_sample(job, "{}")
    assert not (tmp_path / "out.json").exists()


def test_a_cancelled_sample_text_stops_within_a_second_while_its_worker_starts(hand_made):
    cancel = CancelAtFirstReport()
    with pytest.raises(Cancelled):
        sample_text(hand_made, SampleTextRequest(run_id="r1"), cancel)
    assert cancel.seconds_since() < 1.0
    # The worker it started is left to serve other calls; this one stops it: it exits once its socket is gone.
    [worker] = hand_made.backend.list()
    path = socket_path(hand_made.workspace.jobs_dir)
    wait_until(lambda: path.exists() or hand_made.backend.status(worker.id).status.finished, what="the worker")
    path.unlink(missing_ok=True)
    assert hand_made.backend.wait(worker.id, timeout=60).status.finished
