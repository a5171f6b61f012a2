"""The training run's configuration: model, optimizer, checkpoint, mesh and loop settings, as pydantic models.

These classes are the JSON schema the MCP tools show an agent, so every field says what it does. They
import no JAX: the CLI and the server load them at start-up. A run reads its config from YAML or JSON
through `tradewind.core.load_config` / `parse_config`, which name the file and field of any bad value.

Example:
    config = load_config(TrainConfig, "train.yaml", overrides=["model.d_model=192", "steps=300"])
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from tradewind.core import ConfigError, NotFoundError, read_json_config
from tradewind.core.files import Opener, open_plain
from tradewind.runs.models.base import AttentionChoice, Remat
from tradewind.runs.models.configs import LlamaConfig, ModelConfig

# The projections LoRA may adapt: the Llama family's attention and MLP matrices (`tradewind.trainer.lora`).
LoraTarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class OptimizerConfig(BaseModel):
    """AdamW, Lion or Adafactor; gradient clipping; warmup, then decay."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["adamw", "lion", "adafactor"] = Field(
        "adamw", description="Update rule; 'lion' wants a ~3-10x smaller learning rate."
    )
    learning_rate: float = Field(3e-3, gt=0, le=1e10, description="Peak learning rate, reached after warmup.")
    schedule: Literal["cosine", "linear", "constant"] = Field(
        "cosine", description="Decay after warmup, to learning_rate * min_lr_ratio at the end."
    )
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final learning rate, as a share of the peak.")
    warmup_steps: int = Field(20, ge=0, le=10**9, description="Steps of linear warmup from 0.")
    weight_decay: float = Field(0.1, ge=0, le=10, description="Decoupled weight decay, on matrices only.")
    b1: float = Field(0.9, ge=0, lt=1, description="First-moment decay (AdamW, Lion).")
    b2: float = Field(0.95, ge=0, lt=1, description="Second-moment decay (AdamW; Lion's update mix).")
    grad_clip: float = Field(1.0, ge=0, le=1e6, description="Global L2 norm to clip gradients to; 0: off.")
    bf16_moments: bool = Field(False, description="Store the moments in bfloat16: half the memory, updated in float32.")
    host_state: bool = Field(False, description="Keep the moments in host memory, on the chip only for the update.")


class CheckpointConfig(BaseModel):
    """When checkpoints are saved, and which are kept."""

    model_config = ConfigDict(extra="forbid")

    every_steps: int | None = Field(None, gt=0, le=10**9, description="Save every this many steps; null: at the end.")
    every_minutes: float | None = Field(
        None, gt=0, le=10080, description="Also save this many minutes after the last save."
    )
    keep_last: int = Field(3, gt=0, le=1000, description="Keep the newest this many; delete older ones...")
    keep_every: int | None = Field(None, gt=0, le=10**9, description="... except those at multiples of this step.")
    async_save: bool = Field(True, description="Save in the background while training goes on.")


class MeshConfig(BaseModel):
    """Device mesh: batch over data x fsdp, parameters sharded over fsdp and tensor."""

    model_config = ConfigDict(extra="forbid")

    data: int = Field(-1, ge=-1, le=2**16, description="Data-parallel replicas; -1: the devices left.")
    fsdp: int = Field(1, gt=0, le=2**16, description="Devices sharding parameters and optimizer state (ZeRO-3).")
    tensor: int = Field(1, gt=0, le=2**16, description="Tensor-parallel devices per matrix.")

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


