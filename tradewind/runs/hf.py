"""A Hugging Face folder's `config.json` as a Tradewind model config, and the checks that weights load only into
the model it describes.

Each architecture's config class holds the name mapping (`hf_keys`, read both ways, in
`tradewind.runs.models.configs`); this module finds the class by `model_type` and compares. The tensors move in
`tradewind.trainer.hf`.

Example:
    model = model_for_init_from(request.model, request.model.model_fields_set, Path("exports/r1"))  # launcher
    check_matches_hf(model, Path("exports/r1"))  # trainer, before loading
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tradewind.core import ConfigError, NotFoundError
from tradewind.runs.models.base import PRESETS
from tradewind.runs.models.configs import ARCHITECTURES, ModelConfig
from tradewind.runs.record import read_record

SHARDED_INDEX = "model.safetensors.index.json"


def weight_files(directory: Path) -> list[Path]:
    """The weight files of an HF model folder: `model.safetensors`, or the shards its `SHARDED_INDEX` names (what
    `save_pretrained` writes for a large model), in name order.

    Raises:
        NotFoundError: neither is there, or the index names a shard that is not.
    """
    index = directory / SHARDED_INDEX
    if not index.is_file():
        if not (directory / "model.safetensors").is_file():
            raise NotFoundError(f"init_from: {directory} has no model.safetensors (nor {SHARDED_INDEX})")
        return [directory / "model.safetensors"]
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    for shard in shards:
        if not (directory / shard).is_file():
            raise NotFoundError(f"init_from: {index} names the shard {shard}, which is not in {directory}")
    return [directory / shard for shard in shards]


def weights_digest(directory: Path) -> str:
    """sha256 of an HF model folder's weights: each weight file's name and bytes, in order. What a LoRA run
    records of its base, whose weights its adapters fit and no other's."""
    digest = hashlib.sha256()
    for path in weight_files(directory):
        digest.update(f"{path.name}\n".encode())
        with open(path, "rb") as weights:
            while chunk := weights.read(2**24):
                digest.update(chunk)
    return digest.hexdigest()


def check_base_weights(base: Path, runs: dict[str, Path]) -> str:
    """The digest of the base model `base` (`weights_digest`), checked against the one each run record of
    `runs` (by how to name it: "this run") says its LoRA adapters were trained on, where it says one.

    Raises:
        ConfigError: a record names other weights; the message says whose, both digests and what to do.
    """
    digest = weights_digest(base)
    for whose, record in runs.items():
        trained_on = read_record(record).base_digest if record.exists() else None
        if trained_on is not None and trained_on != digest:
            raise ConfigError(
                f"init_from: the base model {base} is not the one {whose} trained its LoRA adapters on (weights "
                f"sha256 {digest[:12]}, the run's {trained_on[:12]}); adapters fit only the weights they were "
                f"trained on: put that base back at {base}, or start a new run on this one"
            )
    return digest


def model_config_from_hf(data: dict[str, Any], source: str | Path = "config.json") -> ModelConfig:
    """The `ModelConfig` that an HF `config.json` (`data`, read from `source`) describes, by its `model_type`.

    Raises:
        ConfigError: an architecture Tradewind does not have, a shape key missing, or something the
            architecture does not implement (see its `from_hf_config`); the message names `source` and the key.
    """
    model_type = data.get("model_type")
    if model_type not in ARCHITECTURES:
        architectures = data.get("architectures")
        named = f" ({', '.join(map(str, architectures))})" if isinstance(architectures, list) and architectures else ""
        raise ConfigError(
            f"{source}: model_type {model_type!r}{named} is not one of {', '.join(map(repr, ARCHITECTURES))}"
        )
    return ARCHITECTURES[model_type].from_hf_config(data, source)


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
    explicit = set(explicit) - {"preset"}
    foreign = sorted(explicit - type(theirs).model_fields.keys())
    if foreign:
        raise ConfigError(
            f"init_from: {Path(directory) / 'config.json'} describes a {theirs.type!r} model, which has no "
            f"{', '.join('model.' + name for name in foreign)}; remove {'it' if len(foreign) == 1 else 'them'}"
        )
    requested = theirs.model_copy(update={name: getattr(model, name) for name in explicit})
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
    """`{field: (ours, theirs)}` for each field in which `ours` is not the model `theirs` describes.

    `preset` and `init_std` are Tradewind's own and not compared.
    """
    if ours.type != theirs.type:
        return {"type": (ours.type, theirs.type)}
    found = {}
    for name in (name for name in type(theirs).model_fields if name not in ("preset", "init_std")):
        mine, folder = ours.resolved(name), theirs.resolved(name)
        # An unset vocab_size comes from the dataset later (the embedding's shape is checked on loading);
        # a shorter max_seq_len only means shorter windows, as rotary positions have no weights.
        if (name == "vocab_size" and mine is None) or (name == "max_seq_len" and mine <= folder):
            continue
        if mine != folder:
            found[name] = (mine, folder)
    return found


def _describe(name: str, values: tuple[Any, Any], directory: Path) -> str:
    ours, folder = values
    return f"model.{name} is {ours!r} but {Path(directory) / 'config.json'} has {folder!r}"
