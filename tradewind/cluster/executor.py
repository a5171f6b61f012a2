"""The step executor: pipelines of steps whose outputs are addressed by a hash of their inputs.

A `Step` has a name, a function, a config and the steps it depends on. Its output folder is
`<workspace>/steps/<name>-<hash>`, where the hash covers the step's name, `version`, config (as
canonical JSON) and its dependencies' output paths (relative to the steps folder, so they carry their
own hashes and moving the workspace changes nothing). Change a config anywhere upstream and every
step below gets a new path; change nothing and a rerun finds every output finished and skips it.
The function's code is *not* hashed: bump `version` when a change to it should invalidate outputs.

Each output folder holds `.step.json` (RUNNING, SUCCEEDED or FAILED, with the error) and
`.lease.json`, a lease renewed by a heartbeat thread. An executor runs a step only while it holds
the lease; a lease whose heartbeat is older than `lease_ttl_s`, or whose holder on this host is dead
(pid and start time), is taken over. Reading and writing the lease happens under `flock` on
`.lease.lock`, so two executors on one machine or on a POSIX shared filesystem never both take it.

With `storage` (a bucket prefix, `gs://bucket/prefix` or `s3://...`), each output is also kept at
`<storage>/steps/<name>-<hash>`, the local folder's name, so hosts that share no disk share finished steps.
A bucket copy counts only once its marker is there (`core.buckets`: written last), so a copy cut off
part-way is never read. A step finished here is also copied to the bucket if it has no complete copy
(it ran before storage was set, or its copy was cut off); a step not finished here but complete in the
bucket is downloaded into its local folder instead of run (its function is not called); any other step
runs here, under the local lease, and is copied up before it is marked SUCCEEDED. The executor's own
files (status, lease, lock) stay out of the bucket. The lease is per machine: two hosts may both run a
step. The first complete copy is kept; a host that finishes later finds it and does not copy its own
(it keeps its own output locally). Between the check and the marker there is a window in which both may
copy, file by file, so a step shared through a bucket should write the same files whichever host runs it.

Example:
    tokenize = Step("tokenize", tokenize_fn, {"input": "corpus.txt"})
    train = Step("train", train_fn, {"steps": 100}, deps=(tokenize,))
    Executor(workspace.root / "steps").run([train])  # runs tokenize, then train; a rerun skips both
    Executor(workspace.root / "steps", storage="gs://bucket/tw").run([train])  # and copies both to the bucket
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from tradewind.cluster.jobs import utc_now
from tradewind.cluster.process import process_alive, process_start_time
from tradewind.core import ConfigError, TradewindError, atomic_write_json, read_json
from tradewind.core.buckets import download_folder, is_complete, join_url, upload_folder

STATUS_FILE, LEASE_FILE, LOCK_FILE = ".step.json", ".lease.json", ".lease.lock"
META_FILES = (STATUS_FILE, LEASE_FILE, LOCK_FILE)
HASH_CHARS = 12


class StepFailedError(TradewindError):
    """A step raised, failed in an earlier run and `force` was not given, or its output could not be copied to
    the bucket."""


class StepBusyError(TradewindError):
    """Another executor held a step's lease for longer than this one would wait."""


StepFunction = Callable[[Path, Any, dict[str, Path]], Any]
"""`fn(output_dir, config, inputs)`; `inputs` maps each dependency's name to its output folder."""


@dataclass(frozen=True, eq=False)
class Step:
    """One unit of a pipeline. `fn(output_dir, config, inputs)` writes its results into `output_dir`."""

    name: str
    fn: StepFunction
    config: Any = None
    deps: tuple[Step, ...] = field(default_factory=tuple)
    version: str = "1"

    def __post_init__(self) -> None:
        names = [dep.name for dep in self.deps]
        if len(set(names)) != len(names):
            # Dependencies are addressed by name (in the hash and in `inputs`); twins would shadow each other.
            raise ConfigError(f"step {self.name!r} has two dependencies with one name: {sorted(names)}")


def canonical_config(config: Any) -> Any:
    """The config as plain JSON values: pydantic models dumped, paths as strings."""
    if isinstance(config, BaseModel):
        return config.model_dump(mode="json")
    return json.loads(json.dumps(config, sort_keys=True, default=str))


