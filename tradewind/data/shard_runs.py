"""Running a cache build's shards on a `TaskRunner`, and following their progress while they run.

`run_shards` runs the shards that have no completion record yet and returns every shard's record. A
runner returns only when all its tasks are done, so progress is read from files: each finished shard's
completion record (the shard is then handed to `on_shard`, which may copy it elsewhere), and, for a running
shard, a counter file in the partial folder where its tokenizer (wrapped in `_ReportingTokenizer`) writes the
text bytes it has encoded so far. The same wrapper stops the shard at its next batch once a stop file appears,
which is how a failing callback (a cancelled call) stops shards running in other processes.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tradewind.cluster import TaskRunner
from tradewind.core import read_json
from tradewind.data.shards import ShardRecord, ShardTask, tokenize_shard
from tradewind.data.tokenizers import Tokenizer

_PROGRESS_INTERVAL_S = 0.25
_COUNTERS_DIR = "progress"  # in the partial folder: text bytes each running shard has encoded
_STOP_FILE = "stop"  # in the partial folder: its presence stops every running shard at its next batch


def run_shards(
    tasks: list[ShardTask],
    runner: TaskRunner,
    partial: Path,
    progress: Callable[[int, int], None] | None,
    on_shard: Callable[[ShardTask], None] | None = None,
) -> list[ShardRecord]:
    """Run the shards of `tasks` that have no completion record on `runner`; return every shard's record.

    Args:
        tasks: every shard of the build, in order, finished or not.
        runner: runs the unfinished shards.
        partial: the build's partial folder, which holds the progress counters and the stop file.
        progress: called as `progress(done, total)` with the input bytes tokenized so far, from this thread,
            each time they grow. If it raises, the running shards stop at their next batch and the error
            propagates.
        on_shard: called with each finished shard's task (those finished before the call too), from this thread,
            before the progress that counts it; once per shard. If it raises, as `progress`.
    """
    total = sum(task.input_bytes for task in tasks)
    pending = [task for task in tasks if not task.record_path.exists()]
    if progress is None and on_shard is None:
        runner.map(tokenize_shard, pending)
    else:
        # The shards run in a helper thread and this thread reports, because a progress callback may only
        # work from its caller's thread (the MCP server's calls back into its event loop from there).
        counters, stop = partial / _COUNTERS_DIR, partial / _STOP_FILE
        shutil.rmtree(counters, ignore_errors=True)  # an interrupted build's counts; its shards start again
        stop.unlink(missing_ok=True)
        counters.mkdir()
        reporting = [
            dataclasses.replace(
                task, tokenizer=_ReportingTokenizer(task.tokenizer, str(counters / task.name), str(stop))
            )
            for task in pending
        ]
        failure: list[BaseException] = []

        def run() -> None:
            try:
                runner.map(tokenize_shard, reporting)
            except BaseException as error:  # re-raised below, in the caller's thread
                failure.append(error)

        finished: set[str] = set()
        worker = threading.Thread(target=run, name="cache-shards", daemon=True)
        worker.start()
        last = -1
        try:
            while True:
                worker.join(_PROGRESS_INTERVAL_S)
                running = worker.is_alive()  # read first: a shard it finishes after this is seen next time round
                for task in tasks:
                    if task.name not in finished and task.record_path.exists():
                        finished.add(task.name)
                        if on_shard:
                            on_shard(task)
                done = sum(
                    task.input_bytes if task.name in finished else _bytes_encoded(task, counters) for task in tasks
                )
                if progress and last < done < total:
                    progress(done, total)
                    last = done
                if not running:
                    break
        except BaseException:
            stop.touch()  # a callback failed (a cancelled call, a bucket refused): every shard stops at its next batch
            raise
        finally:
            # A failing progress callback must not leave shards being written after the build lock is released.
            worker.join()
            shutil.rmtree(counters, ignore_errors=True)
            stop.unlink(missing_ok=True)
        if failure:
            raise failure[0]
        if progress:
            progress(total, total)
    return [ShardRecord.model_validate(read_json(task.record_path)) for task in tasks]


def _bytes_encoded(task: ShardTask, counters: Path) -> int:
    """The text bytes an unfinished shard has encoded so far (at most its input bytes)."""
    try:
        return min(int((counters / task.name).read_text() or 0), task.input_bytes)
    except (OSError, ValueError):  # not started yet, or caught mid-write
        return 0


class _Stopped(Exception):
    """A shard stopped because its build was told to (the stop file appeared)."""


@dataclasses.dataclass(frozen=True)
class _ReportingTokenizer:
    """A tokenizer that, for each batch, first stops if `stop` exists, then counts the batch's UTF-8 bytes into
    the file `counter`: how the build follows a shard running in another process and stops it."""

    inner: Tokenizer
    counter: str
    stop: str
    encoded: list[int] = dataclasses.field(default_factory=lambda: [0])

    name = property(lambda self: self.inner.name)
    fingerprint = property(lambda self: self.inner.fingerprint)
    vocab_size = property(lambda self: self.inner.vocab_size)
    bos_id = property(lambda self: self.inner.bos_id)
    eos_id = property(lambda self: self.inner.eos_id)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        self._check_stop()
        ids = self.inner.encode_batch(texts)
        self._count(texts)
        return ids

    def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """The inner tokenizer's (a chat's ids and their character spans, for its loss mask), reported alike."""
        self._check_stop()
        encoded = self.inner.encode_with_offsets(texts)
        self._count(texts)
        return encoded

    def _check_stop(self) -> None:
        if os.path.exists(self.stop):
            raise _Stopped(f"the build of {os.path.dirname(self.stop)} was stopped")

    def _count(self, texts: list[str]) -> None:
        self.encoded[0] += sum(len(text.encode("utf-8")) for text in texts)
        with open(self.counter, "w") as out:
            out.write(str(self.encoded[0]))

    def decode(self, ids: Any) -> str:
        return self.inner.decode(ids)
