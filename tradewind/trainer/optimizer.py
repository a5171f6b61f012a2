"""The optimizer, built from `OptimizerConfig` by composing optax transforms.

    clip_by_global_norm(grad_clip)  ->  adamw(schedule, b1, b2, weight_decay, mask=matrices only)

The schedule warms up linearly from 0 to the peak learning rate, then follows a cosine down to
`min_lr_ratio * learning_rate` at the last step. Weight decay applies to matrices (embeddings and
projections) and skips vectors (norm scales, biases), which decay would only pull towards zero.

Example:
    optimizer = build_optimizer(OptimizerConfig(learning_rate=1e-3), total_steps=300)
    opt_state = optimizer.init(params)
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from tradewind.trainer.config import OptimizerConfig


def build_schedule(config: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """The learning rate of update `count` (0-based): linear warmup from 0, then cosine decay to the minimum.

    `schedule(warmup_steps)` is the peak and `schedule(total_steps)` is `min_lr_ratio * learning_rate`.
    A warmup longer than the run is cut to the run's length.
    """
    peak = config.learning_rate
    warmup = min(config.warmup_steps, total_steps)
    decay = optax.cosine_decay_schedule(peak, decay_steps=max(total_steps - warmup, 1), alpha=config.min_lr_ratio)
    if warmup == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], boundaries=[warmup])


def decay_mask(params: Any) -> Any:
    """True for the parameters weight decay applies to: those with two or more dimensions."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def build_optimizer(config: OptimizerConfig, total_steps: int) -> optax.GradientTransformation:
    """Global-norm clipping followed by AdamW on `build_schedule`, decaying matrices only.

    Args:
        config: learning rate, schedule, Adam and clipping settings.
        total_steps: updates in the run; the cosine reaches its minimum there.

    Returns:
        An optax transformation for any pytree of float parameters (e.g. an `nnx.State`).
    """
    adamw = optax.adamw(
        build_schedule(config, total_steps),
        b1=config.b1,
        b2=config.b2,
        weight_decay=config.weight_decay,
        mask=decay_mask,
    )
    # identity() when clipping is off keeps the state's structure the same either way.
    clip = optax.clip_by_global_norm(config.grad_clip) if config.grad_clip > 0 else optax.identity()
    return optax.chain(clip, adamw)
