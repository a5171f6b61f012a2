"""Whether a process we started is still the one running: pid plus the kernel's start time."""

import os
import subprocess
import sys
import time

from tradewind.cluster.process import process_alive, process_start_time


def test_this_process_is_alive_and_its_start_time_identifies_it():
    start = process_start_time(os.getpid())
    assert isinstance(start, int) and start > 0
    assert process_alive(os.getpid()) and process_alive(os.getpid(), start)


def test_a_different_start_time_means_a_different_process_under_a_reused_pid():
    start = process_start_time(os.getpid())
    assert not process_alive(os.getpid(), start + 1)


def test_a_reaped_child_is_not_alive_and_has_no_start_time():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start_time(child.pid)
    child.wait()
    assert start is not None
    assert not process_alive(child.pid, start) and process_start_time(child.pid) is None


def test_an_exited_but_unreaped_child_a_zombie_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Poll /proc without reaping (Popen.poll would reap it): the zombie keeps its pid until waited on.
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert not process_alive(child.pid)
    finally:
        child.wait()


def test_a_name_with_spaces_and_parentheses_does_not_confuse_the_stat_parser(tmp_path):
    odd = tmp_path / "odd) name (x"
    odd.symlink_to(sys.executable)
    child = subprocess.Popen([str(odd), "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        start = process_start_time(child.pid)
        assert start is not None and process_alive(child.pid, start)
    finally:
        child.communicate(b"")
    assert not process_alive(child.pid, start)


def test_a_job_process_start_up_clock_starts_when_the_process_did_not_up_to_a_second_before():
    """psutil's create_time adds the start's ticks to a boot time rounded to the whole second, which put a job's
    start up to a second before it was spawned: every tiny run's log said "python and imports 1.0 s"."""
    report = "import time; from tradewind.trainer.startup import StartupClock as C; c = C.since_process_start(); "
    report += "print(time.time() - (time.perf_counter() - c.start))"
    spawned = time.time()
    started = float(subprocess.run([sys.executable, "-c", report], capture_output=True, text=True, check=True).stdout)
    tick = 1 / os.sysconf("SC_CLK_TCK")  # the kernel keeps a process's start to the clock tick
    assert spawned - tick <= started <= time.time()
