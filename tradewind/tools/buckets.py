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

from tradewind.core import NotFoundError
from tradewind.core.buckets import (
    MARKER,
    CopyProgress,
    check_access,
    download_folder,
    is_complete,
    join_url,
    remote_fs,
    upload_folder,
    url_name,
)
from tradewind.data.token_cache import MANIFEST
from tradewind.runs.config import TrainConfig
from tradewind.runs.layout import RunLayout, bucket_outputs, run_url
from tradewind.tools.context import Progress, ToolContext

COPIES = "copies.json"  # in a token cache: the buckets it has been copied to or from
MODELS_DIR = "models"  # in the workspace: the models init_from named by a bucket URL, as downloaded


def stage_in_bucket(
    ctx: ToolContext, storage: str, layout: RunLayout, config: TrainConfig, progress: Progress
) -> tuple[str, TrainConfig]:
    """Put what the run's processes read into `storage`: the token cache and the `init_from` model (unless a
    complete copy is there), the config they train (a continued run's `resume_from` its parent's URL) and the
    record. Returns the run's URL and that config.

    Raises:
        ConfigError: the bucket cannot be used (`check_access`'s message: the URL and how to authenticate).
    """
    check_access(storage, argument="storage")
    copies = {"dataset": publish_dataset(ctx, Path(config.dataset), storage, progress)}
    if config.init_from is not None:
        model = Path(config.init_from)
        copies["init_from"] = copy_once(
            model, join_url(storage, "models", f"{model.name}-{folder_digest(model)}"), progress
        )
    if config.resume_from is not None:  # it continues a run that lives in this bucket too (resolve_launch)
        copies["resume_from"] = run_url(storage, Path(config.resume_from).name)
    job_config = config.model_copy(update=copies)
    url = run_url(storage, layout.root.name)
    fs, path = remote_fs(url)
    fs.pipe_file(f"{path}/config.json", job_config.model_dump_json(indent=2).encode())
    fs.put_file(str(layout.record), f"{path}/run.json")
    return url, job_config


def copy_once(folder: Path, url: str, progress: Progress) -> str:
    """`url`, after copying `folder` there unless a complete copy is there already."""
    if not is_complete(url):
        upload_folder(folder, url, copy_progress(progress, f"copying to {url}"))
    return url


def copy_progress(progress: Progress, what: str) -> CopyProgress:
    """A copy's progress (bytes) as a tool reports it."""
    return lambda done, total: progress(done, total, f"{what} (bytes)")


def publish_dataset(ctx: ToolContext, cache: Path, storage: str, progress: Progress) -> str:
    """The URL of token cache `cache`'s copy at `<storage>/datasets/<id>`, copied there unless complete, and
    noted in the cache's `copies.json` (what `list_datasets` shows)."""
    return copy_dataset(ctx, cache, join_url(storage, "datasets", cache.name), progress)


def copy_dataset(ctx: ToolContext, cache: Path, url: str, progress: Progress, argument: str = "dataset") -> str:
    """`url`, after copying token cache `cache` there unless complete (what the bucket has already is not sent
    again), noted in the cache's `copies.json`."""
    copy_once(cache, url, progress)
    _note_copy(ctx, cache, url, argument)
    return url


def fetch_dataset(ctx: ToolContext, url: str, argument: str, progress: Progress) -> Path:
    """The workspace's folder of the token cache copied to `url` (an allowed bucket prefix ending in its id),
    downloaded unless the workspace has it.

    Raises:
        PathEscapeError: `url` is under no allowed bucket prefix.
        NotFoundError: `url` holds no complete copy.
    """
    url = ctx.check_bucket(url, argument)
    folder = ctx.workspace.dataset_dir(url_name(url), must_exist=False)
    if not (folder / MANIFEST).is_file():
        download_folder(url, folder, copy_progress(progress, f"copying {url}"))
    _note_copy(ctx, folder, url, argument)
    return folder


def fetch_model(ctx: ToolContext, url: str, progress: Progress) -> Path:
    """The workspace's copy, `models/<name>-<digest>`, of the model folder copied complete to `url` (an allowed
    bucket prefix), downloaded unless the workspace has that copy (the digest covers its marker).

    Raises:
        PathEscapeError: `url` is under no allowed bucket prefix.
        NotFoundError: `url` holds no complete copy.
    """
    url = ctx.check_bucket(url, "init_from")
    fs, path = remote_fs(url)
    try:
        marker = fs.cat_file(f"{path}/{MARKER}")
    except FileNotFoundError:
        raise NotFoundError(
            f"argument 'init_from': {url} holds no complete copy of a model (no {MARKER}); copy a Hugging Face "
            f"folder there with `tradewind export RUN --out {url}` or tradewind.core.buckets.upload_folder"
        ) from None
    digest = hashlib.sha256(url.encode() + marker).hexdigest()[:12]
    # Made through the workspace first, so a link planted in its place, leading out, is refused.
    folder = ctx.workspace.make_dir(MODELS_DIR, argument="init_from") / f"{url_name(url)}-{digest}"
    if not folder.is_dir():
        download_folder(url, folder, copy_progress(progress, f"copying {url}"))
    return folder


def _note_copy(ctx: ToolContext, cache: Path, url: str, argument: str) -> None:
    """Add `url` to the bucket copies `cache`'s `copies.json` lists, unless it is there."""
    known = dataset_copies(ctx, cache, argument)
    if url not in known:
        ctx.workspace.write_atomic(cache / COPIES, json.dumps([*known, url]), argument=argument)


def dataset_copies(ctx: ToolContext, cache: Path, argument: str = "dataset") -> list[str]:
    """The bucket URLs token cache `cache` has been copied to (or from), read through the workspace."""
    path = cache / COPIES
    if not (path.is_file() or path.is_symlink()):
        return []
    with ctx.workspace.open(path, argument=argument) as file:
        return json.loads(file.read())


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
