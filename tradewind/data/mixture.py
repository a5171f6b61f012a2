"""`MixtureLoader`: batches whose windows come from several token streams in fixed proportions.

Samples are dealt in blocks of `block` samples. In each block, source `i` gets `quota[i]` samples
(`weights` scaled to the block, rounded by largest remainder so that the quotas sum to `block`), in an
order shuffled per block by `(seed, block)`. Sample `k` is therefore source `s = order_b[k % block]`'s
sample number `b * quota[s] + (rank of k among block b's samples of s)`, with `b = k // block`, which
that source's own `TokenWindows` turns into a window (each of its windows once per its own epoch). All
of it is a function of `k`, so the mixture keeps the loader's contract: its whole state is the step.

Example:
    loader = MixtureLoader([web.tokens("train"), code.tokens("train")], [0.7, 0.3], batch_size=16, seq_len=1024)
    batch = loader.batch(step)                    # [16, 1025] int32
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Unpack

import numpy as np

from tradewind.core import InvalidInputError
from tradewind.data.loader import LoaderSizes, StepLoader, TokenWindows

DEFAULT_BLOCK = 1024
_CACHED_BLOCKS = 4


class MixtureLoader(StepLoader):
    """Deterministic batches mixing windows of several token streams by weight.

    Args:
        sources: 1-D token streams (e.g. several caches' `tokens("train")`).
        weights: non-negative, one per source, not all zero; normalised to sum to 1.
        sizes: batch_size, seq_len, seed, shuffle, process_index, process_count, as `StepLoader` takes them.
        block: samples per dealing block; proportions are exact over every block.

    Raises:
        InvalidInputError: mismatched or invalid weights, or a source with a positive weight that is too
            short for one window.
    """

    def __init__(
        self,
        sources: Sequence[Any],
        weights: Sequence[float],
        *,
        block: int = DEFAULT_BLOCK,
        **sizes: Unpack[LoaderSizes],
    ):
        super().__init__(**sizes)
        seq_len, seed = self.seq_len, self.seed
        if len(sources) != len(weights) or not sources:
            raise InvalidInputError(f"give one weight per source (got {len(sources)} sources, {len(weights)} weights)")
        w = np.asarray(weights, dtype=np.float64)
        if np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
            raise InvalidInputError(f"weights must be non-negative and not all zero (got {list(weights)})")
        if block < 1:
            raise InvalidInputError(f"block must be at least 1 (got {block})")
        self.weights = w / w.sum()
        self.block = block
        self.sources = [
            TokenWindows(tokens, seq_len, (seed, index), self.shuffle, name=f"source {index}")
            for index, tokens in enumerate(sources)
        ]
        for index, source in enumerate(self.sources):
            if self.weights[index] > 0 and source.num_windows == 0:
                raise InvalidInputError(
                    f"source {index} has {len(source.tokens):,} tokens, too few for one window of seq_len={seq_len}"
                )
        self.quotas = _largest_remainder(self.weights, block)
        self._blocks: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def assignments(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each global sample number: its source and its sample number within that source."""
        samples = np.asarray(samples, dtype=np.int64)
        blocks, positions = np.divmod(samples, self.block)
        sources = np.empty_like(samples)
        local = np.empty_like(samples)
        for b in np.unique(blocks).tolist():
            chosen = blocks == b
            order, ranks = self._block(b)
            sources[chosen] = order[positions[chosen]]
            local[chosen] = b * self.quotas[sources[chosen]] + ranks[positions[chosen]]
        return sources, local

    def batch(self, step: int) -> np.ndarray:
        """This process's rows of batch `step`: int32 `[batch_size / process_count, seq_len + 1]`."""
        sources, local = self.assignments(self.samples(step))
        out = np.empty((self.local_batch_size, self.seq_len + 1), dtype=np.int32)
        for index in np.unique(sources).tolist():
            rows = np.flatnonzero(sources == index)
            source = self.sources[index]
            part = np.empty((len(rows), self.seq_len + 1), dtype=np.int32)
            source.read(source.windows(local[rows]), part)
            out[rows] = part
        return out

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        cached = self._blocks.get(b)
        if cached is None:
            pattern = np.repeat(np.arange(len(self.quotas)), self.quotas)
            order = np.random.default_rng([self.seed, b]).permutation(pattern)
            ranks = np.empty(self.block, dtype=np.int64)
            for index in range(len(self.quotas)):
                where = order == index
                ranks[where] = np.arange(int(where.sum()))
            cached = self._blocks[b] = (order, ranks)
            while len(self._blocks) > _CACHED_BLOCKS:
                self._blocks.popitem(last=False)
        return cached


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integer shares of `total` proportional to `weights`, summing to `total` exactly."""
    exact = weights * total
    quotas = np.floor(exact).astype(np.int64)
    short = total - int(quotas.sum())
    # Ties go to the lower index, so the quotas depend only on the weights.
    quotas[np.argsort(-(exact - quotas), kind="stable")[:short]] += 1
    return quotas
