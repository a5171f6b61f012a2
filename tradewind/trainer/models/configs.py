"""Model configs, one class per architecture, each owning its shape rules, size, FLOPs and Hugging Face mapping.

`ModelConfig` is the union of the architecture classes, told apart by `type` (a preset may set it; absent,
it is "llama"). Each class knows what only its architecture knows: the MLP width it defaults to, how many
parameters and matmul weights it has, and how it maps to a `transformers` `config.json` and tensor names.
Everything that holds for every architecture is written once, in terms of those: the shared fields and
FLOPs per token in `base.py`, the HF tensor conversion in `tradewind.trainer.hf`.

Imports no JAX: the CLI, the server and the tool schemas load these classes at start-up. The `nnx` module
of an architecture lives beside it (`llama.py`, `gpt2.py`); the config class names it (`module`).

Adding an architecture: its config class here (and in `ModelConfig`), its module file, and its test.

Example:
    config = model_config({"preset": "gpt2-small", "vocab_size": 50_257})  # -> GPT2Config
    config.count_params(), config.flops_per_token(seq_len=1024)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from tradewind.core import ConfigError, parse_config
from tradewind.trainer.models.base import PRESETS, TYPE_DESCRIPTION, BaseModelConfig, HFWeight, hf_key

DEFAULT_TYPE = "llama"


class Llama3RopeScaling(BaseModel):
    """Llama 3.1's rotary scaling (`rope_type: llama3`), which stretches a model trained on
    `original_max_position_embeddings` tokens to longer sequences: rotary frequencies whose wavelength is longer
    than that context / `low_freq_factor` are divided by `factor`, those shorter than it / `high_freq_factor` are
    kept, and those between are blended from the two."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # frozen: hashable, so a module may hold it

    factor: float = Field(gt=0, le=1e6, description="What the low frequencies are divided by.")
    low_freq_factor: float = Field(1.0, gt=0, le=1e6)
    high_freq_factor: float = Field(4.0, gt=0, le=1e6)
    original_max_position_embeddings: int = Field(8192, gt=0, le=10_000_000)

    @model_validator(mode="after")
    def _high_above_low(self) -> Llama3RopeScaling:
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor ({self.low_freq_factor})"
            )
        return self


