import os

import pytest

from tradewind.cluster import LocalTaskRunner, get_task_runner
from tradewind.core import InvalidInputError


def square_with_pid(value: int) -> tuple[int, int]:
    return value * value, os.getpid()


def fail_on_three(value: int) -> int:
    if value == 3:
        raise ValueError("three is not allowed")
    return value


def fail_outside(parent_pid: int) -> int:
    if os.getpid() != parent_pid:
        raise ValueError("a spawned worker's task failed")
    return parent_pid


def test_local_runner_returns_results_in_order_from_this_process_and_a_spawned_one():
    results = LocalTaskRunner(workers=2).map(square_with_pid, list(range(8)))
    assert [square for square, _ in results] == [i * i for i in range(8)]
    # The first task goes to the spawned worker as it starts; this process takes the next ones at once.
    assert results[0][1] != os.getpid() and results[1][1] == os.getpid()


def fail_with_index(index: int) -> int:
    raise ValueError(f"item {index} failed")


def test_the_first_failed_item_in_item_order_is_raised_whichever_failed_first():
    # Item 1 fails here at once; item 0 fails later, in the worker that has to start first.
    with pytest.raises(ValueError, match="item 0 failed"):
        LocalTaskRunner(workers=2).map(fail_with_index, [0, 1, 2, 3])


def test_a_task_failing_in_a_spawned_worker_raises_its_error_here():
    with pytest.raises(ValueError, match="a spawned worker's task failed"):
        LocalTaskRunner(workers=2).map(fail_outside, [os.getpid()] * 4)


def test_one_worker_runs_in_this_process():
    results = get_task_runner("local", workers=1).map(square_with_pid, [1, 2])
    assert results == [(1, os.getpid()), (4, os.getpid())]


def test_a_failing_task_raises_its_error():
    with pytest.raises(ValueError, match="three is not allowed"):
        LocalTaskRunner(workers=2).map(fail_on_three, [1, 2, 3, 4])


def test_bad_runner_settings_are_refused():
    with pytest.raises(InvalidInputError, match="workers must be at least 1"):
        LocalTaskRunner(workers=0)
    with pytest.raises(InvalidInputError, match="unknown task backend 'spark'"):
        get_task_runner("spark")
