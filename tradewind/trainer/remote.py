"""A run that lives in a bucket: each process trains in a private local folder and the bucket holds the truth.

The hosts of a multi-host run share no disk. A run launched with `storage` therefore lives at the prefix
`<storage>/runs/<id>/` (its job's `run_dir`), and its dataset at `<storage>/datasets/<id>/`. Every process:

1. makes its own local folder (`cluster.jobs.local_dir`: `$TRADEWIND_LOCAL_DIR`, which a backend sets per
   process, else a fresh folder under the system's temporary folder) and copies into it the run's
   `config.json`, `run.json` and `metrics.jsonl` from the bucket, and the token cache (and the `init_from`
   model) whole, complete or refused (see `core.buckets`);
2. trains there, with its checkpoints in the bucket (`checkpoint.open_checkpointer`): orbax writes them to
   `gs://` itself, shard by shard; to `s3://`, which orbax cannot write, they are saved locally and copied up
   (`bucket_checkpoint`);
3. (process 0) sends `metrics.jsonl`, `summary.json` and `run.json` back, in that order (`MIRRORED`): before
   each checkpoint, so that the bucket holds every row up to the checkpoint's step, at most every `PUSH_EVERY_S`
   seconds in between, and at the end. A process restarted on another host finds everything it needs in the bucket.

Example:
    remote = RemoteRun.open("gs://bucket/prefix/runs/run-1234")
    config = config.model_copy(update={"dataset": str(remote.fetch(config.dataset, "datasets"))})
"""

from __future__ import annotations

import time
from pathlib import Path

from tradewind.cluster.jobs import local_dir
from tradewind.core import atomic_write_bytes
from tradewind.core.buckets import download_folder, is_remote, join_url, read_objects, upload_files, url_name
from tradewind.runs.layout import MIRRORED, RunLayout
from tradewind.trainer.distributed import is_main_process
from tradewind.trainer.hooks import CheckpointHook, Interval
from tradewind.trainer.state import TrainState

PULLED = ("config.json", "run.json", "metrics.jsonl")
PUSH_EVERY_S = 10.0


class RemoteRun:
    """The run at bucket prefix `url`, with its local copy `layout` and its checkpoints' URL."""

    def __init__(self, url: str, local: Path):
        self.url = url.rstrip("/")
        self.layout = RunLayout(local)
        self.checkpoints = join_url(self.url, "checkpoints")
        self.last_push = time.monotonic()

    @classmethod
    def open(cls, url: str) -> RemoteRun:
        """Copy the run's files this process needs from `url` into its private folder."""
        remote = cls(url, local_dir() / "runs" / url_name(url))
        remote.layout.root.mkdir(parents=True, exist_ok=True)
        for name, data in read_objects(remote.url, PULLED).items():
            atomic_write_bytes(remote.layout.root / name, data)
        return remote

    def fetch(self, url: str, kind: str) -> Path:
        """The folder (a token cache, a model) at bucket prefix `url`, copied whole into this process's folder
        `<kind>/` once per process: a copy lands whole or not at all (`download_folder`)."""
        local = local_dir() / kind / url_name(url)
        if not local.is_dir():
            started = time.monotonic()
            download_folder(url, local, progress=_Report(url))
            print(f"copied {url} to {local} in {time.monotonic() - started:.1f}s", flush=True)
        return local

    def push(self) -> None:
        """Send the run's outputs to the bucket (process 0; the others write none)."""
        if is_main_process():
            upload_files(self.layout.root, self.url, MIRRORED)
        self.last_push = time.monotonic()


class PushHook:
    """Sends the outputs before each checkpoint (which follows this hook), and at most every `PUSH_EVERY_S`."""

    def __init__(self, remote: RemoteRun, checkpoint: CheckpointHook | None):
        self.remote, self.checkpoint = remote, checkpoint

    def wants(self, step: int) -> bool:
        saves = self.checkpoint is not None and self.checkpoint.wants(step)
        return saves or time.monotonic() - self.remote.last_push >= PUSH_EVERY_S

    def __call__(self, state: TrainState, interval: Interval) -> None:
        self.remote.push()


def parent_files(resume_from: str) -> tuple[str | Path, Path]:
    """Where the run this one continues (`resume_from`: its folder, or its bucket prefix) keeps its checkpoints,
    and its metrics file: a bucket run's is copied into this process's folder."""
    if not is_remote(resume_from):
        parent = RunLayout(Path(resume_from))
        return parent.checkpoints, parent.metrics
    copy = RunLayout(local_dir() / "parents" / url_name(resume_from))
    copy.root.mkdir(parents=True, exist_ok=True)
    rows = read_objects(resume_from, (copy.metrics.name,)).get(copy.metrics.name, b"")
    atomic_write_bytes(copy.metrics, rows)
    return join_url(resume_from, "checkpoints"), copy.metrics


class _Report:
    """Prints a copy's progress to the run log, at most every five seconds."""

    def __init__(self, what: str):
        self.what, self.last = what, time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if time.monotonic() - self.last >= 5 or done == total:
            print(f"copying {self.what}: {done / 2**20:,.1f} of {total / 2**20:,.1f} MiB", flush=True)
            self.last = time.monotonic()
