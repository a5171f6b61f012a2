"""LoRA: fine-tuning a model by training a small low-rank update beside each chosen projection, the base frozen.

A projection computes `y = x W` with a weight `W` [in, out]. Full fine-tuning trains all of `W`; LoRA (low-rank
adaptation, Hu et al. 2021) keeps `W` fixed and learns an update made of two thin matrices instead:

    y = x W + (x A B) * alpha / r        A [in, r], B [r, out], r (the rank) far below in and out

Only `A` and `B` are trained, `r * (in + out)` numbers per projection rather than `in * out`: the gradients,
the optimizer's moments and the checkpoints hold just them (a fraction of a percent of a large model), while
`W` is only read, so it can stay in bfloat16 and needs no moments at all. The update `A B` has rank at most `r`;
what makes LoRA work is that the change fine-tuning needs is close to low-rank, so a small `r` (4 to 64) is
enough for most tasks.

- **Initialisation.** `A` is random (uniform in +-1/sqrt(in), as PEFT draws it) and `B` is zero, so `A B = 0`
  and a freshly adapted model computes exactly what its base does: training starts from the pretrained function,
  not a perturbed one. `B`'s gradient (`(x A)^T` times the output's) is nonzero from the first step; `A` starts
  to move once `B` has.
- **The scale `alpha / r`.** The update's size grows with `r`; dividing by it means a change of rank needs no
  new learning rate, and `alpha` sets the update's strength once. It is PEFT's convention, so a PEFT export
  computes the same function.
- **Dropout** (optional) masks the adapter's input `x` only; the frozen path sees the whole input.

Which variables are what, for `nnx.state`/`nnx.split` (`nnx.LoRAParam` is a subclass of `nnx.Param`, so take
the adapters first or filter the base with `FROZEN`):

- `nnx.LoRAParam`: the adapters, `lora_a` [..., in, r] and `lora_b` [..., r, out]: what is trained and saved.
- `FROZEN` (`nnx.Param` but not `nnx.LoRAParam`): the base model, unchanged; an adapted projection's weights
  sit under its `base` (`blocks.0.attn.q_proj.base.kernel`).
- `nnx.RngState`: with dropout > 0 only, one stream per adapted projection (its `nnx.RngKey` and `nnx.RngCount`
  under `dropout.rngs`). A model built with `scan_layers` holds its blocks stacked (`layers.StackedBlocks`):
  its adapters, keys and counts get the same leading layer axis as its kernels, and layer `i` of a stacked
  model gets the initial adapters and dropout keys of block `i` of an unrolled one.

Dropout masks are a pure function of the state: a forward pass draws its mask from `fold_in(key, count)` and
changes nothing (a scanned model's blocks run inside `jax.lax.scan`, where a count it advanced would be lost
anyway). The trainer advances the counts with `advance_dropout` once per update, so every update draws new masks
and a resumed run draws the same ones (the microbatches of one update share its masks). A model is in
training mode once adapted; an evaluation or sampling pass must be deterministic: `model.eval()` (in place;
`model.train()` undoes it) or `nnx.view(model, deterministic=True, raise_if_not_found=False)` (a view, the
model unchanged), then split that for the eval step's graphdef. The flag is static (in the graphdef), so the
two modes compile separately.

Exports: `merged_params(model)` folds each adapter into its kernel, the parameter dict of the model without
adapters, for `tradewind.trainer.hf.write_hf_model`; `write_peft_adapter` writes the adapters alone as a PEFT
folder (`adapter_config.json`, `adapter_model.safetensors`) that `peft.PeftModel.from_pretrained` puts on the
Hugging Face base model.

Example:
    model = build_model(config, rngs=nnx.Rngs(0))
    add_adapters(model, LoraConfig(rank=8, targets=["q_proj", "v_proj"]), rngs=nnx.Rngs(1))
    graphdef, adapters, frozen, rng = nnx.split(model, nnx.LoRAParam, nnx.Param, nnx.RngState)
    grads = jax.grad(lambda a: loss(nnx.merge(graphdef, a, frozen, rng), batch))(adapters)
    write_hf_model(out, config, merged_params(model))  # or write_peft_adapter(out, config, lora, model, name)
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tradewind.core import ConfigError, atomic_write_json
from tradewind.runs.config import LoraConfig
from tradewind.runs.models.configs import ModelConfig
from tradewind.trainer.hf import write_safetensors
from tradewind.trainer.models.layers import per_layer_params

# The frozen base of an adapted model: its parameters other than the adapters.
FROZEN = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))
PEFT_PREFIX = "base_model.model."  # where PEFT's causal-LM wrapper puts the transformers model's tensor names


class LoRALinear(nnx.Module):
    """An `nnx.Linear` with a trained low-rank update: `base(x) + (dropout(x) @ lora_a @ lora_b) * alpha / rank`.

    The update is computed in the base's compute dtype. Every array has the base kernel's leading axes (a stacked
    model's layer axis), so the module works as one layer of a scanned stack, where each array is sliced.

    Args:
        base: the projection to adapt; its parameters stay `nnx.Param` (frozen by the trainer's filter).
        rank: the update's rank r.
        alpha: the update's scale is alpha / rank.
        dropout: the rate at which the adapter's input is dropped in training mode; 0: no dropout, no rng state.
        key: a PRNG key array of shape `base.kernel.shape[:-2]` (one key per stacked layer): `lora_a` is drawn
            from it, and the dropout stream starts from it.
    """

    def __init__(self, base: nnx.Linear, *, rank: int, alpha: float, dropout: float = 0.0, key: jax.Array):
        *lead, fan_in, fan_out = base.kernel.shape
        self.base = base
        self.rank, self.scale = rank, alpha / rank
        keys = key.reshape(-1)
        bound = 1 / math.sqrt(fan_in)  # PEFT's kaiming_uniform_(a=sqrt(5)): uniform in +-1/sqrt(fan_in)

        def draw(layer_key: jax.Array) -> jax.Array:
            return jax.random.uniform(jax.random.fold_in(layer_key, 0), (fan_in, rank), jnp.float32, -bound, bound)

        self.lora_a = nnx.LoRAParam(jax.vmap(draw)(keys).reshape(*lead, fan_in, rank))
        self.lora_b = nnx.LoRAParam(jnp.zeros((*lead, rank, fan_out), jnp.float32))
        self.dropout = nnx.Dropout(dropout)
        if dropout > 0:
            # Set rather than passed: `nnx.Dropout` would fork the stream, which takes one key, not a stack.
            stream_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, 1).reshape(key.shape)
            self.dropout.rngs = nnx.RngStream(stream_keys, tag="dropout")

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.base(x)  # [..., out] in the compute dtype
        stream = self.dropout.rngs
        key = None if stream is None else jax.random.fold_in(stream.key[...], stream.count[...])
        h = self.dropout(x, rngs=key).astype(y.dtype)  # [..., in]
        update = (h @ self.lora_a[...].astype(y.dtype)) @ self.lora_b[...].astype(y.dtype)  # [..., out]
        return y + update * jnp.asarray(self.scale, y.dtype)

    def merged_kernel(self) -> jax.Array:
        """The base kernel with the update folded in, `kernel + lora_a @ lora_b * scale`, float32."""
        delta = jnp.matmul(self.lora_a[...].astype(jnp.float32), self.lora_b[...].astype(jnp.float32))
        return self.base.kernel[...].astype(jnp.float32) + delta * self.scale


def add_adapters(model: nnx.Module, lora: LoraConfig, rngs: nnx.Rngs) -> list[str]:
    """Replace, in place, each `nnx.Linear` of `model` named in `lora.targets` by a `LoRALinear` wrapping it.

    Stacked blocks (`scan_layers`) get adapters with their leading layer axis. Initial adapters and dropout keys
    are drawn from one `rngs.params()` key folded with each projection's place (its path without the layer) and
    its layer, so a stacked and an unrolled model get the same ones.

    Returns:
        The adapted projections' paths, e.g. `blocks.0.attn.q_proj` (`blocks.layer.attn.q_proj` when stacked).

    Raises:
        ConfigError: the model has no projection of some target name (GPT-2 has none); the message names the
            model's type and the projections it has.
        ValueError: the model has adapters already.
    """
    modules = list(nnx.iter_modules(model))
    if any(isinstance(module, LoRALinear) for _, module in modules):
        raise ValueError(f"{type(model).__name__} has LoRA adapters already")
    linears = [
        (path, module, name, child)
        for path, module in modules
        for name, child in vars(module).items()
        if isinstance(child, nnx.Linear)
    ]
    found = [(path, module, name, base) for path, module, name, base in linears if name in lora.targets]
    missing = [target for target in lora.targets if target not in {name for _, _, name, _ in found}]
    if missing:
        projections = ", ".join(sorted({name for _, _, name, _ in linears}))
        raise ConfigError(
            f"lora.targets: a {type(model).__name__} model has no {', '.join(missing)}; its projections are "
            f"{projections} (LoRA adapts the Llama family's)"
        )
    root = rngs.params()
    paths = []
    for path, module, name, base in found:
        # The projection's place without its layer (`blocks/attn/q_proj`), and its layers: block i of an unrolled
        # model, or all of a stack's (its leading axis), so that layer i of a stack draws what block i draws.
        site = "/".join(str(part) for part in (*path, name) if not isinstance(part, int) and part != "layer")
        first_layer = next((part for part in path if isinstance(part, int)), 0)
        layers = first_layer + jnp.arange(math.prod(base.kernel.shape[:-2]))
        site_key = jax.random.fold_in(root, zlib.crc32(site.encode()))
        key = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(site_key, layers).reshape(base.kernel.shape[:-2])
        setattr(module, name, LoRALinear(base, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, key=key))
        paths.append(".".join(str(part) for part in (*path, name)))
    return paths


def adapter_state(model: nnx.Module) -> nnx.State:
    """The adapters (`nnx.LoRAParam`): what the optimizer updates and a checkpoint keeps."""
    return nnx.state(model, nnx.LoRAParam)


def count_trainable(model: nnx.Module) -> int:
    """Scalars in the adapters: rank * (in + out) per adapted projection and layer."""
    return sum(leaf.size for leaf in jax.tree.leaves(adapter_state(model)))


def count_frozen(model: nnx.Module) -> int:
    """Scalars in the frozen base (`FROZEN`)."""
    return sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, FROZEN)))


def advance_dropout(rng_state: nnx.State, by: int | jax.Array = 1) -> nnx.State:
    """`rng_state` (`nnx.state(model, nnx.RngState)`) with every dropout count `by` further on: the next update's
    masks. Pure, so it runs inside a jitted step; an empty state (no dropout) comes back as it is."""

    def advance(_: tuple, variable: Any) -> Any:
        if isinstance(variable, nnx.RngCount):
            return nnx.RngCount(variable[...] + jnp.asarray(by, variable.dtype), tag=variable.tag)
        return variable

    return nnx.map_state(advance, rng_state)


def merged_params(model: nnx.Module) -> dict[str, Any]:
    """The parameters of `model` without adapters, each folded into its kernel (`LoRALinear.merged_kernel`).

    A pure dict (`nnx.to_pure_dict`) laid out as the model was before `add_adapters`, float32: what
    `tradewind.trainer.hf.write_hf_model` (and `to_hf_tensors`) take.
    """
    pure = nnx.to_pure_dict(nnx.state(model, FROZEN))
    for path, module in nnx.iter_modules(model):
        if isinstance(module, LoRALinear):
            *parents, name = path
            node = _at(pure, parents)
            node[name] = {**node[name]["base"], "kernel": module.merged_kernel()}
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), pure)


def write_peft_adapter(
    out_dir: Path, model_config: ModelConfig, lora: LoraConfig, model: nnx.Module, base_model_name_or_path: str
) -> Path:
    """Write `model`'s adapters as a PEFT LoRA folder that `peft.PeftModel.from_pretrained(base, out_dir)` loads
    onto the Hugging Face model of `model_config` (named `base_model_name_or_path` in its config).

    `adapter_model.safetensors` holds, per adapted projection and layer, `lora_A.weight` [r, in] and
    `lora_B.weight` [out, r] (float32) under the HF module's name, found through `model_config.hf_weights()`;
    `adapter_config.json` says `r`, `lora_alpha`, `lora_dropout` and the target modules.

    Raises:
        ConfigError: an adapter has no tensor in the HF table, or sits on a weight HF keeps as [in, out].
    """
    for path, module in nnx.iter_modules(model):
        if isinstance(module, LoRALinear) and (module.rank, module.scale) != (lora.rank, lora.alpha / lora.rank):
            raise ValueError(
                f"{'.'.join(map(str, path))}: rank {module.rank}, scale {module.scale}; `lora` says rank "
                f"{lora.rank}, scale {lora.alpha / lora.rank}"
            )
    adapters = per_layer_params(nnx.to_pure_dict(adapter_state(model)))
    tensors: dict[str, np.ndarray] = {}
    modules: set[str] = set()
    for weight in model_config.hf_weights():
        *module_path, variable = weight.path
        node = _at(adapters, module_path, missing=None)
        if variable != "kernel" or node is None:
            continue
        if not weight.transpose:  # PEFT's fan_in_fan_out (GPT-2's Conv1D); no adapted architecture has it
            raise ConfigError(f"{weight.name} is stored [in, out]; a LoRA export needs a Linear weight [out, in]")
        hf_module = weight.name.removesuffix(".weight")
        tensors[f"{PEFT_PREFIX}{hf_module}.lora_A.weight"] = np.asarray(node["lora_a"], np.float32).T  # [r, in]
        tensors[f"{PEFT_PREFIX}{hf_module}.lora_B.weight"] = np.asarray(node["lora_b"], np.float32).T  # [out, r]
        modules.add(hf_module.rsplit(".", 1)[-1])
    # One lora_A and one lora_B per adapted projection and layer.
    expected = sum(math.prod(leaf.shape[:-2]) for leaf in jax.tree.leaves(adapter_state(model)))
    if len(tensors) != expected:
        raise ConfigError(
            f"{len(tensors) // 2} of the model's {expected // 2} adapters have a tensor in the {model_config.type} "
            f"Hugging Face table; a PEFT export needs them all"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_safetensors(out_dir / "adapter_model.safetensors", tensors)
    atomic_write_json(
        out_dir / "adapter_config.json",
        {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": lora.rank,
            "lora_alpha": lora.alpha,
            "lora_dropout": lora.dropout,
            "target_modules": sorted(modules),
            "bias": "none",
            "fan_in_fan_out": False,
            "use_rslora": False,
            "base_model_name_or_path": base_model_name_or_path,
            "inference_mode": True,
        },
    )
    return out_dir


_REQUIRED = object()


def _at(tree: dict[Any, Any], path: Any, missing: Any = _REQUIRED) -> Any:
    """The node of nested dict `tree` at `path`; `missing` (if given) where there is none."""
    for key in path:
        if missing is not _REQUIRED and (not isinstance(tree, dict) or key not in tree):
            return missing
        tree = tree[key]
    return tree
