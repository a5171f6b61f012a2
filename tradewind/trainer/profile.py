"""Profile a run's train step: where its time goes, what limits it, and a JAX profiler trace.

As a job (what the `profile_run` tool submits; the keyword arguments are a `ProfileJob`):
    JobSpec(name="profile r1", callable="tradewind.trainer.profile:profile_job",
            kwargs={"run_dir": "RUN_DIR", "steps": 5, "start_step": 2})

reads `RUN_DIR/config.json` and writes `RUN_DIR/profile/summary.json` (a `ProfileSummary`) and the trace
under `RUN_DIR/profile/trace/` (`plugins/profile/<run>/*.xplane.pb` for TensorBoard/XProf, `*.trace.json.gz`
for Perfetto). It builds the run exactly as `train` does (`setup_training`), trains steps 1 to
`start_step + steps` in the training loop (`run_steps`, with a `ProfileHook`) and throws them away: the run's
own files are left alone. Steps before `start_step` run untraced (the first execution's one-off costs stay
out); steps `[start_step, start_step + steps)` are traced and timed; one more step runs so that the last
traced one also reads its next batch, as every step of a run does.

The summary, without any UI:

- compile time against the traced steps' mean, median and first step time;
- the step split, measured in the loop for each traced step: data wait (reading and placing the next batch),
  compute (blocked on the device's result), host (the rest: dispatch and Python) and checkpoint (saving
  checkpoints; always 0 here, as profiling saves none); shares of the total traced time, summing to 1;
- the 10 ops that took longest in the trace (`trace_summary.ranked_ops`);
- peak memory: the device's `peak_bytes_in_use` where it reports one (GPU, TPU), else the process's peak RSS;
- MFU at the mean step time, from the run's FLOPs per token and the peak FLOP/s `setup_training` found.

The verdict (`diagnose`, a pure function of those measurements), the first rule that holds:

1. `recompiling`: XLA compiled anything during the traced steps (a shape or static argument changed);
2. `checkpoint-bound`: checkpoint saves take over 20% of the step;
3. `data-bound`: the data wait is over 30% of the step;
4. `host-bound`: host overhead is over 40% of a step shorter than 20 ms;
5. `compute-bound`: otherwise; the device is the limit.

Each comes with its evidence (the numbers) and one suggestion; a batch size to try doubles the run's until
the step would take about 50 ms (step time taken as proportional to the batch) or the training memory
estimate would pass 80% of the device's memory (host RAM on CPU). A compute-bound step's evidence names the
part of the model that loses the most MFU (`part_times`), and `profile_training` checks its suggestion: it
times the run and a few changes for a few steps each (`check_changes`) and suggests the fastest that helps.

From Python, `profile_training(config, out_dir, steps, start_step)` does the same for any config, and
`profile_setup(setup, ...)` for a setup already built (say, one whose loader a test slowed down).
"""

from __future__ import annotations

import os
import resource
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from tradewind.core import InvalidInputError, atomic_write_json, parse_config
from tradewind.runs.config import TrainConfig, named_fields, read_train_config, with_fields
from tradewind.runs.flops import training_memory
from tradewind.runs.jobs import ProfileJob
from tradewind.runs.layout import RunLayout
from tradewind.runs.metrics import CheckedChange, Diagnosis, PartTime, ProfileSummary, StepSplit
from tradewind.trainer.hooks import ProfileHook, StepTiming
from tradewind.trainer.loop import run_steps
from tradewind.trainer.setup import TrainSetup, setup_training
from tradewind.trainer.trace_summary import ranked_ops, time_by_part, trace_events, trace_file

DATA_BOUND_SHARE = 0.30
HOST_BOUND_SHARE = 0.40
HOST_BOUND_STEP_S = 0.020
CHECKPOINT_BOUND_SHARE = 0.20
CHECK_STEPS = 3  # steps a suggested change is timed for
CHECKED_GAIN = 1.05  # how much faster a timed change must be to be suggested
TARGET_STEP_S = 0.050  # a step this long keeps dispatch and Python overhead small on any device
MEMORY_HEADROOM = 0.8  # of the device's memory that a suggested batch's training estimate may use


