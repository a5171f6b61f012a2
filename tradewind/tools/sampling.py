"""The tool that samples text from a training run's checkpoint."""

from __future__ import annotations

from pydantic import BaseModel, Field

from tradewind.cluster import JobSpec
from tradewind.core import NotFoundError, make_id, read_json
from tradewind.tools.bounds import LINE_CHARS, cut
from tradewind.tools.context import Progress, ToolContext, no_progress, run_job
from tradewind.tools.runs import RunRequest
from tradewind.trainer import SAMPLE_CALLABLE, RunLayout, SampleJob, SampleOptions

# The generated text as JSON: most of a result's 32,000 characters (max_tokens long tokens can decode to more).
MAX_TEXT_CHARS = 28_000


class SampleTextRequest(SampleOptions, RunRequest):
    timeout_s: float = Field(default=300, gt=0, le=3600, description="Give up (and stop sampling) after this long.")


class SampleTextResult(BaseModel):
    run_id: str
    prompt: str = Field(description=f"The prompt, cut to {LINE_CHARS} characters.")
    text: str = Field(
        description=f"The generated continuation (without the prompt), cut to {MAX_TEXT_CHARS:,} characters as JSON."
    )
    truncated: bool = Field(description="True when `text` was cut; output_file holds all of it.")
    tokens: int = Field(description="Tokens generated.")
    step: int = Field(description="Checkpoint step the text was sampled from.")
    output_file: str = Field(description="JSON file with the result and the token ids.")


def sample_text(ctx: ToolContext, request: SampleTextRequest, progress: Progress = no_progress) -> SampleTextResult:
    """Generate text from a run's checkpoint to see what it learned. Use it once the run has saved a
    checkpoint.

    A run saves checkpoints at its end, or as its checkpoint policy says. Sampling runs in a
    separate process with a key/value cache; takes about as long as loading the checkpoint and compiling
    the model, plus a few milliseconds per token on CPU.
    """
    layout = RunLayout(ctx.workspace.run_dir(request.run_id))
    if not layout.checkpoints.is_dir():
        raise NotFoundError(f"run {request.run_id!r} has no checkpoints yet; wait until it saves one")
    sample_id = make_id("sample")
    out_path = layout.samples / f"{sample_id}.json"
    options = request.model_dump(include=set(SampleOptions.model_fields))
    job = SampleJob(run_dir=str(layout.root), output_file=str(out_path), **options)
    run_job(
        ctx,
        JobSpec(
            name=f"sample {request.run_id}",
            callable=SAMPLE_CALLABLE,
            kwargs=job.model_dump(),
            log_path=str(layout.samples / f"{sample_id}.log"),
        ),
        job_id=sample_id,
        timeout_s=request.timeout_s,
        activity=f"sampling run {request.run_id!r}",
        progress=progress,
    )
    output = read_json(out_path)
    text = cut(output["text"], MAX_TEXT_CHARS)
    return SampleTextResult(
        run_id=request.run_id,
        prompt=cut(output["prompt"]),
        text=text,
        truncated=text != output["text"],
        tokens=len(output["tokens"]),
        step=output["step"],
        output_file=str(out_path),
    )
