"""Hugging Face interop: a Llama run as `config.json` + `model.safetensors`, and back.

The export loads in `transformers` as `LlamaForCausalLM` without Tradewind installed. The safetensors
file is written and read here directly (an 8-byte header length, a JSON header of names, dtypes, shapes
and byte offsets, then the raw little-endian float32 data), so neither `safetensors` nor `torch` is needed.

Weight names follow `LlamaForCausalLM`: nnx kernels are [in, out] and HF weights [out, in], so matrices
are transposed; rotary embeddings already use HF's half-split layout, so no permutation is needed.

    tradewind export RUN --format hf --out DIR        (see `tradewind.trainer.cli`)

Example:
    export_hf(Path("runs/r1"), Path("exports/r1"))
    params = load_hf_params(Path("exports/r1"))  # a pure dict for `TrainConfig.init_from`
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from tradewind.core import ConfigError, NotFoundError, atomic_write_json
from tradewind.trainer.config import ModelConfig


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


def model_config_from_hf(data: dict[str, Any]) -> ModelConfig:
    """The Llama `ModelConfig` that an HF `config.json` describes."""
    if data.get("model_type") != "llama":
        raise ConfigError(f"config.json: model_type {data.get('model_type')!r} is not 'llama'")
    theta = data.get("rope_theta") or (data.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    return ModelConfig(
        type="llama",
        vocab_size=data["vocab_size"],
        d_model=data["hidden_size"],
        n_layers=data["num_hidden_layers"],
        n_heads=data["num_attention_heads"],
        n_kv_heads=data.get("num_key_value_heads"),
        d_ff=data["intermediate_size"],
        max_seq_len=data["max_position_embeddings"],
        rope_theta=theta,
        norm_eps=data.get("rms_norm_eps", 1e-6),
        tie_embeddings=data.get("tie_word_embeddings", True),
    )


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


def export_hf(run_dir: Path, out_dir: Path, step: int | None = None) -> Path:
    """Write the run's newest (or `step`'s) Llama checkpoint to `out_dir` in Hugging Face format.

    Raises:
        ConfigError: the run's model is not a Llama.
        NotFoundError: no run config, dataset or checkpoint.
    """
    from flax import nnx

    from tradewind.trainer.restore import load_run_model

    loaded = load_run_model(run_dir, step)
    if loaded.model_config.type != "llama":
        raise ConfigError(f"model.type: only 'llama' runs export to Hugging Face, not {loaded.model_config.type!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = hf_config(loaded.model_config)
    config["eos_token_id"] = loaded.manifest.tokenizer.eos_id
    config["bos_token_id"] = loaded.manifest.tokenizer.bos_id
    atomic_write_json(out_dir / "config.json", config)
    write_safetensors(
        out_dir / "model.safetensors", to_hf_tensors(nnx.to_pure_dict(loaded.params), loaded.model_config)
    )
    return out_dir


def load_hf_params(directory: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """Read an HF Llama directory: its `ModelConfig` and a pure parameter dict for `setup_training`.

    Raises:
        NotFoundError: `config.json` or `model.safetensors` is missing.
    """
    directory = Path(directory)
    for name in ("config.json", "model.safetensors"):
        if not (directory / name).is_file():
            raise NotFoundError(f"init_from: {directory} has no {name}")
    config = model_config_from_hf(json.loads((directory / "config.json").read_text(encoding="utf-8")))
    return config, from_hf_tensors(read_safetensors(directory / "model.safetensors"), config)
