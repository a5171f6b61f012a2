"""The tool that profiles a run's training step with the JAX profiler."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from tradewind.cluster import JobSpec, Resources
from tradewind.core import make_id
from tradewind.core.buckets import join_url, upload_folder
from tradewind.data import open_token_cache
from tradewind.runs import PROFILE_CALLABLE, ProfileJob, ProfileOptions, ProfileSummary, RunLayout
from tradewind.runs.layout import run_url
from tradewind.tools.buckets import copy_progress
from tradewind.tools.context import Progress, ToolContext, no_progress, run_job
from tradewind.tools.launching import read_run_config, training_env
from tradewind.tools.limits import admit_job
from tradewind.tools.runs import RunRequest, run_placement
from tradewind.tools.spec import tool


class ProfileRunRequest(ProfileOptions, RunRequest):
    timeout_s: float = Field(default=600, gt=0, le=3600)


class ProfileResult(ProfileSummary):
    run_id: str
    log_file: str


@tool("Profile a run's steps", links=("profile",))
def profile_run(ctx: ToolContext, request: ProfileRunRequest, progress: Progress = no_progress) -> ProfileResult:
    """Profile training steps: where the time goes, what to change. Use it when training is slow.

    Returns compile and step time, the step split (compute, data wait, host, checkpoint), time and MFU lost by
    model part, time by op kind, top ops, peak memory, MFU, a verdict with one suggestion, and the trace. Runs
    in a separate process on fresh weights, for about a compile plus `steps` steps; the run's files stay as
    they are (a bucket run's trace goes to `<run>/profile`). Refused where settings.yaml refuses the run.
    """
    layout = RunLayout(ctx.workspace.run_dir(request.run_id))
    config = read_run_config(ctx, layout.root, argument="run_id")
    vocab_size = open_token_cache(Path(config.dataset)).manifest.tokenizer.vocab_size
    placement = run_placement(ctx, layout.root, "run_id")
    admit_job(ctx, config, placement, vocab_size=vocab_size, what="profile_run's job", instead="")
    # The job writes its summary, trace and log here: made first, so a link planted in its place is refused.
    ctx.workspace.make_dir(layout.profile, argument="run_id")
    log_path = layout.profile / "profile.log"
    job = ProfileJob(run_dir=str(layout.root), **request.model_dump(include=set(ProfileOptions.model_fields)))
    local = placement.backend == "local"  # on the run's own devices (a TPU run's chip: it waits its turn there)
    run_job(
        ctx,
        JobSpec(
            name=f"profile {request.run_id}",
            callable=PROFILE_CALLABLE,
            kwargs=job.model_dump(),
            log_path=str(log_path),
            resources=placement.resources() if local else Resources(),
            env=training_env(ctx, placement, ctx.backend) if local else {},
        ),
        job_id=make_id("profile"),
        timeout_s=request.timeout_s,
        activity=f"profiling run {request.run_id!r}",
        progress=progress,
    )
    with ctx.workspace.open(layout.profile / "summary.json", argument="run_id") as file:
        summary = ProfileSummary.model_validate_json(file.read())
    if placement.storage is not None:  # the trace goes beside the run's other files
        url = join_url(run_url(placement.storage, request.run_id), "profile")
        upload_folder(layout.profile, url, copy_progress(progress, f"copying the trace to {url}"))
    return ProfileResult(**summary.model_dump(), run_id=request.run_id, log_file=str(log_path))


def describe_profile(result: ProfileSummary) -> str:
    """The profile as a person reads it: timing, the step split, where the step goes by part of the model and by
    kind of op, the top ops, and the verdict's suggestion."""
    split, diagnosis = result.split, result.diagnosis
    lines = [
        f"compile {result.compile_s:.1f} s; steps {result.start_step}-{result.start_step + result.steps - 1}: mean "
        f"{result.mean_step_s * 1000:.1f} ms, {result.tokens_per_s:,.0f} tokens/s, MFU {result.mfu or 0:.1%}",
        f"step split: compute {split.compute:.0%}, data wait {split.data_wait:.0%}, host {split.host:.0%}, "
        f"checkpoint {split.checkpoint:.0%}; peak memory {(result.peak_memory_bytes or 0) / 2**20:,.0f} MiB "
        f"({result.peak_memory_source})",
        *(
            f"  {part.part:<14} {part.seconds * 1000:8.2f} ms  {part.share:6.1%} of the step, "
            f"MFU lost {part.mfu_lost:6.1%}"
            for part in result.parts
        ),
        *(
            ["by kind: " + ", ".join(f"{kind} {s * 1000:.2f} ms" for kind, s in result.kinds.items())]
            * bool(result.kinds)
        ),
        *(f"  {op.share:6.1%}  {op.total_ms:9.1f} ms  {op.name}" for op in result.top_ops),
        f"{diagnosis.verdict}: {diagnosis.suggestion}",
        f"evidence: {diagnosis.evidence}",
    ]
    return "\n".join(lines)
