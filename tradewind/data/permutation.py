"""A keyed pseudo-random permutation of `range(n)` evaluated at any index in O(1): a Feistel network.

`FeistelPermutation(n, key)(indices)` maps each index to its image under a bijection of `[0, n)` chosen by
`key`, without materialising the permutation: a 4-round balanced Feistel network over the smallest
power-of-four domain that holds `n`, with cycle walking to stay inside `[0, n)` (the domain is under
`4n`, so a few steps on average). The loader uses one per epoch to shuffle windows: every window once
per epoch, for any number of windows, with O(1) memory.

Example:
    perm = FeistelPermutation(10, key=(0, 3))
    sorted(perm(np.arange(10))) == list(range(10))   # True
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

_ROUNDS = 4
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


class FeistelPermutation:
    """A bijection of `[0, n)` chosen by `key`.

    Args:
        n: the size of the index space (at least 1).
        key: any sequence of non-negative ints (say `(seed, epoch)`); equal keys give equal permutations.
    """

    def __init__(self, n: int, key: Sequence[int]):
        if n < 1:
            raise ValueError(f"n must be at least 1 (got {n})")
        self.n = n
        self.half_bits = max(1, (int(n - 1).bit_length() + 1) // 2)
        self.mask = np.uint64((1 << self.half_bits) - 1)
        digest = hashlib.blake2b(repr(tuple(int(k) for k in key)).encode(), digest_size=8 * _ROUNDS).digest()
        self.round_keys = [np.uint64(int.from_bytes(digest[8 * i : 8 * i + 8], "little")) for i in range(_ROUNDS)]

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """The images of `indices` (ints in `[0, n)`), as int64."""
        values = np.asarray(indices, dtype=np.uint64).copy()
        if self.n == 1:
            return values.astype(np.int64)
        todo = np.ones(values.shape, dtype=bool)
        while todo.any():  # cycle walking: re-apply until the image lands inside [0, n)
            values[todo] = self._rounds(values[todo])
            todo = values >= self.n
        return values.astype(np.int64)

    def _rounds(self, values: np.ndarray) -> np.ndarray:
        bits = np.uint64(self.half_bits)
        left, right = values >> bits, values & self.mask
        with np.errstate(over="ignore"):
            for round_key in self.round_keys:
                mixed = (right ^ round_key) * _MULTIPLIER
                mixed ^= mixed >> np.uint64(29)
                mixed *= _MULTIPLIER
                mixed ^= mixed >> np.uint64(32)
                left, right = right, left ^ (mixed & self.mask)
        return (left << bits) | right
