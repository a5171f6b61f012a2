"""Hugging Face interop: a run as `config.json` + `model.safetensors` + tokenizer files, and back.

The families imported and exported, by `config.json`'s `model_type`: `llama` (Llama 2, 3 and 3.x with its
rotary scaling), `mistral`, `qwen2` (Qwen2 and Qwen2.5, with their query/key/value biases), `qwen3` (with its
query/key norms and head width) and `gpt2`; tied or untied heads, grouped-query attention. Any other
`model_type` is refused by name before training, and so is a setting a family's class does not implement
(another activation or rotary scaling, biases where it has none). A sliding window that is on caps the model's
`max_seq_len` at its width, where full attention computes the same (`LlamaConfig._hf_window`).

The export loads in `transformers` (`LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`,
`Qwen3ForCausalLM` or `GPT2LMHeadModel`, and `AutoTokenizer`) without Tradewind installed. Each architecture's
config class says how, in two tables read both ways (`hf_keys`: the `config.json` keys of its fields, from
which `hf_config` and `from_hf_config` are derived; `hf_weights`: its tensors, in
`tradewind.runs.models.configs`); this module moves the tensors. The safetensors file is written and read
here directly (an 8-byte header length, a JSON header of names, dtypes, shapes and byte offsets, then the raw
little-endian float32 data), so neither `safetensors` nor `torch` is needed.

Rotary embeddings already use HF's half-split layout, so no Llama-family weight needs a permutation.

Weights are only ever loaded into the model their `config.json` describes: `tradewind.runs.hf`'s
`model_for_init_from` gives a run that model (keeping what the user set only where it agrees), and its
`check_matches_hf` refuses any other before training starts.

    tradewind export RUN --format hf --out DIR        (`tradewind.trainer.cli`; a run's export is `export.export_hf`)

Example:
    write_hf_model(Path("exports/r1"), model_config, params, eos_id=0, bos_id=None)
    _, params = load_hf_params(Path("exports/r1"))  # a pure dict for `setup_training`
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from tradewind.core import ConfigError, NotFoundError, atomic_write_json
from tradewind.runs.hf import SHARDED_INDEX, read_hf_config, weight_files
from tradewind.runs.models.configs import ModelConfig


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


def to_hf_tensors(params: dict[str, Any], config: ModelConfig) -> dict[str, np.ndarray]:
    """HF-named tensors from a pure parameter dict (`nnx.to_pure_dict`; stacked blocks are split per layer)."""
    from tradewind.trainer.models.layers import per_layer_params  # JAX loads only here: the server imports this module

    params = per_layer_params(params)
    tensors = {}
    for weight in config.hf_weights():
        array = np.asarray(_at(params, weight.path))
        tensors[weight.name] = array.T if weight.transpose else array
    return tensors


def from_hf_tensors(tensors: dict[str, np.ndarray], config: ModelConfig) -> dict[str, Any]:
    """A pure parameter dict from HF-named tensors (the inverse of `to_hf_tensors`)."""
    params: dict[str, Any] = {}
    for weight in config.hf_weights():
        if weight.name not in tensors:
            raise NotFoundError(f"model.safetensors has no tensor {weight.name!r}")
        *parents, leaf = weight.path
        node = params
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = tensors[weight.name].T if weight.transpose else tensors[weight.name]
    return params


def _at(tree: dict[str, Any], path: tuple[str | int, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def write_hf_model(
    out_dir: Path, config: ModelConfig, params: dict[str, Any], *, eos_id: int | None = None, bos_id: int | None = None
) -> None:
    """Write a model's `config.json` and `model.safetensors` (from a pure parameter dict) into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "config.json", {**config.hf_config(), "eos_token_id": eos_id, "bos_token_id": bos_id})
    write_safetensors(out_dir / "model.safetensors", to_hf_tensors(params, config))


def load_hf_params(directory: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """Read an HF model directory: its `ModelConfig` and a pure parameter dict for `setup_training`.

    Raises:
        NotFoundError: `config.json` is missing, or the weights (`model.safetensors`, or a shard the sharded
            index names).
        ConfigError: the index names a tensor its shard does not hold.
    """
    directory = Path(directory)
    config = read_hf_config(directory)
    return config, from_hf_tensors(read_hf_tensors(directory), config)


def read_hf_tensors(directory: Path) -> dict[str, np.ndarray]:
    """The tensors of an HF model directory: `model.safetensors`, or the shards `model.safetensors.index.json`
    maps each tensor to (what `save_pretrained` writes for a large model)."""
    tensors: dict[str, np.ndarray] = {}
    for path in weight_files(directory):
        tensors.update(read_safetensors(path))
    index = directory / SHARDED_INDEX
    if not index.is_file():
        return tensors
    weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    missing = sorted(name for name in weight_map if name not in tensors)
    if missing:
        raise ConfigError(f"{index}: {len(missing)} tensor(s) are not in the shards it names, e.g. {missing[0]}")
    return tensors
