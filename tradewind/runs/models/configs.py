"""Model configs, one class per architecture, each owning its shape rules, size, FLOPs and Hugging Face mapping.

`ModelConfig` is the union of the architecture classes registered in `ARCHITECTURES`, told apart by `type`
(a preset may set it; absent, it is "llama"; each is the `model_type` of its Hugging Face `config.json`).
Each class knows what only its architecture knows: the MLP width it defaults to, how many parameters and
matmul weights it has, and how it maps to `transformers`: `hf_keys`, the table of its `config.json` keys (the
field each holds, the value when absent), from which both export (`hf_shape`) and import (`from_hf_config`)
are derived, and `hf_weights`, the table of its tensors, which `tradewind.trainer.hf` writes and reads.
Everything that holds for every architecture is written once, in terms of those: the shared fields and
FLOPs per token in `base.py`, the HF tensor conversion in `tradewind.trainer.hf`.

The Llama family is one class and its subclasses, which build the same module: `MistralConfig`, `Qwen2Config`
(biases on the query, key and value projections) and `Qwen3Config` (an RMSNorm over each query and key head,
its own `head_dim`) change only class variables (`qkv_bias`, `qk_norm`, the HF names and defaults), which the
module and the counts read. None implements a sliding window: import caps `max_seq_len` at an active window,
within which full attention is exact, and export writes none (`LlamaConfig._hf_window`).

Imports no JAX: the CLI, the server and the tool schemas load these classes at start-up. The `nnx` module
of an architecture lives beside it (`llama.py`, `gpt2.py`); the config class names it (`module`).

Adding an architecture: its config class here (registered in `ARCHITECTURES`), its module file (or a setting of
an existing module's config), and its test.

Example:
    config = model_config({"preset": "gpt2-small", "vocab_size": 50_257})  # -> GPT2Config
    config.count_params(), config.flops_per_token(seq_len=1024)
"""

from __future__ import annotations

