"""The warm sampling worker: one long-lived process per workspace that answers `sample_text` and `export_model`
requests.

Started as a callable job (`SAMPLE_WORKER_CALLABLE`, keyword arguments a `SampleWorkerJob`) by the first
`sample_text` call that finds none answering. It listens on a Unix socket (`<workspace>/jobs/sample-worker.sock`),
keeps the last `CACHED_RUNS` run models it loaded (keyed by run folder and step, dropped when the run's
checkpoints or config change) and, through `sample.sample_tokens`, their compiled sampling programs, so a
second call on a run skips the process start, the JAX import, the checkpoint read and the compilation.

Protocol (`tradewind.runs.sample_client`, the tools' side): one request per connection, one JSON line each way,
at most `MAX_MESSAGE_BYTES`:
    {"op": "sample", "job": SampleJob, "log_file": "runs/r1/samples/ID.log"}  -> {"pid": 123, "error": null}
    {"op": "export", "job": ExportJob}                                        -> {"pid": 123, "error": null}
    {"op": "ping"}                                                            -> {"pid": 123, "error": null}
A sample writes the job's output file (a `SampleOutput`) and the log file (prompt and text) as the sampling
job does, both confined to the job's run folder; a failure answers
`{"error": {"type": "NotFoundError", "message": "..."}}`. Requests are served one at a time; a client that
hangs up (cancelled, timed out) does not stop the worker. The worker exits after `idle_s` without a request,
or once its socket file is removed or replaced (a newer worker took over).

This module imports no JAX until the worker serves, so that JAX loads while the first caller connects.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import traceback
from collections import OrderedDict
from pathlib import Path
from typing import Any

from tradewind.core import TradewindError, parse_config
from tradewind.runs.jobs import ExportJob, SampleJob, SampleWorkerJob, write_sample
from tradewind.runs.sample_client import read_line, send_line

CACHED_RUNS = 4
TICK_S = 0.5  # how often an idle worker checks its socket file and idle time
PRELOAD = ("tradewind.trainer.restore", "tradewind.trainer.sample")  # what the fork server imports ahead of the jobs


class RunCache:
    """The last `size` run models loaded, with their tokenizers, keyed by run folder and requested step."""

    def __init__(self, size: int = CACHED_RUNS) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[str, int | None], tuple[tuple, Any, Any]] = OrderedDict()

    @staticmethod
    def fingerprint(run_dir: Path) -> tuple:
        """What changes when a checkpoint is added, removed or rewritten, or the config is edited."""
        from tradewind.runs.layout import RunLayout

        layout = RunLayout(run_dir)
        marks: list[tuple[str, int]] = []
        for path in (layout.config, *(sorted(layout.checkpoints.iterdir()) if layout.checkpoints.is_dir() else ())):
            with contextlib.suppress(FileNotFoundError):
                marks.append((path.name, path.stat().st_mtime_ns))
        return tuple(marks)

    def get(self, run_dir: Path, step: int | None):
        """(the `LoadedRun`, its tokenizer) for the run's checkpoint `step` (None: the newest), loaded if
        not kept or if the run's checkpoints changed since."""
        from tradewind.trainer.restore import load_run_model

        key = (str(Path(run_dir).resolve()), step)
        mark = self.fingerprint(Path(key[0]))
        entry = self._entries.get(key)
        if entry is not None and entry[0] == mark:
            self._entries.move_to_end(key)
            return entry[1], entry[2]
        self._entries.pop(key, None)
        loaded = load_run_model(Path(key[0]), step)
        tokenizer = loaded.cache.tokenizer()
        self._entries[key] = (mark, loaded, tokenizer)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return loaded, tokenizer


def _sample(request: dict[str, Any], cache: RunCache) -> None:
    from tradewind.trainer.sample import sample_loaded

    job = parse_config(SampleJob, request.get("job"), source="sample request")
    loaded, tokenizer = cache.get(Path(job.run_dir), job.step)
    result = sample_loaded(loaded, tokenizer, job)
    write_sample(job, result.model_dump_json())
    if log_file := request.get("log_file"):
        write_sample(job, result.prompt + result.text + "\n", str(log_file))


