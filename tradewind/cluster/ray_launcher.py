"""The launcher: one detached Ray actor per cluster that starts Tradewind job drivers on request.

A job through Ray's Jobs API costs about 3 s before its driver runs: a supervisor actor (a new worker
process), a runtime environment and a driver's Python start, per job. The launcher pays for them once.
The first `RayBackend` on a cluster creates it (named `LAUNCHER_NAME` in `NAMESPACE`, pinned to the head
node, detached, so it outlives that backend's process and every other process finds it by name). It keeps
one spare driver per interpreter warm (`python -m tradewind.cluster.ray_entry --spare`: Ray and Tradewind
imported, joined to the cluster); a submission is one actor call that hands the job's id and spec to the
spare on its stdin and starts the next spare.

Each job is up to three files in the launcher's folder, under the Ray session's folder on the head (so a
new cluster starts empty and a restarted launcher finds every job again): `<id>.json` (the spec, the
submission time, the driver's pid and start time, and once it ended its exit code and end time),
`<id>.log` (the driver's output, the replicas' included through Ray's `log_to_driver`) and `<id>.result`
(the outcome the driver wrote as it ended). What the job's status is follows from these, in `RayBackend`;
the launcher only starts, stops and reports drivers.

Ray is imported only inside methods: `ray.remote(Launcher)` is made in `RayBackend`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from tradewind.cluster.process import process_alive, process_start_time
from tradewind.cluster.ray_entry import STARTED_LINE

NAMESPACE = "tradewind"
LAUNCHER_NAME = "tradewind-launcher"
PROTOCOL = 2  # what `ping` answers; raised when the launcher's calls, arguments or files change


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Launcher:
    """Starts, stops and reports the drivers of Tradewind jobs on the Ray cluster it runs on."""

    def __init__(self) -> None:
        import ray

        worker = ray._private.worker.global_worker  # no public name for the session folder
        self.root = Path(worker.node.get_session_dir_path()) / "tradewind-jobs"
        self.root.mkdir(parents=True, exist_ok=True)
        self.gcs_address = ray.get_runtime_context().gcs_address
        self.drivers: dict[str, subprocess.Popen] = {}  # this process's children, by job id
        self.spares: dict[str, tuple[subprocess.Popen, Path]] = {}  # by interpreter

    def ping(self) -> int:
        return PROTOCOL

    def warm(self, python: str) -> None:
        """Start a spare driver for `python` unless one is waiting."""
        spare = self.spares.get(python)
        if spare is None or spare[0].poll() is not None:
            self.spares[python] = self._spawn_spare(python)

    def _spawn_spare(self, python: str) -> tuple[subprocess.Popen, Path]:
        log = self.root / f"spare-{os.urandom(6).hex()}.log"
        with open(log, "ab") as out:  # append mode: the file may be truncated under the driver
            process = subprocess.Popen(
                [python, "-m", "tradewind.cluster.ray_entry", "--spare", str(self.root)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a driver outlives a restarted launcher
                env={**os.environ, "RAY_ADDRESS": self.gcs_address, "PYTHONUNBUFFERED": "1"},
            )
        return process, log

    def submit(self, job_id: str, spec_json: str, python: str) -> bool:
        """Hand the job to the spare driver for `python` (started now if none waits) and warm the next.

        Returns False, starting nothing, when a job with this id exists.
        """
        meta = self.root / f"{job_id}.json"
        if meta.exists():
            return False
        self.warm(python)
        process, log = self.spares.pop(python)
        os.replace(log, self.root / f"{job_id}.log")
        os.truncate(self.root / f"{job_id}.log", 0)  # what the spare printed while it joined the cluster
        stdin: IO[bytes] = process.stdin  # type: ignore[assignment]
        stdin.write(f"{job_id} {spec_json}\n".encode())
        stdin.close()
        self.drivers[job_id] = process
        pid = process.pid
        state = {"spec": spec_json, "submitted_at": _now(), "pid": pid, "pid_start": process_start_time(pid)}
        meta.write_text(json.dumps(state))
        self.warm(python)
        return True

    def _state(self, job_id: str) -> dict[str, Any]:
        """The job's state file, brought up to date with whether its driver ended."""
        path = self.root / f"{job_id}.json"
        state = json.loads(path.read_text())
        if "ended_at" in state:
            return state
        process = self.drivers.get(job_id)
        if process is not None:
            if process.poll() is None:
                return state
            state["exit_code"] = process.returncode
            del self.drivers[job_id]
        elif process_alive(state["pid"], state["pid_start"]):
            return state  # started by an earlier launcher; its exit code is not ours to read
        state["ended_at"] = _now()
        path.write_text(json.dumps(state))
        return state

    def view(self, job_id: str, offset: int = 0, limit: int | None = 0) -> dict[str, Any] | None:
        """The job's state, its log's size, whether its replicas started, its outcome (JSON) once its driver
        wrote one, and `limit` bytes of its log from `offset` (None: to the end); None for an unknown id.

        Only the asked-for bytes travel: a status needs the facts, not the log.
        """
        if not (self.root / f"{job_id}.json").exists():
            return None
        state = self._state(job_id)
        log = self.root / f"{job_id}.log"
        if not log.exists():
            return {**state, "id": job_id, "size": 0, "log": b"", "started": False, "result": None}
        with open(log, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(offset)
            page = file.read(-1 if limit is None else limit)
        if not state.get("started"):
            state["started"] = STARTED_LINE.encode() in log.read_bytes()  # an early line: read until it shows
            if state["started"]:
                (self.root / f"{job_id}.json").write_text(json.dumps(state))
        result_path = self.root / f"{job_id}.result"
        result = result_path.read_text() if result_path.exists() else None
        return {**state, "id": job_id, "size": size, "log": page, "result": result}

    def views(self) -> list[dict[str, Any]]:
        """Every job's view without log bytes, in no particular order."""
        return [view for path in self.root.glob("*.json") if (view := self.view(path.stem)) is not None]

    def stop(self, job_id: str) -> None:
        """SIGTERM the job's driver, which cancels its replicas; a later view says it was stopped."""
        state = self._state(job_id)
        if "ended_at" in state:
            return
        path = self.root / f"{job_id}.json"
        path.write_text(json.dumps({**state, "stopped": True}))
        with contextlib.suppress(ProcessLookupError):
            os.kill(state["pid"], signal.SIGTERM)