class LoraConfig(BaseModel):
    """LoRA: the base frozen, low-rank adapters trained."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(8, gt=0, le=4096, description="Adapter rank r.")
    alpha: float = Field(16.0, gt=0, le=1e6, description="Scale: alpha / rank.")
    dropout: float = Field(0.0, ge=0, lt=1, description="On adapter inputs.")
    targets: list[LoraTarget] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1, description="Projections."
    )

    @field_validator("targets")
    @classmethod
    def _distinct(cls, targets: list[str]) -> list[str]:
        repeated = sorted({name for name in targets if targets.count(name) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} named more than once")
        return targets

    def count_params(self, model: ModelConfig) -> int:
        """Scalars in the adapters on `model`: `rank * (in + out)` per target and layer (`lora_a` [in, rank],
        `lora_b` [rank, out]), from the config alone (`tradewind.trainer.lora.count_trainable` counts a built model).

        Raises:
            ConfigError: `model` has no projection of some target name (GPT-2 has none); the message names its
                projections.
        """
        shapes = model.projection_shapes()
        missing = [target for target in self.targets if target not in shapes]
        if missing:
            raise ConfigError(
                f"lora.targets: a {model.type} model has no {', '.join(missing)}; its projections are "
                f"{', '.join(sorted(shapes))} (LoRA adapts the Llama family's; set lora to null to train every weight)"
            )
        return model.n_layers * sum(self.rank * sum(shapes[target]) for target in self.targets)


MAX_STEPS = 10**9  # the most updates a run may make, as `steps` or as a token or FLOP budget's

# The TrainConfig field that sets each kind of budget.
BUDGET_FIELDS = {"tokens": "token_budget", "flops": "flop_budget", "time": "time_budget_s", "steps": "steps"}


class Budget(BaseModel):
    """What fixes a run's length (`TrainConfig.budget`): a size of work (tokens, FLOPs), of time, or steps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["tokens", "flops", "time", "steps"] = Field(description="What the budget counts.")
    size: float = Field(description="How many: tokens, FLOPs, seconds or steps.")

    @property
    def field(self) -> str:
        """The `TrainConfig` field that sets this budget."""
        return BUDGET_FIELDS[self.kind]

    @property
    def fixes_work(self) -> bool:
        """Whether the budget is an amount of work (tokens or FLOPs), which a time budget can only cap."""
        return self.kind in ("tokens", "flops")

    def describe(self) -> str:
        """The budget in words for logs and reports: '2,048,000 tokens', '1.2e+12 FLOPs', '60 s', '200 steps'."""
        if self.kind == "flops":
            return f"{self.size:.3g} FLOPs"
        if self.kind == "time":
            return f"{self.size:g} s"
        return f"{int(self.size):,} {self.kind}"


