"""What every architecture's model config shares: the common fields and rules, presets, and the interface
(MLP width, parameter and matmul counts, Hugging Face mapping) that each architecture's class fills in.

An architecture's Hugging Face mapping is two tables: `hf_keys` (its `config.json` keys, each with the field it
holds and its value when absent), from which `hf_shape` (export) and `from_hf_config` (import) are both derived,
and `hf_weights` (its tensors), from which `tradewind.trainer.hf` both writes and reads the weights.

Imports no JAX. The architectures and their union, `ModelConfig`, are in `configs.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from tradewind.core import ConfigError

# Named model shapes; any field given next to `preset` overrides the preset's value. Sizes are for a
# 32k vocabulary (nano and micro are meant for byte-level vocabularies of 258).
PRESETS: dict[str, dict[str, Any]] = {
    "nano": {"d_model": 128, "n_layers": 4, "n_heads": 4, "max_seq_len": 256},
    "micro": {"d_model": 256, "n_layers": 6, "n_heads": 8, "max_seq_len": 512},
    "llama-20m": {"d_model": 384, "n_layers": 8, "n_heads": 6, "n_kv_heads": 2, "max_seq_len": 512},
    "gpt2-small": {"type": "gpt2", "d_model": 768, "n_layers": 12, "n_heads": 12, "max_seq_len": 1024},
    "llama-125m": {"d_model": 768, "n_layers": 12, "n_heads": 12, "max_seq_len": 1024},
    # 128-wide heads, a TPU's matrix unit's width: 64-wide ones ran the 350M a quarter slower on a v5e
    "llama-350m": {"d_model": 1024, "n_layers": 24, "n_heads": 8, "n_kv_heads": 4, "max_seq_len": 2048},
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
    "llama-8b": {
        "d_model": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 8,
        "d_ff": 14336,
        "max_seq_len": 8192,
        "rope_theta": 500000.0,
        "tie_embeddings": False,
    },
}
# What a block keeps for the backward pass while training (`tradewind.trainer.models.layers.REMAT_POLICIES`):
# everything; nothing but its input (recompute it all); or its matmuls' outputs (recompute the rest).
Remat = Literal["none", "full", "save_matmuls"]
BlockRemat = Remat | tuple[Remat, ...]  # one policy for every block, or one per block (`TrainConfig.block_remat`)
# The named scopes (`jax.named_scope`) a training step's ops run under, by the part of the model or step that
# they compute: a TPU profile attributes its time to them (`tradewind.trainer.trace_summary`).
MODEL_PARTS = ("embedding", "attention", "mlp", "norms", "loss", "optimizer")
# How a training step computes causal attention (`tradewind.trainer.models.layers.attend`): the reference einsums
# (half the masked scores skipped); `jax.nn.dot_product_attention` (cuDNN's fused flash kernel on a GPU in
# bfloat16, XLA's otherwise); or Pallas's splash kernel for TPUs (blocks of scores in VMEM, never stored, those
# above the diagonal skipped), compiled, or run by Pallas's interpreter on other platforms (how CPU tests check
# it). Sampling with a key/value cache always uses the reference.
Attention = Literal["reference", "dot_product", "splash", "splash_interpret"]
# A run's choice: 'auto' is dot_product on a GPU in 16-bit (cuDNN's kernel, measured 1.8x faster on an H200),
# splash on a TPU (sequences in whole 128-token blocks), the reference elsewhere (XLA's dot_product computes every
# score: slower). 'splash' off a TPU runs the interpreter: correct, and slow.
AttentionChoice = Literal["auto", "reference", "dot_product", "splash"]
TYPE_DESCRIPTION = "'llama', 'mistral', 'qwen2', 'qwen3' (RMSNorm, rotary, SwiGLU, GQA) or 'gpt2' (GELU)."


@dataclass(frozen=True)
class HFKey:
    """One `config.json` key of an architecture: the config field it holds (export writes the value the model is
    built with, `BaseModelConfig.resolved`), and the value import takes when the file leaves it out (`...`: none,
    the key is required)."""

    field: str
    key: str
    default: Any = ...


@dataclass(frozen=True)
class HFWeight:
    """One tensor of a Hugging Face checkpoint: where it sits in the nnx parameter dict, and its HF name.

    `transpose`: nnx kernels are [in, out]; `torch.nn.Linear` weights are [out, in] (GPT-2's Conv1D is not).
    """

    path: tuple[str | int, ...]
    name: str
    transpose: bool = False


class BaseModelConfig(BaseModel):
    """The fields and rules every decoder-only architecture shares."""

    model_config = ConfigDict(extra="forbid")

    # The `nnx.Module` class that `build_model` builds from this config (imported only then: it needs JAX).
    module: ClassVar[str]
    # The `transformers` class of this architecture, the `config.json` keys it implements only one way, and the
    # table of the keys that hold its fields.
    hf_architecture: ClassVar[str]
    hf_fixed: ClassVar[dict[str, Any]] = {}
    hf_keys: ClassVar[tuple[HFKey, ...]]
    # Fields whose None stands for a derived value: the property that gives the value the model is built with.
    derived: ClassVar[dict[str, str]] = {"d_ff": "ff_dim"}

    type: str = Field(description=TYPE_DESCRIPTION)  # each architecture narrows it to its own name

    preset: str | None = Field(
        None,
        description=f"Named shape ({', '.join(PRESETS)}); fields set beside it override it.",
    )
    vocab_size: int | None = Field(
        None, gt=0, le=2**20, description="Null: the dataset tokenizer's; if set, at least that."
    )
    d_model: int = Field(128, gt=0, le=2**16, description="Width of the residual stream.")
    n_layers: int = Field(4, gt=0, le=1024, description="Transformer blocks.")
    n_heads: int = Field(4, gt=0, le=1024, description="Query heads per block; must divide d_model.")
    d_ff: int | None = Field(
        None, gt=0, le=2**18, description="MLP width; null: 8/3 d_model rounded up to 32 (llama), 4 d_model (gpt2)."
    )
    max_seq_len: int = Field(256, gt=0, le=2**20, description="Longest sequence the model accepts.")
    norm_eps: float = Field(1e-6, gt=0, le=1, description="Epsilon of the RMSNorm / LayerNorm.")
    tie_embeddings: bool = Field(True, description="Use the input embedding as the output projection.")
    init_std: float = Field(0.02, gt=0, le=1, description="Standard deviation of the weight initialisation.")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        # A preset that is no string is left to the field's type check, which names it (a list is no dict key).
        if isinstance(data, dict) and isinstance(data.get("preset"), str):
            name = data["preset"]
            if name not in PRESETS:
                raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
            data = {**PRESETS[name], **data}
        return data

    @field_validator("n_heads")
    @classmethod
    def _heads_divide_width(cls, n_heads: int, info: ValidationInfo) -> int:
        d_model = info.data.get("d_model")
        if d_model is not None and d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        return n_heads

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads per block."""
        return self.n_heads

    @property
    def ff_dim(self) -> int:
        """The MLP hidden width."""
        raise NotImplementedError

    def count_params(self) -> int:
        """Trainable parameters (equal to `count_params` of the built model); needs `vocab_size`."""
        raise NotImplementedError

    def attention_matmul_params(self) -> int:
        """Weights of one block's attention projections."""
        raise NotImplementedError

    def mlp_matmul_params(self) -> int:
        """Weights of one block's MLP."""
        raise NotImplementedError

    def block_matmul_params(self) -> int:
        """Weights of one block's matrix multiplies (its projections and MLP)."""
        return self.attention_matmul_params() + self.mlp_matmul_params()

    def resolved(self, name: str) -> Any:
        """The value of field `name` that the model is built with (a None `d_ff` is the MLP width it derives)."""
        return getattr(self, self.derived.get(name, name))

    def matmul_params(self) -> int:
        """Weights used in matrix multiplies (every block's, and the output head's); needs `vocab_size`."""
        return self.n_layers * self.block_matmul_params() + self.d_model * (self.vocab_size or 0)

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per trained token, forward and backward, at sequence length `seq_len` (PaLM, app. B).

        `6 * matmul_params + 12 * n_layers * n_heads * head_dim * seq_len`: the second term is the attention score
        and value products, not halved for the causal mask.
        """
        return sum(self.flops_by_part(seq_len).values())

    def flops_by_part(self, seq_len: int) -> dict[str, float]:
        """`flops_per_token` by the part of the model that computes it, named as the steps' scopes are
        (`MODEL_PARTS`): attention (its projections, and the score and value products), mlp, and loss (the
        output head)."""
        return {
            "attention": 6.0 * self.n_layers * self.attention_matmul_params() + self.attention_product_flops(seq_len),
            "mlp": 6.0 * self.n_layers * self.mlp_matmul_params(),
            "loss": 6.0 * self.d_model * (self.vocab_size or 0),
        }

    def attention_product_flops(self, seq_len: int) -> float:
        """The attention score and value products' FLOPs per token, forward and backward, not halved for the
        causal mask (as MFU counts them)."""
        return 12.0 * self.n_layers * self.n_heads * self.head_dim * seq_len

    def hf_config(self) -> dict[str, Any]:
        """This model's `config.json` for `transformers`."""
        return {
            "architectures": [self.hf_architecture],
            "model_type": self.type,
            **self.hf_shape(),
            **self.hf_fixed,
            "initializer_range": self.init_std,
            "torch_dtype": "float32",
        }

    def hf_shape(self) -> dict[str, Any]:
        """The `config.json` keys of this model's fields (`hf_keys`), in `transformers`' names."""
        return {row.key: self.resolved(row.field) for row in self.hf_keys}

    @classmethod
    def from_hf_config(cls, data: dict[str, Any], source: str | Path) -> BaseModelConfig:
        """The config an HF `config.json` describes (`data`, read from `source`); refuses what it cannot build.

        Raises:
            ConfigError: a required key is missing, a value is out of range, or the file asks for something this
                architecture does not implement; the message names `source` and the key.
        """
        cls._check_fixed(data, source)
        values = {}
        for row in cls.hf_keys:
            if row.key not in data and row.default is ...:
                raise ConfigError(f"{source}: no {row.key!r}")
            values[row.field] = data.get(row.key, row.default)
        values |= cls._from_hf_special(data, source, values)
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            keys = {row.field: row.key for row in cls.hf_keys}  # name each problem by the file's key
            problems = [
                f"{keys.get(item['loc'][0], item['loc'][0]) if item['loc'] else '(top level)'}: {item['msg']}"
                for item in error.errors()
            ]
            raise ConfigError(f"{source}: {'; '.join(problems)}") from None

    @classmethod
    def _from_hf_special(cls, data: dict[str, Any], source: str | Path, values: dict[str, Any]) -> dict[str, Any]:
        """Fields that the `config.json` keys of `hf_keys` (read into `values`) do not give one to one."""
        return {}

    def hf_weights(self) -> list[HFWeight]:
        """Every tensor of the HF checkpoint, with its place in the nnx parameter dict."""
        raise NotImplementedError

    @classmethod
    def _check_fixed(cls, data: dict[str, Any], source: str | Path) -> None:
        """Refuse an HF config whose `hf_fixed` keys ask for another variant than this architecture's."""
        for key, supported in cls.hf_fixed.items():
            if data.get(key, supported) != supported:
                raise ConfigError(f"{source}: {key} is {data[key]!r}; Tradewind implements only {supported!r}")

    def _head_weights(self, name: str) -> list[HFWeight]:
        """The untied output projection's tensor, if there is one."""
        return [] if self.tie_embeddings else [HFWeight(("lm_head", "kernel"), name, transpose=True)]
