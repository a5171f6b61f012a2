"""`tail_logs`: a training run's log, a page at a time, with hints for the failures that come up most."""

from __future__ import annotations

import os
import re

from pydantic import BaseModel, ConfigDict, Field

from tradewind.runs import RunLayout
from tradewind.tools.bounds import fitting_prefix
from tradewind.tools.context import ToolContext
from tradewind.tools.runs import RunRequest, get_run
from tradewind.tools.spec import tool

MAX_PAGE_BYTES = 32_000
MAX_CURSOR = 2**50  # a petabyte of log: past any real file, within what JSON numbers carry exactly
# The page's text as JSON: what is left of a result's 31,000 characters after the hints and the other fields.
MAX_TEXT_CHARS = 28_000


class TailLogsRequest(RunRequest):
    model_config = ConfigDict(extra="forbid")

    cursor: int = Field(default=0, ge=0, le=MAX_CURSOR, description="0, or the last page's next_cursor.")
    limit_bytes: int = Field(default=16_000, ge=1, le=MAX_PAGE_BYTES)


class LogHint(BaseModel):
    """A known failure found in the log (or the run's reason), with what to do about it."""

    matched: str = Field(description="The log line (or reason) that matched, cut to 200 characters.")
    meaning: str = Field(description="What the failure means.")
    next_step: str = Field(description="What to try next.")


class LogPage(BaseModel):
    run_id: str
    text: str = Field(
        description=f"The log from `cursor`: at most limit_bytes bytes and {MAX_TEXT_CHARS:,} characters as JSON "
        "(escapes counted), cut back to whole UTF-8 characters."
    )
    cursor: int
    next_cursor: int = Field(description="Pass as cursor to read on; equals size at the end of the log so far.")
    size: int = Field(description="Bytes in the log so far.")
    finished: bool = Field(description="True once the run has ended and this page reaches the end of its log.")
    status: str
    hints: list[LogHint] = Field(default_factory=list, description="Known failures this page (or the reason) shows.")


# (pattern, meaning, next step), tried on every line of the page and on the run's reason.
_KNOWN_FAILURES = (
    (
        re.compile(r"out of memory|RESOURCE_EXHAUSTED|\bOOM\b|MemoryError|Cannot allocate memory", re.IGNORECASE),
        "the accelerator or host ran out of memory",
        "launch again with a smaller batch_size or seq_len (or a smaller model); resume_from keeps the checkpoints",
    ),
    (
        re.compile(r"loss became (nan|inf|-inf)|non-finite|\bloss[=: ]+(nan|inf)\b", re.IGNORECASE),
        "the training loss became NaN or infinite, so training stopped at the first bad step",
        "launch again with a lower optimizer.learning_rate (10x lower; about 1e-3 to 1e-2 if it was far above "
        "that), some optimizer.warmup_steps and grad_clip on; read_metrics shows where lr and grad_norm rose",
    ),
    (
        re.compile(r"no token cache|FileNotFoundError|No such file or directory|NotFoundError"),
        "an input the run needs (its dataset, a checkpoint or a file) is missing",
        "check the dataset with list_datasets or tokenize_dataset (and init_from/resume_from), then launch again",
    ),
    (
        re.compile(
            r"worker (process )?(died|crashed|was killed)|ActorDiedError|WorkerCrashedError|NodeDiedError|"
            r"ended without finishing|vanished|signal 9|SIGKILL|Killed$",
            re.IGNORECASE,
        ),
        "a training process or worker died without reporting an error (often killed for memory, or its node went away)",
        "check cluster_status, then launch again with resume_from this run to continue from its last checkpoint",
    ),
)


@tool("Read a run's log", read_only=True, idempotent=True, links=("logs",))
def tail_logs(ctx: ToolContext, request: TailLogsRequest) -> LogPage:
    """A run's log, paged, with hints for common failures. Use it when a run failed or looks stuck.

    Hints name what matched (out of memory, non-finite loss, missing data, a dead worker), what it means and
    the next step. `finished` is true once the run has ended and the page reaches the end of its log.
    """
    info = get_run(ctx, request)  # first: a run that is not there is an error naming it
    path = RunLayout(ctx.workspace.run_dir(request.run_id)).log
    size, data = 0, b""
    if path.exists() or path.is_symlink():  # a link is opened to be refused, never followed
        with ctx.workspace.open(path, "rb", argument="run_id") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(min(request.cursor, size))
            data = f.read(request.limit_bytes) if request.cursor < size else b""
    if data:
        for cut in range(4):  # a character may straddle the page end: leave it for the next page
            try:
                data[: len(data) - cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
            data = data[: len(data) - cut]
            break
    # Undecodable bytes stay one character each (surrogateescape) so that the bytes a cut keeps can be counted.
    text = data.decode("utf-8", errors="surrogateescape")
    text = text[: fitting_prefix(text, MAX_TEXT_CHARS)]
    data = text.encode("utf-8", errors="surrogateescape")
    text = data.decode("utf-8", errors="replace")
    next_cursor = request.cursor + len(data)
    lines = [*text.splitlines(), *([info.reason] if info.reason and info.status.finished else [])]
    return LogPage(
        run_id=request.run_id,
        text=text,
        cursor=request.cursor,
        next_cursor=next_cursor,
        size=size,
        finished=info.status.finished and next_cursor >= size,
        status=info.status.value,
        hints=failure_hints(lines),
    )


def failure_hints(lines: list[str]) -> list[LogHint]:
    """One hint per known failure, for the first line that shows it."""
    hints = []
    for pattern, meaning, next_step in _KNOWN_FAILURES:
        line = next((line for line in lines if pattern.search(line)), None)
        if line is not None:
            hints.append(LogHint(matched=line.strip()[:200], meaning=meaning, next_step=next_step))
    return hints
