"""The tool that samples text from a training run's checkpoint, through the workspace's warm sampling worker.

The first call starts the worker (`tradewind.trainer.sample_worker`) as a job on the local backend and waits
for its socket; later calls find it answering and pay only for the sampling itself (and, on a run or step
the worker has not loaded yet, for loading and compiling it). A lock file makes two concurrent first calls
start one worker; a worker that died leaves a socket nobody answers, and the next call starts a new one.
"""

from __future__ import annotations

import fcntl
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

import tradewind.core
from tradewind.cluster import JobSpec, Resources
from tradewind.cluster.tpu_host import host_tpu
from tradewind.core import NotFoundError, TradewindError, make_id, tail_lines
from tradewind.data import open_token_cache
from tradewind.runs import RunLayout, SampleJob, SampleOptions, TrainConfig
from tradewind.runs.jobs import SAMPLE_WORKER_CALLABLE, SampleWorkerJob
from tradewind.runs.sample_client import LOCK_NAME, ask, connect, idle_seconds, socket_path
from tradewind.tools.bounds import LINE_CHARS, cut
from tradewind.tools.context import LOG_TAIL_LINES, Progress, ToolContext, no_progress
from tradewind.tools.launching import read_run_config
from tradewind.tools.limits import check_sampling_memory
from tradewind.tools.runs import RunRequest, run_placement
from tradewind.tools.spec import tool

# The generated text as JSON: most of a result's 31,000 characters (max_tokens long tokens can decode to more).
MAX_TEXT_CHARS = 28_000


WORKER_DEVICE_MEANING = "the sampling worker's JAX platform; on a TPU host the CPU (its chips are for training)."


def worker_device(reply: dict[str, Any]) -> str:
    """Where the sampling worker computed a reply, in words: on a TPU host, the CPU and why."""
    device = reply.get("device") or "cpu"
    return f"{device} (this host's TPU is for training runs)" if device == "cpu" and host_tpu() else device


class SampleTextRequest(SampleOptions, RunRequest):
    timeout_s: float = Field(default=300, gt=0, le=3600)


class SampleTextResult(BaseModel):
    run_id: str
    prompt: str = Field(
        description=f"The prompt as the model saw it (messages rendered), cut to {LINE_CHARS} characters."
    )
    text: str = Field(
        description=f"The generated continuation (without the prompt), cut to {MAX_TEXT_CHARS:,} characters as JSON."
    )
    truncated: bool = Field(description="True when `text` was cut; output_file holds all of it.")
    tokens: int = Field(
        description="Tokens generated; with messages, those before its end of turn (fewer than max_tokens: the "
        "reply ended)."
    )
    step: int = Field(description="Checkpoint step the text was sampled from.")
    output_file: str = Field(description="JSON file with the result and the token ids.")
    device: str = Field(default="cpu", description=f"Where it was sampled: {WORKER_DEVICE_MEANING}")


@tool("Sample text from a run")
def sample_text(ctx: ToolContext, request: SampleTextRequest, progress: Progress = no_progress) -> SampleTextResult:
    """Sample text from a run's checkpoint. Use it to see what it learned.

    With `messages` (a chat, instead of `prompt`; 10,000 characters of content in all) the model continues the
    chat rendered with the run's tokenizer's chat template and its generation prompt, and the reply is cut before
    its end of turn (the token the template ends a reply with, or EOS). That needs a run trained on data
    tokenized with a Hugging Face tokenizer folder that has a chat template (`format="chat"`).

    A run saves checkpoints at its end, or as its checkpoint policy says. Sampling runs in a
    separate worker process, kept warm per workspace, with a key/value cache: the first call on a run takes
    about as long as starting it, loading the checkpoint and compiling the model; later calls with the same
    options take a few milliseconds per token on CPU.
    """
    layout = RunLayout(ctx.workspace.run_dir(request.run_id))
    in_bucket = run_placement(ctx, layout.root, "run_id").storage is not None  # the worker reads them there
    if not in_bucket and not layout.checkpoints.is_dir():
        raise NotFoundError(f"run {request.run_id!r} has no checkpoints yet; wait until it saves one")
    config = read_run_config(ctx, layout.root, argument="run_id")
    cache = open_token_cache(Path(config.dataset))
    check_sampling_memory(ctx, config, cache.manifest.tokenizer.vocab_size)
    check_worker_reads(ctx, layout, config, cache.tokenizer_source(), in_bucket=in_bucket)
    ctx.workspace.make_dir(layout.samples, argument="run_id")  # the worker writes into it: it may not lead out
    sample_id = make_id("sample")
    out_path = layout.samples / f"{sample_id}.json"
    options = request.model_dump(include=set(SampleOptions.model_fields))
    job = SampleJob(run_dir=str(layout.root), output_file=str(out_path), **options)
    ask = {"op": "sample", "job": job.model_dump(), "log_file": str(layout.samples / f"{sample_id}.log")}
    reply = ask_sample_worker(
        ctx, ask, timeout_s=request.timeout_s, activity=f"sampling run {request.run_id!r}", progress=progress
    )
    if error := reply.get("error"):
        raise worker_error(error)
    with ctx.workspace.open(out_path, "r", argument="run_id") as file:
        output = json.load(file)
    text = cut(output["text"], MAX_TEXT_CHARS)
    return SampleTextResult(
        run_id=request.run_id,
        prompt=cut(output["prompt"]),
        text=text,
        truncated=text != output["text"],
        tokens=len(output["tokens"]),
        step=output["step"],
        output_file=str(out_path),
        device=worker_device(reply),
    )


