"""Asking the operating system whether a process we started is still the one running.

A pid alone is not enough: after a process exits, the kernel may hand its pid to a new one. We record
the start time the kernel reports for the pid (field 22 of `/proc/<pid>/stat`) and compare it later. The same
start time gives a process its age (`process_age`), from which a job's start-up clock counts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces; split after it.
    return text[text.rindex(")") + 2 :].split()


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` in clock ticks since boot, or None without `/proc`."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process_age() -> float:
    """Seconds since this process started, to the kernel's clock tick. (psutil's `create_time` adds the start's
    ticks to a boot time the kernel gives in whole seconds, which can place a start up to a second early.)"""
    start = process_start_time(os.getpid())
    if start is None:  # no /proc (macOS)
        return time.time() - psutil.Process().create_time()
    with open("/proc/uptime") as uptime:  # seconds since boot, to the hundredth
        return float(uptime.read().split()[0]) - start / os.sysconf("SC_CLK_TCK")


def process_alive(pid: int, start_time: int | None = None) -> bool:
    """Whether `pid` runs (not a zombie) and, when `start_time` is given, is the same process as then."""
    fields = _stat_fields(pid)
    if fields is None:
        if Path("/proc/self/stat").exists():
            return False
        try:  # no /proc (macOS): fall back to a signal-0 probe
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if fields[0] in ("Z", "X"):
        return False
    return start_time is None or int(fields[19]) == start_time
