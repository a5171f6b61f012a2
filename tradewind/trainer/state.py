"""The training state: everything a run continues from, and the one place the checkpoint layout is spelled.

A checkpoint holds exactly a `TrainState`: the parameters the run trains and the optimizer state (pytrees of
arrays), `step` (updates done), `data_step` (the loader's position: a loader is a pure function of its step,
so the step is its whole state) and `rng` (the run's PRNG key data, uint32 [2]). A LoRA run's parameters are
its adapters and their dropout streams (which the step advances, so a resumed run draws the same masks); its
frozen base is not in the state: it is rebuilt from `init_from` (`setup.split_run_model`).

Example:
    state = TrainState.start(params, opt_state, seed=0)
    params, opt_state, metrics = train_step(state.params, state.opt_state, batch, learning_rate, frozen)
    state = state.advanced(params, opt_state)  # step and data_step + 1
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np


@dataclass(frozen=True)
class TrainState:
    """What one point of a run is: restoring it and training on gives the run that was never stopped."""

    params: Any
    opt_state: Any
    step: int
    data_step: int
    rng: np.ndarray

    @classmethod
    def start(cls, params: Any, opt_state: Any, seed: int) -> TrainState:
        """The state before the first update: step 0, the loader at its start, the key of `seed`."""
        return cls(params, opt_state, step=0, data_step=0, rng=np.asarray(jax.random.key_data(jax.random.key(seed))))

    def advanced(self, params: Any, opt_state: Any) -> TrainState:
        """The state after one more update, which read one more batch."""
        return replace(self, params=params, opt_state=opt_state, step=self.step + 1, data_step=self.data_step + 1)

    def to_checkpoint(self) -> dict[str, Any]:
        """The pytree a checkpoint stores."""
        return {
            "params": self.params,
            "opt_state": self.opt_state,
            "step": self.step,
            "data_step": self.data_step,
            "rng": self.rng,
        }

    @classmethod
    def from_checkpoint(cls, tree: dict[str, Any]) -> TrainState:
        """The state a checkpoint's pytree (as `to_checkpoint` made it) holds."""
        return cls(
            params=tree["params"],
            opt_state=tree["opt_state"],
            step=int(tree["step"]),
            data_step=int(tree["data_step"]),
            rng=np.asarray(tree["rng"], np.uint32),
        )