def check_worker_reads(
    ctx: ToolContext, layout: RunLayout, config: TrainConfig, tokenizer: str, *, in_bucket: bool
) -> None:
    """Refuse a link leading out of the workspace in what the worker reads whole for a run: its checkpoints (unless
    they are in a bucket), its tokenizer folder (a chat template among its files) and a LoRA run's base.

    Raises:
        PathEscapeError: one of them holds such a link.
    """
    if not in_bucket:
        ctx.workspace.check_tree(layout.checkpoints, argument="run_id")
    if Path(tokenizer).is_dir():
        ctx.workspace.check_tree(tokenizer, argument="run_id")
    if config.lora is not None and config.init_from:
        ctx.workspace.check_tree(config.init_from, argument="run_id")


def worker_error(error: dict[str, Any]) -> TradewindError:
    """The worker's error as the `TradewindError` subclass it raised (a `TradewindError` for any other)."""
    kind = getattr(tradewind.core, str(error.get("type")), None)
    if not (isinstance(kind, type) and issubclass(kind, TradewindError)):
        kind = TradewindError
    return kind(str(error.get("message")))


def ask_sample_worker(
    ctx: ToolContext, request: dict[str, Any], *, timeout_s: float, activity: str, progress: Progress
) -> dict[str, Any]:
    """Send `request` to the workspace's sampling worker (started if none answers) and return its reply,
    reporting elapsed seconds about twice a second.

    Raises:
        TradewindError: no reply within `timeout_s`, the worker did not start, or it ended before it answered.
        Cancelled: the caller cancelled the call; the worker goes on serving others.
    """
    start = time.monotonic()

    def tick() -> None:
        elapsed = time.monotonic() - start
        if elapsed >= timeout_s:
            raise TradewindError(f"{activity} took longer than timeout_s={timeout_s}")
        progress(elapsed, timeout_s, f"{activity} (seconds elapsed)")

    path = socket_path(ctx.workspace.jobs_dir)
    conn = connect(path) or _start_worker(ctx, path, tick)
    conn.settimeout(0.5)  # so that waiting ticks: progress, the timeout, cancellation
    line = ask(conn, request, on_timeout=tick)
    if line is None:
        raise TradewindError(
            f"{activity} failed: the sampling worker ended before it answered (see the newest 'sample worker' "
            f"job's log in {ctx.workspace.jobs_dir}); the next call starts a new one"
        )
    return json.loads(line)


def _start_worker(ctx: ToolContext, path: Path, tick: Callable[[], None]) -> socket.socket:
    """Start a worker unless another caller did meanwhile (under the workspace's lock), and connect to it."""
    with open(ctx.workspace.jobs_dir / LOCK_NAME, "a") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # another call is starting one
                tick()
                time.sleep(0.05)
        try:
            if conn := connect(path):
                return conn
            job_id = make_id("sample-worker")
            spec = JobSpec(
                name="sample worker",
                callable=SAMPLE_WORKER_CALLABLE,
                kwargs=SampleWorkerJob(socket_path=str(path), idle_s=idle_seconds()).model_dump(),
                resources=Resources(cpus=0),  # idle most of its life; it must not hold a CPU training could use
                env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},  # take accelerator memory as needed, not 75%
            )
            record = ctx.backend.submit(spec, job_id=job_id)
            while (conn := connect(path)) is None:
                record = ctx.backend.status(job_id)
                if record.status.finished:
                    tail = "\n".join(tail_lines(record.log_path, LOG_TAIL_LINES))
                    raise TradewindError(
                        f"the sampling worker did not start ({record.reason}); log {record.log_path} ends:\n{tail}"
                    )
                tick()
                time.sleep(0.05)
            return conn
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
