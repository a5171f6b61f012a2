"""The tool that samples text from a training run's checkpoint."""

from __future__ import annotations

import sys

from pydantic import BaseModel, Field

from tradewind.cluster import JobSpec
from tradewind.core import NotFoundError, make_id, read_json
from tradewind.tools.context import Progress, ToolContext, no_progress, run_job
from tradewind.tools.runs import RunRequest
from tradewind.trainer import RunLayout


class SampleTextRequest(RunRequest):
    prompt: str = Field(default="", max_length=10_000, description="Text the model continues (may be empty).")
    max_tokens: int = Field(default=200, ge=1, le=4096, description="Tokens to generate after the prompt.")
    temperature: float = Field(
        default=0.8, ge=0, le=5, description="Softmax temperature; 0 always takes the most likely token."
    )
    top_k: int = Field(default=0, ge=0, description="Sample only among the k most likely tokens; 0 turns it off.")
    top_p: float = Field(
        default=1.0, gt=0, le=1, description="Sample from the smallest set of tokens whose probability reaches top_p."
    )
    seed: int = Field(default=0, ge=0, description="Random seed; the same seed and settings give the same text.")
    step: int | None = Field(default=None, ge=0, description="Checkpoint step to sample from; null: the newest.")
    timeout_s: float = Field(default=300, gt=0, le=3600, description="Give up (and stop sampling) after this long.")


class SampleTextResult(BaseModel):
    run_id: str
    prompt: str
    text: str = Field(description="The generated continuation (without the prompt).")
    tokens: int = Field(description="Tokens generated.")
    step: int = Field(description="Checkpoint step the text was sampled from.")
    output_file: str = Field(description="JSON file with the result and the token ids.")


def sample_text(ctx: ToolContext, request: SampleTextRequest, progress: Progress = no_progress) -> SampleTextResult:
    """Generate text from a run's checkpoint (temperature, top-k, top-p, max tokens) to see what it learned.

    Use it after a run has saved a checkpoint (at the end, or as its checkpoint policy says). Runs in a
    separate process with a key/value cache; takes about as long as loading the checkpoint and compiling
    the model, plus a few milliseconds per token on CPU.
    """
    layout = RunLayout(ctx.workspace.run_dir(request.run_id))
    if not layout.checkpoints.is_dir():
        raise NotFoundError(f"run {request.run_id!r} has no checkpoints yet; wait until it saves one")
    sample_id = make_id("sample")
    out_path = layout.samples / f"{sample_id}.json"
    log_path = layout.samples / f"{sample_id}.log"
    command = [
        sys.executable,
        "-m",
        "tradewind.trainer.sample",
        str(layout.root),
        "--prompt",
        request.prompt,
        "--max-tokens",
        str(request.max_tokens),
        "--temperature",
        str(request.temperature),
        "--top-k",
        str(request.top_k),
        "--top-p",
        str(request.top_p),
        "--seed",
        str(request.seed),
        "--out",
        str(out_path),
    ]
    if request.step is not None:
        command += ["--step", str(request.step)]
    run_job(
        ctx,
        JobSpec(name=f"sample {request.run_id}", command=command, log_path=str(log_path)),
        job_id=sample_id,
        timeout_s=request.timeout_s,
        activity=f"sampling run {request.run_id!r}",
        progress=progress,
    )
    output = read_json(out_path)
    return SampleTextResult(
        run_id=request.run_id,
        prompt=output["prompt"],
        text=output["text"],
        tokens=len(output["tokens"]),
        step=output["step"],
        output_file=str(out_path),
    )
