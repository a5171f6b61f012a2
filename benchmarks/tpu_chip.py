"""One TPU chip's speed and memory by model shape and training choice, each beside its compile-only estimate.

Command (on a TPU VM; `scripts/tpu-check` runs it with TPU_CHECK_PARTS=chip):
    python benchmarks/tpu_chip.py --out FILE.jsonl [--shapes 125m,350m,1b] [--choices default,scan,...] [--steps 30]
    python benchmarks/tpu_chip.py --smoke --out FILE.jsonl     # a tiny model on the CPU: checks that the script runs

Llama shapes at sequence 2048 (`SHAPES`: the 125M, the 350M, and a 1B with vocabulary 128256), Tradewind's own
trainer (`train`, the loop's own metrics), on random-free real tokens (Tiny Shakespeare, byte-level: the ids are
small, the compute is the model's). For each shape, processes of their own (one process at a time holds the chip):

1. the first choice (the default, unless `--choices` says otherwise) in a new process with an empty compile
   cache: the time to the first update, cold (`--no-cold` leaves this out);
2. every choice in a new process with that cache, one after the other (`CHOICES`: scanned layers, each remat
   policy, the reference attention, half and twice the per-chip batch, the memory options, the knobs). With
   `--compile-workers N` that process first compiles every choice, N at a time on the host's cores, into the
   cache (`compile_ahead`): a choice then costs its load and its steps, not a compile of a minute or more.

And first, the chip's ceiling: a bf16 8192^3 matmul. Each measured choice gives tokens/s and MFU in steady state
(the median of the metrics rows after the first, each of `log_every` = 10 updates as the loop logs by default),
the step time, the compile time, the time to the first update, the HBM the compiled train step needs
(`memory_analysis()`: the chip's own `memory_stats()` peak is not trustworthy on a v5e), the compile-only estimate
of the same step (`tpu_compile.estimate_step`, what `tradewind compile` prints) and its ratio to the measured step,
and a profile of three more steps (`profile_figures`: time by part of the model, by kind of op, and the op groups
that took longest, with their HLO; `--no-profile` leaves it out). A choice that does not fit says so, with XLA's
message. Each row holds the whole config it ran (`config`). Besides config changes, a choice may set a module
constant of the trainer (`constants`): how a default such as the splash kernel's fused backward was measured
before it was made the default. `--no-ceiling` leaves out the matmul ceiling.

Output: one JSON object per line (`--out`, and stdout) as each is measured, so a session cut short keeps what it
measured; `kind` is `ceiling`, `choice`, `profile_check` (`--check-suggestion`) or `error`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SEQ_LEN = 2048
SHAPES: dict[str, dict[str, Any]] = {  # the shapes, each with its default per-chip batch
    "125m": {"model": {"preset": "llama-125m", "vocab_size": 32768, "max_seq_len": SEQ_LEN}, "batch_size": 16},
    "350m": {"model": {"preset": "llama-350m", "vocab_size": 32768, "max_seq_len": SEQ_LEN}, "batch_size": 8},
    "1b": {  # as `launch_training` runs it at 8 x 2048 tokens an update (its preflight's pick, 2026-12-07)
        "model": {"preset": "llama-1b", "vocab_size": 128256, "max_seq_len": SEQ_LEN},
        "batch_size": 8,
        "optimizer": {"type": "adafactor"},  # the change the launch offers: AdamW's state alone exceeds the chip
        "remat": "full",
        "remat_blocks": 7,  # full remat of the first 7 of the 16 blocks; the rest keep their activations
        "scan_layers": False,
    },
}
CHOICES: dict[str, dict[str, Any]] = {  # config changes, each measured against the shape's default
    "default": {},
    "scan": {"scan_layers": True, "remat_blocks": None},  # a scanned loop recomputes every block or none
    "unrolled": {"scan_layers": False},
    # AdamW for the 1B: the launch's pick for it (bfloat16 moments, the first 15 of 16 blocks recomputed), and
    # the same with every block recomputed
    "adamw_bf16_moments_remat_15": {
        "optimizer": {"type": "adamw", "bf16_moments": True},
        "remat": "full",
        "remat_blocks": 15,
    },
    "adamw_bf16_moments_unrolled": {
        "optimizer": {"type": "adamw", "bf16_moments": True},
        "scan_layers": False,
        "remat_blocks": None,
    },
    "remat_full": {"remat": "full", "remat_blocks": None},  # every block recomputed
    # full remat of the first blocks only: the rest keep their activations in the memory unrolled blocks leave
    "unrolled_remat_10": {"scan_layers": False, "remat_blocks": 10},
    "unrolled_remat_9": {"scan_layers": False, "remat_blocks": 9},
    "remat_save_matmuls": {"remat": "save_matmuls"},
    "scan_remat_full": {"scan_layers": True, "remat": "full", "remat_blocks": None},
    "reference_attention": {"attention": "reference"},
    "half_batch": {"batch_size": 0.5},
    "double_batch": {"batch_size": 2},
    "bf16_moments": {"optimizer": {"bf16_moments": True}},
    "adafactor": {"optimizer": {"type": "adafactor"}},
    "host_state": {"optimizer": {"host_state": True}},  # the optimizer state in host memory between steps
    "adamw_host_bf16_moments": {"optimizer": {"type": "adamw", "host_state": True, "bf16_moments": True}},
    "accumulate_2": {"batch_size": 2, "grad_accum": 2},  # twice the tokens per update in two microbatches
    "batch_1.5": {"batch_size": 1.5},
    "d_ff_2816": {"model": {"d_ff": 2816}},  # Llama's rule (8/3 d_model in multiples of 256) for d_model 1024
    # The 350M's width in 128-wide heads (its preset since 2026-12-07), and in the 64-wide heads it had before
    "heads_128_wide": {"model": {"n_heads": 8, "n_kv_heads": 4}},
    "heads_64_narrow": {"model": {"n_heads": 16, "n_kv_heads": 8}},
    # Knobs: the trainer's module constants, each against its default, to find what a change of it gains
    "ce_block_8m": {"constants": {"tradewind.trainer.setup:block_logits": lambda platform: 8 * 2**20}},
    "splash_512": {"constants": {"tradewind.trainer.models.layers:SPLASH_BLOCKS": (512, 256, 128)}},
    "splash_2048": {"constants": {"tradewind.trainer.models.layers:SPLASH_BLOCKS": (2048, 1024, 512, 256, 128)}},
    "log_every_step": {"log_every": 1},  # the host waits for every update's metrics before it sends the next
    "splash_zero_segments": {"constants": {"tradewind.trainer.models.layers:SPLASH_ZERO_SEGMENTS": True}},
    "splash_separate_backward": {"constants": {"tradewind.trainer.models.layers:SPLASH_FUSED_BACKWARD": False}},
    "rotate_by_slices": {
        "constants": {
            "tradewind.trainer.models.layers:ROTATE_BY_MATMUL": False,
            "tradewind.trainer.models.layers:ROTARY_IN_COMPUTE_DTYPE": False,
        }
    },
}
SMOKE_SHAPE = {"model": {"d_model": 64, "n_layers": 2, "n_heads": 2, "vocab_size": 512, "max_seq_len": 128}}
TRAINING = {"eval_every": 10_000, "eval_batches": 1, "log_every": 10, "checkpoint": False}  # the loop's default rows


def config_fields(fields: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """`fields` with `change` applied: a dict merged into the field's, a `batch_size` a factor of the shape's, and
    `constants` left out (not the config's: `constants_set` sets them)."""
    fields = dict(fields)
    for key, value in change.items():
        if key == "constants":
            continue
        if key == "batch_size":
            fields[key] = max(1, int(fields.get("batch_size", 16) * value))
        elif isinstance(value, dict):
            fields[key] = {**fields.get(key, {}), **value}
        else:
            fields[key] = value
    return fields


def config_for(shape: dict[str, Any], choice: dict[str, Any], dataset: str, steps: int, seq_len: int) -> Any:
    """The run of `shape` with `choice` applied (`config_fields`)."""
    from tradewind.runs import TrainConfig

    fields = {**TRAINING, **shape, "dataset": dataset, "steps": steps, "seq_len": seq_len}
    return TrainConfig.model_validate(config_fields(fields, choice))


@contextlib.contextmanager
def constants_set(constants: dict[str, Any]) -> Iterator[None]:
    """The module constants `constants` ("module:NAME" -> value) set for the block, then put back."""
    saved = []
    for target, value in constants.items():
        module_name, name = target.split(":")
        module = importlib.import_module(module_name)
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def matmul_ceiling(n: int, repeats: int = 10) -> dict[str, Any]:
    """FLOP/s of a bf16 n^3 matmul on the default device, and that against the chip's peak."""
    import jax
    import jax.numpy as jnp

    from tradewind.runs.flops import peak_flops

    a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in range(2))
    matmul = jax.jit(lambda x, y: x @ y)
    matmul(a, b).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        out = matmul(a, b)
    out.block_until_ready()
    flops = 2 * n**3 * repeats / (time.perf_counter() - start)
    device = jax.devices()[0]
    peak, source = peak_flops(device.device_kind if device.platform != "cpu" else "cpu", os.cpu_count() or 1)
    return {"kind": "ceiling", "n": n, "flops_per_s": flops, "of_peak": flops / peak, "peak_source": source}