class LlamaConfig(BaseModelConfig):
    """Llama: RMSNorm, rotary position embeddings, grouped-query attention, a SwiGLU MLP, no biases."""

    module: ClassVar[str] = "tradewind.trainer.models.llama.Llama"
    hf_architecture: ClassVar[str] = "LlamaForCausalLM"
    hf_fixed: ClassVar[dict[str, Any]] = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}

    type: Literal["llama"] = Field("llama", description=TYPE_DESCRIPTION)
    n_kv_heads: int | None = Field(
        None, gt=0, le=1024, description="Key/value heads (llama); must divide n_heads. Null: n_heads."
    )
    rope_theta: float = Field(10000.0, gt=0, le=1e9, description="Rotary embedding base (llama).")
    rope_scaling: Llama3RopeScaling | None = Field(None, description="Llama 3.1 rotary scaling (llama); null: none.")

    @field_validator("n_heads")
    @classmethod
    def _even_head_size(cls, n_heads: int, info: ValidationInfo) -> int:
        d_model = info.data.get("d_model")
        if d_model is not None and (d_model // n_heads) % 2:
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
        return n_kv_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: `n_kv_heads`, or `n_heads` when it is None."""
        return self.n_kv_heads or self.n_heads

    @property
    def ff_dim(self) -> int:
        """`d_ff`, else 8/3 of d_model rounded up to a multiple of 32 (SwiGLU's three matrices cost what
        GPT-2's two at 4x do)."""
        if self.d_ff is not None:
            return self.d_ff
        return 32 * -(-8 * self.d_model // (3 * 32))  # ceil(8/3 * d_model / 32) in integers

    def block_matmul_params(self) -> int:
        d, kv = self.d_model, self.kv_heads * self.head_dim
        return 2 * d * d + 2 * d * kv + 3 * d * self.ff_dim  # q and o, k and v, gate up and down

    def count_params(self) -> int:
        d, vocab = self.d_model, self.vocab_size or 0
        head = 0 if self.tie_embeddings else d * vocab
        return vocab * d + self.n_layers * (self.block_matmul_params() + 2 * d) + d + head

    def hf_shape(self) -> dict[str, Any]:
        return {
            "hidden_size": self.d_model,
            "intermediate_size": self.ff_dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_seq_len,
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_theta": self.rope_theta, **self._rope_kind()},
        }

    def _rope_kind(self) -> dict[str, Any]:
        if self.rope_scaling is None:
            return {"rope_type": "default"}
        return {"rope_type": "llama3", **self.rope_scaling.model_dump()}

    @classmethod
    def from_hf_config(cls, data: dict[str, Any], source: str | Path) -> LlamaConfig:
        cls._check_fixed(data, source)
        rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ConfigError(
                f"{source}: rope_type {rope_type!r} is not supported (only 'default', unscaled rotary, and 'llama3')"
            )
        scaling = None
        if rope_type == "llama3":
            values = {k: v for k, v in rope.items() if k in Llama3RopeScaling.model_fields}
            scaling = parse_config(Llama3RopeScaling, values, source=f"{source}: rope_parameters of rope_type 'llama3'")
        d_model, n_heads = hf_key(data, "hidden_size", source), hf_key(data, "num_attention_heads", source)
        if data.get("head_dim", d_model // n_heads) * n_heads != d_model:
            raise ConfigError(f"{source}: head_dim {data['head_dim']} is not hidden_size / num_attention_heads")
        return cls(
            vocab_size=hf_key(data, "vocab_size", source),
            d_model=d_model,
            n_layers=hf_key(data, "num_hidden_layers", source),
            n_heads=n_heads,
            n_kv_heads=data.get("num_key_value_heads"),
            d_ff=hf_key(data, "intermediate_size", source),
            max_seq_len=data.get("max_position_embeddings", 2048),
            rope_theta=data.get("rope_theta") or rope.get("rope_theta", 10000.0),
            rope_scaling=scaling,
            norm_eps=data.get("rms_norm_eps", 1e-6),
            # transformers' LlamaConfig unties them unless config.json says otherwise.
            tie_embeddings=data.get("tie_word_embeddings", False),
        )

    def hf_weights(self) -> list[HFWeight]:
        weights = [HFWeight(("embed", "embedding"), "model.embed_tokens.weight")]
        for i in range(self.n_layers):
            hf = f"model.layers.{i}"
            for part, hf_part, names in (
                ("attn", "self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
                ("mlp", "mlp", ("gate_proj", "up_proj", "down_proj")),
            ):
                weights += [
                    HFWeight(("blocks", i, part, name, "kernel"), f"{hf}.{hf_part}.{name}.weight", transpose=True)
                    for name in names
                ]
            weights += [
                HFWeight(("blocks", i, "attn_norm", "scale"), f"{hf}.input_layernorm.weight"),
                HFWeight(("blocks", i, "mlp_norm", "scale"), f"{hf}.post_attention_layernorm.weight"),
            ]
        return [*weights, HFWeight(("norm", "scale"), "model.norm.weight"), *self._head_weights("lm_head.weight")]


class GPT2Config(BaseModelConfig):
    """GPT-2: LayerNorm, learned position embeddings, a GELU (tanh) MLP, biases, multi-head attention."""

    module: ClassVar[str] = "tradewind.trainer.models.gpt2.GPT2"
    hf_architecture: ClassVar[str] = "GPT2LMHeadModel"
    hf_fixed: ClassVar[dict[str, Any]] = {
        "activation_function": "gelu_new",
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
    }

    type: Literal["gpt2"] = Field("gpt2", description=TYPE_DESCRIPTION)

    @property
    def ff_dim(self) -> int:
        """`d_ff`, else 4 * d_model."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    def block_matmul_params(self) -> int:
        d = self.d_model
        return 3 * d * d + d * d + 2 * d * self.ff_dim  # qkv, out, MLP in and out

    def count_params(self) -> int:
        d, vocab = self.d_model, self.vocab_size or 0
        head = 0 if self.tie_embeddings else d * vocab
        biases_and_norms = 3 * d + d + self.ff_dim + d + 4 * d  # qkv, out, MLP in, MLP out; two LayerNorms
        blocks = self.n_layers * (self.block_matmul_params() + biases_and_norms)
        return vocab * d + self.max_seq_len * d + blocks + 2 * d + head

    def hf_shape(self) -> dict[str, Any]:
        return {
            "n_embd": self.d_model,
            "n_inner": self.ff_dim,
            "n_layer": self.n_layers,
            "n_head": self.n_heads,
            "n_positions": self.max_seq_len,
            "layer_norm_epsilon": self.norm_eps,
        }

    @classmethod
    def from_hf_config(cls, data: dict[str, Any], source: str | Path) -> GPT2Config:
        cls._check_fixed(data, source)
        return cls(
            vocab_size=hf_key(data, "vocab_size", source),
            d_model=hf_key(data, "n_embd", source),
            n_layers=hf_key(data, "n_layer", source),
            n_heads=hf_key(data, "n_head", source),
            d_ff=data.get("n_inner"),
            max_seq_len=hf_key(data, "n_positions", source),
            norm_eps=data.get("layer_norm_epsilon", 1e-5),
            tie_embeddings=data.get("tie_word_embeddings", True),
        )

    def hf_weights(self) -> list[HFWeight]:
        weights = [HFWeight(("wte", "embedding"), "transformer.wte.weight")]
        weights.append(HFWeight(("wpe", "embedding"), "transformer.wpe.weight"))
        # GPT-2's Conv1D keeps weights as [in, out], like nnx kernels: nothing is transposed.
        for i in range(self.n_layers):
            hf = f"transformer.h.{i}"
            for ours, theirs in (
                (("ln_1",), "ln_1"),
                (("attn", "qkv"), "attn.c_attn"),
                (("attn", "proj"), "attn.c_proj"),
                (("ln_2",), "ln_2"),
                (("fc",), "mlp.c_fc"),
                (("fc_out",), "mlp.c_proj"),
            ):
                weight = "scale" if theirs.startswith("ln") else "kernel"
                weights.append(HFWeight(("blocks", i, *ours, weight), f"{hf}.{theirs}.weight"))
                weights.append(HFWeight(("blocks", i, *ours, "bias"), f"{hf}.{theirs}.bias"))
        weights += [
            HFWeight(("ln_f", "scale"), "transformer.ln_f.weight"),
            HFWeight(("ln_f", "bias"), "transformer.ln_f.bias"),
        ]
        return [*weights, *self._head_weights("lm_head.weight")]


ARCHITECTURES: dict[str, type[LlamaConfig] | type[GPT2Config]] = {"llama": LlamaConfig, "gpt2": GPT2Config}


def _model_type(data: Any) -> str:
    """The architecture a raw config names: its `type`, else its preset's, else the default."""
    if isinstance(data, dict):
        return data.get("type") or PRESETS.get(data.get("preset") or "", {}).get("type") or DEFAULT_TYPE
    return getattr(data, "type", DEFAULT_TYPE)


def _listed_schema() -> dict[str, Any]:
    """One object schema with every architecture's fields: what tool and config schemas show.

    A `oneOf` per architecture would repeat the shared fields in every listing; validation still goes by
    `type` to the architecture's own class.
    """
    properties: dict[str, Any] = {
        "type": {
            "type": "string",
            "enum": list(ARCHITECTURES),
            "default": DEFAULT_TYPE,
            "description": TYPE_DESCRIPTION,
        }
    }
    for config_class in ARCHITECTURES.values():
        schema = config_class.model_json_schema()
        for name, prop in schema["properties"].items():
            properties.setdefault(name, _inlined(prop, schema.get("$defs", {})))
    return {
        "type": "object",
        "title": "ModelConfig",
        "description": "The shape of a decoder-only language model.",
        "properties": properties,
        "additionalProperties": False,
    }


def _inlined(schema: Any, defs: dict[str, Any]) -> Any:
    """`schema` with each reference into `defs` (a nested model's schema) replaced by what it refers to: the
    merged schema is embedded in others, where a `$ref` would point into their `$defs` instead."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return _inlined(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
        return {key: _inlined(value, defs) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_inlined(item, defs) for item in schema]
    return schema


def _without_tag(data: Any, validate: ValidatorFunctionWrapHandler) -> BaseModelConfig:
    """Validate, naming a bad field `model.d_model` rather than pydantic's `model.llama.d_model`, and an
    unknown `type` in words."""
    try:
        return validate(data)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            kind, context = item["type"], item.get("ctx") or {}
            if kind == "union_tag_invalid":
                wording = "type '{tag}' is not a model type; choose one of {expected_tags}"
                kind = PydanticCustomError(kind, wording, context)
            problems.append({"type": kind, "loc": item["loc"][1:], "input": item["input"], "ctx": context})
        raise ValidationError.from_exception_data(error.title, problems) from None


ModelConfig = Annotated[
    Annotated[LlamaConfig, Tag("llama")] | Annotated[GPT2Config, Tag("gpt2")],
    Discriminator(_model_type),
    WrapValidator(_without_tag),
    WithJsonSchema(_listed_schema()),
]
_MODEL_CONFIG = TypeAdapter(ModelConfig)


def model_config(data: dict[str, Any] | None = None, **fields: Any) -> LlamaConfig | GPT2Config:
    """Validate a model config of any architecture from a dict and/or keyword fields (`type` picks the class).

    Example:
        model_config(preset="gpt2-small", vocab_size=50_257)  # -> GPT2Config
    """
    return _MODEL_CONFIG.validate_python({**(data or {}), **fields})
