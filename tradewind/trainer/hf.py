"""Hugging Face interop: a Llama run as `config.json` + `model.safetensors` + tokenizer files, and back.

The export loads in `transformers` (`LlamaForCausalLM`, `AutoTokenizer`) without Tradewind installed. The
safetensors file is written and read here directly (an 8-byte header length, a JSON header of names,
dtypes, shapes and byte offsets, then the raw little-endian float32 data), so neither `safetensors` nor
`torch` is needed.

Weight names follow `LlamaForCausalLM`: nnx kernels are [in, out] and HF weights [out, in], so matrices
are transposed; rotary embeddings already use HF's half-split layout, so no permutation is needed.

Weights are only ever loaded into the model their `config.json` describes: `model_for_init_from` gives a
run that model (keeping what the user set only where it agrees), and `check_matches_hf` refuses any
other before training starts.

    tradewind export RUN --format hf --out DIR        (see `tradewind.trainer.cli`)

Example:
    export_hf(Path("runs/r1"), Path("exports/r1"))
    model = model_for_init_from(request.model, request.model.model_fields_set, Path("exports/r1"))  # launcher
    check_matches_hf(model, Path("exports/r1"))  # trainer, before loading
    _, params = load_hf_params(Path("exports/r1"))  # a pure dict for `setup_training`
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tradewind.core import ConfigError, NotFoundError, atomic_write_json
from tradewind.data import Tokenizer, TokenizerInfo, load_tokenizer, write_hf_tokenizer_files
from tradewind.trainer.config import PRESETS, ModelConfig


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Write float32 `tensors` as a safetensors file."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    blobs = []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for blob in blobs:
            file.write(blob)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Read a safetensors file of F32, F16 or BF16 tensors as float32 arrays."""
    raw = Path(path).read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    base = 8 + size
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        chunk = raw[base + start : base + end]
        if info["dtype"] == "F32":
            array = np.frombuffer(chunk, "<f4")
        elif info["dtype"] == "F16":
            array = np.frombuffer(chunk, "<f2").astype(np.float32)
        elif info["dtype"] == "BF16":
            array = (np.frombuffer(chunk, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ConfigError(f"{path}: tensor {name} has dtype {info['dtype']}; only F32, F16 and BF16 are read")
        out[name] = array.reshape(info["shape"]).astype(np.float32)
    return out


def hf_config(config: ModelConfig) -> dict[str, Any]:
    """`config.json` of `LlamaForCausalLM` for a Llama `ModelConfig`."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.ff_dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": config.init_std,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": None,
    }


# config.json keys that Tradewind's Llama has no switch for, with the one value it implements.
_FIXED_KEYS = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}

# The `ModelConfig` fields that a Llama config.json decides; the others (`init_std`, `preset`) are Tradewind's.
_HF_FIELDS = (
    "type",
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "d_ff",
    "max_seq_len",
    "rope_theta",
    "norm_eps",
    "tie_embeddings",
)


def model_config_from_hf(data: dict[str, Any], source: str | Path = "config.json") -> ModelConfig:
    """The Llama `ModelConfig` that an HF `config.json` describes; missing keys take `LlamaConfig`'s defaults.

    Raises:
        ConfigError: not a Llama, a shape key is missing, or the config asks for something Tradewind's
            Llama does not implement (another activation, biases, rotary scaling, a head_dim of its own);
            the message names `source` and the key.
    """

    def need(key: str) -> Any:
        if key not in data:
            raise ConfigError(f"{source}: no {key!r}")
        return data[key]

    if data.get("model_type") != "llama":
        raise ConfigError(f"{source}: model_type {data.get('model_type')!r} is not 'llama'")
    for key, supported in _FIXED_KEYS.items():
        if data.get(key, supported) != supported:
            raise ConfigError(f"{source}: {key} is {data[key]!r}; Tradewind's Llama implements only {supported!r}")
    rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"{source}: rope_type {rope_type!r} is not supported (only 'default', unscaled rotary)")
    d_model, n_heads = need("hidden_size"), need("num_attention_heads")
    if data.get("head_dim", d_model // n_heads) * n_heads != d_model:
        raise ConfigError(f"{source}: head_dim {data['head_dim']} is not hidden_size / num_attention_heads")
    return ModelConfig(
        type="llama",
        vocab_size=need("vocab_size"),
        d_model=d_model,
        n_layers=need("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=data.get("num_key_value_heads"),
        d_ff=need("intermediate_size"),
        max_seq_len=data.get("max_position_embeddings", 2048),
        rope_theta=data.get("rope_theta") or rope.get("rope_theta", 10000.0),
        norm_eps=data.get("rms_norm_eps", 1e-6),
        # transformers' LlamaConfig unties them unless config.json says otherwise.
        tie_embeddings=data.get("tie_word_embeddings", False),
    )


def read_hf_config(directory: Path) -> ModelConfig:
    """The `ModelConfig` of HF folder `directory`'s `config.json` (see `model_config_from_hf`).

    Raises:
        NotFoundError: no `config.json`.
        ConfigError: as `model_config_from_hf`.
    """
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise NotFoundError(f"init_from: {directory} has no config.json")
    return model_config_from_hf(json.loads(path.read_text(encoding="utf-8")), source=path)


def model_for_init_from(model: ModelConfig, explicit: Iterable[str], directory: Path) -> ModelConfig:
    """The model config of a run that starts from HF folder `directory`: the one its `config.json` describes.

    Call it where the user's request is still at hand, since only it tells a field the user chose from a
    default. A field the user set is kept when it agrees with the folder (a shorter `max_seq_len` agrees:
    rotary positions have no weights); `init_std` is the user's, since every weight is loaded anyway.

    Args:
        model: the requested model config.
        explicit: the model fields the user set (e.g. `request.model.model_fields_set`); `preset` is ignored,
            the fields it filled in count as set.
        directory: the HF folder of `init_from`.

    Raises:
        ConfigError: a field the user set differs from the folder's; the message names each, with both
            values, the file and what to change.
        NotFoundError: no `config.json`.
    """
    theirs = read_hf_config(directory)
    requested = theirs.model_copy(update={name: getattr(model, name) for name in explicit if name != "preset"})
    mismatches = _mismatches(requested, theirs)
    if mismatches:
        preset_fields = PRESETS.get(model.preset or "", {})
        reasons = []
        for name, values in mismatches.items():
            remove = f"model.{name}" + (" and model.preset" if name in preset_fields else "")
            value = f"at most {values[1]!r}" if name == "max_seq_len" else repr(values[1])
            reasons.append(f"{_describe(name, values, directory)}: remove {remove} or set it to {value}")
        raise ConfigError("init_from: " + "; ".join(reasons))
    return requested


def check_matches_hf(model: ModelConfig, directory: Path) -> None:
    """Refuse to load HF folder `directory`'s weights into a model other than the one its `config.json` describes.

    The trainer calls it before loading the weights, so that a run config written without
    `model_for_init_from` cannot train silently with other rotary or norm settings than the weights had.
    A `vocab_size` of None is not compared (it comes from the dataset; the weights' shapes are checked
    when they load).

    Raises:
        ConfigError: naming every field that differs, with both values.
        NotFoundError: no `config.json`.
    """
    mismatches = _mismatches(model, read_hf_config(directory))
    if mismatches:
        reasons = [_describe(name, values, directory) for name, values in mismatches.items()]
        raise ConfigError(
            f"init_from: {'; '.join(reasons)}; take the folder's values (launch_training does for the model "
            f"fields it is not given)"
        )


def _mismatches(ours: ModelConfig, theirs: ModelConfig) -> dict[str, tuple[Any, Any]]:
    """`{field: (ours, theirs)}` for each of `_HF_FIELDS` in which `ours` is not the model `theirs` describes."""
    found = {}
    for name in _HF_FIELDS:
        mine, folder = _effective(ours, name), _effective(theirs, name)
        # An unset vocab_size comes from the dataset later (the embedding's shape is checked on loading);
        # a shorter max_seq_len only means shorter windows, as rotary positions have no weights.
        if (name == "vocab_size" and mine is None) or (name == "max_seq_len" and mine <= folder):
            continue
        if mine != folder:
            found[name] = (mine, folder)
    return found


def _effective(config: ModelConfig, name: str) -> Any:
    """The value of field `name` that the model is built with (None n_kv_heads and d_ff mean derived ones)."""
    if name == "n_kv_heads":
        return config.kv_heads
    if name == "d_ff":
        return config.ff_dim
    return getattr(config, name)


def _describe(name: str, values: tuple[Any, Any], directory: Path) -> str:
    ours, folder = values
    return f"model.{name} is {ours!r} but {Path(directory) / 'config.json'} has {folder!r}"


_LAYER = {
    ("attn", "q_proj"): "self_attn.q_proj",
    ("attn", "k_proj"): "self_attn.k_proj",
    ("attn", "v_proj"): "self_attn.v_proj",
    ("attn", "o_proj"): "self_attn.o_proj",
    ("mlp", "gate_proj"): "mlp.gate_proj",
    ("mlp", "up_proj"): "mlp.up_proj",
    ("mlp", "down_proj"): "mlp.down_proj",
}


def to_hf_tensors(params: dict[str, Any], config: ModelConfig) -> dict[str, np.ndarray]:
    """HF-named tensors from a Llama pure parameter dict (`nnx.to_pure_dict`)."""
    tensors = {"model.embed_tokens.weight": np.asarray(params["embed"]["embedding"])}
    for i in range(config.n_layers):
        block = params["blocks"][i]
        for (part, name), hf_name in _LAYER.items():
            tensors[f"model.layers.{i}.{hf_name}.weight"] = np.asarray(block[part][name]["kernel"]).T
        tensors[f"model.layers.{i}.input_layernorm.weight"] = np.asarray(block["attn_norm"]["scale"])
        tensors[f"model.layers.{i}.post_attention_layernorm.weight"] = np.asarray(block["mlp_norm"]["scale"])
    tensors["model.norm.weight"] = np.asarray(params["norm"]["scale"])
    if not config.tie_embeddings:
        tensors["lm_head.weight"] = np.asarray(params["lm_head"]["kernel"]).T
    return tensors


def from_hf_tensors(tensors: dict[str, np.ndarray], config: ModelConfig) -> dict[str, Any]:
    """A Llama pure parameter dict from HF-named tensors (the inverse of `to_hf_tensors`)."""

    def get(name: str) -> np.ndarray:
        if name not in tensors:
            raise NotFoundError(f"model.safetensors has no tensor {name!r}")
        return tensors[name]

    blocks = {}
    for i in range(config.n_layers):
        block: dict[str, Any] = {"attn": {}, "mlp": {}}
        for (part, name), hf_name in _LAYER.items():
            block[part][name] = {"kernel": get(f"model.layers.{i}.{hf_name}.weight").T}
        block["attn_norm"] = {"scale": get(f"model.layers.{i}.input_layernorm.weight")}
        block["mlp_norm"] = {"scale": get(f"model.layers.{i}.post_attention_layernorm.weight")}
        blocks[i] = block
    params: dict[str, Any] = {
        "embed": {"embedding": get("model.embed_tokens.weight")},
        "blocks": blocks,
        "norm": {"scale": get("model.norm.weight")},
    }
    if not config.tie_embeddings:
        params["lm_head"] = {"kernel": get("lm_head.weight").T}
    return params


def write_hf_model(
    out_dir: Path, config: ModelConfig, params: dict[str, Any], *, eos_id: int | None = None, bos_id: int | None = None
) -> None:
    """Write a Llama's `config.json` and `model.safetensors` (from a pure parameter dict) into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "config.json", {**hf_config(config), "eos_token_id": eos_id, "bos_token_id": bos_id})
    write_safetensors(out_dir / "model.safetensors", to_hf_tensors(params, config))


def export_hf(run_dir: Path, out_dir: Path, step: int | None = None) -> Path:
    """Write the run's newest (or `step`'s) Llama checkpoint and its tokenizer to `out_dir` in Hugging Face format.

    Raises:
        ConfigError: the run's model is not a Llama, or its tokenizer file changed since the dataset was built.
        NotFoundError: no run config, dataset, checkpoint or tokenizer.
    """
    from flax import nnx

    from tradewind.trainer.restore import load_run_model

    loaded = load_run_model(run_dir, step)
    if loaded.model_config.type != "llama":
        raise ConfigError(f"model.type: only 'llama' runs export to Hugging Face, not {loaded.model_config.type!r}")
    tokenizer = _dataset_tokenizer(loaded.manifest.tokenizer)
    out_dir = Path(out_dir)
    write_hf_model(
        out_dir, loaded.model_config, nnx.to_pure_dict(loaded.params), eos_id=tokenizer.eos_id, bos_id=tokenizer.bos_id
    )
    write_hf_tokenizer_files(tokenizer, out_dir, model_max_length=loaded.model_config.max_seq_len)
    return out_dir


def _dataset_tokenizer(info: TokenizerInfo) -> Tokenizer:
    """The tokenizer a token cache was built with, refused if its file changed since."""
    tokenizer = load_tokenizer(info.name)
    if tokenizer.fingerprint != info.fingerprint:
        raise ConfigError(
            f"tokenizer {info.name}: changed since the run's dataset was tokenized (fingerprint "
            f"{tokenizer.fingerprint[:12]}, the dataset's {info.fingerprint[:12]}); restore the tokenizer the "
            f"model was trained with to export it"
        )
    return tokenizer


def load_hf_params(directory: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """Read an HF Llama directory: its `ModelConfig` and a pure parameter dict for `setup_training`.

    Raises:
        NotFoundError: `config.json` or `model.safetensors` is missing.
    """
    directory = Path(directory)
    config = read_hf_config(directory)
    if not (directory / "model.safetensors").is_file():
        raise NotFoundError(f"init_from: {directory} has no model.safetensors")
    return config, from_hf_tensors(read_safetensors(directory / "model.safetensors"), config)