@dataclass(frozen=True)
class Measured:
    """What the verdict is decided from: the traced steps' mean time, its split (shares summing to 1), the
    compilations seen while tracing, and the batch sizes a suggestion may choose from."""

    step_s: float
    split: StepSplit
    compiles: int
    batch_size: int
    grad_accum: int
    max_batch_size: int
    parts: tuple[PartTime, ...] = ()  # most MFU lost first


def diagnose(measured: Measured) -> Diagnosis:
    """The verdict on what limits the step, with its evidence and one suggestion (rules in the module doc)."""
    m, split = measured, measured.split
    evidence = (
        f"{m.step_s * 1000:.1f} ms/step: compute {split.compute:.0%}, data wait {split.data_wait:.0%}, "
        f"host {split.host:.0%}, checkpoint {split.checkpoint:.0%}; {m.compiles} compilation(s) while tracing"
    )
    if m.compiles > 0:
        return Diagnosis(
            verdict="recompiling",
            evidence=evidence,
            suggestion=f"shapes change between steps: XLA compiled {m.compiles} time(s) during the traced steps; "
            "keep every jitted input's shape, dtype and static arguments the same each step",
        )
    if split.checkpoint > CHECKPOINT_BOUND_SHARE:
        return Diagnosis(
            verdict="checkpoint-bound",
            evidence=evidence,
            suggestion="save less often: raise checkpoints.every_steps, and keep checkpoints.async_save on",
        )
    if split.data_wait > DATA_BOUND_SHARE:
        return Diagnosis(
            verdict="data-bound",
            evidence=evidence,
            suggestion="the loader is slower than the device: prefetch more batches or use more loader workers "
            "(and keep the token cache on local disk)",
        )
    bigger = suggested_batch_size(m)
    if split.host > HOST_BOUND_SHARE and m.step_s < HOST_BOUND_STEP_S:
        if bigger > m.batch_size:
            return Diagnosis(
                verdict="host-bound",
                evidence=evidence,
                suggestion=f"raise batch_size to {bigger}: more work per dispatch",
            )
        accum = m.grad_accum * 2
        return Diagnosis(
            verdict="host-bound",
            evidence=evidence,
            suggestion=f"raise batch_size to {m.batch_size * 2} with grad_accum {accum}: more work per dispatch in "
            "the same memory",
        )
    if m.parts:
        worst = m.parts[0]
        evidence += f"; {worst.part} loses the most MFU: {worst.mfu_lost:.0%} of the step"
    if bigger > m.batch_size:
        return Diagnosis(
            verdict="compute-bound",
            evidence=evidence,
            suggestion=f"raise batch_size to {bigger}: a {m.step_s * 1000:.1f} ms step leaves the device idle "
            "between steps",
        )
    return Diagnosis(
        verdict="compute-bound",
        evidence=evidence,
        suggestion="the device is the limit: add devices (replicas or the mesh's data axis); top_ops shows which "
        "computation takes the time",
    )


def suggested_batch_size(measured: Measured) -> int:
    """The run's batch size doubled until the step would take `TARGET_STEP_S` (time taken as proportional to
    the batch) or the next doubling would pass `max_batch_size`."""
    size = measured.batch_size
    while measured.step_s * size / measured.batch_size < TARGET_STEP_S and size * 2 <= measured.max_batch_size:
        size *= 2
    return size


