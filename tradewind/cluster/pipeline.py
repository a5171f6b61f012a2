"""Plan or run a pipeline file with the step executor, as a job or from the command line.

As a job (what the `run_pipeline` tool submits, for the plan and for the run; the keyword arguments are
a `PipelineJob`):
    JobSpec(name="pipeline pipe.py", callable="tradewind.cluster.pipeline:pipeline_job",
            kwargs={"pipeline": "pipe.py", "workspace": "WS", "dry_run": True, "output_file": "plan.json"})

From the command line, `tradewind cluster pipeline FILE [--run] [--force] [--storage URL]` (see
`tradewind.cluster.cli`)
runs the same `execute_pipeline` in its own process. Either way it prints one JSON line per step
(`name`, `output_path`, `action`, ...) to stdout and, while running, `[done/total] step NAME` to stderr.

A plan cannot be had without importing the file: steps are Python objects whose hashes cover their
functions and configs. So a dry run does import it (its top-level code runs) but calls no step, and the
import runs with the working folder set to a fresh temporary folder, removed afterwards, so that relative
paths in the file's top-level code land there rather than in the workspace or the server's folder.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster.executor import Executor, PlannedStep, load_pipeline
from tradewind.cluster.placement import BucketURL
from tradewind.core import atomic_write_json, parse_config

PIPELINE_CALLABLE = "tradewind.cluster.pipeline:pipeline_job"


class PipelineJob(BaseModel):
    """Which pipeline file to plan or run, in which workspace, and where its list of steps goes."""

    model_config = ConfigDict(extra="forbid")

    pipeline: str = Field(description="A Python file defining `steps` (tradewind.cluster.Step objects).")
    workspace: str = Field(description="The workspace root; step outputs go to <workspace>/steps.")
    force: bool = Field(default=False, description="Rerun steps that failed in an earlier run.")
    dry_run: bool = Field(default=False, description="Only plan: say which steps would run, run nothing.")
    storage: BucketURL | None = Field(
        default=None, description="A bucket prefix (gs://, s3://); step outputs are also kept under <storage>/steps."
    )
    output_file: str | None = Field(
        default=None, description="Also write the steps (a JSON list of `PlannedStep`) here; null: only print them."
    )


def steps_dir(workspace_root: str | Path) -> Path:
    """Where the executor keeps step outputs in a workspace."""
    return Path(workspace_root).expanduser().resolve() / "steps"


@contextlib.contextmanager
def _working_folder(folder: str):
    """Run the block with `folder` as the working folder, then go back."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def _print_progress(done: int, total: int, message: str) -> None:
    print(f"[{done}/{total}] {message}", file=sys.stderr, flush=True)


def execute_pipeline(job: PipelineJob) -> list[PlannedStep]:
    """Plan (`dry_run`) or run the pipeline; print one JSON line per step and write `output_file`.

    Raises:
        ConfigError: the file cannot be imported or defines no `steps`.
        StepFailedError: a step raised, or failed before and `force` is off.
        StepBusyError: another executor held a step for too long.
    """
    if job.dry_run:
        job = job.model_copy(
            update={
                "pipeline": str(Path(job.pipeline).resolve()),
                "workspace": str(Path(job.workspace).expanduser().resolve()),
                "output_file": None if job.output_file is None else str(Path(job.output_file).resolve()),
            }
        )
        with tempfile.TemporaryDirectory(prefix="tradewind-plan-") as scratch, _working_folder(scratch):
            steps = load_pipeline(job.pipeline)
    else:
        steps = load_pipeline(job.pipeline)
    results = Executor(steps_dir(job.workspace), storage=job.storage).run(
        steps, force=job.force, dry_run=job.dry_run, progress=_print_progress
    )
    for result in results:
        print(result.model_dump_json())
    if job.output_file is not None:
        atomic_write_json(job.output_file, [result.model_dump() for result in results])
    return results


def pipeline_job(**job: Any) -> None:
    """The entry of a pipeline job: validates its keyword arguments as a `PipelineJob` and executes it."""
    execute_pipeline(parse_config(PipelineJob, job, source="pipeline job"))