def measure(
    shape_name: str,
    choice_name: str,
    config: Any,
    workdir: Path,
    clock: Any = None,
    compiled: dict[str, Any] | None = None,
    profile: bool = True,
) -> dict[str, Any]:
    """Train `config` in this process (its start-up timed by `clock`); its speed, start-up, HBM and estimate.

    `compiled`: what `compile_ahead` found of its train step (then it is not compiled again to be read, and a step
    that did not compile is not trained). `profile`: also profile three more steps (`profile_figures`)."""
    import jax

    from tradewind.cluster.tpu_host import host_tpu
    from tradewind.runs.metrics import read_metrics
    from tradewind.trainer.loop import train
    from tradewind.trainer.setup import setup_training
    from tradewind.trainer.tpu_compile import estimate_step

    figures: dict[str, Any] = {"kind": "choice", "shape": shape_name, "choice": choice_name}
    figures |= {"batch_size": config.batch_size, "seq_len": config.seq_len}
    figures["config"] = config.model_dump(mode="json", exclude={"dataset"})
    if compiled is not None and "error" in compiled:
        return figures | {"fits": False} | compiled
    run_dir = workdir / f"{shape_name}-{choice_name}-{time.monotonic_ns()}"
    try:
        summary = train(config, run_dir, clock=clock)
    except Exception as error:  # out of memory, most often: what does not fit is a figure too
        return figures | {"fits": False, "error": f"{type(error).__name__}: {str(error)[:1500]}"}
    steps = [row.step_time_s for row in read_metrics(run_dir / "metrics.jsonl") if row.step_time_s]
    step_s = statistics.median(steps[1:] or steps)  # the first row's window holds the first updates' warm-up
    setup = setup_training(config) if profile or compiled is None else None  # the steps `train` compiled
    step = dict(compiled or step_figures(setup.train_step))
    collectives = step.pop("collectives")
    tokens = config.batch_size * config.seq_len
    figures |= {
        "fits": True,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "mfu": summary.model_flops_per_token * tokens / step_s / summary.peak_flops,
        "loop_mfu": summary.mfu,
        "compile_s": summary.compile_s,
        "first_update_s": summary.first_update_s,
        "startup_s": summary.startup_s,
        "final_loss": summary.final_loss,
    } | step
    target = host_tpu()
    if target is not None and jax.default_backend() == "tpu":
        estimate = estimate_step(config, config.model, target, 1, collectives)
        figures |= {"estimate_step_s": estimate.seconds, "estimate_over_measured": estimate.seconds / step_s}
        figures |= {"estimate": estimate.model_dump()}
    if setup is not None and profile:
        figures["profile"] = profile_figures(setup, run_dir / "profile")
    return figures