def profile_training(
    config: TrainConfig, out_dir: Path, steps: int = 5, start_step: int = 2, checks: int = 2
) -> ProfileSummary:
    """Compile the run's train step, then trace and time steps `[start_step, start_step + steps)`; a
    compute-bound step's suggestion is then checked by timing up to `checks` changes (`check_changes`).

    Args:
        config: the run to profile; its `steps` only shapes the learning-rate schedule.
        out_dir: where `summary.json` and the `trace/` folder go; created if missing.
        steps: train steps to trace and time.
        start_step: the first of them; the steps before it run untraced.

    Returns:
        The summary, also written to `out_dir/summary.json`.

    Raises:
        InvalidInputError: `steps` is below 1 or `start_step` below 2.
        NotFoundError, ConfigError: as `setup_training`.
    """
    if steps < 1:
        raise InvalidInputError(f"argument 'steps': must be at least 1 (got {steps})")
    if start_step < 2:
        raise InvalidInputError(
            f"argument 'start_step': must be at least 2, after the untimed first (got {start_step})"
        )
    setup = setup_training(config)
    summary = profile_setup(setup, out_dir, steps, start_step)
    if summary.diagnosis.verdict == "compute-bound" and checks:
        limit = _max_batch_size(config, setup.model_config.vocab_size or 0, _memory()[2])
        del setup  # its arrays leave the device before the changes are built
        worst = summary.parts[0].part if summary.parts else None
        changes = candidate_changes(config, limit, worst, jax.default_backend())
        summary.diagnosis = check_changes(config, summary, changes[:checks])
        atomic_write_json(Path(out_dir) / "summary.json", summary.model_dump())
    return summary


def candidate_changes(
    config: TrainConfig, max_batch_size: int, worst_part: str | None = None, platform: str = "cpu"
) -> list[dict[str, Any]]:
    """Changes that may speed a compute-bound step up, most promising first: on a TPU whose step loses the most
    MFU in attention, heads twice as wide (`wider_heads`); twice the batch where the memory estimate allows it,
    no remat, unrolled layers."""
    changes: list[dict[str, Any]] = []
    wider = wider_heads(config) if worst_part == "attention" and platform == "tpu" else None
    if wider is not None:
        changes.append(wider)
    if config.batch_size * 2 <= max_batch_size:
        changes.append({"batch_size": config.batch_size * 2})
    if config.remat != "none":
        changes.append({"remat": "none"})
    if config.scan_layers:
        changes.append({"scan_layers": False})
    return changes


