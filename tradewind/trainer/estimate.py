"""What a run will need before it queues: parameters, FLOPs per token, memory, and a measured step time.

The analytic part (`estimate_training(config, placement)`) reads the dataset's manifest for the vocabulary,
imports no JAX and builds no model: parameter and FLOP counts come from the model config (a LoRA run's adapters
from its `LoraConfig`, its base frozen), memory from `training_memory`, and the memory it is compared against is
this machine's available RAM. With `probe=True` it also builds the run as `train` does
(`setup_training`), trains one step so that nothing one-off is timed, times `probe_steps` more in the training
loop (`run_steps`), and takes the device's memory limit from JAX where the device reports one.

As a job (what the `estimate_run` tool submits; the keyword arguments are an `EstimateJob`):
    JobSpec(name="estimate", callable="tradewind.trainer.estimate:estimate_job",
            kwargs={"config": {...}, "output_file": "jobs/estimate-ab/estimate.json"})

writes a `TrainEstimate` as JSON to `output_file`. The probe's updates are thrown away.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster.placement import Placement
from tradewind.core import atomic_write_json, parse_config
from tradewind.data import open_token_cache
from tradewind.trainer.config import TrainConfig
from tradewind.trainer.flops import MemoryEstimate, training_memory

ESTIMATE_CALLABLE = "tradewind.trainer.estimate:estimate_job"
PROBE_STEPS = 3


class MemoryBytes(BaseModel):
    """Estimated training memory of one process, in bytes."""

    model_config = ConfigDict(extra="forbid")

    params: int = Field(description="Weights and the trained ones' gradients.")
    optimizer: int = Field(description="Optimizer moments.")
    activations: int = Field(description="Activations of one microbatch, with the logits.")
    total: int = Field(description="All of the above.")


class TrainEstimate(BaseModel):
    """A config's size, memory and (when probed) step time, as `estimate_training` finds them."""

    model_config = ConfigDict(extra="forbid")

    parameters: int = Field(description="Trainable parameters.")
    frozen_parameters: int = Field(0, description="LoRA's frozen base.")
    flops_per_token: float = Field(description="Model FLOPs per trained token, forward and backward.")
    tokens_per_step: int = Field(description="batch_size * seq_len.")
    memory_bytes: MemoryBytes
    device_memory_bytes: int | None = Field(description="Memory it is compared with; null: unknown.")
    device_memory_source: str | None = Field(description="Where device_memory_bytes comes from.")
    fits: bool | None = Field(description="memory_bytes.total fits device_memory_bytes; null: unknown.")
    step_time_s: float | None = Field(None, description="Mean probed step time after the first step.")
    compile_s: float | None = Field(None, description="Seconds compiling the probe's steps.")


class EstimateJob(BaseModel):
    """An estimating process's arguments: the config to probe, where, and where its `TrainEstimate` goes."""

    model_config = ConfigDict(extra="forbid")

    config: TrainConfig
    placement: Placement = Field(default_factory=Placement)
    output_file: str = Field(description="Where the `TrainEstimate` is written as JSON.")
    probe_steps: int = Field(default=PROBE_STEPS, ge=1, le=100, description="Steps timed after the first.")


def memory_bytes(memory: MemoryEstimate) -> MemoryBytes:
    """A `training_memory` estimate split into weights, optimizer state and activations."""
    return MemoryBytes(
        params=memory.weight_bytes,
        optimizer=memory.optimizer_bytes,
        activations=memory.activation_bytes,
        total=memory.total_bytes,
    )


def estimate_training(
    config: TrainConfig, placement: Placement | None = None, probe: bool = False, probe_steps: int = PROBE_STEPS
) -> TrainEstimate:
    """Parameters, FLOPs per token and memory of `config` against the device's; with `probe`, its step time.

    Args:
        config: the run (`config.dataset` is a token-cache folder).
        placement: where it runs: its accelerator, and the replicas that share the batch; None: one CPU process.
        probe: build and compile the run, train one step, then time `probe_steps` more (loads JAX).
        probe_steps: steps timed after the first.

    Returns:
        The estimate; `step_time_s` and `compile_s` only with `probe`. `parameters` are the trained ones (a LoRA
        run's adapters), `frozen_parameters` a LoRA run's base (else 0).

    Raises:
        NotFoundError: no token cache at `config.dataset`.
        ConfigError: `config.lora` targets projections the model does not have.
        ConfigError, InvalidInputError: as `setup_training` (only with `probe`).
    """
    vocab_size = open_token_cache(Path(config.dataset)).manifest.tokenizer.vocab_size
    model = config.model.model_copy(update={"vocab_size": config.model.vocab_size or vocab_size})
    placement = placement or Placement()
    counted = training_memory(config, vocab_size, placement.replicas)
    memory = memory_bytes(counted)
    on_cpu = placement.accelerator.kind == "cpu"
    step_time_s = compile_s = None
    if probe:
        step_time_s, compile_s = _probe(config, placement, probe_steps)
        device_memory, source = _device_memory()
    elif on_cpu:
        device_memory, source = psutil.virtual_memory().available, "available RAM"
    else:
        device_memory, source = None, None  # only a process on the device can ask it
    # CPU processes of one run share this machine's memory; each accelerator process has its own device.
    needed = memory.total * (placement.replicas if on_cpu else 1)
    return TrainEstimate(
        parameters=counted.params,
        frozen_parameters=counted.frozen,
        flops_per_token=model.flops_per_token(config.seq_len),
        tokens_per_step=config.tokens_per_step,
        memory_bytes=memory,
        device_memory_bytes=device_memory,
        device_memory_source=source,
        fits=None if device_memory is None else needed <= device_memory,
        step_time_s=step_time_s,
        compile_s=compile_s,
    )


def _probe(config: TrainConfig, placement: Placement, steps: int) -> tuple[float, float]:
    """The mean time of `steps` training steps after the first, and the compile time, of a run built as `train`
    builds it."""
    import jax

    from tradewind.trainer.distributed import check_devices
    from tradewind.trainer.loop import run_steps
    from tradewind.trainer.setup import setup_training

    check_devices(placement.accelerator)
    setup = setup_training(config)
    # The first execution pays one-off costs (allocation, autotuning); it is left out of the timing.
    state = run_steps(setup, setup.state, hooks=[], last_step=1)
    jax.block_until_ready(state.params)
    start = time.perf_counter()
    state = run_steps(setup, state, hooks=[], last_step=1 + steps)
    jax.block_until_ready(state.params)
    return (time.perf_counter() - start) / steps, setup.compile_s


def _device_memory() -> tuple[int, str]:
    """The first device's memory limit where JAX reports one (GPU, TPU), else this machine's available RAM."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{jax.devices()[0].device_kind} bytes_limit"
    return psutil.virtual_memory().available, "available RAM"


def estimate_job(**job: Any) -> None:
    """The entry of an estimating job: validates its keyword arguments as an `EstimateJob`, probes the config
    and writes the `TrainEstimate` to `output_file`."""
    request = parse_config(EstimateJob, job, source="estimate job")
    estimate = estimate_training(request.config, request.placement, probe=True, probe_steps=request.probe_steps)
    atomic_write_json(Path(request.output_file), estimate.model_dump())
    print(
        f"{estimate.parameters:,} parameters; compile {estimate.compile_s:.1f}s; "
        f"{(estimate.step_time_s or 0) * 1000:.1f} ms/step over {request.probe_steps} steps",
        flush=True,
    )
