"""What a run will need before it queues: parameters, FLOPs per token and memory, without JAX.

`estimate_training(config, placement)` reads the dataset's manifest for the vocabulary, imports no JAX and builds
no model: parameter and FLOP counts come from the model config (a LoRA run's adapters from its `LoraConfig`, its
base frozen), memory from `training_memory`, and the memory it is compared against is this machine's available
RAM. The measured step time comes from the probe, `tradewind.trainer.estimate.probe_training`, which runs as a
job (what the `estimate_run` tool submits; the keyword arguments are an `EstimateJob`):
    JobSpec(name="estimate", callable="tradewind.trainer.estimate:estimate_job",
            kwargs={"config": {...}, "output_file": "jobs/estimate-ab/estimate.json"})

and writes a `TrainEstimate` as JSON to `output_file`.
"""

from __future__ import annotations

from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster.placement import Placement
from tradewind.data import open_token_cache
from tradewind.runs.config import TrainConfig
from tradewind.runs.flops import MemoryEstimate, training_memory

ESTIMATE_CALLABLE = "tradewind.trainer.estimate:estimate_job"
PROBE_S = 2.0  # seconds of steps the probe times
PROBE_MIN_STEPS = 10  # steps it times at least, however slow...
PROBE_MAX_S = 30.0  # ...unless these seconds pass first


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
    step_time_s: float | None = Field(None, description="Seconds per step in the run's loop, evals included.")
    compile_s: float | None = Field(None, description="Seconds compiling the probe's steps.")
    probed_steps: int | None = Field(None, description="Steps the probe timed.")


class EstimateJob(BaseModel):
    """An estimating process's arguments: the config to probe, where, and where its `TrainEstimate` goes."""

    model_config = ConfigDict(extra="forbid")

    config: TrainConfig
    placement: Placement = Field(default_factory=Placement)
    output_file: str = Field(description="Where the `TrainEstimate` is written as JSON.")
    probe_s: float = Field(
        default=PROBE_S, gt=0, le=PROBE_MAX_S, description=f"Seconds of steps to time (at least {PROBE_MIN_STEPS})."
    )


def memory_bytes(memory: MemoryEstimate) -> MemoryBytes:
    """A `training_memory` estimate split into weights, optimizer state and activations."""
    return MemoryBytes(
        params=memory.weight_bytes,
        optimizer=memory.optimizer_bytes,
        activations=memory.activation_bytes,
        total=memory.total_bytes,
    )


def estimate_training(
    config: TrainConfig, placement: Placement | None = None, device_memory: tuple[int, str] | None = None
) -> TrainEstimate:
    """Parameters, FLOPs per token and memory of `config` against the device's.

    Args:
        config: the run (`config.dataset` is a token-cache folder).
        placement: where it runs: its accelerator, and the replicas that share the batch; None: one CPU process.
        device_memory: the device's memory in bytes and where that figure comes from, as a process on the device
            reads it (the probe does); None: this machine's available RAM for a CPU run, else unknown.

    Returns:
        The estimate, without a step time (`tradewind.trainer.estimate.probe_training` measures one). `parameters`
        are the trained ones (a LoRA run's adapters), `frozen_parameters` a LoRA run's base (else 0).

    Raises:
        NotFoundError: no token cache at `config.dataset`.
        ConfigError: `config.lora` targets projections the model does not have.
    """
    vocab_size = open_token_cache(Path(config.dataset)).manifest.tokenizer.vocab_size
    config = config.with_vocabulary(vocab_size)
    placement = placement or Placement()
    counted = training_memory(config, vocab_size, placement.replicas, placement.accelerator.kind)
    memory = memory_bytes(counted)
    on_cpu = placement.accelerator.kind == "cpu"
    if device_memory is None:
        # only a process on the device can ask an accelerator's memory
        device_memory = (psutil.virtual_memory().available, "available RAM") if on_cpu else (None, None)
    available, source = device_memory
    # CPU processes of one run share this machine's memory; each accelerator process has its own device.
    needed = memory.total * (placement.replicas if on_cpu else 1)
    return TrainEstimate(
        parameters=counted.params,
        frozen_parameters=counted.frozen,
        flops_per_token=config.flops_per_token(vocab_size),
        tokens_per_step=config.tokens_per_step,
        memory_bytes=memory,
        device_memory_bytes=available,
        device_memory_source=source,
        fits=None if available is None else needed <= available,
    )