def wider_heads(config: TrainConfig) -> dict[str, Any] | None:
    """The model's width in half as many heads, each twice as wide, where they are narrower than the 128 lanes
    of a TPU's matrix unit: the attention kernel's products run along a head, and a 64-wide head fills half of
    it (a 350M Llama trained at 72% MFU on a v5e in 128-wide heads, 53% in 64-wide; docs/reports/benchmarks.md).
    The parameters and FLOPs are the same, the model is not: None for a run whose weights come from elsewhere
    (`init_from`, `resume_from`, LoRA), or whose heads do not halve (odd counts, a set `d_head`)."""
    model = config.model
    if config.init_from or config.resume_from or config.lora or model.head_dim >= 128:
        return None
    if model.n_heads % 2 or model.kv_heads % 2 or getattr(model, "d_head", None) is not None:
        return None
    heads = {"model.n_heads": model.n_heads // 2}
    if "n_kv_heads" in type(model).model_fields:  # a Llama's; GPT-2's key/value heads are its heads
        heads["model.n_kv_heads"] = model.kv_heads // 2
    return heads


def check_changes(config: TrainConfig, summary: ProfileSummary, changes: list[dict[str, Any]]) -> Diagnosis:
    """The verdict with its suggestion checked: the run as it is and each of `changes` compiled and timed, untraced,
    for `CHECK_STEPS` steps in this process (the first is `checked[0]`, the change `{}`); the fastest change that
    beats the run by `CHECKED_GAIN` is suggested, with its figures, else the rule's suggestion stands and says
    what was not faster. With no `changes`, nothing is timed and the suggestion says so."""
    diagnosis = summary.diagnosis
    if not changes:  # what `candidate_changes` found none of
        note = "nothing to time here: twice the batch exceeds the memory estimate, remat is off, layers unrolled"
        return diagnosis.model_copy(update={"suggestion": f"{diagnosis.suggestion} ({note})"})
    baseline = time_change(config, {}, None)
    if baseline.tokens_per_s is None:
        return diagnosis
    checked = [baseline, *(time_change(config, change, baseline.tokens_per_s) for change in changes)]
    faster = [c for c in checked[1:] if c.speedup is not None and c.speedup >= CHECKED_GAIN]
    if faster:
        best = max(faster, key=lambda c: c.speedup or 0.0)
        suggestion = (
            f"set {named_fields(best.change)}: it trained at {best.tokens_per_s:,.0f} tokens/s against "
            f"{baseline.tokens_per_s:,.0f} ({best.speedup:.2f}x), both timed here over {CHECK_STEPS} steps"
        )
        if any(name.startswith("model.") for name in best.change):
            suggestion += "; a model of the same size but other heads, for a run that starts from scratch"
    else:
        tried = "; ".join(named_fields(c.change) for c in checked[1:])
        suggestion = f"{diagnosis.suggestion} (timed here and not faster: {tried})"
    return diagnosis.model_copy(update={"suggestion": suggestion, "checked": checked})


def time_change(config: TrainConfig, change: dict[str, Any], baseline: float | None) -> CheckedChange:
    """`config` with `change`, compiled and timed for `CHECK_STEPS` steps after two untimed ones; its speedup
    over `baseline` tokens/s (None: it is the baseline)."""
    try:
        setup = setup_training(with_fields(config, change))
        timer = ProfileHook(None, first=3, last=2 + CHECK_STEPS)
        run_steps(setup, setup.state, [timer], last_step=3 + CHECK_STEPS)
    except Exception as error:  # out of memory, most often: the change does not fit
        return CheckedChange(
            change=change, tokens_per_s=None, speedup=None, error=f"{type(error).__name__}: {error}"[:500]
        )
    seconds = sum(t.seconds for t in timer.steps)
    rate = sum(timer.tokens) / seconds
    return CheckedChange(change=change, tokens_per_s=rate, speedup=rate / baseline if baseline else 1.0)


def profile_setup(setup: TrainSetup, out_dir: Path, steps: int = 5, start_step: int = 2) -> ProfileSummary:
    """`profile_training` on a setup already built (say, one whose loader a test slowed down); the caller
    checks `steps` and `start_step` as `profile_training` does."""
    out_dir = Path(out_dir)
    trace_dir = out_dir / "trace"
    last = start_step + steps - 1
    profiler = ProfileHook(trace_dir, first=start_step, last=last)
    run_steps(setup, setup.state, [profiler], last_step=last + 1)
    summary = _summarise(setup, profiler, trace_dir, start_step)
    atomic_write_json(out_dir / "summary.json", summary.model_dump())
    return summary


def _summarise(setup: TrainSetup, profiler: ProfileHook, trace_dir: Path, start_step: int) -> ProfileSummary:
    """The summary of a finished `ProfileHook`: timing, split, top ops, memory, MFU and the verdict."""
    config, timings = setup.config, profiler.steps
    mean_step_s = sum(t.seconds for t in timings) / len(timings)
    split = _split(timings)
    peak_bytes, peak_source, limit_bytes = _memory()
    events = trace_events(trace_dir)  # read once: a TPU trace is tens of megabytes
    by_part, by_kind = time_by_part(events, setup.train_step.as_text(), steps=len(timings))
    devices = len(jax.devices())
    measured = Measured(
        step_s=mean_step_s,
        split=split,
        compiles=profiler.compiles,
        batch_size=config.batch_size,
        grad_accum=config.grad_accum,
        max_batch_size=_max_batch_size(config, setup.model_config.vocab_size or 0, limit_bytes),
        parts=tuple(part_times(setup, by_part, mean_step_s, devices)),
    )
    tokens_per_s = sum(profiler.tokens) / len(profiler.tokens) / mean_step_s  # packed documents: without padding
    trace = trace_file(trace_dir)
    return ProfileSummary(
        steps=len(timings),
        compile_s=setup.compile_s,
        mean_step_s=mean_step_s,
        tokens_per_s=tokens_per_s,
        parameters=setup.parameters,
        trace_dir=str(trace_dir),
        backend=jax.default_backend(),
        start_step=start_step,
        median_step_s=statistics.median(t.seconds for t in timings),
        first_step_s=timings[0].seconds,
        split=split,
        compiles=profiler.compiles,
        top_ops=ranked_ops(events),
        trace_file=str(trace) if trace is not None else None,
        peak_memory_bytes=peak_bytes,
        peak_memory_source=peak_source,
        mfu=tokens_per_s * setup.flops_per_token / (setup.peak_flops * devices),
        diagnosis=diagnose(measured),
        parts=list(measured.parts),
        kinds={kind: seconds / devices for kind, seconds in by_kind.items()},
    )


def part_times(setup: TrainSetup, by_part: dict[str, float], step_s: float, devices: int) -> list[PartTime]:
    """Each part's device seconds per step (`by_part`, summed over `devices`) and the MFU it loses: its seconds
    less those its FLOPs (the model's, `flops_by_part`, scaled to the run's count) would take at the peak, over
    the step. The host and idle time (the step less every op) loses all of its own; the losses and the MFU sum
    to 1. Most MFU lost first."""
    model_flops = setup.model_config.flops_by_part(setup.config.seq_len)
    scale = setup.flops_per_token / sum(model_flops.values())  # a LoRA run counts fewer
    tokens = setup.config.batch_size * setup.config.seq_len
    seconds = {part: total / devices for part, total in by_part.items()}
    seconds["host and idle"] = max(step_s - sum(seconds.values()), 0.0)
    parts = [
        PartTime(
            part=part,
            seconds=spent,
            share=spent / step_s,
            mfu_lost=(spent - model_flops.get(part, 0.0) * scale * tokens / (setup.peak_flops * devices)) / step_s,
        )
        for part, spent in seconds.items()
    ]
    return sorted(parts, key=lambda part: part.mfu_lost, reverse=True)


def _split(timings: list[StepTiming]) -> StepSplit:
    """Compute, data wait and host shares of the traced steps' total time (no checkpoints: profiling saves none)."""
    total = sum(t.seconds for t in timings)
    return StepSplit(
        compute=sum(t.device_s for t in timings) / total,
        data_wait=sum(t.data_s for t in timings) / total,
        host=sum(t.host_s for t in timings) / total,
        checkpoint=0.0,
    )


def _memory() -> tuple[int, str, int]:
    """Peak bytes in use, where that figure comes from, and the memory a batch may fill (bytes)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        limit = stats.get("bytes_limit") or stats["peak_bytes_in_use"]
        return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use", int(limit)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return peak_rss, "process peak RSS", os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _max_batch_size(config: TrainConfig, vocab_size: int, limit_bytes: int) -> int:
    """The largest doubling of the run's batch size whose training memory estimate fits the headroom."""
    size = config.batch_size
    while size < 1024 * config.batch_size:  # far past any step-time target: the estimate is rough
        larger = config.model_copy(update={"batch_size": size * 2})
        if training_memory(larger, vocab_size).total_bytes > MEMORY_HEADROOM * limit_bytes:
            break
        size *= 2
    return size


def profile_job(**job: Any) -> None:
    """The entry of a profiling job: validates its keyword arguments as a `ProfileJob` and profiles the run.

    Raises:
        ConfigError: an argument is missing or out of range (the message names it), or the run's config is bad.
        NotFoundError: as `read_train_config` and `setup_training`.
    """
    request = parse_config(ProfileJob, job, source="profile job")
    layout = RunLayout(Path(request.run_dir))
    config = read_train_config(layout.config)
    summary = profile_training(config, layout.profile, steps=request.steps, start_step=request.start_step)
    print(
        f"{summary.mean_step_s * 1000:.1f} ms/step, {summary.tokens_per_s:,.0f} tok/s on {summary.backend} "
        f"(compile {summary.compile_s:.1f}s); trace in {summary.trace_dir}\n"
        f"{summary.diagnosis.verdict}: {summary.diagnosis.evidence}\nsuggestion: {summary.diagnosis.suggestion}"
    )
