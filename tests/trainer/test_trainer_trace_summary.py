"""The top ops of a profiler trace, read from its Chrome-trace JSON: a trace written here by hand, and one
the JAX profiler writes for a small jitted function."""

import gzip
import json

import jax
import jax.numpy as jnp
import pytest

from tradewind.trainer.trace_summary import (
    op_category,
    program_ops,
    time_by_part,
    top_ops,
    trace_events,
    trace_file,
)


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


def test_a_programs_ops_are_told_by_the_model_part_their_scope_names_and_by_kind():
    def loss(w, x):
        with jax.named_scope("attention"):
            h = jnp.tanh(x @ w)
        with jax.named_scope("mlp"):
            return jnp.sum(jnp.sin(h @ w.T))

    hlo = jax.jit(jax.grad(loss)).lower(jnp.ones((64, 64)), jnp.ones((32, 64))).compile().as_text()
    ops = program_ops(hlo)
    assert {part for part, _ in ops.values()} >= {"attention", "mlp"}  # forward and backward ops both
    assert any(kind == "matmul" for part, kind in ops.values() if part == "attention")
    assert any(kind == "matmul" for part, kind in ops.values() if part == "mlp")


def test_time_by_part_counts_a_loops_body_and_not_the_loop_and_knows_copies_and_collectives(tmp_path):
    hlo = """HloModule m

%body.1 (p: f32[8]) -> f32[8] {
  %p = f32[8] parameter(0)
  %dot.2 = f32[8] dot(%p, %p), metadata={op_name="jit(step)/while/body/jvp(mlp)/dot_general"}
  ROOT %all-reduce.3 = f32[8] all-reduce(%dot.2), metadata={op_name="jit(step)/optimizer/psum"}
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8] parameter(0)
  %copy.4 = f32[8]{0} copy(%a), metadata={op_name="jit(step)/jvp(attention)/transpose"}
  ROOT %while.5 = f32[8] while(%copy.4), condition=%cond.1, body=%body.1
}
"""
    events = [
        op("while.5", 100.0, ts=10),  # holds the two ops of its body
        op("dot.2", 60.0, ts=20),
        op("all-reduce.3", 30.0, ts=80),
        op("copy.4", 10.0, ts=0),
        op("dot.2", 60.0, ts=1000, tid=5),  # the second of two steps, on another line
    ]
    write_trace(tmp_path, events)
    by_part, by_kind = time_by_part(trace_events(tmp_path), hlo, steps=2)
    assert by_part == pytest.approx({"mlp": 60e-6, "optimizer": 15e-6, "attention": 5e-6})
    assert by_kind == pytest.approx({"matmul": 60e-6, "collective": 15e-6, "copy or layout": 5e-6})


def test_a_splash_kernel_without_an_op_name_counts_as_attention():
    # How a TPU program names a splash kernel: its custom call carries no op_name (read off a v5e compile)
    hlo = """HloModule m

ENTRY %main (a: bf16[16,12,2048,64]) -> bf16[16,12,2048,64] {
  %a = bf16[16,12,2048,64] parameter(0)
  %splash_mha_dkv_segmented_no_residuals.24 = bf16[16,12,2048,64] custom-call(%a), custom_call_target="tpu_custom_call"
  ROOT %fusion.2 = bf16[16,12,2048,64] add(%splash_mha_dkv_segmented_no_residuals.24, %a)
}
"""
    ops = program_ops(hlo)
    assert ops["splash_mha_dkv_segmented_no_residuals.24"] == ("attention", "attention kernel")
    assert ops["fusion.2"] == ("other", "other")
