"""Where a training run keeps its files: one folder per run, the same names everywhere.

<run>/run.json        the run record: backend and job, parent run, status (see `tradewind.runs.record`)
<run>/config.json     the validated TrainConfig the run was launched with
<run>/metrics.jsonl   one JSON object per logged step (see `tradewind.runs.metrics`)
<run>/summary.json    written by the trainer at the end: parameter count, final/best losses, timing
<run>/train.log       the training process's stdout and stderr
<run>/checkpoints/    orbax checkpoints
<run>/profile/        profiler traces and `profile/summary.json`
<run>/tensorboard/    TensorBoard event files of the metrics rows
<run>/samples/        text sampled from the run's checkpoints (the `sample_text` tool's jobs)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tradewind.core.buckets import MARKER, join_url, read_objects, remote_fs

# What a run's process 0 sends to its bucket, in this order, and the launcher copies back, in the reverse order:
# a reader that finds the record finished then finds the summary the trainer sent before it.
MIRRORED = ("metrics.jsonl", "summary.json", "run.json")


def run_url(storage: str, run_id: str) -> str:
    """Where run `run_id` of a launch with `storage` (a bucket prefix) lives."""
    return join_url(storage, "runs", run_id)


def bucket_outputs(storage: str, run_id: str) -> dict[str, bytes]:
    """The outputs (`MIRRORED`) process 0 has sent to the run's bucket so far, read in the reverse order."""
    return read_objects(run_url(storage, run_id), MIRRORED[::-1])


def bucket_checkpoint_steps(url: str) -> list[int]:
    """Steps of the complete checkpoints under bucket prefix `url`, oldest first: those with orbax's commit file,
    which orbax writes itself on `gs://`, or elsewhere the marker of their copy (see `bucket_checkpoint`)."""
    fs, path = remote_fs(url)
    fs.invalidate_cache(path)
    committed = "commit_success.txt" if url.startswith("gs://") else MARKER
    steps = (found.split("/")[-2] for found in fs.glob(f"{path}/*/{committed}"))
    return sorted(int(step) for step in steps if step.isdigit())


@dataclass(frozen=True)
class RunLayout:
    """The file names inside one run folder."""

    root: Path

    @property
    def record(self) -> Path:
        return self.root / "run.json"

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def log(self) -> Path:
        return self.root / "train.log"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def profile(self) -> Path:
        return self.root / "profile"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def samples(self) -> Path:
        return self.root / "samples"
