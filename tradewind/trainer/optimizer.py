"""The optimizer, built from `OptimizerConfig` by composing optax transforms.

    clip_by_global_norm(grad_clip)  ->  adamw | lion | adafactor (schedule, decay on matrices only)

Update rules register under `OptimizerConfig.type` in `OPTIMIZERS`. The schedule warms up linearly from
0 to the peak learning rate, then decays (cosine or linear) to `min_lr_ratio * learning_rate` at the last
step, or stays constant. Weight decay applies to matrices (embeddings and projections) and skips vectors
(norm scales, biases), which decay would only pull towards zero.

Example:
    optimizer = build_optimizer(OptimizerConfig(learning_rate=1e-3), total_steps=300)
    opt_state = optimizer.init(params)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax

from tradewind.trainer.config import OptimizerConfig

UpdateRule = Callable[[OptimizerConfig, optax.Schedule], optax.GradientTransformation]
OPTIMIZERS: dict[str, UpdateRule] = {}


def register_optimizer(name: str) -> Callable[[UpdateRule], UpdateRule]:
    """Decorator: make `OptimizerConfig(type=name)` build with the decorated function."""

    def register(rule: UpdateRule) -> UpdateRule:
        OPTIMIZERS[name] = rule
        return rule

    return register


def build_schedule(config: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """The learning rate of update `count` (0-based): linear warmup from 0, then the configured decay.

    `schedule(warmup_steps)` is the peak and, for cosine and linear, `schedule(total_steps)` is
    `min_lr_ratio * learning_rate`. A warmup longer than the run is cut to the run's length.
    """
    peak = config.learning_rate
    warmup = min(config.warmup_steps, total_steps)
    decay_steps = max(total_steps - warmup, 1)
    if config.schedule == "cosine":
        decay = optax.cosine_decay_schedule(peak, decay_steps=decay_steps, alpha=config.min_lr_ratio)
    elif config.schedule == "linear":
        decay = optax.linear_schedule(peak, peak * config.min_lr_ratio, decay_steps)
    else:
        decay = optax.constant_schedule(peak)
    if warmup == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], boundaries=[warmup])


def decay_mask(params: Any) -> Any:
    """True for the parameters weight decay applies to: those with two or more dimensions."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


@register_optimizer("adamw")
def adamw(config: OptimizerConfig, schedule: optax.Schedule) -> optax.GradientTransformation:
    return optax.adamw(schedule, b1=config.b1, b2=config.b2, weight_decay=config.weight_decay, mask=decay_mask)


@register_optimizer("lion")
def lion(config: OptimizerConfig, schedule: optax.Schedule) -> optax.GradientTransformation:
    return optax.lion(schedule, b1=config.b1, b2=config.b2, weight_decay=config.weight_decay, mask=decay_mask)


@register_optimizer("adafactor")
def adafactor(config: OptimizerConfig, schedule: optax.Schedule) -> optax.GradientTransformation:
    return optax.adafactor(
        schedule,
        multiply_by_parameter_scale=False,
        weight_decay_rate=config.weight_decay or None,
        weight_decay_mask=decay_mask,
    )


def build_optimizer(config: OptimizerConfig, total_steps: int) -> optax.GradientTransformation:
    """Global-norm clipping followed by the configured update rule on `build_schedule`.

    Args:
        config: update rule, learning rate, schedule and clipping settings.
        total_steps: updates in the run; the decay reaches its minimum there.

    Returns:
        An optax transformation for any pytree of float parameters (e.g. an `nnx.State`).
    """
    rule = OPTIMIZERS[config.type](config, build_schedule(config, total_steps))
    # identity() when clipping is off keeps the state's structure the same either way.
    clip = optax.clip_by_global_norm(config.grad_clip) if config.grad_clip > 0 else optax.identity()
    return optax.chain(clip, rule)