import operator
from dataclasses import replace
from functools import reduce
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
from tradewind.runs.models.base import PRESETS, TYPE_DESCRIPTION, BaseModelConfig, HFKey, HFWeight

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
    """Llama: RMSNorm, rotary position embeddings, grouped-query attention, a SwiGLU MLP, no biases.

    Mistral, Qwen2 and Qwen3 are the same model with settings fixed per architecture (the class variables
    below), and build the same module; `d_head` gives them all a head width other than d_model / n_heads.
    """

    module: ClassVar[str] = "tradewind.trainer.models.llama.Llama"
    hf_architecture: ClassVar[str] = "LlamaForCausalLM"
    hf_fixed: ClassVar[dict[str, Any]] = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}
    # Biases on the query, key and value projections (Qwen2's); an RMSNorm over each query and key head, before
    # the rotation (Qwen3's).
    qkv_bias: ClassVar[bool] = False
    qk_norm: ClassVar[bool] = False
    # The config.json keys that turn a sliding window off, which export writes: Tradewind's attention has none.
    hf_full_attention: ClassVar[dict[str, Any]] = {}
    derived: ClassVar[dict[str, str]] = {"d_ff": "ff_dim", "n_kv_heads": "kv_heads", "d_head": "head_dim"}
    # The rotary keys (`rope_theta`, `rope_parameters`) and the sliding window are `_from_hf_special`'s.
    hf_keys: ClassVar[tuple[HFKey, ...]] = (
        HFKey("vocab_size", "vocab_size"),
        HFKey("d_model", "hidden_size"),
        HFKey("n_layers", "num_hidden_layers"),
        HFKey("n_heads", "num_attention_heads"),
        HFKey("n_kv_heads", "num_key_value_heads", None),
        HFKey("d_head", "head_dim", None),
        HFKey("d_ff", "intermediate_size"),
        HFKey("max_seq_len", "max_position_embeddings", 2048),
        HFKey("norm_eps", "rms_norm_eps", 1e-6),
        # transformers' Llama-family configs untie them unless config.json says otherwise.
        HFKey("tie_embeddings", "tie_word_embeddings", False),
    )

    type: Literal["llama"] = Field("llama", description=TYPE_DESCRIPTION)
    n_kv_heads: int | None = Field(
        None, gt=0, le=1024, description="Key/value heads (llama); must divide n_heads. Null: n_heads."
    )
    rope_theta: float = Field(10000.0, gt=0, le=1e9, description="Rotary embedding base (llama).")
    rope_scaling: Llama3RopeScaling | None = Field(None, description="Llama 3.1 rotary scaling (llama); null: none.")
    d_head: int | None = Field(None, gt=0, le=4096, description="Null: d_model / n_heads.")

    @field_validator("n_heads")
    @classmethod
    def _even_head_size(cls, n_heads: int, info: ValidationInfo) -> int:
        # Checked before `d_head` is read, so also where `d_head` gives the width instead; no released model of
        # these families has an odd d_model / n_heads.
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

    @field_validator("d_head")
    @classmethod
    def _even_own_head_size(cls, d_head: int | None) -> int | None:
        if d_head is not None and d_head % 2:
            raise ValueError(f"d_head ({d_head}) must be even for rotary embeddings")
        return d_head

    @property
    def head_dim(self) -> int:
        """Width of one attention head: `d_head`, or d_model / n_heads when it is None."""
        return self.d_head or self.d_model // self.n_heads

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

    def attention_matmul_params(self) -> int:
        d, q, kv = self.d_model, self.n_heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * d * q + 2 * d * kv  # q and o, k and v

    def mlp_matmul_params(self) -> int:
        return 3 * self.d_model * self.ff_dim  # gate, up and down

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """Each block's projections by module name, `(in, out)`: what LoRA may adapt (`LoraConfig.count_params`)."""
        d, q, kv, ff = self.d_model, self.n_heads * self.head_dim, self.kv_heads * self.head_dim, self.ff_dim
        return {
            "q_proj": (d, q),
            "k_proj": (d, kv),
            "v_proj": (d, kv),
            "o_proj": (q, d),
            "gate_proj": (d, ff),
            "up_proj": (d, ff),
            "down_proj": (ff, d),
        }

    def count_params(self) -> int:
        d, vocab = self.d_model, self.vocab_size or 0
        head = 0 if self.tie_embeddings else d * vocab
        biases = (self.n_heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        qk_norms = 2 * self.head_dim if self.qk_norm else 0
        block = self.block_matmul_params() + biases + qk_norms + 2 * d  # and the two norms' scales
        return vocab * d + self.n_layers * block + d + head

    def hf_shape(self) -> dict[str, Any]:
        rope = {"rope_type": "default"}
        if self.rope_scaling is not None:
            rope = {"rope_type": "llama3", **self.rope_scaling.model_dump()}
        return {
            **super().hf_shape(),
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_theta": self.rope_theta, **rope},
            **self.hf_full_attention,
        }

    @classmethod
    def _from_hf_special(cls, data: dict[str, Any], source: str | Path, values: dict[str, Any]) -> dict[str, Any]:
        """The rotary base and scaling (top-level keys, or `rope_parameters` / `rope_scaling`), and `max_seq_len`
        capped at an active sliding window (`_hf_window`)."""
        rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ConfigError(
                f"{source}: rope_type {rope_type!r} is not supported (only 'default', unscaled rotary, and 'llama3')"
            )
        scaling = None
        if rope_type == "llama3":
            scaling_values = {k: v for k, v in rope.items() if k in Llama3RopeScaling.model_fields}
            scaling = parse_config(
                Llama3RopeScaling, scaling_values, source=f"{source}: rope_parameters of rope_type 'llama3'"
            )
        special = {"rope_theta": data.get("rope_theta") or rope.get("rope_theta", 10000.0), "rope_scaling": scaling}
        window, longest = cls._hf_window(data, values), values["max_seq_len"]
        if window is not None and isinstance(longest, int):
            special["max_seq_len"] = min(longest, window)
        return special

    @classmethod
    def _hf_window(cls, data: dict[str, Any], values: dict[str, Any]) -> int | None:
        """The sliding window some layer of the model `data` describes attends within, or None if none does.

        Tradewind attends to every earlier position; that equals attention within a window of W positions on
        sequences of at most W tokens, so import caps `max_seq_len` at the window.
        """
        return None

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
            if self.qkv_bias:
                weights += [
                    HFWeight(("blocks", i, "attn", name, "bias"), f"{hf}.self_attn.{name}.bias")
                    for name in ("q_proj", "k_proj", "v_proj")
                ]
            if self.qk_norm:
                weights += [
                    HFWeight(("blocks", i, "attn", name, "scale"), f"{hf}.self_attn.{name}.weight")
                    for name in ("q_norm", "k_norm")
                ]
            weights += [
                HFWeight(("blocks", i, "attn_norm", "scale"), f"{hf}.input_layernorm.weight"),
                HFWeight(("blocks", i, "mlp_norm", "scale"), f"{hf}.post_attention_layernorm.weight"),
            ]
        return [*weights, HFWeight(("norm", "scale"), "model.norm.weight"), *self._head_weights("lm_head.weight")]


def _with_defaults(keys: tuple[HFKey, ...], **defaults: Any) -> tuple[HFKey, ...]:
    """The rows of `keys`, with other values for the absent keys of some fields (`field=default`)."""
    return tuple(replace(row, default=defaults[row.field]) if row.field in defaults else row for row in keys)


class MistralConfig(LlamaConfig):
    """Mistral: Llama's model. Its sliding window (`sliding_window`, on every layer) caps `max_seq_len` on import
    (see `_hf_window`); export writes none."""

    hf_architecture: ClassVar[str] = "MistralForCausalLM"
    hf_fixed: ClassVar[dict[str, Any]] = {"hidden_act": "silu"}
    hf_full_attention: ClassVar[dict[str, Any]] = {"sliding_window": None}
    hf_keys: ClassVar[tuple[HFKey, ...]] = _with_defaults(LlamaConfig.hf_keys, max_seq_len=4096 * 32)

    type: Literal["mistral"] = Field("mistral", description=TYPE_DESCRIPTION)

    @classmethod
    def _hf_window(cls, data: dict[str, Any], values: dict[str, Any]) -> int | None:
        return data.get("sliding_window", 4096)


class Qwen2Config(LlamaConfig):
    """Qwen2 and Qwen2.5: Llama's model with biases on the query, key and value projections. Its sliding window
    (`use_sliding_window`, on the layers from `max_window_layers` on, or as `layer_types` says) caps `max_seq_len`
    on import (see `_hf_window`); export writes none."""

    hf_architecture: ClassVar[str] = "Qwen2ForCausalLM"
    hf_fixed: ClassVar[dict[str, Any]] = {"hidden_act": "silu"}
    qkv_bias: ClassVar[bool] = True
    hf_full_attention: ClassVar[dict[str, Any]] = {"use_sliding_window": False, "sliding_window": None}
    hf_keys: ClassVar[tuple[HFKey, ...]] = _with_defaults(LlamaConfig.hf_keys, max_seq_len=32768)

    type: Literal["qwen2"] = Field("qwen2", description=TYPE_DESCRIPTION)

    @classmethod
    def _hf_window(cls, data: dict[str, Any], values: dict[str, Any]) -> int | None:
        window = data.get("sliding_window", 4096)
        if not data.get("use_sliding_window", False) or window is None:
            return None
        if data.get("layer_types"):
            return window if "sliding_attention" in data["layer_types"] else None
        first, layers = data.get("max_window_layers", 28), values["n_layers"]
        return window if isinstance(layers, int) and first < layers else None


class Qwen3Config(Qwen2Config):
    """Qwen3: Qwen2's model with an RMSNorm over each query and key head (before the rotation) in place of the
    projections' biases, and a head width of its own (`head_dim`: 128 when absent)."""

    hf_architecture: ClassVar[str] = "Qwen3ForCausalLM"
    hf_fixed: ClassVar[dict[str, Any]] = {"hidden_act": "silu", "attention_bias": False}
    qkv_bias: ClassVar[bool] = False
    qk_norm: ClassVar[bool] = True
    hf_keys: ClassVar[tuple[HFKey, ...]] = _with_defaults(LlamaConfig.hf_keys, max_seq_len=32768, d_head=128)

    type: Literal["qwen3"] = Field("qwen3", description=TYPE_DESCRIPTION)


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
    hf_keys: ClassVar[tuple[HFKey, ...]] = (
        HFKey("vocab_size", "vocab_size"),
        HFKey("d_model", "n_embd"),
        HFKey("n_layers", "n_layer"),
        HFKey("n_heads", "n_head"),
        HFKey("d_ff", "n_inner", None),
        HFKey("max_seq_len", "n_positions"),
        HFKey("norm_eps", "layer_norm_epsilon", 1e-5),
        HFKey("tie_embeddings", "tie_word_embeddings", True),
    )

    type: Literal["gpt2"] = Field("gpt2", description=TYPE_DESCRIPTION)

    @property
    def ff_dim(self) -> int:
        """`d_ff`, else 4 * d_model."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    def attention_matmul_params(self) -> int:
        return 4 * self.d_model * self.d_model  # qkv and out

    def mlp_matmul_params(self) -> int:
        return 2 * self.d_model * self.ff_dim  # in and out

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """Each block's projections by module name, `(in, out)`; LoRA adapts none of them (its targets are the
        Llama family's)."""
        d = self.d_model
        return {"qkv": (d, 3 * d), "proj": (d, d), "fc": (d, self.ff_dim), "fc_out": (self.ff_dim, d)}

    def count_params(self) -> int:
        d, vocab = self.d_model, self.vocab_size or 0
        head = 0 if self.tie_embeddings else d * vocab
        biases_and_norms = 3 * d + d + self.ff_dim + d + 4 * d  # qkv, out, MLP in, MLP out; two LayerNorms
        blocks = self.n_layers * (self.block_matmul_params() + biases_and_norms)
        return vocab * d + self.max_seq_len * d + blocks + 2 * d + head

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


# Every architecture, by its `type` (Hugging Face's `model_type`): the one place one is registered.
ARCHITECTURES: dict[str, type[LlamaConfig] | type[GPT2Config]] = {
    "llama": LlamaConfig,
    "gpt2": GPT2Config,
    "mistral": MistralConfig,
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
}


def _model_type(data: Any) -> str:
    """The architecture a raw config names: its `type`, else its preset's, else the default."""
    if isinstance(data, dict):
        preset = data.get("preset")
        # A preset that is no string names none (and its type check refuses it): a list is no dict key.
        preset_type = PRESETS.get(preset, {}).get("type") if isinstance(preset, str) else None
        return data.get("type") or preset_type or DEFAULT_TYPE
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
    reduce(operator.or_, (Annotated[config_class, Tag(name)] for name, config_class in ARCHITECTURES.items())),
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
