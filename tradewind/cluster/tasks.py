"""Running many independent tasks in parallel: the execution interface that data pipelines use.

A pipeline hands a picklable function and a list of task inputs (one per shard, say) to a `TaskRunner`
and gets the results back in input order. The local runner uses worker processes on this machine; other
backends (Ray) implement the same protocol, so a pipeline does not change when it moves.

Example:
    runner = get_task_runner("local", workers=2)
    sizes = runner.map(count_tokens, shard_paths)
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Protocol, TypeVar

from tradewind.core import InvalidInputError

T = TypeVar("T")
R = TypeVar("R")


class TaskRunner(Protocol):
    """Runs `fn` on every item, in parallel where it can, and returns the results in item order."""

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]: ...


class LocalTaskRunner:
    """Worker processes on this machine.

    Args:
        workers: processes to use; defaults to the CPU count. With one worker (or one item) the tasks
            run in this process, which keeps tracebacks and debuggers simple.
    """

    def __init__(self, workers: int | None = None):
        if workers is not None and workers < 1:
            raise InvalidInputError(f"workers must be at least 1 (got {workers})")
        self.workers = workers or os.cpu_count() or 1

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if self.workers == 1 or len(items) <= 1:
            return [fn(item) for item in items]
        # "spawn": forking a process that holds threads (the MCP server's, JAX's) can deadlock the child.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(self.workers, len(items)), mp_context=context) as pool:
            return list(pool.map(fn, items))


def get_task_runner(backend: str = "local", workers: int | None = None) -> TaskRunner:
    """The task runner of `backend` (only "local" so far)."""
    if backend == "local":
        return LocalTaskRunner(workers)
    raise InvalidInputError(f"unknown task backend {backend!r}; known: local")