def step_figures(train_step: Any) -> dict[str, Any]:
    """A compiled train step's HBM (`hbm_needed`; `memory_analysis` whole), the compiler's cost totals, and its
    collectives (`collectives`: what `estimate_step` takes)."""
    from tradewind.trainer.tpu_compile import collectives_of, compiler_cost, hbm_needed

    memory = train_step.memory_analysis()
    return {
        "hbm_bytes": hbm_needed(memory),
        "memory_analysis": {name: getattr(memory, name) for name in dir(memory) if name.endswith("_in_bytes")},
        "compiler_cost": {k: v for k, v in compiler_cost(train_step).items() if "{" not in k},  # the totals
        "collectives": collectives_of(train_step.as_text()),
    }


def compile_ahead(configs: dict[str, tuple[Any, dict[str, Any]]], workers: int) -> dict[str, dict[str, Any]]:
    """Compile the train and eval steps of each named `(config, constants)` for this process's devices, `workers`
    at a time, into the persistent compile cache its parent set: the runs that follow load their steps rather than
    compile them one after another, and one compile keeps few of a TPU host's cores busy. For each name, the train
    step's figures (`step_figures`) and its compile time beside the others (`compile_ahead_s`), or the error that
    stopped its compile (a step that does not fit in HBM fails to compile).

    Each config is lowered here, one after the other (tracing is Python's, under `constants`); the compiles run on
    threads. No executable is kept: each holds its code in the device's memory."""
    from concurrent.futures import ThreadPoolExecutor

    import jax

    from tradewind.trainer.sharding import build_mesh
    from tradewind.trainer.tpu_compile import lower_abstract_steps

    def compiled(lowered: tuple[Any, Any]) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            train_step, _ = lowered[0].compile(), lowered[1].compile()
        except jax.errors.JaxRuntimeError as error:
            return {"error": f"{type(error).__name__}: {str(error)[:1500]}"}
        return step_figures(train_step) | {"compile_ahead_s": time.perf_counter() - start}

    lowered = {}
    for name, (config, constants) in configs.items():
        with constants_set(constants):
            mesh = build_mesh(config.mesh, jax.devices())
            lowered[name] = lower_abstract_steps(config, config.model, mesh, jax.default_backend())[:2]
    with ThreadPoolExecutor(workers) as pool:
        futures = {name: pool.submit(compiled, steps) for name, steps in lowered.items()}
        return {name: future.result() | {"compiled_alongside": len(configs)} for name, future in futures.items()}


