"""Packed, shuffled training batches from one flat token stream, addressed by step number.

The stream is cut into `num_windows = (len(tokens) - 1) // seq_len` windows of `seq_len + 1` tokens;
window `i` is `tokens[i * seq_len : i * seq_len + seq_len + 1]`. Neighbouring windows share one token,
so every token after the first is a prediction target exactly once per epoch. Documents are not aligned
to windows: the cache puts EOS after every document, which is how the model sees document boundaries.

Sample `k` (counted over the whole run) is window `perm(epoch)[k % num_windows]` with
`epoch = k // num_windows`; the permutation depends only on `(seed, epoch)`. So the loader's entire state
is the step number, and resuming from a checkpoint at step `n` is just `iter_batches(start_step=n)`.

Example:
    cache = open_token_cache("datasets/shakespeare")
    loader = PackedLoader(cache.tokens("train"), batch_size=8, seq_len=256, seed=0)
    for batch in loader.iter_batches(start_step=resume_step):  # [batch, seq_len + 1] int32
        inputs, targets = batch[:, :-1], batch[:, 1:]
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from tradewind.core import InvalidInputError

# A batch straddles at most two epochs, so two cached permutations make `iter_batches` recompute none.
_CACHED_EPOCHS = 2


class PackedLoader:
    """Deterministic batches of contiguous token windows, shuffled per epoch.

    Args:
        tokens: the 1-D token stream, e.g. `TokenCache.tokens("train")` (a memmap is fine; only the
            windows of each batch are read).
        batch_size: windows per batch.
        seq_len: tokens the model sees per window; each window holds `seq_len + 1` tokens so that
            inputs are `window[:-1]` and targets `window[1:]`.
        seed: chooses the per-epoch permutations.
        shuffle: if False, windows come in stream order every epoch.

    Raises:
        InvalidInputError: a non-positive size, a stream that is not 1-D, or fewer windows than
            `batch_size`.
    """

    def __init__(self, tokens: np.ndarray, *, batch_size: int, seq_len: int, seed: int = 0, shuffle: bool = True):
        if batch_size < 1 or seq_len < 1:
            raise InvalidInputError(f"batch_size and seq_len must be at least 1 (got {batch_size} and {seq_len})")
        if np.ndim(tokens) != 1:
            raise InvalidInputError(f"tokens must be a 1-D stream, got shape {np.shape(tokens)}")
        if seed < 0:
            raise InvalidInputError(f"seed must be non-negative (got {seed})")
        num_windows = max(len(tokens) - 1, 0) // seq_len
        if num_windows < batch_size:
            raise InvalidInputError(
                f"the token stream has {len(tokens):,} tokens, which make {num_windows:,} windows of "
                f"seq_len={seq_len}, fewer than batch_size={batch_size}; use a smaller batch_size or "
                f"seq_len, or more data (a batch needs at least {batch_size * seq_len + 1:,} tokens)"
            )
        self.tokens = tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.shuffle = shuffle
        self._num_windows = num_windows
        self._perms: OrderedDict[int, np.ndarray] = OrderedDict()

    @property
    def num_windows(self) -> int:
        """Windows per epoch."""
        return self._num_windows

    @property
    def tokens_per_batch(self) -> int:
        """Target tokens per batch: `batch_size * seq_len`."""
        return self.batch_size * self.seq_len

    def batch(self, step: int) -> np.ndarray:
        """The batch at `step`, the same whichever batches were read before.

        Args:
            step: the 0-based training step.

        Returns:
            An int32 array of shape `[batch_size, seq_len + 1]`.

        Raises:
            InvalidInputError: `step` is negative.
        """
        if step < 0:
            raise InvalidInputError(f"step must be non-negative (got {step})")
        samples = np.arange(step * self.batch_size, (step + 1) * self.batch_size, dtype=np.int64)
        epochs = samples // self._num_windows
        positions = samples % self._num_windows
        out = np.empty((self.batch_size, self.seq_len + 1), dtype=np.int32)
        for row, (epoch, position) in enumerate(zip(epochs.tolist(), positions.tolist(), strict=True)):
            window = int(self._permutation(epoch)[position]) if self.shuffle else position
            start = window * self.seq_len
            out[row] = self.tokens[start : start + self.seq_len + 1]
        return out

    def iter_batches(self, start_step: int = 0) -> Iterator[np.ndarray]:
        """Yield `batch(start_step)`, `batch(start_step + 1)`, ... without end."""
        step = start_step
        while True:
            yield self.batch(step)
            step += 1

    def _permutation(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self._num_windows)
            self._perms[epoch] = perm
            while len(self._perms) > _CACHED_EPOCHS:
                self._perms.popitem(last=False)
        return perm
