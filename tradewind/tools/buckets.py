"""Runs whose files live in a bucket (`storage`): what the launcher puts there, and what it reads back.

A run launched with `storage: gs://bucket/prefix` keeps its token cache at `<storage>/datasets/<dataset id>/`
and its `init_from` model at `<storage>/models/<name>-<digest>/` (each copied once, complete or absent), and its
run folder at `<storage>/runs/<run id>/`: the config its processes train (its dataset the bucket copy), the
record, the metrics, the summary and the checkpoints. The run's processes need no disk in common with each
other or with this workspace (see `tradewind.trainer.remote`).

The workspace keeps its own folder of the run, as for any run, with the config as launched (its dataset the
local cache). `get_run` (and so `wait_for_run` and the CLI) copies the record, metrics and summary back from
the bucket until the summary is here, and the job's end copies them once more, so every tool reads the run as
it reads any other.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tradewind.core.buckets import check_access, is_complete, join_url, remote_fs, upload_folder
from tradewind.tools.context import Progress, ToolContext
from tradewind.trainer.config import TrainConfig
from tradewind.trainer.layout import RunLayout, bucket_outputs, run_url


def stage_in_bucket(
    ctx: ToolContext, storage: str, layout: RunLayout, config: TrainConfig, progress: Progress
) -> tuple[str, TrainConfig]:
    """Put what the run's processes read into `storage`: the token cache and the `init_from` model (unless a
    complete copy is there), the config they train and the record. Returns the run's URL and that config.

    Raises:
        ConfigError: the bucket cannot be used (`check_access`'s message: the URL and how to authenticate).
    """
    check_access(storage, argument="storage")
    dataset = Path(config.dataset)
    copies = {"dataset": copy_once(dataset, join_url(storage, "datasets", dataset.name), progress)}
    if config.init_from is not None:
        model = Path(config.init_from)
        copies["init_from"] = copy_once(
            model, join_url(storage, "models", f"{model.name}-{folder_digest(model)}"), progress
        )
    job_config = config.model_copy(update=copies)
    url = run_url(storage, layout.root.name)
    fs, path = remote_fs(url)
    fs.pipe_file(f"{path}/config.json", job_config.model_dump_json(indent=2).encode())
    fs.put_file(str(layout.record), f"{path}/run.json")
    return url, job_config


def copy_once(folder: Path, url: str, progress: Progress) -> str:
    """`url`, after copying `folder` there unless a complete copy is there already."""
    if not is_complete(url):
        upload_folder(folder, url, progress=lambda done, total: progress(done, total, f"copying to {url} (bytes)"))
    return url


def folder_digest(folder: Path) -> str:
    """12 hex digits that change whenever a file in `folder` does (its name, size or modification time)."""
    listing = sorted(
        (file.relative_to(folder).as_posix(), file.stat().st_size, file.stat().st_mtime_ns)
        for file in folder.rglob("*")
        if file.is_file()
    )
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:12]


def pull_run_outputs(ctx: ToolContext, layout: RunLayout, storage: str) -> None:
    """Copy the run's record, metrics and summary from its bucket into its workspace folder."""
    for name, data in bucket_outputs(storage, layout.root.name).items():
        ctx.workspace.write_atomic(layout.root / name, data, argument="run_id")