def _export(request: dict[str, Any], cache: RunCache) -> None:
    from tradewind.trainer.export import export_hf

    job = parse_config(ExportJob, request.get("job"), source="export request")
    export_hf(Path(job.run_dir), Path(job.out_dir), peft=job.peft)


OPS = {"sample": _sample, "export": _export}


def _platform() -> str:
    """The platform this worker's JAX computes on (loaded by the request it has just answered)."""
    import jax

    return jax.default_backend()


def _answer(request: dict[str, Any], cache: RunCache) -> dict[str, Any]:
    reply: dict[str, Any] = {"pid": os.getpid(), "error": None}
    try:
        if request.get("op") == "ping":
            return reply
        if request.get("op") not in OPS:
            raise TradewindError(f"unknown sampling worker request {request.get('op')!r}")
        OPS[request["op"]](request, cache)
        reply["device"] = _platform()
    except TradewindError as error:
        print(f"{request.get('op')} request failed: {error}", file=sys.stderr, flush=True)
        reply["error"] = {"type": type(error).__name__, "message": str(error)}
    except Exception as error:  # a bug: keep serving, tell the caller where the traceback is
        traceback.print_exc(file=sys.stderr)
        reply["error"] = {
            "type": "TradewindError",
            "message": f"{request.get('op')} failed: {type(error).__name__}: {error}",
        }
    return reply


def _ours(path: Path, inode: int) -> bool:
    try:
        return path.stat().st_ino == inode
    except FileNotFoundError:
        return False


def _serve_one(conn: socket.socket, cache: RunCache) -> None:
    with conn:
        conn.settimeout(30)  # a client writes its request at once
        try:
            line = read_line(conn)
            if line is None:
                return
            reply = _answer(json.loads(line), cache)
            conn.settimeout(5)
            send_line(conn, reply)
        except (OSError, ValueError, TradewindError) as error:  # the caller left, or sent garbage
            print(f"sample request dropped: {error}", file=sys.stderr, flush=True)


def serve(path: Path, idle_s: float) -> None:
    """Answer requests on the Unix socket `path` until idle for `idle_s` or the socket file is gone."""
    path = Path(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    inode = None
    try:
        path.unlink(missing_ok=True)  # a dead worker's; whoever starts a worker holds the lock
        server.bind(str(path))
        os.chmod(path, 0o600)  # a request names files to write: only this user may send one
        server.listen(64)
        inode = path.stat().st_ino
        print(f"sample worker {os.getpid()} listening on {path} (idle timeout {idle_s} s)", file=sys.stderr, flush=True)
        import tradewind.trainer.sample  # noqa: F401  (JAX: loaded while the first caller connects)

        cache = RunCache()
        server.settimeout(TICK_S)
        last = time.monotonic()
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                if not _ours(path, inode):
                    print("sample worker: socket file gone or replaced; exiting", file=sys.stderr, flush=True)
                    return
                if time.monotonic() - last >= idle_s:
                    break
                continue
            _serve_one(conn, cache)
            last = time.monotonic()
        # Idle: take the socket away first, so new callers start a new worker, then answer who already connected.
        if _ours(path, inode):
            path.unlink(missing_ok=True)
        server.setblocking(False)
        while True:
            try:
                conn, _ = server.accept()
            except BlockingIOError:
                break
            conn.setblocking(True)
            _serve_one(conn, cache)
        print(f"sample worker: idle for {idle_s} s; exiting", file=sys.stderr, flush=True)
    finally:
        server.close()
        if inode is not None and _ours(path, inode):
            path.unlink(missing_ok=True)


def sample_worker_job(**job: Any) -> None:
    """The entry of the worker job: validates its keyword arguments as a `SampleWorkerJob` and serves.

    Raises:
        ConfigError: an argument is missing or out of range.
    """
    request = parse_config(SampleWorkerJob, job, source="sample worker job")
    serve(Path(request.socket_path), request.idle_s)