def profile_figures(setup: Any, folder: Path, ops: int = 30) -> dict[str, Any]:
    """Three traced steps of `setup`: seconds per step by part, by kind, by part and kind, and the `ops` groups of
    ops that took longest (an op's name less its number, as `splash_mha_dkv` of every layer), each with its part,
    kind and one HLO instruction (what to change is read there)."""
    from tradewind.trainer.profile import profile_setup
    from tradewind.trainer.trace_summary import op_category, time_by_op, trace_events

    summary = profile_setup(setup, folder, steps=3, start_step=2)
    hlo = setup.train_step.as_text()
    by_op = time_by_op(trace_events(folder / "trace"), hlo, steps=3)
    by_part_kind: dict[str, float] = defaultdict(float)
    for (_, part, kind), seconds in by_op.items():
        by_part_kind[f"{part}/{kind}"] += seconds
    groups: dict[tuple[str, str, str], list[Any]] = {}  # (the op's name less its number, part, kind)
    for (op, part, kind), seconds in by_op.items():
        group = groups.setdefault((op_category(op), part, kind), [0.0, 0, op])
        group[0] += seconds
        group[1] += 1
    instructions = {}
    for line in hlo.splitlines():
        name, _, rest = line.strip().removeprefix("ROOT ").partition(" = ")
        instructions[name.lstrip("%")] = rest[:300]
    longest = sorted(groups.items(), key=lambda item: item[1][0], reverse=True)[:ops]
    return {
        "mean_step_s": summary.mean_step_s,
        "mfu": summary.mfu,
        "verdict": summary.diagnosis.verdict,
        "split": summary.split.model_dump(),
        "parts": [part.model_dump() for part in summary.parts],
        "kinds": summary.kinds,
        "by_part_kind": dict(sorted(by_part_kind.items(), key=lambda item: -item[1])),
        "ops": [
            {"ops": category, "part": part, "kind": kind, "ms": seconds * 1e3, "count": count, "hlo": instructions[op]}
            for (category, part, kind), (seconds, count, op) in longest
        ],
    }


