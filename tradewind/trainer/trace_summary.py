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

A step's time is also told by the part of the model each op computes and by its kind (`time_by_part`): the
compiled program's HLO text names, for each instruction, the op it came from (`op_name`, whose path holds the
named scopes of `MODEL_PARTS`), and says what it is (a matrix multiply, a Pallas kernel, a copy, a collective).
Only innermost events count there, so a loop (`while`) and the ops of its body are not counted twice.

Example:
    for op in top_ops(Path("runs/r1/profile/trace")):
        print(f"{op.share:6.1%} {op.total_ms:8.2f} ms  {op.name}")
    by_part, by_kind = time_by_part(trace_events(Path("runs/r1/profile/trace")), compiled.as_text(), steps=5)
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from tradewind.runs.metrics import OpTime
from tradewind.runs.models.base import MODEL_PARTS

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


# The kinds of op `time_by_part` tells apart; the rest is "other".
KINDS = ("matmul", "attention kernel", "copy or layout", "collective", "other")
_PART = re.compile(r"\b(" + "|".join(MODEL_PARTS) + r")\b")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")
_OPCODE = re.compile(r"\b([a-z][a-z0-9\-]*)\(")  # the first lower-case word before "(": shapes' layouts are upper
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_COMPUTATION = re.compile(r"^(ENTRY )?%(\S+) ")
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_ATTENTION_KERNEL = re.compile(r"(splash|flash)_")  # Pallas's splash kernels (splash_mha_fwd...), flash kernels
_LAYOUT = ("copy", "copy-start", "copy-done", "transpose", "bitcast", "reshape", "bitcast-convert")


def hlo_computations(hlo: str) -> dict[str, list[str]]:
    """The instruction lines of each computation of an HLO module's text, by name (the entry's, and those of a
    fragment with no computation around them, under `ENTRY`)."""
    computations: dict[str, list[str]] = {"ENTRY": []}
    lines = computations["ENTRY"]
    for line in hlo.splitlines():
        if not line.startswith(" ") and line.endswith("{") and (found := _COMPUTATION.match(line)):
            lines = computations.setdefault("ENTRY" if found.group(1) else found.group(2), [])
        elif line.startswith(" "):
            lines.append(line)
    return computations


def program_ops(hlo: str) -> dict[str, tuple[str, str]]:
    """Each instruction of a compiled program's HLO text by name: the part of the model it computes (the innermost
    of `MODEL_PARTS` in its `op_name`, else "other") and its kind (`KINDS`). A fusion is a matmul when its
    computation multiplies matrices."""
    computations = hlo_computations(hlo)
    multiplying = {
        name for name, lines in computations.items() if any(_opcode(line) in ("dot", "convolution") for line in lines)
    }
    ops = {}
    for lines in computations.values():
        for line in lines:
            if found := _INSTRUCTION.match(line):
                name, rest = found.groups()
                op_name = _OP_NAME.search(rest)
                parts = _PART.findall(op_name.group(1)) if op_name else []
                if not parts and _ATTENTION_KERNEL.match(name):  # a kernel's custom call has no op_name on a TPU
                    parts = ["attention"]
                part = parts[-1] if parts else "other"
                ops[name] = (part, _kind(rest, part, multiplying))
    return ops


def _opcode(line: str) -> str:
    found = _OPCODE.search(line.split(" = ", 1)[-1])
    return found.group(1) if found else ""


def _kind(instruction: str, part: str, multiplying: set[str]) -> str:
    opcode = _opcode(instruction)
    calls = _CALLS.search(instruction)
    if opcode in ("dot", "convolution") or (opcode == "fusion" and calls and calls.group(1) in multiplying):
        return "matmul"
    if opcode == "custom-call" and part == "attention":
        return "attention kernel"
    if opcode in _LAYOUT:
        return "copy or layout"
    if opcode.removesuffix("-start").removesuffix("-done") in COLLECTIVES:
        return "collective"
    return "other"


def trace_events(trace_dir: Path) -> list[dict[str, Any]]:
    """The events of the newest trace under `trace_dir` (`trace_file`); empty without one."""
    path = trace_file(trace_dir)
    if path is None:
        return []
    with gzip.open(path, "rt", encoding="utf-8") as file:
        return json.load(file).get("traceEvents", [])


def time_by_part(events: list[dict[str, Any]], hlo: str, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Device seconds per step of a trace's `events` (`trace_events`), by part of the model and by kind of op,
    for the ops of the program whose HLO text is `hlo` (others count as part and kind "other"); `steps`: the
    steps the trace holds."""
    by_part: dict[str, float] = defaultdict(float)
    by_kind: dict[str, float] = defaultdict(float)
    for (_, part, kind), seconds in time_by_op(events, hlo, steps).items():
        by_part[part] += seconds
        by_kind[kind] += seconds
    return dict(by_part), dict(by_kind)


def time_by_op(events: list[dict[str, Any]], hlo: str, steps: int) -> dict[tuple[str, str, str], float]:
    """Device seconds per step of each innermost op of a trace's `events`, by `(op, part, kind)` (as
    `time_by_part`): the finest split of a step, what a benchmark lists to find the op that loses the most."""
    ops = program_ops(hlo)
    seconds: dict[tuple[str, str, str], float] = defaultdict(float)
    for event in _innermost(_op_events(events)):
        name = _arg(event, "hlo_op") or event["name"]
        part, kind = ops.get(name, ("other", "other"))
        seconds[(name, part, kind)] += float(event["dur"]) / 1e6 / steps
    return dict(seconds)


def _innermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of each thread that hold no other within their time (a loop's event holds its body's ops)."""
    threads: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        threads[(event.get("pid"), event.get("tid"))].append(event)
    holders: set[int] = set()
    for timed in threads.values():
        open_events: list[dict[str, Any]] = []
        for event in sorted(timed, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
            while open_events and float(open_events[-1]["ts"]) + float(open_events[-1]["dur"]) <= float(event["ts"]):
                open_events.pop()
            if open_events:
                holders.add(id(open_events[-1]))
            open_events.append(event)
    return [event for event in events if id(event) not in holders]


def top_ops(trace_dir: Path, limit: int = 10) -> list[OpTime]:
    """The `limit` ops that ran longest in the newest trace under `trace_dir`, longest first (`ranked_ops`)."""
    return ranked_ops(trace_events(trace_dir), limit)


def ranked_ops(events: list[dict[str, Any]], limit: int = 10) -> list[OpTime]:
    """The `limit` ops that ran longest among a trace's `events`, longest first.

    `share` is the op's part of the time of all ops in the trace. Empty when it holds no op events.
    """
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
