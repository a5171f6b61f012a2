"""The training run's configuration: model, optimizer, checkpoint, mesh and loop settings, as pydantic models.

These classes are the JSON schema the MCP tools show an agent, so every field says what it does. They
import no JAX: the CLI and the server load them at start-up. A run reads its config from YAML or JSON
through `tradewind.core.load_config` / `parse_config`, which name the file and field of any bad value.

Example:
    config = load_config(TrainConfig, "train.yaml", overrides=["model.d_model=192", "steps=300"])
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from tradewind.cluster.jobs import accelerator_resources, parse_accelerator
from tradewind.core import NotFoundError, parse_config, read_json

# Named model shapes; any field given next to `preset` overrides the preset's value. Sizes are for a
# 32k vocabulary (nano and micro are meant for byte-level vocabularies of 258).
PRESETS: dict[str, dict[str, Any]] = {
    "nano": {"d_model": 128, "n_layers": 4, "n_heads": 4, "max_seq_len": 256},
    "micro": {"d_model": 256, "n_layers": 6, "n_heads": 8, "max_seq_len": 512},
    "llama-20m": {"d_model": 384, "n_layers": 8, "n_heads": 6, "n_kv_heads": 2, "max_seq_len": 512},
    "gpt2-small": {"type": "gpt2", "d_model": 768, "n_layers": 12, "n_heads": 12, "max_seq_len": 1024},
    "llama-125m": {"d_model": 768, "n_layers": 12, "n_heads": 12, "max_seq_len": 1024},
    "llama-350m": {"d_model": 1024, "n_layers": 24, "n_heads": 16, "n_kv_heads": 8, "max_seq_len": 2048},
    "llama-1b": {
        "d_model": 2048,
        "n_layers": 16,
        "n_heads": 32,
        "n_kv_heads": 8,
        "d_ff": 8192,
        "max_seq_len": 2048,
        "rope_theta": 500000.0,
        "tie_embeddings": True,
    },
}


class ModelConfig(BaseModel):
    """The shape of a decoder-only language model."""

    model_config = ConfigDict(extra="forbid")

    preset: str | None = Field(
        None,
        description=f"Named shape ({', '.join(PRESETS)}); fields set beside it override the preset's.",
    )
    type: Literal["llama", "gpt2"] = Field(
        "llama",
        description="'llama' (RMSNorm, rotary, SwiGLU, GQA) or 'gpt2' (LayerNorm, learned positions, GELU).",
    )
    vocab_size: int | None = Field(
        None, gt=0, le=2**20, description="Null: the dataset tokenizer's; if set, at least that."
    )
    d_model: int = Field(128, gt=0, le=2**16, description="Width of the residual stream.")
    n_layers: int = Field(4, gt=0, le=1024, description="Transformer blocks.")
    n_heads: int = Field(4, gt=0, le=1024, description="Query heads per block; must divide d_model.")
    n_kv_heads: int | None = Field(
        None, gt=0, le=1024, description="Key/value heads (llama); must divide n_heads. Null: n_heads."
    )
    d_ff: int | None = Field(
        None, gt=0, le=2**18, description="MLP width; null: 8/3 d_model rounded up to 32 (llama), 4 d_model (gpt2)."
    )
    max_seq_len: int = Field(256, gt=0, le=2**20, description="Longest sequence the model accepts.")
    rope_theta: float = Field(10000.0, gt=0, le=1e9, description="Rotary embedding base (llama).")
    norm_eps: float = Field(1e-6, gt=0, le=1, description="Epsilon of the RMSNorm / LayerNorm.")
    tie_embeddings: bool = Field(True, description="Use the input embedding as the output projection.")
    init_std: float = Field(0.02, gt=0, le=1, description="Standard deviation of the weight initialisation.")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            name = data["preset"]
            if name not in PRESETS:
                raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
            data = {**PRESETS[name], **data}
        return data

    @field_validator("n_heads")
    @classmethod
    def _heads_divide_width(cls, n_heads: int, info: ValidationInfo) -> int:
        d_model = info.data.get("d_model")
        if d_model is None:
            return n_heads
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if (d_model // n_heads) % 2:
            raise ValueError(
                f"head size d_model / n_heads = {d_model // n_heads} must be even for rotary embeddings; "
                f"change d_model ({d_model}) or n_heads ({n_heads})"
            )
        return n_heads

    @field_validator("n_kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, n_kv_heads: int | None, info: ValidationInfo) -> int | None:
        n_heads = info.data.get("n_heads")
        if n_kv_heads is not None and n_heads is not None and n_heads % n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads})")
        if n_kv_heads is not None and n_kv_heads != n_heads and info.data.get("type") == "gpt2":
            raise ValueError("grouped-query attention (n_kv_heads != n_heads) is for type 'llama' only")
        return n_kv_heads

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: `n_kv_heads`, or `n_heads` when it is None."""
        return self.n_kv_heads or self.n_heads

    @property
    def ff_dim(self) -> int:
        """The MLP hidden width: `d_ff`, else 4 * d_model (gpt2) or 8/3 of it rounded up to 32 (llama)."""
        if self.d_ff is not None:
            return self.d_ff
        if self.type == "gpt2":
            return 4 * self.d_model
        return 32 * -(-8 * self.d_model // (3 * 32))  # ceil(8/3 * d_model / 32) in integers


class OptimizerConfig(BaseModel):
    """AdamW, Lion or Adafactor, with gradient clipping and a warmup-then-decay schedule."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["adamw", "lion", "adafactor"] = Field(
        "adamw", description="Update rule; 'lion' wants a ~3-10x smaller learning rate."
    )
    learning_rate: float = Field(3e-3, gt=0, le=1e10, description="Peak learning rate, reached after warmup.")
    schedule: Literal["cosine", "linear", "constant"] = Field(
        "cosine", description="Decay after warmup, down to learning_rate * min_lr_ratio at the last step."
    )
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final learning rate, as a share of the peak.")
    warmup_steps: int = Field(20, ge=0, le=10**9, description="Steps of linear warmup from 0.")
    weight_decay: float = Field(0.1, ge=0, le=10, description="Decoupled weight decay, on matrices only.")
    b1: float = Field(0.9, ge=0, lt=1, description="First-moment decay (AdamW, Lion).")
    b2: float = Field(0.95, ge=0, lt=1, description="Second-moment decay (AdamW; Lion's update mix).")
    grad_clip: float = Field(1.0, ge=0, le=1e6, description="Global L2 norm to clip gradients to; 0: off.")


class CheckpointConfig(BaseModel):
    """When checkpoints are written and which are kept."""

    model_config = ConfigDict(extra="forbid")

    every_steps: int | None = Field(None, gt=0, le=10**9, description="Save every this many steps; null: at the end.")
    every_minutes: float | None = Field(
        None, gt=0, le=10080, description="Also save this many minutes after the last save."
    )
    keep_last: int = Field(3, gt=0, le=1000, description="Keep the newest this many; delete older ones...")
    keep_every: int | None = Field(None, gt=0, le=10**9, description="... except those at multiples of this step.")
    async_save: bool = Field(True, description="Save in the background while training goes on.")


class MeshConfig(BaseModel):
    """How devices are arranged: batch over `data` x `fsdp`, parameters sharded over `fsdp` and `tensor`."""

    model_config = ConfigDict(extra="forbid")

    data: int = Field(-1, ge=-1, le=2**16, description="Data-parallel replicas; -1: the devices left, 0 is refused.")
    fsdp: int = Field(1, gt=0, le=2**16, description="Devices sharding parameters and optimizer state (ZeRO-3).")
    tensor: int = Field(1, gt=0, le=2**16, description="Devices splitting each matrix's outputs (tensor parallel).")

    @field_validator("data")
    @classmethod
    def _data_not_zero(cls, data: int) -> int:
        if data == 0:
            raise ValueError("must be -1 (the devices fsdp and tensor leave) or a positive count (got 0)")
        return data


class DistributedConfig(BaseModel):
    """Multi-process (multi-host) set-up for `jax.distributed.initialize`."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Initialise jax.distributed before training.")
    coordinator_address: str | None = Field(
        None, description="host:port of process 0; null lets JAX auto-detect it (TPU pods, SLURM)."
    )
    num_processes: int | None = Field(None, gt=0, le=2**16, description="Processes in the job; null: auto-detect.")
    process_id: int | None = Field(None, ge=0, lt=2**16, description="This process's index; null: auto-detect.")