def checked_suggestion(shape_name: str, config: Any, workdir: Path) -> dict[str, Any]:
    """What `profile_run` tells a user of `config`: its verdict and the suggestion it checked by timing the
    candidate changes on this chip (`profile_training` with its default checks)."""
    from tradewind.trainer.profile import profile_training

    summary = profile_training(config, workdir / f"{shape_name}-profile-check-{time.monotonic_ns()}", steps=3)
    parts = [part.model_dump() for part in summary.parts]
    return {
        "kind": "profile_check",
        "shape": shape_name,
        "mfu": summary.mfu,
        "parts": parts,
    } | summary.diagnosis.model_dump()


def run_choices(
    shape_name: str,
    choice_names: list[str],
    dataset: str,
    steps: int,
    smoke: bool,
    cache: str,
    check: bool = False,
    profile: bool = True,
    compile_workers: int = 1,
) -> None:
    """Measure `choice_names` of one shape in this process, printing a JSON line each; the first one's start-up
    counts from this process's start, with the compile cache `cache` ("empty" or "filled"). `check`: then profile
    the first choice as `profile_run` does, its suggestion checked (`checked_suggestion`). `profile`: profile each
    choice (`profile_figures`). `compile_workers` above 1: compile every choice first, that many at once
    (`compile_ahead`; not with an empty cache, whose first compile is the figure wanted)."""
    import jax

    from tradewind.trainer.startup import StartupClock

    if not smoke and jax.default_backend() != "tpu":  # a 125M at 16 x 2048 tokens would fill a CPU host's memory
        sys.exit(
            f"the chip's shapes run on a TPU; JAX found {jax.default_backend()} (JAX_PLATFORMS is "
            f"{os.environ.get('JAX_PLATFORMS')!r}); --smoke runs a tiny model anywhere"
        )
    clock = StartupClock.since_process_start()
    workdir = Path(tempfile.mkdtemp(prefix="tpu-chip-"))
    shape = SMOKE_SHAPE if smoke else SHAPES[shape_name]
    seq_len = 128 if smoke else SEQ_LEN
    configs = {name: config_for(shape, CHOICES[name], dataset, steps, seq_len) for name in choice_names}
    ahead = {}
    if compile_workers > 1 and cache == "filled":
        choices = {name: (config, CHOICES[name].get("constants", {})) for name, config in configs.items()}
        ahead = compile_ahead(choices, compile_workers)
        cache = "filled by compile_ahead"
        clock = StartupClock()  # the first run's start-up, from after the compiles ahead of it
    for name, config in configs.items():
        with constants_set(CHOICES[name].get("constants", {})):
            figures = measure(shape_name, name, config, workdir, clock, ahead.get(name), profile)
        if clock is not None:
            figures["first_in_process"] = {"compile_cache": cache}
        print(json.dumps(figures, default=str), flush=True)
        clock = None
    if check:
        config = config_for(shape, CHOICES[choice_names[0]], dataset, steps, seq_len)
        print(json.dumps(checked_suggestion(shape_name, config, workdir), default=str), flush=True)


