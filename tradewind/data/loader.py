"""Packed, shuffled training batches from token streams, addressed by step number.

A stream is cut into `num_windows = (len(tokens) - 1) // seq_len` windows of `seq_len + 1` tokens;
window `i` is `tokens[i * seq_len : i * seq_len + seq_len + 1]`. Neighbouring windows share one token,
so every token after the first is a prediction target exactly once per epoch. Documents are packed
back to back: the cache puts EOS after every document, which is how the model sees their boundaries.

Sample `k` (counted over the whole run) is window `perm_epoch(k % num_windows)` with
`epoch = k // num_windows`, where `perm_epoch` is a Feistel permutation keyed by `(seed, epoch)`: every
window once per epoch, computed per index in O(1), so any batch is read directly (the streams are
memory-mapped). Batch `step` holds samples `[step * batch_size, (step + 1) * batch_size)`; with
`process_count > 1` each process takes its own contiguous slice of those rows, so no two processes read
the same window. The loader's entire state is the step number: resuming at step `n` is
`iter_batches(start_step=n)`, and gives exactly the batches an uninterrupted run would have seen.

`MixtureLoader` draws each batch's samples from several streams by weight (see `tradewind.data.mixture`);
`DocumentLoader` packs whole documents into windows, with segment ids (see `tradewind.data.packing`).

Example:
    cache = open_token_cache("datasets/shakespeare")
    loader = PackedLoader(cache.tokens("train"), batch_size=8, seq_len=256, seed=0)
    for batch in loader.iter_batches(start_step=resume_step):  # [batch, seq_len + 1] int32
        inputs, targets = batch[:, :-1], batch[:, 1:]
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Generic, Required, TypedDict, TypeVar, Unpack

import numpy as np

from tradewind.core import InvalidInputError
from tradewind.data.permutation import FeistelPermutation

_CACHED_EPOCHS = 2  # a batch spans at most two epochs
_TABLE_LIMIT = 1 << 22  # windows; a table of int32 window ids up to 16 MiB per epoch
_PUT_TIMEOUT_S = 0.1

BatchT = TypeVar("BatchT")


class LoaderSizes(TypedDict, total=False):
    """The keywords every loader takes after its streams, as `StepLoader.__init__` takes and checks them."""

    batch_size: Required[int]
    seq_len: Required[int]
    seed: int
    shuffle: bool
    process_index: int
    process_count: int


class WindowOrder:
    """Which window each sample reads: every window once per epoch, in an order shuffled per epoch.

    Sample `k` (counted across epochs) reads window `perm_epoch(k % num_windows)`, with
    `epoch = k // num_windows` and `perm_epoch` a Feistel permutation keyed by `(*key, epoch)`. What a
    window is belongs to the caller (`TokenWindows`: fixed-size slices of a stream; `DocumentLoader`:
    runs of whole documents).

    Args:
        num_windows: windows per epoch.
        key: seeds the shuffle together with the epoch.
        shuffle: if False, windows come in stream order every epoch.
    """

    def __init__(self, num_windows: int, key: tuple[int, ...], shuffle: bool = True):
        self.num_windows = num_windows
        self.key = key
        self.shuffle = shuffle
        self._perms: OrderedDict[int, np.ndarray | FeistelPermutation] = OrderedDict()

    def windows(self, samples: np.ndarray) -> np.ndarray:
        """The window index of each sample number (counted across epochs)."""
        samples = np.asarray(samples, dtype=np.int64)
        epochs, positions = np.divmod(samples, self.num_windows)
        if not self.shuffle:
            return positions
        if len(epochs) and epochs[0] == epochs[-1]:  # the usual case: a batch inside one epoch
            return self._permuted(int(epochs[0]), positions)
        out = np.empty_like(positions)
        for epoch in np.unique(epochs).tolist():
            chosen = epochs == epoch
            out[chosen] = self._permuted(epoch, positions[chosen])
        return out

    def _permuted(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            feistel = FeistelPermutation(self.num_windows, (*self.key, epoch))
            # Evaluating the network costs tens of numpy calls per batch; for all but huge streams one
            # vectorised pass per epoch is cheaper and the table small, so look windows up in it instead.
            if self.num_windows <= _TABLE_LIMIT:
                perm = feistel(np.arange(self.num_windows)).astype(np.int32)
            else:
                perm = feistel
            self._perms[epoch] = perm
            while len(self._perms) > _CACHED_EPOCHS:
                self._perms.popitem(last=False)
        return perm[positions].astype(np.int64) if isinstance(perm, np.ndarray) else perm(positions)


class TokenWindows(WindowOrder):
    """The windows of one token stream and their per-epoch shuffle.

    Args:
        tokens: the 1-D token stream (a memmap or `ShardedTokens` is fine; only requested windows are read).
        seq_len: tokens per window, less one.
        key: seeds the shuffle together with the epoch.
        shuffle: if False, windows come in stream order every epoch.
        name: how errors refer to the stream.
    """

    def __init__(self, tokens: Any, seq_len: int, key: tuple[int, ...], shuffle: bool = True, name: str = "tokens"):
        if np.ndim(tokens) != 1:
            raise InvalidInputError(f"{name} must be a 1-D stream, got shape {np.shape(tokens)}")
        super().__init__(max(len(tokens) - 1, 0) // seq_len, key, shuffle)
        self.tokens = tokens
        self.seq_len = seq_len

    def read(self, windows: np.ndarray, out: np.ndarray) -> None:
        """Copy the given windows into the rows of `out` (`[len(windows), seq_len + 1]`)."""
        span = self.seq_len + 1
        for row, window in enumerate(windows.tolist()):
            start = window * self.seq_len
            out[row] = self.tokens[start : start + span]


class StepLoader(Generic[BatchT]):
    """What every loader shares: its sizes, per-process row slicing and step-addressed, prefetching iteration.

    A subclass takes its streams, then its sizes as keywords (`**sizes: Unpack[LoaderSizes]`) that it hands
    to `StepLoader.__init__`, and defines `batch(step)`; `BatchT` is what that returns (an int32 array for
    `PackedLoader`, a `DocumentBatch` for `DocumentLoader`).

    Args:
        batch_size: windows per global batch (all processes together).
        seq_len: tokens the model sees per window; a window holds (at most) `seq_len + 1` tokens so that
            inputs are `window[:-1]` and targets `window[1:]`.
        seed: chooses the per-epoch permutations.
        shuffle: if False, windows come in stream order every epoch.
        process_index: this process's index among `process_count` processes that share the batches.
        process_count: processes reading disjoint slices of each batch (multi-host training).

    Raises:
        InvalidInputError: a negative seed, a non-positive size, or a `batch_size` that `process_count` does
            not divide.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        shuffle: bool = True,
        process_index: int = 0,
        process_count: int = 1,
    ) -> None:
        if seed < 0:
            raise InvalidInputError(f"seed must be non-negative (got {seed})")
        if batch_size < 1 or seq_len < 1:
            raise InvalidInputError(f"batch_size and seq_len must be at least 1 (got {batch_size} and {seq_len})")
        if process_count < 1 or not 0 <= process_index < process_count:
            raise InvalidInputError(
                f"process_index must be in [0, process_count) (got {process_index} of {process_count})"
            )
        if batch_size % process_count:
            raise InvalidInputError(
                f"batch_size {batch_size} must be divisible by process_count {process_count} "
                f"(each process reads batch_size / process_count rows)"
            )
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.shuffle = shuffle
        self.process_index = process_index
        self.process_count = process_count
        self.local_batch_size = batch_size // process_count

    @property
    def tokens_per_batch(self) -> int:
        """Target tokens per global batch: `batch_size * seq_len`."""
        return self.batch_size * self.seq_len

    def samples(self, step: int) -> np.ndarray:
        """The global sample numbers of this process's rows of batch `step`.

        Raises:
            InvalidInputError: `step` is negative.
        """
        if step < 0:
            raise InvalidInputError(f"step must be non-negative (got {step})")
        first = step * self.batch_size + self.process_index * self.local_batch_size
        return np.arange(first, first + self.local_batch_size, dtype=np.int64)

    def batch(self, step: int) -> BatchT:
        """This process's rows of batch `step`, int32 arrays of `[batch_size / process_count, seq_len + 1]`."""
        raise NotImplementedError

    def iter_batches(self, start_step: int = 0, prefetch: int = 2) -> Iterator[BatchT]:
        """Yield `batch(start_step)`, `batch(start_step + 1)`, ... without end.

        Args:
            start_step: the first step, e.g. the step a checkpoint was saved at.
            prefetch: batches read ahead by a background thread; 0 reads each when it is asked for.
        """
        if prefetch <= 0:
            step = start_step
            while True:
                yield self.batch(step)
                step += 1
        else:
            yield from _prefetched(self.batch, start_step, prefetch)


