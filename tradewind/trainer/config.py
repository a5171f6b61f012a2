"""The training run's configuration: model, optimizer and loop settings, as pydantic models.

These classes are the JSON schema the MCP tools show an agent, so every field says what it does. They
import no JAX: the CLI and the server load them at start-up. A run reads its config from YAML or JSON
through `tradewind.core.load_config` / `parse_config`, which name the file and field of any bad value.

Example:
    config = load_config(TrainConfig, "train.yaml", overrides=["model.d_model=192", "steps=300"])
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tradewind.core import NotFoundError, parse_config, read_json


class ModelConfig(BaseModel):
    """The shape of a decoder-only language model; `type` picks the architecture from the model registry."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["llama"] = Field(
        "llama",
        description="Architecture: 'llama' (RMSNorm, rotary position embeddings, SwiGLU MLP, pre-norm blocks).",
    )
    vocab_size: int | None = Field(
        None,
        gt=0,
        description="Vocabulary size; null takes it from the dataset's tokenizer. If set, at least the tokenizer's.",
    )
    d_model: int = Field(128, gt=0, description="Width of the residual stream (embedding size).")
    n_layers: int = Field(4, gt=0, description="Number of transformer blocks.")
    n_heads: int = Field(4, gt=0, description="Attention heads per block; must divide d_model into an even head size.")
    d_ff: int | None = Field(
        None,
        gt=0,
        description="Hidden width of the SwiGLU MLP; null means about 8/3 of d_model, rounded up to a multiple of 32.",
    )
    max_seq_len: int = Field(256, gt=0, description="Longest sequence the model accepts, in tokens.")
    rope_theta: float = Field(10000.0, gt=0, description="Base of the rotary position embedding frequencies.")
    tie_embeddings: bool = Field(
        True, description="Reuse the input embedding matrix as the output projection (fewer parameters)."
    )
    init_std: float = Field(0.02, gt=0, description="Standard deviation of the normal weight initialisation.")

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

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_heads

    @property
    def ff_dim(self) -> int:
        """The MLP hidden width: `d_ff`, or 8/3 of `d_model` rounded up to a multiple of 32."""
        if self.d_ff is not None:
            return self.d_ff
        return 32 * -(-8 * self.d_model // (3 * 32))  # ceil(8/3 * d_model / 32) in integers


class OptimizerConfig(BaseModel):
    """AdamW with global-norm gradient clipping and a warmup-then-cosine learning-rate schedule."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float = Field(3e-3, gt=0, description="Peak learning rate, reached at the end of warmup.")
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="The cosine decay ends at learning_rate * min_lr_ratio on the last step."
    )
    warmup_steps: int = Field(20, ge=0, description="Steps of linear warmup from 0 to learning_rate.")
    weight_decay: float = Field(
        0.1, ge=0, description="Decoupled (AdamW) weight decay; applied to matrices, not to norm scales."
    )
    b1: float = Field(0.9, ge=0, lt=1, description="Adam decay rate of the first moment.")
    b2: float = Field(0.95, ge=0, lt=1, description="Adam decay rate of the second moment.")
    grad_clip: float = Field(1.0, ge=0, description="Clip gradients to this global L2 norm; 0 turns clipping off.")


class TrainConfig(BaseModel):
    """One training run: which token cache, which model, which optimizer, and how long."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(description="Folder of the token cache to train on (it needs 'train' and 'val' splits).")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model architecture and size.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="Optimizer and LR schedule.")
    steps: int = Field(200, gt=0, description="Number of optimizer updates.")
    batch_size: int = Field(16, gt=0, description="Sequences per update.")
    seq_len: int = Field(128, gt=0, description="Tokens per training sequence; at most model.max_seq_len.")
    seed: int = Field(0, ge=0, description="Seed for weight initialisation and for the order of training batches.")
    eval_every: int = Field(
        50,
        gt=0,
        description="Evaluate on the val split every this many steps, and before the first and after the last.",
    )
    eval_batches: int = Field(4, gt=0, description="Val batches averaged per evaluation (the same batches each time).")
    log_every: int = Field(10, gt=0, description="Write a metrics row and a log line every this many steps.")
    checkpoint: bool = Field(True, description="Save the final parameters and optimizer state with orbax.")

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
