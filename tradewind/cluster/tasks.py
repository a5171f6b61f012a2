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
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Protocol, TypeVar

from tradewind.core import InvalidInputError

T = TypeVar("T")
R = TypeVar("R")


class TaskRunner(Protocol):
    """Runs `fn` on every item, in parallel where it can, and returns the results in item order."""

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]: ...


class LocalTaskRunner:
    """Worker processes on this machine, this one among them.

    The calling process takes the next task whenever it is free: its imports and caches are warm and it
    starts at once, while each spawned worker pays a second or so to start and import (a 2-worker cache build
    gained 1.21x over one worker when both workers were spawned). The other `workers - 1` are spawned
    processes, each given the next task as it finishes one.

    Args:
        workers: processes to use, this one included; defaults to the CPU count. With one worker (or one
            item) every task runs in this process, which keeps tracebacks and debuggers simple.
    """

    def __init__(self, workers: int | None = None):
        if workers is not None and workers < 1:
            raise InvalidInputError(f"workers must be at least 1 (got {workers})")
        self.workers = workers or os.cpu_count() or 1

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if self.workers == 1 or len(items) <= 1:
            return [fn(item) for item in items]
        return _SharedMap(fn, items).run(spawned=min(self.workers, len(items)) - 1)


class _SharedMap:
    """One `LocalTaskRunner.map`: this thread and a pool of spawned processes take tasks in item order.

    Once a task fails no further task starts; those running finish, and the error raised is that of the
    first failed item in item order (as `Executor.map` reports it), so that a strict cache build names the
    first bad record of its input whichever process came upon a bad record first.
    """

    def __init__(self, fn: Callable[[T], R], items: Sequence[T]):
        self.fn, self.items = fn, items
        self.results: list[R | None] = [None] * len(items)
        self.failures: dict[int, BaseException] = {}  # by item index
        self._next = 0
        self._lock = threading.Lock()

    def run(self, spawned: int) -> list[R]:
        # "spawn": forking a process that holds threads (the MCP server's, JAX's) can deadlock the child.
        with ProcessPoolExecutor(max_workers=spawned, mp_context=multiprocessing.get_context("spawn")) as pool:
            # The pool's first tasks are handed out before this thread takes any, so that the spawned
            # processes have work as soon as they are up however fast the tasks here go.
            running = self._top_up(pool, spawned, {})
            feeder = threading.Thread(target=self._feed, args=(pool, spawned, running), name="task-feeder")
            feeder.start()
            index = None
            try:
                while (index := self._claim()) is not None:
                    self.results[index] = self.fn(self.items[index])
            except BaseException as error:  # an interrupt between tasks counts before any task's failure
                self._fail(-1 if index is None else index, error)
            finally:
                feeder.join()
        if self.failures:
            raise self.failures[min(self.failures)]
        return self.results  # type: ignore[return-value]  # every slot is filled when nothing failed

    def _claim(self) -> int | None:
        """The index of the next task nobody has taken, or None when all are taken or one failed."""
        with self._lock:
            if self.failures or self._next == len(self.items):
                return None
            self._next += 1
            return self._next - 1

    def _fail(self, index: int, error: BaseException) -> None:
        with self._lock:
            self.failures[index] = error

    def _top_up(self, pool: ProcessPoolExecutor, slots: int, running: dict[Future, int]) -> dict[Future, int]:
        """Submit tasks to the pool until `slots` of them run (or none is left); returns `running`."""
        while len(running) < slots and (index := self._claim()) is not None:
            try:
                running[pool.submit(self.fn, self.items[index])] = index
            except BaseException as error:  # the pool broke: a worker died
                self._fail(index, error)
        return running

    def _feed(self, pool: ProcessPoolExecutor, slots: int, running: dict[Future, int]) -> None:
        """Collect the pool's results, handing it the next task as each finishes, until none are left."""
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                index = running.pop(future)
                try:
                    self.results[index] = future.result()
                except BaseException as error:
                    self._fail(index, error)
            self._top_up(pool, slots, running)


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