def _prefetched(read: Callable[[int], BatchT], start_step: int, depth: int) -> Iterator[BatchT]:
    ready: queue.Queue[tuple[BatchT | None, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        step = start_step
        while not stop.is_set():
            try:
                item: tuple[BatchT | None, BaseException | None] = (read(step), None)
            except BaseException as error:  # handed to the consumer, which raises it
                item = (None, error)
            while not stop.is_set():
                try:
                    ready.put(item, timeout=_PUT_TIMEOUT_S)
                    break
                except queue.Full:
                    continue
            if item[1] is not None:
                return
            step += 1

    thread = threading.Thread(target=produce, name="loader-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            batch, error = ready.get()
            if error is not None:
                raise error
            yield batch
    finally:
        stop.set()
        thread.join()


class PackedLoader(StepLoader[np.ndarray]):
    """Deterministic batches of contiguous token windows, shuffled per epoch.

    Args:
        tokens: the 1-D token stream, e.g. `TokenCache.tokens("train")` (a memmap is fine; only the
            windows of each batch are read).
        sizes: batch_size, seq_len, seed, shuffle, process_index, process_count, as `StepLoader` takes them;
            each window holds `seq_len + 1` tokens.

    Raises:
        InvalidInputError: a non-positive size, a stream that is not 1-D, fewer windows than
            `batch_size`, or a `batch_size` that `process_count` does not divide.
    """

    def __init__(self, tokens: Any, **sizes: Unpack[LoaderSizes]):
        super().__init__(**sizes)
        batch_size, seq_len = self.batch_size, self.seq_len
        self.windows = TokenWindows(tokens, seq_len, (self.seed,), self.shuffle)
        if self.windows.num_windows < batch_size:
            num = self.windows.num_windows
            raise InvalidInputError(
                f"the token stream has {len(tokens):,} tokens, which make {num:,} windows of "
                f"seq_len={seq_len}, fewer than batch_size={batch_size}; use a smaller batch_size or "
                f"seq_len, or more data (a batch needs at least {batch_size * seq_len + 1:,} tokens)"
            )
        self.tokens = tokens

    @property
    def num_windows(self) -> int:
        """Windows per epoch."""
        return self.windows.num_windows

    def batch(self, step: int) -> np.ndarray:
        """This process's rows of batch `step`, the same whichever batches were read before.

        Args:
            step: the 0-based training step.

        Returns:
            An int32 array of shape `[batch_size / process_count, seq_len + 1]`.

        Raises:
            InvalidInputError: `step` is negative.
        """
        out = np.empty((self.local_batch_size, self.seq_len + 1), dtype=np.int32)
        self.windows.read(self.windows.windows(self.samples(step)), out)
        return out