def tokens(folder: Path) -> Path:
    """Tiny Shakespeare, byte-level, as a token cache in `folder`."""
    from tradewind.data import build_token_cache, load_tokenizer
    from tradewind.data.corpora import builtin_corpus_path

    build_token_cache([builtin_corpus_path("tinyshakespeare")], folder, load_tokenizer("byte"))
    return folder


def child(arguments: list[str], env: dict[str, str], out: Any, timeout_s: float) -> None:
    """Run this script with `arguments` in a new process; copy its JSON lines to `out` and stdout as they come."""
    command = [sys.executable, __file__, *arguments]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as process:
        assert process.stdout is not None
        deadline = time.monotonic() + timeout_s
        for line in process.stdout:
            if line.startswith("{"):
                out.write(line)
                out.flush()
                print(line, end="", flush=True)
            if time.monotonic() > deadline:
                process.kill()
                break
        if process.wait() != 0:
            error = {"kind": "error", "arguments": arguments, "exit_code": process.returncode}
            out.write(json.dumps(error) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON lines file (appended to); required but in a child")
    parser.add_argument("--shapes", default="125m,350m,1b")
    parser.add_argument("--choices", default=",".join(CHOICES), help="comma-separated names of CHOICES")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--timeout-s", type=float, default=3600, help="per process")
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU: checks that the script runs")
    parser.add_argument("--no-cold", action="store_true", help="leave out each shape's run with an empty cache")
    parser.add_argument(
        "--check-suggestion", action="store_true", help="then profile each shape's first choice as profile_run does"
    )
    parser.add_argument("--no-profile", action="store_true", help="leave out each choice's profile of three steps")
    parser.add_argument("--no-ceiling", action="store_true", help="leave out the matmul ceiling")
    parser.add_argument(
        "--compile-workers", type=int, default=1, help="above 1: compile a shape's choices first, this many at once"
    )
    parser.add_argument("--measure", metavar="SHAPE", help=argparse.SUPPRESS)  # a child: one shape's choices here
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--cache", choices=("empty", "filled"), help=argparse.SUPPRESS)
    parser.add_argument("--ceiling", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    smoke = ["--smoke"] * args.smoke
    if args.ceiling:
        print(json.dumps(matmul_ceiling(256 if args.smoke else 8192)), flush=True)
        return
    if args.measure:
        choices = args.choices.split(",")
        run_choices(
            args.measure,
            choices,
            args.dataset,
            args.steps,
            args.smoke,
            args.cache,
            args.check_suggestion,
            not args.no_profile,
            args.compile_workers,
        )
        return
    if args.out is None:
        parser.error("--out is required")
    dataset = tokens(Path(tempfile.mkdtemp(prefix="tpu-chip-data-")) / "tinyshakespeare")
    with open(args.out, "a", encoding="utf-8") as out:
        if not args.no_ceiling:
            child(["--ceiling", *smoke], dict(os.environ), out, args.timeout_s)
        for shape in args.shapes.split(","):
            cache = tempfile.mkdtemp(prefix="tpu-chip-xla-")
            env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
            measure_args = ["--measure", shape, "--dataset", str(dataset), "--steps", str(args.steps), *smoke]
            measure_args += ["--check-suggestion"] * args.check_suggestion + ["--no-profile"] * args.no_profile
            if not args.no_cold:
                first = args.choices.split(",")[0]
                child([*measure_args, "--cache", "empty", "--choices", first], env, out, args.timeout_s)
            filled = [*measure_args, "--cache", "filled", "--compile-workers", str(args.compile_workers)]
            child([*filled, "--choices", args.choices], env, out, args.timeout_s)


if __name__ == "__main__":
    main()
