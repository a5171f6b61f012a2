"""Where a trace's device time goes: the XLA ops that took longest, read from the profiler's Chrome-trace JSON.

`jax.profiler.start_trace(dir, create_perfetto_trace=True)` writes, besides the `*.xplane.pb` that
TensorBoard/XProf read, a `plugins/profile/<run>/<host>.trace.json.gz` in the Chrome trace event format
(a documented JSON format: `traceEvents`, complete events with `ph == "X"` and a `dur` in microseconds).
Reading that needs only `gzip` and `json`; this module imports no JAX and no protobuf.

An op event is one that names its HLO op in `args.hlo_op` (on CPU, each thunk the executor runs; checked
on CPU only), or one on a device's "XLA Ops" line (how XProf lays out TPU and GPU ops). Wrapper events are
left out: the executor's `ThunkExecutor::Execute`, `PjitFunction(...)`, Python frames (`$file.py:line fn`),
`block_until_ready`, thread-pool markers and the runtime's host bookkeeping. Ops are grouped by their
name (numbered fusions keep the number: `ynn_fusion.134`) and also given a category, the name without the
number (`ynn_fusion`), which groups one kind of fusion across the model.

Example:
    for op in top_ops(Path("runs/r1/profile/trace")):
        print(f"{op.share:6.1%} {op.total_ms:8.2f} ms  {op.name}")
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from tradewind.trainer.metrics import OpTime

_NUMBER_SUFFIX = re.compile(r"\.\d+$")
# Events that wrap or wait for ops rather than being one; never counted, whatever their arguments.
_WRAPPERS = (
    "ThunkExecutor",
    "PjitFunction",
    "$",
    "block_until_ready",
    "ThreadpoolListener",
    "SlinkyThreadPool",
    "end: ",
)


def trace_file(trace_dir: Path) -> Path | None:
    """The newest `*.trace.json.gz` under `trace_dir` (each trace is a new `plugins/profile/<run>/`), or None."""
    files = list(Path(trace_dir).rglob("*.trace.json.gz"))
    return max(files, key=lambda path: path.stat().st_mtime) if files else None


def top_ops(trace_dir: Path, limit: int = 10) -> list[OpTime]:
    """The `limit` ops that ran longest in the newest trace under `trace_dir`, longest first.

    `share` is the op's part of the time of all ops in the trace. Empty when there is no trace file or it
    holds no op events.
    """
    path = trace_file(trace_dir)
    if path is None:
        return []
    with gzip.open(path, "rt", encoding="utf-8") as file:
        events = json.load(file).get("traceEvents", [])
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for event in _op_events(events):
        totals[event["name"]] += float(event["dur"])
        counts[event["name"]] += 1
    everything = sum(totals.values())
    ranked = sorted(totals, key=totals.__getitem__, reverse=True)[:limit]
    return [
        OpTime(
            name=name,
            category=op_category(name),
            total_ms=totals[name] / 1000,
            count=counts[name],
            share=totals[name] / everything,
        )
        for name in ranked
        if totals[name] > 0
    ]


def op_category(name: str) -> str:
    """The op's name without its numeric suffix: 'ynn_fusion.134' -> 'ynn_fusion'."""
    return _NUMBER_SUFFIX.sub("", name)


def _op_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The complete events of ops: those naming an HLO op, and those on a device's "XLA Ops" line."""
    op_lines = {
        (event.get("pid"), event.get("tid"))
        for event in events
        if event.get("ph") == "M" and event.get("name") == "thread_name" and _arg(event, "name") == "XLA Ops"
    }
    return [
        event
        for event in events
        if event.get("ph") == "X"
        and "dur" in event
        and not str(event.get("name", "")).startswith(_WRAPPERS)
        and (_arg(event, "hlo_op") is not None or (event.get("pid"), event.get("tid")) in op_lines)
    ]


def _arg(event: dict[str, Any], key: str) -> Any:
    return (event.get("args") or {}).get(key)
