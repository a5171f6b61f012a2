"""The one bounded poll the suite uses instead of sleeping: wait on a condition with a deadline; and a condition
such waits use, whether a thread is inside a function."""

import sys
import time


def wait_until(condition, timeout: float = 60.0, what: str = "condition", interval: float = 0.02):
    """Poll `condition` until it returns a true value and return that value; fail naming `what` once `timeout`
    seconds have passed without it.

    In an async test, run it off the event loop (`await anyio.to_thread.run_sync(...)`) so the loop keeps serving.
    """
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(interval)
    return value


def threads_inside(function_name: str) -> bool:
    """Whether any thread is running a frame of a function called `function_name`."""
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == function_name:
                return True
            frame = frame.f_back
    return False
