"""Runs a job whose entrypoint is a Python callable: imports it and calls it with the job's arguments.

Command (built by `JobSpec.argv`, not typed by hand):
    python -m tradewind.cluster.entry '{"callable": "pkg.module:function", "args": [], "kwargs": {}}'

The process exits 0 when the call returns and 1 when it raises: a `TradewindError` (a mistake the user can
fix) prints `error: <message>` to stderr, anything else its traceback, both into the job's log.
"""

from __future__ import annotations

import gc
import importlib
import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn


def load_callable(path: str) -> Callable[..., Any]:
    """The object named by `package.module:attribute.path`."""
    module_name, _, attribute = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def run_call(call: dict[str, Any]) -> int:
    """Call `call` (`{"callable": ..., "args": [...], "kwargs": {...}}`); returns the exit code its process would
    have: 0 when it returns, 1 when it raises a `TradewindError` (printed as `error: <message>`). Anything else
    propagates (`SystemExit` included): a process prints its traceback and exits 1."""
    from tradewind.core import TradewindError

    try:
        load_callable(call["callable"])(*call.get("args", []), **call.get("kwargs", {}))
    except TradewindError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


def exit_after(call: dict[str, Any]) -> NoReturn:
    """Run `call` and end this process with its exit code (`run_call`'s).

    The process ends as Python ends any (its threads joined, its exit handlers run, its files flushed and closed),
    but without the garbage collections of its last moments: over the objects of JAX and the other modules a job
    loads they took 0.4 s of CPU, more than a small run's training, and freed nothing the exit would not.
    """
    code = run_call(call)
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    exit_after(json.loads(sys.argv[1]))
