"""The run's data: its token cache opened, and the train and val loaders built from its config.

A cache of text gives `PackedLoader`s (windows cut wherever they fall); a cache with a loss mask (chat or
prompt/completion records) gives `DocumentLoader`s, whose windows keep each record whole and score only the
tokens its mask marks.

Imports no JAX, so the tools can check that a configuration fits its dataset before launching a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tradewind.core import InvalidInputError
from tradewind.data import DocumentLoader, PackedLoader, TokenCache, open_token_cache
from tradewind.runs.config import TrainConfig

Loader = PackedLoader | DocumentLoader


@dataclass(frozen=True)
class RunData:
    """A run's token cache with a shuffled train loader and an in-order val loader."""

    cache: TokenCache
    train: Loader
    val: Loader


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
        train=split_loader(cache, "train", config.batch_size, config.seq_len, config.seed, shuffle=True),
        val=split_loader(cache, "val", config.batch_size, config.seq_len, config.seed, shuffle=False),
    )


def with_dataset_vocabulary(config: TrainConfig) -> TrainConfig:
    """`config` with its dataset tokenizer's vocabulary where a FLOP budget needs it (`TrainConfig.with_vocabulary`),
    so that the run's saved config gives every reader the same steps.

    Raises:
        NotFoundError: it needs the vocabulary and there is no token cache at `config.dataset`.
    """
    if config.flop_budget is None or config.model.vocab_size is not None:
        return config
    return config.with_vocabulary(open_token_cache(Path(config.dataset)).manifest.tokenizer.vocab_size)


def split_loader(cache: TokenCache, split: str, batch_size: int, seq_len: int, seed: int, *, shuffle: bool) -> Loader:
    """The loader of one split of `cache`: whole records for a cache with a loss mask, else packed windows.

    Raises:
        InvalidInputError: the split is too short for one batch; the message names the dataset and split.
    """
    sizes = dict(batch_size=batch_size, seq_len=seq_len, seed=seed, shuffle=shuffle)
    tokens, loss_mask = cache.tokens(split), cache.loss_mask(split)
    try:
        if loss_mask is None:
            return PackedLoader(tokens, **sizes)
        return DocumentLoader(tokens, loss_mask, cache.document_starts(split), **sizes)
    except InvalidInputError as error:
        raise InvalidInputError(f"dataset {cache.path}, split {split!r}: {error}") from None
