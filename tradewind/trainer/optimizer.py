"""The optimizer, built from `OptimizerConfig` by composing optax transforms, and its learning-rate schedule.

    clip_by_global_norm(grad_clip)  ->  adamw | lion | adafactor (unit learning rate, decay on matrices only;
                                        its moments stored in bfloat16 with `bf16_moments`)
    update * learning_rate(step, total_steps)   (in the train step; the rate is an argument of the step)

Update rules register under `OptimizerConfig.type` in `OPTIMIZERS`. Each is built at a learning rate of 1 and
the train step multiplies its update by the schedule's rate, which the loop computes on the host and passes in:
the compiled step then does not depend on the schedule, so a budgeted run can re-plan its step count as it
measures its speed, and runs that differ only in learning rate or schedule share one compilation. For AdamW
and Lion, scaling last is exactly a scheduled learning rate (their decay comes before the rate); Adafactor's
optax form adds its decay after the rate, so here its decay scales with the rate too, as AdamW's does.

The schedule warms up linearly from 0 to the peak learning rate, then decays (cosine or linear) to
`min_lr_ratio * learning_rate` at the last step, or stays constant. Weight decay applies to matrices
(embeddings and projections) and skips vectors (norm scales, biases), which decay would only pull towards zero.

Example:
    optimizer = build_optimizer(OptimizerConfig(learning_rate=1e-3))
    opt_state = optimizer.init(params)
    rate = learning_rate(config, step=10, total_steps=300)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from tradewind.runs.config import OptimizerConfig

UpdateRule = Callable[[OptimizerConfig], optax.GradientTransformation]
OPTIMIZERS: dict[str, UpdateRule] = {}


def register_optimizer(name: str) -> Callable[[UpdateRule], UpdateRule]:
    """Decorator: make `OptimizerConfig(type=name)` build with the decorated function."""

    def register(rule: UpdateRule) -> UpdateRule:
        OPTIMIZERS[name] = rule
        return rule

    return register


def learning_rate(config: OptimizerConfig, step: int, total_steps: int) -> float:
    """The learning rate of update `step` (0-based) of a run of `total_steps`: linear warmup from 0, then the
    configured decay.

    At `warmup_steps` it is the peak and, for cosine and linear, at `total_steps` (and after) it is
    `min_lr_ratio * learning_rate`. A warmup longer than the run is cut to the run's length.
    """
    peak = config.learning_rate
    warmup = min(config.warmup_steps, total_steps)
    if step < warmup:
        return peak * step / warmup
    progress = min(step - warmup, max(total_steps - warmup, 1)) / max(total_steps - warmup, 1)
    if config.schedule == "cosine":
        return peak * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
    if config.schedule == "linear":
        return peak * (1 - (1 - config.min_lr_ratio) * progress)
    return peak


def build_schedule(config: OptimizerConfig, total_steps: int) -> Callable[[int], float]:
    """`learning_rate` for a run of `total_steps`, as a function of the step."""
    return lambda step: learning_rate(config, int(step), total_steps)


UNDECAYED = ("scale", "bias")  # the vectors: norms' gains and shifts, projections' biases


def decay_mask(params: Any) -> Any:
    """True for the parameters weight decay applies to: the matrices (kernels and embeddings), not the norms'
    and biases' vectors. By name, since a stacked block's vector has a layer axis in front."""

    def is_matrix(path: tuple, _: Any) -> bool:
        name = next(str(key.key) for key in reversed(path) if hasattr(key, "key"))  # past a Variable's `value`
        return name not in UNDECAYED

    return jax.tree_util.tree_map_with_path(is_matrix, params)


@register_optimizer("adamw")
def adamw(config: OptimizerConfig) -> optax.GradientTransformation:
    return optax.adamw(1.0, b1=config.b1, b2=config.b2, weight_decay=config.weight_decay, mask=decay_mask)


@register_optimizer("lion")
def lion(config: OptimizerConfig) -> optax.GradientTransformation:
    return optax.lion(1.0, b1=config.b1, b2=config.b2, weight_decay=config.weight_decay, mask=decay_mask)


@register_optimizer("adafactor")
def adafactor(config: OptimizerConfig) -> optax.GradientTransformation:
    return optax.adafactor(
        1.0,
        multiply_by_parameter_scale=False,
        weight_decay_rate=config.weight_decay or None,
        weight_decay_mask=decay_mask,
    )


def stored_in(rule: optax.GradientTransformation, dtype: Any) -> optax.GradientTransformation:
    """`rule` with its floating-point state (its moments) stored in `dtype` between updates and updated in
    float32: in bfloat16, half the memory of float32 moments, at the rounding of bfloat16's 8-bit mantissa."""

    def cast(tree: Any, to: Any) -> Any:
        return jax.tree.map(lambda x: x.astype(to) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        updates, state = rule.update(updates, cast(state, jnp.float32), params)
        return updates, cast(state, dtype)

    return optax.GradientTransformation(lambda params: cast(rule.init(params), dtype), update)


def build_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """Global-norm clipping followed by the configured update rule, at a learning rate of 1; with
    `bf16_moments`, the rule's moments are stored in bfloat16 (`stored_in`).

    Multiply its updates by `learning_rate(config, step, total_steps)` (the train step does).

    Returns:
        An optax transformation for any pytree of float parameters (e.g. an `nnx.State`).
    """
    rule = OPTIMIZERS[config.type](config)
    if config.bf16_moments:
        rule = stored_in(rule, jnp.bfloat16)
    # identity() when clipping is off keeps the state's structure the same either way.
    clip = optax.clip_by_global_norm(config.grad_clip) if config.grad_clip > 0 else optax.identity()
    return optax.chain(clip, rule)
