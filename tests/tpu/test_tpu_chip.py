"""On this host's real TPU chip, through the public tools: training, attention kernels, a killed run's resume, an
export, an agent's MCP session, two runs queued on one chip, the compile cache, and a run too big to start.

Marked `tpu`: skipped where this host has no TPU chip (CI), run on a TPU VM by `scripts/tpu-check`. The pytest
process never opens the chip itself (JAX here stays on the CPU, tests/conftest.py): every chip program runs in a
job or a child process, one at a time, as libtpu allows.
"""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import numpy as np
import pytest
from hf_models import transformers_logits
from polling import wait_until
from runs_helpers import finish, losses

from tradewind.cluster import JobStatus
from tradewind.cluster.tpu_host import host_tpu, lock_holders
from tradewind.cluster.warm import release, warm_process
from tradewind.core import InvalidInputError
from tradewind.runs import RunLayout, TrainConfig, read_record
from tradewind.runs.compile import COMPILE_CALLABLE
from tradewind.tools import (
    ExportModelRequest,
    LaunchTrainingRequest,
    RunRequest,
    ToolContext,
    export_model,
    get_run,
    launch_training,
)

pytestmark = [
    pytest.mark.tpu,
    pytest.mark.slow,
    pytest.mark.skipif(host_tpu() is None, reason="this host has no TPU chip"),
]
ROOT = Path(__file__).resolve().parents[2]
# 128-token sequences, so that attention is the splash kernel on the chip.
CHIP_MODEL = {"d_model": 128, "n_layers": 2, "n_heads": 4, "max_seq_len": 128}
CHIP_TRAINING = {"batch_size": 8, "seq_len": 128, "eval_every": 20, "eval_batches": 2, "log_every": 5}


def chip_run(ctx: ToolContext, dataset: str, **settings) -> str:
    request = {"dataset": dataset, "model": CHIP_MODEL, **CHIP_TRAINING, "steps": 20, **settings}
    return launch_training(ctx, LaunchTrainingRequest(**request)).run_id


@pytest.fixture(scope="module")
def chip_ws(tmp_path_factory, ctx, dataset_id) -> tuple[ToolContext, str]:
    """A workspace of these tests alone (its own compile cache), with the session's dataset."""
    fresh = ToolContext.open(tmp_path_factory.mktemp("chip"), allowed_paths=(ctx.workspace.datasets_dir,))
    (fresh.workspace.root / "settings.yaml").write_text("backend: local\n", encoding="utf-8")
    return fresh, str(ctx.workspace.dataset_dir(dataset_id))


@pytest.fixture(scope="module")
def chip_and_cpu_runs(chip_ws) -> tuple[str, str]:
    ctx, dataset = chip_ws
    on_chip = chip_run(ctx, dataset, checkpoints={"every_steps": 10})  # the host's TPU: the default here
    on_cpu = chip_run(ctx, dataset, accelerator="cpu")
    for run_id in (on_chip, on_cpu):
        assert finish(ctx, run_id).status is JobStatus.SUCCEEDED, get_run(ctx, RunRequest(run_id=run_id)).log_tail
    return on_chip, on_cpu


def test_the_default_accelerator_is_the_hosts_tpu_and_it_trains_to_the_cpus_losses(chip_ws, chip_and_cpu_runs):
    """Tolerance: relative 3e-2 per logged loss over 20 steps. On the chip XLA multiplies float32 operands in
    bfloat16 passes at JAX's default precision (about 3 significant digits a product) and the CPU in float32;
    the runs start from the same weights and batches, and the gap grows as training moves them apart."""
    ctx, _ = chip_ws
    on_chip, on_cpu = chip_and_cpu_runs
    info = get_run(ctx, RunRequest(run_id=on_chip))
    assert (str(info.accelerator), info.platform) == (f"tpu-{host_tpu().tpu_type}", "tpu")
    assert "this host's TPU, the default on a TPU host" in RunLayout(Path(info.run_dir)).log.read_text()
    # MFU against the chip's own peak, from the chip table
    assert info.summary.peak_flops == host_tpu().chip.peak_bf16_flops * host_tpu().chips
    assert host_tpu().chip.device_kind.lower() in info.summary.peak_flops_source
    chip_losses, cpu_losses = losses(ctx, on_chip), losses(ctx, on_cpu)
    assert [step for step, _ in chip_losses] == [step for step, _ in cpu_losses]
    np.testing.assert_allclose([loss for _, loss in chip_losses], [loss for _, loss in cpu_losses], rtol=3e-2)