class PlannedStep(BaseModel):
    """What the executor will do, or did, with one step."""

    name: str
    output_path: str
    action: Literal["run", "cached", "rerun", "blocked"]
    status: str | None = None
    error: str | None = None
    url: str | None = None  # where the bucket keeps (or will keep) the output; None without storage


class Executor:
    """Runs steps in dependency order, skipping finished ones, one executor per step at a time.

    Args:
        steps_dir: where outputs go, normally `<workspace>/steps`.
        lease_ttl_s: a lease not renewed for this long is stale and may be taken over.
        heartbeat_s: how often the holder renews its lease.
        wait_s: how long to wait for a step another executor is running before `StepBusyError`.
        storage: a bucket prefix (`gs://...`, `s3://...`) where outputs are also kept, under `steps/`.
    """

    def __init__(
        self,
        steps_dir: str | os.PathLike[str],
        lease_ttl_s: float = 30.0,
        heartbeat_s: float = 5.0,
        wait_s: float = 3600,
        storage: str | None = None,
    ):
        self.steps_dir = Path(steps_dir)
        self.lease_ttl_s, self.heartbeat_s, self.wait_s = lease_ttl_s, heartbeat_s, wait_s
        self.storage = storage
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    # -- addressing -------------------------------------------------------------------------------

    def output_path(self, step: Step) -> Path:
        """`<steps_dir>/<name>-<hash of name, version, config and dependency outputs>`."""
        identity = {
            "name": step.name,
            "version": step.version,
            "config": canonical_config(step.config),
            "deps": {dep.name: self.output_path(dep).name for dep in step.deps},
        }
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:HASH_CHARS]
        return self.steps_dir / f"{step.name}-{digest}"

    def output_url(self, step: Step) -> str | None:
        """`<storage>/steps/<the output folder's name>`, the step's copy in the bucket; None without storage."""
        if self.storage is None:
            return None
        return join_url(self.storage, "steps", self.output_path(step).name)

    def _in_bucket(self, step: Step) -> bool:
        """Whether the bucket holds a complete copy of the step's output (never, without storage)."""
        url = self.output_url(step)
        return url is not None and is_complete(url)

    def order(self, steps: Sequence[Step]) -> list[Step]:
        """Every step the given ones need, dependencies first, each output once."""
        ordered: list[Step] = []
        seen: set[Path] = set()

        def visit(step: Step) -> None:  # a frozen Step cannot depend on itself, so no cycle check is needed
            out = self.output_path(step)
            if out in seen:
                return
            for dep in step.deps:
                visit(dep)
            seen.add(out)
            ordered.append(step)

        for step in steps:
            visit(step)
        return ordered

    def read_status(self, step: Step) -> dict[str, Any] | None:
        path = self.output_path(step) / STATUS_FILE
        with contextlib.suppress(FileNotFoundError, ValueError):
            return read_json(path)
        return None

    def plan(self, steps: Sequence[Step], force: bool = False) -> list[PlannedStep]:
        """What `run` would do now: which steps run, which are cached, where their outputs go."""
        planned = []
        for step in self.order(steps):
            status = self.read_status(step) or {}
            state = status.get("status")
            if state == "SUCCEEDED" or self._in_bucket(step):
                action = "cached"
            elif state == "FAILED":
                action = "rerun" if force else "blocked"
            else:
                action = "run"
            planned.append(
                PlannedStep(
                    name=step.name,
                    output_path=str(self.output_path(step)),
                    action=action,
                    status=state,
                    error=status.get("error"),
                    url=self.output_url(step),
                )
            )
        return planned

    # -- running ----------------------------------------------------------------------------------

    def run(
        self,
        steps: Sequence[Step],
        force: bool = False,
        dry_run: bool = False,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> list[PlannedStep]:
        """Run what is not finished yet; returns each step's action (`cached` or `run`).

        Raises:
            StepFailedError: a step raised, or failed before and `force` is False.
            StepBusyError: another executor held a step for longer than `wait_s`.
        """
        if dry_run:
            return self.plan(steps, force)
        ordered = self.order(steps)
        done = []
        for index, step in enumerate(ordered):
            if progress is not None:
                progress(index, len(ordered), f"step {step.name}")
            done.append(self._run_one(step, force))
        if progress is not None:
            progress(len(ordered), len(ordered), "done")
        return done

    def _run_one(self, step: Step, force: bool) -> PlannedStep:
        out = self.output_path(step)
        out.mkdir(parents=True, exist_ok=True)
        lease = Lease(out, self.owner, self.lease_ttl_s)
        deadline = time.monotonic() + self.wait_s
        while True:
            status = self.read_status(step) or {}
            if status.get("status") == "SUCCEEDED":
                return self._cached(step)
            # A step that failed here but finished on another host is taken from the bucket below.
            if status.get("status") == "FAILED" and not force and not self._in_bucket(step):
                raise StepFailedError(
                    f"step {step.name!r} failed before ({status.get('error')}); rerun with force=True ({out})"
                )
            if lease.try_acquire():
                break
            if time.monotonic() >= deadline:
                raise StepBusyError(f"step {step.name!r} is held by {lease.holder()} for more than {self.wait_s} s")
            time.sleep(min(0.2, self.lease_ttl_s / 10))
        try:
            status = (self.read_status(step) or {}).get("status")  # it may have finished while we waited
            if status == "SUCCEEDED":
                return self._cached(step)
            if self._in_bucket(step):
                self._download(step, out, lease)
                return self._finished(step, "cached")
            rerun = status == "FAILED"
            if rerun and not force:
                raise StepFailedError(f"step {step.name!r} failed before; rerun with force=True ({out})")
            self._execute(step, out, lease)
            return self._finished(step, "rerun" if rerun else "run")
        finally:
            lease.release()

    def _finished(self, step: Step, action: Literal["run", "cached", "rerun"]) -> PlannedStep:
        return PlannedStep(
            name=step.name,
            output_path=str(self.output_path(step)),
            action=action,
            status="SUCCEEDED",
            url=self.output_url(step),
        )

    def _cached(self, step: Step) -> PlannedStep:
        """A step finished here, copied to the bucket if the bucket has no complete copy yet."""
        self._publish(step)
        return self._finished(step, "cached")

    def _status_fields(self, step: Step) -> dict[str, Any]:
        """What every status this executor writes for `step` says besides the state."""
        return {
            "name": step.name,
            "config": canonical_config(step.config),
            "owner": self.owner,
            "deps": {dep.name: str(self.output_path(dep)) for dep in step.deps},
        }

    def _execute(self, step: Step, out: Path, lease: Lease) -> None:
        clear_outputs(out)  # leftovers of a crashed or failed attempt
        fields = self._status_fields(step)
        atomic_write_json(out / STATUS_FILE, {**fields, "status": "RUNNING", "started_at": utc_now()})
        inputs = {dep.name: self.output_path(dep) for dep in step.deps}
        with heartbeat(lease, self.heartbeat_s):
            try:
                step.fn(out, step.config, inputs)
                check_held(step, lease)
            except StepBusyError:
                raise
            except Exception as error:
                message = f"{type(error).__name__}: {error}"
                atomic_write_json(
                    out / STATUS_FILE, {**fields, "status": "FAILED", "error": message, "ended_at": utc_now()}
                )
                raise StepFailedError(f"step {step.name!r} failed: {message} ({out})") from error
            # Copied before it is SUCCEEDED, so a step this host reports finished is there for the others too;
            # a copy cut off leaves it RUNNING here, and the next run runs it again.
            self._publish(step)
        atomic_write_json(out / STATUS_FILE, {**fields, "status": "SUCCEEDED", "ended_at": utc_now()})

    def _download(self, step: Step, out: Path, lease: Lease) -> None:
        """Fill `out` with the step's complete copy from the bucket, and mark the step SUCCEEDED here."""
        url = self.output_url(step)
        clear_outputs(out)
        # The copy lands beside `out`, then moves in: `out` keeps the lease and lock this executor holds.
        with heartbeat(lease, self.heartbeat_s), scratch_folder(out) as fetched:
            download_folder(url, fetched)
            check_held(step, lease)
            for child in fetched.iterdir():
                child.rename(out / child.name)
        fields = {**self._status_fields(step), "copied_from": url}
        atomic_write_json(out / STATUS_FILE, {**fields, "status": "SUCCEEDED", "ended_at": utc_now()})

    def _publish(self, step: Step) -> None:
        """Copy the step's output to its bucket URL unless a complete copy is there; the first copy is kept.

        The executor's files stay behind: the lease and its lock belong to this host, and the status would say
        RUNNING (a step turns SUCCEEDED only once copied) and name this host's executor. In the bucket the
        marker is the status; a host that downloads the copy writes its own.

        Raises:
            StepFailedError: the copy failed (the bucket's error, the folder and the URL).
        """
        url = self.output_url(step)
        if url is None or is_complete(url):
            return
        out = self.output_path(step)
        try:
            upload_folder(out, url, skip=META_FILES)
        except Exception as error:  # each bucket library raises its own errors
            raise StepFailedError(
                f"step {step.name!r}: copying {out} to {url} failed: {type(error).__name__}: {error}; "
                "run the pipeline again to retry"
            ) from error


def check_held(step: Step, lease: Lease) -> None:
    """Renew `lease`, or raise if another executor took the step over while this one stalled."""
    if not lease.renew():
        raise StepBusyError(f"step {step.name!r} lost its lease to another executor; its output is theirs")


def clear_outputs(out: Path) -> None:
    """Remove everything in `out` but the executor's files."""
    for child in out.iterdir():
        if child.name not in META_FILES:
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()


@contextlib.contextmanager
def scratch_folder(out: Path) -> Iterator[Path]:
    """A path for a folder beside `out`, hidden and unique to this call; whatever is there is removed after."""
    folder = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.download")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Lease:
    """The right to run the step in `folder`, held by `owner` while its heartbeat is fresh."""

    def __init__(self, folder: Path, owner: str, ttl_s: float):
        self.folder, self.owner, self.ttl_s = folder, owner, ttl_s
        self.path = folder / LEASE_FILE

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.folder / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any] | None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return read_json(self.path)
        return None

    def holder(self) -> str | None:
        lease = self._read()
        return lease["owner"] if lease else None

    def _stale(self, lease: dict[str, Any]) -> bool:
        if time.time() - lease["heartbeat"] > self.ttl_s:
            return True
        # On this host a dead holder is known at once, without waiting out the TTL.
        return lease.get("host") == socket.gethostname() and not process_alive(lease["pid"], lease.get("pid_start"))

    def _write(self) -> None:
        pid = os.getpid()
        atomic_write_json(
            self.path,
            {
                "owner": self.owner,
                "host": socket.gethostname(),
                "pid": pid,
                "pid_start": process_start_time(pid),
                "heartbeat": time.time(),
            },
        )

    def try_acquire(self) -> bool:
        """Take the lease if it is free, stale or ours already."""
        with self._locked():
            lease = self._read()
            if lease is not None and lease["owner"] != self.owner and not self._stale(lease):
                return False
            self._write()
            return True

    def renew(self) -> bool:
        """Refresh the heartbeat; False when another executor took the lease over."""
        with self._locked():
            lease = self._read()
            if lease is None or lease["owner"] != self.owner:
                return False
            self._write()
            return True

    def release(self) -> None:
        with self._locked():
            lease = self._read()
            if lease is not None and lease["owner"] == self.owner:
                self.path.unlink()


@contextlib.contextmanager
def heartbeat(lease: Lease, every_s: float) -> Iterator[None]:
    """Renew `lease` every `every_s` seconds in a background thread while the block runs."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            if not lease.renew():
                return

    thread = threading.Thread(target=beat, name=f"lease-heartbeat {lease.folder.name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def load_pipeline(path: str | os.PathLike[str]) -> list[Step]:
    """The steps a pipeline file defines: a module-level `steps` list (final steps; deps come along)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"tradewind_pipeline_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"argument 'pipeline': {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise ConfigError(f"argument 'pipeline': importing {path} failed: {type(error).__name__}: {error}") from error
    steps = getattr(module, "steps", None)
    if not isinstance(steps, list | tuple) or not all(isinstance(s, Step) for s in steps):
        raise ConfigError(f"argument 'pipeline': {path} must define `steps`, a list of tradewind.cluster.Step")
    return list(steps)