class TrainConfig(BaseModel):
    """One training run: which token cache, which model, which optimizer, how long, on what mesh.

    Where its processes run (backend, accelerator, hosts) is the launch's `tradewind.cluster.Placement`:
    the step is the same program wherever it runs."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(description="The token cache's folder (it needs 'train' and 'val' splits).")
    model: ModelConfig = Field(default_factory=LlamaConfig, description="Architecture and size.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="Optimizer and LR schedule.")
    steps: int = Field(200, gt=0, le=MAX_STEPS, description="Updates, unless a budget is set.")
    token_budget: int | None = Field(None, gt=0, le=10**15, description="Tokens to train; fixes the steps.")
    flop_budget: float | None = Field(None, gt=0, le=1e25, description="Model FLOPs to train, as MFU counts them.")
    time_budget_s: float | None = Field(
        None, gt=0, le=604800, description="Seconds to train; caps a token/flop budget."
    )
    batch_size: int = Field(16, gt=0, le=2**20, description="Global sequences per update.")
    grad_accum: int = Field(1, gt=0, le=2**16, description="Microbatches; divides batch_size.")
    seq_len: int = Field(128, gt=0, le=2**20, description="At most model.max_seq_len.")
    seed: int = Field(0, ge=0, lt=2**32, description="Seeds weights and batch order.")
    z_loss: float = Field(0.0, ge=0, le=1, description="Weight of mean(logsumexp^2), e.g. 1e-4.")
    remat: Remat = Field("none", description="Recompute activations (less memory).")
    remat_blocks: int | None = Field(
        None, gt=0, le=10**4, description="Remat only the first N blocks (unrolled); null: every block."
    )
    attention: AttentionChoice = Field(
        "auto",
        description="auto: cuDNN on GPU, splash on TPU.",
    )
    scan_layers: bool = Field(False, description="One compiled block for all layers.")
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="auto: bfloat16 on GPU/TPU, else float32."
    )
    on_nonfinite: Literal["stop", "skip"] = Field("stop", description="On NaN/inf loss: fail, or drop the update.")
    eval_every: int = Field(50, gt=0, le=10**9, description="Steps between evals.")
    eval_batches: int = Field(4, gt=0, le=10**4, description="Val batches per eval.")
    log_every: int = Field(10, gt=0, le=10**9, description="Steps per metrics row.")
    checkpoint: bool = Field(True, description="Save at the end and per `checkpoints`.")
    checkpoints: CheckpointConfig = Field(default_factory=CheckpointConfig, description="When to save, what to keep.")
    resume: bool = Field(True, description="Restart from its newest checkpoint.")
    init_from: str | None = Field(None, description="Start from HF weights: hf:PATH.")
    mesh: MeshConfig = Field(default_factory=MeshConfig, description="Device mesh for sharding.")
    distributed: DistributedConfig = Field(
        default_factory=DistributedConfig, description="For a gang started by hand (SLURM, a TPU pod's own launcher)."
    )
    tensorboard: bool = Field(True, description="Also write TensorBoard events.")
    wandb_project: str | None = Field(None, description="Also log to this W&B project.")
    peak_flops: float | None = Field(None, gt=0, le=1e18, description="Per device, for MFU; null: looked up.")
    resume_from: str | None = Field(None, description="Continue this run as a new one.")
    lora: LoraConfig | None = Field(None, description="LoRA; null: train all weights.")

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

    @field_validator("init_from")
    @classmethod
    def _a_folder(cls, init_from: str | None) -> str | None:
        """`hf:PATH` is PATH: the prefix says what the folder holds (a Hugging Face model), the only kind read."""
        return None if init_from is None else init_from.removeprefix("hf:")

    @field_validator("lora")
    @classmethod
    def _adapts_the_model(cls, lora: LoraConfig | None, info: ValidationInfo) -> LoraConfig | None:
        model = info.data.get("model")
        if lora is not None and model is not None:
            lora.count_params(model)  # refuses a target the model has not
        return lora

    @field_validator("grad_accum")
    @classmethod
    def _divides_batch(cls, grad_accum: int, info: ValidationInfo) -> int:
        batch_size = info.data.get("batch_size")
        if batch_size is not None and batch_size % grad_accum:
            raise ValueError(f"grad_accum ({grad_accum}) must divide batch_size ({batch_size})")
        return grad_accum

    @model_validator(mode="after")
    def _remat_blocks_unrolled(self) -> TrainConfig:
        if self.remat_blocks is None:
            return self
        if self.remat == "none":
            raise ValueError("remat_blocks: needs remat 'full' or 'save_matmuls' (it says how many blocks recompute)")
        if self.scan_layers:
            raise ValueError("remat_blocks: needs unrolled blocks (scan_layers false); a scanned loop remats all")
        if self.remat_blocks > self.model.n_layers:
            blocks = self.model.n_layers
            raise ValueError(f"remat_blocks ({self.remat_blocks}) is more than the model's blocks ({blocks})")
        return self

    @property
    def recomputed_blocks(self) -> int:
        """How many blocks recompute their activations in the backward pass: every one, or the first
        `remat_blocks`; none without remat."""
        if self.remat == "none":
            return 0
        return self.model.n_layers if self.remat_blocks is None else self.remat_blocks

    @property
    def block_remat(self) -> Remat | tuple[Remat, ...]:
        """What each block keeps for the backward pass, as the model's `decode` takes it: `remat` for every
        block, or with `remat_blocks` that policy for the first blocks and none for the rest."""
        if self.remat_blocks is None:
            return self.remat
        return (self.remat,) * self.remat_blocks + ("none",) * (self.model.n_layers - self.remat_blocks)

    @model_validator(mode="after")
    def _one_work_budget(self) -> TrainConfig:
        if self.token_budget is not None and self.flop_budget is not None:
            raise ValueError("token_budget and flop_budget: set at most one (each fixes the run's work)")
        if self.flop_budget is not None and self.model.vocab_size is None:
            return self  # its steps wait for the dataset's vocabulary (`with_vocabulary`)
        total = self.total_steps
        if total is not None and total > MAX_STEPS:
            raise ValueError(
                f"{self.budget.field}: {self.budget.describe()} is {total:.3g} updates of {self.tokens_per_step:,} "
                f"tokens, more than the {MAX_STEPS:,} a run may make; lower it or raise batch_size or seq_len"
            )
        return self

    @property
    def tokens_per_step(self) -> int:
        """Tokens the model predicts in one update: batch_size * seq_len."""
        return self.batch_size * self.seq_len

    @property
    def budget(self) -> Budget:
        """What fixes the run's length: its token or FLOP budget, else its time budget, else its steps."""
        if self.token_budget is not None:
            return Budget(kind="tokens", size=self.token_budget)
        if self.flop_budget is not None:
            return Budget(kind="flops", size=self.flop_budget)
        if self.time_budget_s is not None:
            return Budget(kind="time", size=self.time_budget_s)
        return Budget(kind="steps", size=self.steps)

    @property
    def total_steps(self) -> int | None:
        """The updates the run's work fixes: `steps`, or as many as its token or FLOP budget takes (the last
        update may go past the budget, never short of it); None for a time budget, whose runs count updates as
        they go (`tradewind.trainer.plan.TimeBudget`). A time cap beside a work budget may stop a run sooner."""
        if self.token_budget is not None:
            return -(-self.token_budget // self.tokens_per_step)  # the ceiling, in exact integers
        if self.flop_budget is not None:
            return math.ceil(self.flop_budget / (self.flops_per_token() * self.tokens_per_step))
        return None if self.time_budget_s is not None else self.steps

    def flops_per_token(self, vocab_size: int | None = None) -> float:
        """Model FLOPs per trained token of this run, forward and backward, attention included (PaLM, app. B).

        A full run: `6 * matmul_params + 12 * n_layers * n_heads * head_dim * seq_len` (`model.flops_per_token`).
        A LoRA run computes no gradient of its frozen weights, only the gradient through them: 4 FLOPs a frozen
        matmul weight (not 6), and 6 an adapter weight.

        Args:
            vocab_size: the tokenizer's, where `model.vocab_size` is null (the output head counts).

        Raises:
            ConfigError: neither says the vocabulary's size.
        """
        vocab_size = self.model.vocab_size or vocab_size
        if vocab_size is None:
            raise ConfigError(
                "model.vocab_size: the FLOPs per token count the output head, and the vocabulary's size is not "
                "known yet (it comes from the dataset's tokenizer when the run is launched)"
            )
        model = self.model.model_copy(update={"vocab_size": vocab_size})
        flops = model.flops_per_token(self.seq_len)
        if self.lora is not None:
            flops += 6.0 * self.lora.count_params(model) - 2.0 * model.matmul_params()
        return flops

    def with_vocabulary(self, vocab_size: int) -> TrainConfig:
        """This config with `model.vocab_size` set to the dataset tokenizer's `vocab_size` where a FLOP budget needs
        it and it is null: the run's saved config then gives every reader the same steps."""
        if self.flop_budget is None or self.model.vocab_size is not None:
            return self
        model = {**self.model.model_dump(), "vocab_size": vocab_size}
        return TrainConfig.model_validate({**self.model_dump(), "model": model})


def with_fields(config: TrainConfig, fields: dict[str, Any]) -> TrainConfig:
    """`config` with `fields` set, validated; a dotted name sets a field of a section (`optimizer.bf16_moments`)."""
    values = config.model_dump()
    for dotted, value in fields.items():
        *sections, name = dotted.split(".")
        inner = values
        for section in sections:
            inner = inner[section]
        inner[name] = value
    return TrainConfig.model_validate(values)


def named_fields(fields: dict[str, Any]) -> str:
    """Dotted `fields` as a person sets them: `optimizer.bf16_moments=true, remat=full and scan_layers=false`."""
    shown = [f"{name}={value if isinstance(value, str) else json.dumps(value)}" for name, value in fields.items()]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def read_train_config(path: str | os.PathLike[str], opener: Opener = open_plain) -> TrainConfig:
    """Read and validate a run's `config.json` (a `TrainConfig` as JSON), opened with `opener`.

    Raises:
        NotFoundError: there is no file at `path`.
        ConfigError: it is not JSON or does not validate; the message names the file and each bad field.
        PathEscapeError: `opener` refused it, as a link that leads outside the workspace.
    """
    if not os.path.lexists(path):  # what is there (a link, a device) is for `opener` to judge
        raise NotFoundError(f"no run config at {path}; write a TrainConfig there as JSON first")
    return read_json_config(TrainConfig, path, opener)
