"""The top ops of a profiler trace, read from its Chrome-trace JSON: a trace written here by hand, and one
the JAX profiler writes for a small jitted function."""

import gzip
import json

import jax
import jax.numpy as jnp

from tradewind.trainer.trace_summary import op_category, top_ops, trace_file


def write_trace(folder, events):
    path = folder / "plugins" / "profile" / "2026_01_01_00_00_00" / "host.trace.json.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt", encoding="utf-8") as file:
        json.dump({"displayTimeUnit": "ns", "traceEvents": events}, file)
    return path


def op(name, dur, **fields):
    return {"ph": "X", "pid": 1, "tid": 2, "ts": 0, "dur": dur, "name": name, "args": {"hlo_op": name}, **fields}


def test_ops_are_grouped_by_name_ranked_by_total_time_and_wrappers_are_left_out(tmp_path):
    events = [
        op("ynn_fusion.134", 300.0),
        op("ynn_fusion.134", 300.0),
        op("ynn_fusion.7", 200.0),
        op("dot.3", 200.0),
        {"ph": "X", "pid": 1, "tid": 2, "ts": 0, "dur": 5000.0, "name": "ThunkExecutor::Execute"},
        {"ph": "X", "pid": 1, "tid": 3, "ts": 0, "dur": 5000.0, "name": "PjitFunction(jit(train_step))"},
        {"ph": "X", "pid": 1, "tid": 3, "ts": 0, "dur": 5000.0, "name": "$api.py:2479 block_until_ready"},
        {"ph": "X", "pid": 1, "tid": 3, "ts": 0, "dur": 5000.0, "name": "ParseArguments"},
        {"ph": "X", "pid": 1, "tid": 2, "ts": 0, "dur": 9.0, "name": "end: dot.3", "args": {}},
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
    ]
    write_trace(tmp_path, events)
    ops = top_ops(tmp_path)
    assert [(o.name, o.category, o.count) for o in ops] == [
        ("ynn_fusion.134", "ynn_fusion", 2),
        ("ynn_fusion.7", "ynn_fusion", 1),
        ("dot.3", "dot", 1),
    ]
    assert [o.total_ms for o in ops] == [0.6, 0.2, 0.2]
    assert [o.share for o in ops] == [0.6, 0.2, 0.2]
    assert [o.name for o in top_ops(tmp_path, limit=1)] == ["ynn_fusion.134"]


def test_events_on_a_devices_xla_ops_line_count_as_ops_without_naming_their_hlo_op(tmp_path):
    events = [
        {"ph": "M", "pid": 7, "tid": 1, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "M", "pid": 7, "tid": 2, "name": "thread_name", "args": {"name": "XLA Modules"}},
        {"ph": "X", "pid": 7, "tid": 1, "ts": 0, "dur": 40.0, "name": "fusion.2"},
        {"ph": "X", "pid": 7, "tid": 2, "ts": 0, "dur": 90.0, "name": "jit_train_step"},
    ]
    write_trace(tmp_path, events)
    assert [(o.name, o.share) for o in top_ops(tmp_path)] == [("fusion.2", 1.0)]


def test_a_folder_without_a_trace_has_no_top_ops(tmp_path):
    assert trace_file(tmp_path) is None and top_ops(tmp_path) == []


def test_a_category_is_the_name_without_its_number():
    assert [op_category(n) for n in ["ynn_fusion.134", "dot", "wrapped_reduce-window.6", "copy.1.2"]] == [
        "ynn_fusion",
        "dot",
        "wrapped_reduce-window",
        "copy.1",
    ]


def test_the_top_ops_of_a_trace_the_jax_profiler_wrote_name_the_functions_xla_ops(tmp_path):
    step = jax.jit(lambda a, b: jnp.tanh(a @ b).sum())
    a, b = jnp.ones((128, 256)), jnp.ones((256, 128))
    step(a, b).block_until_ready()  # compiled before tracing
    jax.profiler.start_trace(str(tmp_path), create_perfetto_trace=True)
    for _ in range(3):
        step(a, b).block_until_ready()
    jax.profiler.stop_trace()

    ops = top_ops(tmp_path)
    assert trace_file(tmp_path).name.endswith(".trace.json.gz")
    assert ops and all(0 < o.share <= 1 for o in ops) and sum(o.share for o in ops) <= 1 + 1e-9
    assert all(o.count >= 3 and o.total_ms > 0 for o in ops)  # each op ran once per call
    assert not any(o.name.startswith(("ThunkExecutor", "PjitFunction", "$")) for o in ops)
