"""The config reference and presets table of `docs/trainer.md`, generated from the pydantic schema.

    python -m tradewind.runs.reference          # prints the markdown that docs/trainer.md embeds

A test checks that `docs/trainer.md` holds exactly this text, so the page cannot drift from the code.
Imports no JAX.
"""

from __future__ import annotations

from pydantic import BaseModel

from tradewind.cluster.placement import Placement
from tradewind.runs.config import (
    CheckpointConfig,
    DistributedConfig,
    LoraConfig,
    MeshConfig,
    OptimizerConfig,
    TrainConfig,
)
from tradewind.runs.models.base import PRESETS
from tradewind.runs.models.configs import ARCHITECTURES, model_config

# (heading, field prefix, models): a config file's top level holds the launch's placement beside the TrainConfig.
SECTIONS: list[tuple[str, str, tuple[type[BaseModel], ...]]] = [
    ("top level", "", (TrainConfig,)),
    ("top level: the placement (launches only)", "", (Placement,)),
    ("model.", "model.", tuple(ARCHITECTURES.values())),  # one table of all architectures' fields, each once
    ("optimizer.", "optimizer.", (OptimizerConfig,)),
    ("checkpoints.", "checkpoints.", (CheckpointConfig,)),
    ("mesh.", "mesh.", (MeshConfig,)),
    ("distributed.", "distributed.", (DistributedConfig,)),
    ("lora.", "lora.", (LoraConfig,)),
]
NESTED = {"model", "optimizer", "checkpoints", "mesh", "distributed", "lora"}


def _default(field) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return "(section)"
    return f"`{field.default!r}`".replace("|", "\\|")


def config_reference() -> str:
    """Markdown tables of every config field: name, default and description."""
    lines = []
    for heading, prefix, models in SECTIONS:
        lines += [f"#### `{heading}`", "", "| field | default | description |", "|---|---|---|"]
        listed = set()
        for model in models:
            for name, field in model.model_fields.items():
                if (not prefix and name in NESTED) or name in listed:
                    continue
                listed.add(name)
                description = (field.description or "").replace("|", "\\|")
                lines.append(f"| `{prefix}{name}` | {_default(field)} | {description} |")
        lines.append("")
    return "\n".join(lines)


def presets_table() -> str:
    """Markdown table of the model presets with their parameter counts."""
    lines = ["| preset | type | d_model | layers | heads (kv) | params (vocab 258) | params (vocab 32k) |"]
    lines.append("|---|---|---|---|---|---|---|")
    for name in PRESETS:
        small = model_config(preset=name, vocab_size=258).count_params()
        large = model_config(preset=name, vocab_size=32_000)
        lines.append(
            f"| `{name}` | {large.type} | {large.d_model} | {large.n_layers} | {large.n_heads} ({large.kv_heads}) | "
            f"{small / 1e6:.1f}M | {large.count_params() / 1e6:.1f}M |"
        )
    return "\n".join(lines) + "\n"


def reference_markdown() -> str:
    """Both tables, as `docs/trainer.md` embeds them between its GENERATED markers."""
    return "### Presets\n\n" + presets_table() + "\n### Config reference\n\n" + config_reference()


if __name__ == "__main__":
    print(reference_markdown(), end="")
