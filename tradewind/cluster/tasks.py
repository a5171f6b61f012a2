"""Running many independent tasks in parallel: the execution interface that data pipelines use.

A pipeline hands a picklable function and a list of task inputs (one per shard, say) to a `TaskRunner`
and gets the results back in input order. The local runner uses worker processes on this machine; other
backends (`RayTaskRunner`) implement the same protocol, so a pipeline does not change when it moves.

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
        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(items)), mp_context=context)
        try:
            results = list(pool.map(fn, items))
        except BaseException:
            pool.shutdown(cancel_futures=True)  # one task failed: the queued ones would be wasted work
            raise
        pool.shutdown()
        return results


def _apply(fn: Callable[[T], R], item: T) -> R:
    """The one Ray task: call `fn` (shipped as an argument, so any picklable callable works)."""
    return fn(item)


class RayTaskRunner:
    """Ray tasks on the cluster at `address` (default `$RAY_ADDRESS`, else a local Ray in this process).

    `fn` must be importable on the workers (a function of an installed module, as the data pipeline's
    are). A task that raises re-raises here as a Ray error that is also an instance of the original
    exception class.

    Args:
        address: the cluster's GCS address `host:port`, or None.
        cpus_per_task: CPUs Ray reserves for each task.
    """

    def __init__(self, address: str | None = None, cpus_per_task: float = 1.0):
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.cpus_per_task = cpus_per_task

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        import ray

        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=False, configure_logging=False)
        remote = ray.remote(num_cpus=self.cpus_per_task, max_retries=0)(_apply)
        return ray.get([remote.remote(fn, item) for item in items])


def get_task_runner(backend: str = "local", workers: int | None = None) -> TaskRunner:
    """The task runner of `backend`: "local" (worker processes) or "ray" (Ray tasks; `workers` is ignored)."""
    if backend == "local":
        return LocalTaskRunner(workers)
    if backend == "ray":
        return RayTaskRunner()
    raise InvalidInputError(f"unknown task backend {backend!r}; known: local, ray")