SPLASH_VS_REFERENCE = """
import json
import jax, jax.numpy as jnp
from tradewind.trainer.models.layers import causal_attention, splash_causal_attention
keys = jax.random.split(jax.random.key(0), 4)
q, k, v = (jax.random.normal(key, (2, 2048, 4, 64), jnp.bfloat16) for key in keys[:3])
cotangent = jax.random.normal(keys[3], (2, 2048, 256), jnp.float32)
positions = jnp.arange(2048)

def reference(q, k, v):
    return causal_attention(q, k, v, positions, positions)

def loss(attention, q, k, v):
    return jnp.sum(attention(q, k, v).astype(jnp.float32) * cotangent)

gaps, scales = {}, {}
for name, splash_part, reference_part in [
    ("out", splash_causal_attention(q, k, v), reference(q, k, v)),
    *zip(("dq", "dk", "dv"), jax.grad(loss, (1, 2, 3))(splash_causal_attention, q, k, v),
         jax.grad(loss, (1, 2, 3))(reference, q, k, v)),
]:
    gaps[name] = float(jnp.abs(splash_part.astype(jnp.float32) - reference_part.astype(jnp.float32)).max())
    scales[name] = float(jnp.abs(reference_part.astype(jnp.float32)).max())
print(json.dumps({"platform": jax.default_backend(), "gaps": gaps, "scales": scales}))
"""


