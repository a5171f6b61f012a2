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


def test_local_runner_returns_results_in_order_from_worker_processes():
    results = LocalTaskRunner(workers=2).map(square_with_pid, list(range(8)))
    assert [square for square, _ in results] == [i * i for i in range(8)]
    assert os.getpid() not in {pid for _, pid in results}


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
