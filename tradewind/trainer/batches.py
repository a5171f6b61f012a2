"""The run's data: its token cache opened, and the train and val loaders built from its config.

Imports no JAX, so the tools can check that a configuration fits its dataset before launching a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tradewind.core import InvalidInputError
from tradewind.data import PackedLoader, TokenCache, open_token_cache
from tradewind.trainer.config import TrainConfig


@dataclass(frozen=True)
class RunData:
    """A run's token cache with a shuffled train loader and an in-order val loader."""

    cache: TokenCache
    train: PackedLoader
    val: PackedLoader


def open_run_data(config: TrainConfig) -> RunData:
    """Open `config.dataset` and build its loaders.

    Raises:
        NotFoundError: no token cache at `config.dataset`.
        InvalidInputError: a split is too short for one batch of `batch_size` x `seq_len`; the message
            names the dataset and the split.
    """
    cache = open_token_cache(Path(config.dataset))
    return RunData(
        cache=cache,
        train=_loader(cache.tokens("train"), "train", config, shuffle=True),
        val=_loader(cache.tokens("val"), "val", config, shuffle=False),
    )


def _loader(tokens: np.ndarray, split: str, config: TrainConfig, *, shuffle: bool) -> PackedLoader:
    try:
        return PackedLoader(
            tokens, batch_size=config.batch_size, seq_len=config.seq_len, seed=config.seed, shuffle=shuffle
        )
    except InvalidInputError as error:
        raise InvalidInputError(f"dataset {config.dataset}, split {split!r}: {error}") from None