def test_splash_attention_on_the_chip_matches_the_reference_in_outputs_and_gradients_at_sequence_2048():
    """The kernel as the trainer calls it (its block sizes, its fused backward) at the benchmark's sequence length,
    so that blocks of 1024 and the causal mask between them are what is checked. Tolerance: 2e-2 of each
    result's largest magnitude, bfloat16 inputs and outputs (8 bits of mantissa: steps of 4e-3 relative)."""
    env = {**os.environ, "JAX_PLATFORMS": ""}
    done = subprocess.run([sys.executable, "-c", SPLASH_VS_REFERENCE], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["platform"] == "tpu"
    for name, gap in result["gaps"].items():
        assert result["scales"][name] > 0.5 and gap <= 2e-2 * result["scales"][name], result


def test_a_run_killed_on_the_chip_resumes_from_its_checkpoint_to_the_same_losses(chip_ws, chip_and_cpu_runs):
    ctx, dataset = chip_ws
    uninterrupted, _ = chip_and_cpu_runs
    run_id = chip_run(ctx, dataset, checkpoints={"every_steps": 10}, max_retries=1)
    layout = RunLayout(ctx.workspace.run_dir(run_id))
    wait_until(lambda: (layout.checkpoints / "10").is_dir(), timeout=300, what="the step-10 checkpoint")
    job = ctx.backend.status(run_id)
    for pid in job.pids:
        os.kill(pid, signal.SIGKILL)  # a preemption: the job restarts from step 10
    done = finish(ctx, run_id)
    assert done.status is JobStatus.SUCCEEDED and done.attempts == 2, done.log_tail
    np.testing.assert_allclose(
        [loss for _, loss in losses(ctx, run_id)], [loss for _, loss in losses(ctx, uninterrupted)], rtol=1e-5
    )


def test_a_chip_trained_model_exported_gives_transformers_the_runs_logits(chip_ws, chip_and_cpu_runs):
    """The export is written on the CPU (the chip is for training); transformers (torch, CPU) and Tradewind's own
    model (JAX, CPU, in this process) agree on its logits to float32 rounding."""
    from tradewind.trainer.restore import load_run_model

    ctx, _ = chip_ws
    on_chip, _ = chip_and_cpu_runs
    exported = export_model(ctx, ExportModelRequest(run_id=on_chip))
    assert exported.device.startswith("cpu")
    tokens = np.array([[5, 72, 101, 108, 108, 111, 32, 119, 33, 100, 3, 9]], np.int32)
    ours = np.asarray(load_run_model(ctx.workspace.run_dir(on_chip)).model()(tokens))
    np.testing.assert_allclose(transformers_logits(exported.path, tokens), ours, rtol=0, atol=1e-4)


def test_two_launches_at_once_share_the_chip_in_turn_and_both_finish(chip_ws):
    ctx, dataset = chip_ws
    first, second = chip_run(ctx, dataset, seed=1), chip_run(ctx, dataset, seed=2)
    wait_until(lambda: ctx.backend.status(first).status is JobStatus.RUNNING, timeout=60, what="the first run")
    assert ctx.backend.status(second).status is JobStatus.PENDING  # it waits for the chip
    assert ctx.backend.cluster_status().used["tpus"] == host_tpu().chips
    for run_id in (first, second):
        assert finish(ctx, run_id).status is JobStatus.SUCCEEDED
    # the second ran where the first had: in the workspace's warm process, which alone keeps the chip for the next
    assert "(warm after 1 job)" in RunLayout(ctx.workspace.run_dir(second)).log.read_text()
    assert [pid for pid, _ in lock_holders()] == [warm_process(ctx.workspace.jobs_dir)]


def test_a_second_launch_of_a_config_finds_its_programs_in_the_compile_cache_or_the_warm_process(chip_ws):
    """The first launch compiles; the second, in a new process (the warm one released), loads the programs from
    the workspace's compile cache; the third runs in the warm process the second left, its programs loaded."""
    ctx, dataset = chip_ws
    settings = {"model": {**CHIP_MODEL, "d_model": 192}, "steps": 10}  # a shape no other test compiled
    first = chip_run(ctx, dataset, **settings)
    assert finish(ctx, first).status is JobStatus.SUCCEEDED
    cached = {entry.name for entry in ctx.workspace.compile_cache_dir.iterdir()}
    assert release(ctx.workspace.jobs_dir) is not None
    second = chip_run(ctx, dataset, **settings)
    assert finish(ctx, second).status is JobStatus.SUCCEEDED
    assert {entry.name for entry in ctx.workspace.compile_cache_dir.iterdir() if entry.name.endswith("-cache")} <= (
        cached
    ), "the second launch compiled programs the first had cached"
    third = chip_run(ctx, dataset, **settings)
    assert finish(ctx, third).status is JobStatus.SUCCEEDED
    logs = [RunLayout(ctx.workspace.run_dir(run)).log.read_text() for run in (second, third)]
    assert "(started for this job)" in logs[0] and "(warm after 1 job)" in logs[1]
    compile_s = [get_run(ctx, RunRequest(run_id=run)).summary.compile_s for run in (first, second, third)]
    assert compile_s[2] < compile_s[1] < compile_s[0], compile_s
    assert losses(ctx, third) == losses(ctx, second)


def test_a_1b_config_too_big_for_the_chip_as_given_trains_there_with_the_memory_change_the_launch_picks(chip_ws):
    ctx, dataset = chip_ws
    before = len(ctx.backend.list())
    big = {"preset": "llama-1b", "vocab_size": 128256}  # its weights, gradients and Adam's moments need 18.42 GiB
    few = {"steps": 3, "log_every": 1, "eval_every": 3, "eval_batches": 1, "checkpoint": False}
    run = launch_training(ctx, LaunchTrainingRequest(dataset=dataset, model=big, batch_size=4, seq_len=128, **few))
    assert "as given it does not fit 1 x v5litepod-1 (its weights, gradients and adamw state alone need 18.42 GiB" in (
        run.accelerator_note
    )
    assert re.search(r"so it trains with [^:]+: [\d.]+ GiB per chip \(compiled\)", run.accelerator_note)
    compiles = [job for job in ctx.backend.list()[before:] if job.spec.callable == COMPILE_CALLABLE]
    assert compiles and all(job.spec.env.get("JAX_PLATFORMS") == "cpu" for job in compiles)  # compiled on the CPU
    assert all(job.spec.resources.tpu is None for job in compiles)
    done = finish(ctx, run.run_id)
    assert done.status is JobStatus.SUCCEEDED, done.log_tail
    assert done.platform == "tpu" and done.summary.steps == 3


@pytest.mark.timeout(1200)  # the launch's compiles on the host's CPU (4-6 minutes), then the run (at most 600 s)
@pytest.mark.parametrize("optimizer", ["adamw", "adafactor"])
def test_the_1b_at_8_by_2048_tokens_an_update_trains_on_the_chip_with_as_few_blocks_recomputed_as_fit(
    chip_ws, optimizer
):
    """The issue's 1B at 8 x 2048 tokens an update, launched as given (no remat): the launch compiles it and its
    memory changes on this host's CPU, then, unrolled, keeps the activations of as many blocks as the chip has room
    for (`remat_blocks`: AdamW's state leaves room for fewer than Adafactor's), and the run trains on the chip.
    Its speed is printed for the benchmarks page, not asserted."""
    ctx, _ = chip_ws
    dataset = "builtin:tinyshakespeare"  # the whole play: its val split holds batches of 2048-token sequences
    big = {"preset": "llama-1b", "vocab_size": 128256}
    few = {"steps": 30, "log_every": 10, "eval_every": 30, "eval_batches": 1, "checkpoint": False}
    request = {"dataset": dataset, "model": big, "optimizer": {"type": optimizer}, "batch_size": 8, "seq_len": 2048}
    run = launch_training(ctx, LaunchTrainingRequest(**request, **few))
    picked = re.search(r"scan_layers=false and remat_blocks=(\d+): [\d.]+ GiB per chip", run.accelerator_note)
    assert picked and 0 < int(picked.group(1)) < 16, run.accelerator_note
    assert f"in the first {picked.group(1)} of the 16 blocks only" in run.accelerator_note
    done = finish(ctx, run.run_id, timeout_s=600)
    assert done.status is JobStatus.SUCCEEDED, done.log_tail
    assert done.platform == "tpu" and done.summary.steps == 30
    print(
        f"\n1b {optimizer} launched: {run.accelerator_note}\n1b {optimizer} trained: MFU {done.summary.mfu:.4f} over "
        f"the run, {done.summary.mean_tokens_per_s:,.0f} tokens/s, compile {done.summary.compile_s:.1f} s"
    )


def test_a_config_no_memory_change_fits_is_refused_before_the_chip_is_touched(chip_ws):
    ctx, dataset = chip_ws
    before = len(ctx.backend.list())
    big = {"preset": "llama-8b", "vocab_size": 128256}  # its float32 weights and gradients alone need 60 GiB
    with pytest.raises(InvalidInputError, match=r"does not fit 1 x v5litepod-1: its weights, gradients and adamw"):
        launch_training(ctx, LaunchTrainingRequest(dataset=dataset, model=big, batch_size=4, seq_len=128))
    assert len(ctx.backend.list()) == before  # not even compiled


def test_a_run_past_the_launch_check_that_runs_out_of_the_chips_memory_fails_with_a_readable_reason(tmp_path, chip_ws):
    """Trained by hand (`python -m tradewind.trainer`, no launch and so no fit check), a 1B config with Adam: its
    weights and moments are placed on the chip, then its step does not fit. The run ends FAILED, its record
    saying so with XLA's figures and what to change."""
    _, dataset = chip_ws
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    big = {"preset": "llama-1b", "vocab_size": 128256}
    config = TrainConfig(dataset=dataset, model=big, batch_size=4, seq_len=128, steps=2, checkpoint=False)
    layout.config.write_text(config.model_dump_json(), encoding="utf-8")
    on_the_chip = {**os.environ, "JAX_PLATFORMS": ""}  # this pytest process keeps JAX on the CPU (conftest.py)
    done = subprocess.run(
        [sys.executable, "-m", "tradewind.trainer", str(layout.root)],
        capture_output=True,
        text=True,
        timeout=600,
        env=on_the_chip,
    )
    assert done.returncode == 1, done.stdout[-2000:]
    record = read_record(layout.record)
    assert record.status == "FAILED", record
    assert record.reason.startswith(f"out of memory on {host_tpu().chip.device_kind}"), record.reason
    assert "RESOURCE_EXHAUSTED" in record.reason and "remat='full' with scan_layers=true" in record.reason


def test_an_agent_over_mcp_stdio_launches_profiles_samples_and_exports_a_run_on_the_chip(tmp_path):
    spec = importlib.util.spec_from_file_location("tpu_host", ROOT / "benchmarks" / "tpu_host.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    figures = anyio.run(bench.agent_session, tmp_path, "tiny", 10, False)  # the benchmark trains the 1B
    assert figures["run"]["platform"] == "tpu" and figures["run"]["mfu"] > 0
    assert figures["profile"]["backend"] == "tpu" and figures["profile"]["top_ops"]
    assert figures["sample"]["device"].startswith("cpu") and figures["sample"]["text"]
    assert "model.safetensors" in figures["export"]["files"] and figures["report"]["report"].endswith(".md")
    resumed = figures["killed_and_resumed"]
    assert resumed["platform"] == "tpu" and resumed["resumed_from_step"] >= 10
    assert resumed["steps"] == resumed["resumed_from_step"] + 10
    sweep = figures["sweep"]
    assert sweep["status"] == "succeeded" and sweep["platforms"] == ["tpu", "tpu"] and sweep["in_turn"]
    assert figures["warm"]["first_step_s"] < figures["cold"]["first_step_s"]


def test_the_cli_trains_estimates_compiles_profiles_samples_and_exports_on_the_chip(tmp_path, chip_ws):
    """The `tradewind` commands a person types on a TPU VM, each a process of its own; the CLI itself stays on
    the CPU (it never holds the chip), the runs and the profile take it."""
    _, dataset = chip_ws
    config = tmp_path / "run.yaml"
    config.write_text(
        json.dumps({"dataset": dataset, "model": CHIP_MODEL, **CHIP_TRAINING, "steps": 10}), encoding="utf-8"
    )
    workspace = ["--workspace", str(tmp_path / "ws"), "--allow-path", str(Path(dataset).parent)]

    def tradewind(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "tradewind", *args, *workspace], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    compiled = json.loads(tradewind("compile", str(config), "--json"))  # the host's chip is the default target
    assert compiled["fits"] and compiled["device_memory_source"].startswith(f"HBM of one {host_tpu().chip.device_kind}")
    estimate = json.loads(tradewind("estimate", str(config), "--json"))
    assert estimate["fits"] and estimate["step_time_s"] > 0
    run_id = re.search(r"run (run-[\w-]+)", tradewind("train", str(config))).group(1)  # it waits for the run
    shown = json.loads(tradewind("runs", "show", run_id))
    assert (shown["status"], shown["platform"]) == ("SUCCEEDED", "tpu")
    profile = json.loads(tradewind("profile", run_id, "--steps", "3", "--json"))
    assert profile["backend"] == "tpu" and profile["top_ops"]
    sample = json.loads(tradewind("sample", run_id, "--prompt", "ROMEO:", "--max-tokens", "8", "--json"))
    assert sample["device"].startswith("cpu") and sample["text"]
    exported = tradewind("export", run_id, "--out", str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "model.safetensors").is_file(), exported


def test_the_125m_step_estimate_is_within_20_percent_of_its_step_on_the_chip_and_the_profile_names_its_parts(
    tmp_path,
):
    # The chip benchmark's own measurement (benchmarks/tpu_chip.py, in a child process that holds the chip)
    out = tmp_path / "chip.jsonl"
    command = [sys.executable, str(ROOT / "benchmarks" / "tpu_chip.py"), "--out", str(out), "--shapes", "125m"]
    on_the_chip = {**os.environ, "JAX_PLATFORMS": ""}  # this pytest process keeps JAX on the CPU (conftest.py)
    arguments = ["--choices", "default", "--steps", "30", "--no-cold"]
    subprocess.run([*command, *arguments], env=on_the_chip, check=True, timeout=900)
    (row,) = [json.loads(line) for line in out.read_text().splitlines() if '"choice"' in line]
    assert row["fits"], row.get("error")
    assert 0.8 <= row["estimate_over_measured"] <= 1.2, (row["estimate_step_s"], row["step_s"])
    parts = {part["part"]: part for part in row["profile"]["parts"]}
    assert parts["attention"]["seconds"] > 0 and parts["mlp"]["seconds"] > 0  # the splash kernel counts as attention
    assert row["profile"]["kinds"]["attention kernel"] > 0