class TrainConfig(BaseModel):
    """One training run: which token cache, which model, which optimizer, how long, and where it runs."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(
        description="The token cache to train on (it needs 'train' and 'val' splits): a dataset id from "
        "tokenize_dataset, a path relative to the workspace root, an absolute path under an allowed root, or "
        "'builtin:NAME' (e.g. builtin:tinyshakespeare, tokenized on first use). launch_training and `tradewind "
        "train` resolve these; a Python call of `train()` takes the cache's folder."
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model architecture and size.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="Optimizer and LR schedule.")
    steps: int = Field(200, gt=0, le=10**9, description="Optimizer updates.")
    batch_size: int = Field(16, gt=0, le=2**20, description="Sequences per update (the global batch).")
    grad_accum: int = Field(
        1, gt=0, le=2**16, description="Microbatches per batch, gradients summed (saves memory); divides batch_size."
    )
    seq_len: int = Field(128, gt=0, le=2**20, description="Tokens per sequence; at most model.max_seq_len.")
    seed: int = Field(0, ge=0, lt=2**32, description="Seed of the initial weights and the batch order.")
    z_loss: float = Field(0.0, ge=0, le=1, description="Weight of mean(logsumexp(logits)^2); 1e-4 is common.")
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Matmul dtype (params stay float32); 'auto': bfloat16 on GPU/TPU, float32 on CPU."
    )
    on_nonfinite: Literal["stop", "skip"] = Field(
        "stop", description="On a NaN/inf loss, fail the run or drop that update."
    )
    eval_every: int = Field(50, gt=0, le=10**9, description="Steps between evaluations (also at the first and last).")
    eval_batches: int = Field(4, gt=0, le=10**4, description="Val batches per evaluation, the same each time.")
    log_every: int = Field(10, gt=0, le=10**9, description="Steps between metrics rows.")
    checkpoint: bool = Field(True, description="Save checkpoints (at the end, and as `checkpoints` says).")
    checkpoints: CheckpointConfig = Field(default_factory=CheckpointConfig, description="When to save, what to keep.")
    resume: bool = Field(True, description="Continue from the run folder's newest good checkpoint, if any.")
    init_from: str | None = Field(
        None, description="Start from a Hugging Face Llama directory's weights (config.json, model.safetensors)."
    )
    mesh: MeshConfig = Field(default_factory=MeshConfig, description="Device mesh for sharding.")
    distributed: DistributedConfig = Field(
        default_factory=DistributedConfig, description="For a gang started by hand (SLURM, a TPU pod's own launcher)."
    )
    tensorboard: bool = Field(True, description="Also write TensorBoard events under <run>/tensorboard/.")
    wandb_project: str | None = Field(None, description="Also log to this W&B project (the `wandb` extra).")
    peak_flops: float | None = Field(
        None, gt=0, le=1e18, description="Peak FLOP/s per device for MFU; null: looked up (CPU: estimated)."
    )
    backend: Literal["local", "ray"] | None = Field(
        None,
        description="'local' or 'ray' (the cluster at RAY_ADDRESS); null: settings.yaml's, else 'ray' if "
        "RAY_ADDRESS is set, else 'local'.",
    )
    accelerator: str = Field(
        "cpu",
        description="Per host: 'cpu', 'gpu', 'gpu:N', or a TPU slice 'tpu-<type>' (e.g. tpu-v5litepod-8, "
        "tpu-v4-32; Ray only).",
    )
    slices: int = Field(1, ge=1, le=64, description="TPU slices training together.")
    replicas: int = Field(
        1, ge=1, le=64, description="Processes of a cpu/gpu run training data-parallel as a gang (TPU: one per host)."
    )
    max_retries: int = Field(
        1, ge=0, le=100, description="Restarts after a kill or preemption, each from the newest checkpoint."
    )
    pending_timeout_s: float | None = Field(
        None,
        gt=0,
        le=604800,
        description="Fail the run if it has not started this many seconds after launch. Null: 1800 on Ray, "
        "no limit locally.",
    )
    resume_from: str | None = Field(
        None,
        description="Continue this run (an id) from its newest checkpoint as a new run on its dataset, model, "
        "seed and batch shape; steps: the new total.",
    )

    @field_validator("accelerator")
    @classmethod
    def _known_accelerator(cls, accelerator: str) -> str:
        parsed = parse_accelerator(accelerator)  # a ValueError names the accepted forms
        if parsed.kind == "tpu":
            return f"tpu-{parsed.tpu_type}"
        return "gpu" if parsed.kind == "gpu" and parsed.gpus == 1 else accelerator.strip().lower()

    @model_validator(mode="after")
    def _gang_fits_accelerator(self) -> TrainConfig:
        accelerator_resources(self.accelerator, slices=self.slices)  # slices need a TPU: a ValueError says so
        if self.accelerator.startswith("tpu-") and self.replicas != 1:
            raise ValueError(
                f"replicas: a TPU run gets one process per host of each slice; leave replicas at 1 "
                f"(got {self.replicas} for {self.accelerator})"
            )
        return self

    @field_validator("seq_len")
    @classmethod
    def _fits_model(cls, seq_len: int, info: ValidationInfo) -> int:
        model = info.data.get("model")
        if model is not None and seq_len > model.max_seq_len:
            raise ValueError(
                f"seq_len ({seq_len}) is longer than model.max_seq_len ({model.max_seq_len}); "
                "shorten seq_len or raise model.max_seq_len"
            )
        return seq_len

    @field_validator("grad_accum")
    @classmethod
    def _divides_batch(cls, grad_accum: int, info: ValidationInfo) -> int:
        batch_size = info.data.get("batch_size")
        if batch_size is not None and batch_size % grad_accum:
            raise ValueError(f"grad_accum ({grad_accum}) must divide batch_size ({batch_size})")
        return grad_accum

    @property
    def tokens_per_step(self) -> int:
        """Tokens the model predicts in one update: batch_size * seq_len."""
        return self.batch_size * self.seq_len


def read_train_config(path: str | os.PathLike[str]) -> TrainConfig:
    """Read and validate a run's `config.json` (a `TrainConfig` as JSON).

    Raises:
        NotFoundError: there is no file at `path`.
        ConfigError: it does not validate; the message names the file and each bad field.
    """
    if not os.path.isfile(path):
        raise NotFoundError(f"no run config at {path}; write a TrainConfig there as JSON first")
    return parse_config(TrainConfig, read_json(path), source=str(path))
