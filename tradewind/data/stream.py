"""`ShardedTokens`: several memory-mapped token files (or loss-mask files) seen as one 1-D stream."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class ShardedTokens:
    """The concatenation of 1-D token arrays (a cache split's shards, or their loss masks), read without copying
    them all.

    Supports what the loader needs from a token stream: `len`, `ndim`, `dtype`, `shape`, integer
    indexing and contiguous slices (returned as new arrays, possibly spanning shards). Lookup is a
    binary search over the shard boundaries, so any window is O(log shards) plus its copy.

    Args:
        parts: the shards' token arrays, in stream order (e.g. read-only memmaps).
        dtype: their dtype.
    """

    ndim = 1

    def __init__(self, parts: Sequence[np.ndarray], dtype: np.dtype):
        self.parts = [part for part in parts if len(part)]
        self.dtype = np.dtype(dtype)
        self.bounds = np.cumsum([0, *(len(part) for part in self.parts)])
        self.shape = (int(self.bounds[-1]),)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"ShardedTokens({len(self.parts)} shards, {len(self):,} tokens, {self.dtype})"

    def __getitem__(self, key: int | slice) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return self[start:stop][::step]
            return self._range(start, max(stop, start))
        index = int(key)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {key} is out of bounds for {len(self)} tokens")
        shard = int(np.searchsorted(self.bounds, index, side="right")) - 1
        return self.parts[shard][index - self.bounds[shard]]

    def _range(self, start: int, stop: int) -> np.ndarray:
        first = int(np.searchsorted(self.bounds, start, side="right")) - 1
        if first < len(self.parts) and stop <= self.bounds[first + 1]:
            base = self.bounds[first]
            return np.asarray(self.parts[first][start - base : stop - base])
        out = np.empty(stop - start, dtype=self.dtype)
        filled, shard = 0, first
        while filled < len(out):
            base = self.bounds[shard]
            piece = self.parts[shard][start + filled - base : stop - base]
            out[filled : filled + len(piece)] = piece
            filled += len(piece)
            shard += 1
        return out

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        whole = np.concatenate(self.parts) if self.parts else np.empty(0, dtype=self.dtype)
        return whole.astype(dtype) if dtype is not None else whole
