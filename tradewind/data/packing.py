"""Whole documents packed into windows, with segment ids: batches in which no document sees another.

`PackedLoader` cuts a token stream into fixed windows wherever they fall, so a window may begin in the
middle of one document and end in the middle of the next, and attention runs across the boundary.
`DocumentLoader` keeps documents whole. Its unit is still a *window* of at most `seq_len + 1` tokens, but
a window here is a contiguous slice of the stream that starts and ends on document boundaries:

1. A document longer than `seq_len + 1` tokens is first cut into consecutive *chunks* of `seq_len + 1`
   tokens; its last, shorter chunk is treated like a document of its own. Call documents and chunks
   alike *pieces*: every piece fits in a window. (A chunk cannot see the chunk before it, so the first
   token of every chunk after a document's first is not a target.)
2. Pieces are packed greedily in stream order: a window takes pieces while the next one still fits,
   then the next window begins with that piece. Every token is in exactly one window, nothing is
   dropped, and what does not fill a window is padding.

Each window is one row of a batch, described by four int32 arrays of `[rows, seq_len + 1]`:

- `tokens`: the window's tokens, then 0 on padding.
- `segments`: 1 for the row's first piece, 2 for its second, ...; 0 on padding. Attention lets token `q`
  see token `k` only if `segments[q] == segments[k]` and `k <= q`, so no document sees another.
- `positions`: each token's position within its piece, restarting at 0 where a piece starts (the
  rotary or learned position the model uses); 0 on padding.
- `loss_mask`: 1 where token `j` is a target when predicted from token `j - 1`: the stream's own loss
  mask is 1 there (say, an assistant's reply in chat data), and `j` is neither the first token of its
  piece (whose predecessor belongs to another piece) nor padding; 0 otherwise.

The trainer feeds `tokens[:, :-1]` with `segments[:, :-1]` and `positions[:, :-1]`, and weights the loss
on the targets `tokens[:, 1:]` by `loss_mask[:, 1:]`.

Example, with `seq_len = 7` (windows of at most 8 tokens) and four documents `a` (3 tokens), `b` (4),
`c` (10) and `d` (2), `document_starts = [0, 3, 7, 17, 19]`. `c` is too long, so it becomes the chunks
`c0..c7` and `c8 c9`; packing then gives three windows, `[a b]`, `[c0..c7]` and `[c8 c9 d]`. The first
and the last, with the stream's mask 1 on every token except `b1`:

    tokens     a0 a1 a2 b0 b1 b2 b3  0        c8 c9 d0 d1  0  0  0  0
    segments    1  1  1  2  2  2  2  0         1  1  2  2  0  0  0  0
    positions   0  1  2  0  1  2  3  0         0  1  0  1  0  0  0  0
    loss_mask   0  1  1  0  0  1  1  0         0  1  0  1  0  0  0  0

The windows are ordered as `PackedLoader` orders its own (`tradewind.data.loader`): sample `k` of the
run is window `perm_epoch(k % num_windows)`, a Feistel permutation keyed by `(seed, epoch)`, so every
window comes once per epoch, any batch is read directly, only its windows are read from the stream, and
resuming at step `n` is `iter_batches(start_step=n)`. The constructor computes the windows: a vectorised
pass over the pieces, then a loop of one list lookup per window (for a million documents, 0.1 s in
170,000 windows of 2,049 tokens, 0.4 s in 2.7 million windows of 129).

Usage:
    loader = DocumentLoader(tokens, loss_mask, document_starts, batch_size=8, seq_len=1024, seed=0)
    batch = loader.batch(step)                        # a DocumentBatch of four [8, 1025] int32 arrays
"""

from __future__ import annotations

from typing import Any, NamedTuple, Unpack

import numpy as np

from tradewind.core import InvalidInputError
from tradewind.data.loader import LoaderSizes, StepLoader, WindowOrder


class DocumentBatch(NamedTuple):
    """This process's rows of one batch: four int32 arrays of `[batch_size / process_count, seq_len + 1]`.

    A `NamedTuple`, so JAX takes it as a pytree of four arrays.

    Attributes:
        tokens: token ids; 0 on padding.
        segments: 1, 2, ... for the row's documents or chunks in order; 0 on padding.
        positions: the position within the segment, from 0 at its first token; 0 on padding.
        loss_mask: 1 where the token is a target when predicted from the token before it (the stream's
            mask is 1, and it is neither its segment's first token nor padding); else 0.
    """

    tokens: np.ndarray
    segments: np.ndarray
    positions: np.ndarray
    loss_mask: np.ndarray


def pack_windows(document_starts: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut documents into pieces of at most `span` tokens and pack the pieces greedily into windows.

    Args:
        document_starts: int64, non-decreasing, each document's start and finally the stream's length
            (an empty document, a repeated entry, has no piece).
        span: the most tokens a window holds (`seq_len + 1`).

    Returns:
        `(piece_starts, window_pieces)`: the stream offset of every piece and finally the stream's
        length; and the index into `piece_starts` of every window's first piece and finally the number
        of pieces. Window `w` is `stream[piece_starts[window_pieces[w]] : piece_starts[window_pieces[w + 1]]]`.
    """
    starts = document_starts[:-1]
    lengths = np.diff(document_starts)
    chunks = -(-lengths // span)  # ceil; 0 for an empty document
    first_chunk = np.cumsum(chunks) - chunks
    chunk_index = np.arange(int(chunks.sum()), dtype=np.int64) - np.repeat(first_chunk, chunks)
    piece_starts = np.append(np.repeat(starts, chunks) + chunk_index * span, document_starts[-1])
    # The furthest piece boundary within `span` of each piece's start: where a window starting there ends.
    reach = np.searchsorted(piece_starts, piece_starts[:-1] + span, side="right") - 1
    # Greedy packing follows `reach` from piece 0, each step depending on the last; it visits only the
    # windows, so a plain loop over a list is cheap next to the vectorised pass above.
    hops = reach.tolist()
    window_pieces, piece, last = [0], 0, len(hops)
    while piece < last:
        piece = hops[piece]
        window_pieces.append(piece)
    return piece_starts, np.asarray(window_pieces, dtype=np.int64)


class DocumentLoader(StepLoader[DocumentBatch]):
    """Deterministic batches of whole documents packed into windows, shuffled per epoch.

    Args:
        tokens: the 1-D token stream (a memmap or `ShardedTokens` is fine; only the windows of each batch
            are read).
        loss_mask: a 1-D uint8 stream as long as `tokens`, nonzero where a token is a loss target; None
            makes every token a target.
        document_starts: int64: each document's start in the stream, in order from 0, then the stream's
            length.
        sizes: batch_size, seq_len, seed, shuffle, process_index, process_count, as `StepLoader` takes them;
            a window holds at most `seq_len + 1` tokens.

    Raises:
        InvalidInputError: a non-positive size, a stream or mask that is not 1-D or not as long as the
            stream, `document_starts` that do not run from 0 to the stream's length in order, fewer
            windows than `batch_size`, or a `batch_size` that `process_count` does not divide.
    """

    def __init__(
        self,
        tokens: Any,
        loss_mask: Any | None,
        document_starts: Any,
        **sizes: Unpack[LoaderSizes],
    ):
        super().__init__(**sizes)
        batch_size, seq_len = self.batch_size, self.seq_len
        if np.ndim(tokens) != 1:
            raise InvalidInputError(f"tokens must be a 1-D stream, got shape {np.shape(tokens)}")
        if loss_mask is not None and (np.ndim(loss_mask) != 1 or len(loss_mask) != len(tokens)):
            raise InvalidInputError(
                f"loss_mask must be a 1-D stream as long as tokens ({len(tokens):,}), got shape {np.shape(loss_mask)}"
            )
        starts = _checked_starts(document_starts, len(tokens))
        self.piece_starts, self._window_pieces = pack_windows(starts, seq_len + 1)
        self.window_starts = self.piece_starts[self._window_pieces]
        self.order = WindowOrder(len(self._window_pieces) - 1, (self.seed,), self.shuffle)
        if self.num_windows < batch_size:
            raise InvalidInputError(
                f"the token stream has {len(tokens):,} tokens in {len(starts) - 1:,} documents, which pack into "
                f"{self.num_windows:,} windows of seq_len={seq_len}, fewer than batch_size={batch_size}; use a "
                f"smaller batch_size or seq_len, or more data"
            )
        self.tokens = tokens
        self.loss_mask = loss_mask
        self.document_starts = starts

    @property
    def num_windows(self) -> int:
        """Windows per epoch."""
        return self.order.num_windows

    @property
    def num_documents(self) -> int:
        """Documents in the stream (empty ones included)."""
        return len(self.document_starts) - 1

    def batch(self, step: int) -> DocumentBatch:
        """This process's rows of batch `step`, the same whichever batches were read before.

        Args:
            step: the 0-based training step.

        Returns:
            A `DocumentBatch` of four int32 arrays of shape `[batch_size / process_count, seq_len + 1]`.

        Raises:
            InvalidInputError: `step` is negative.
        """
        windows = self.order.windows(self.samples(step))
        rows, span = self.local_batch_size, self.seq_len + 1
        starts, ends = self.window_starts[windows], self.window_starts[windows + 1]
        tokens = np.zeros((rows, span), dtype=np.int32)
        stream_mask = np.ones((rows, span), dtype=bool) if self.loss_mask is None else np.zeros((rows, span), bool)
        for row, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            tokens[row, : end - start] = self.tokens[start:end]
            if self.loss_mask is not None:
                stream_mask[row, : end - start] = self.loss_mask[start:end]

        # Number the batch's pieces row by row and mark the cell each starts at (`cells`, ascending); over
        # the flattened batch a running count of the marks is then each cell's piece, which gives its
        # segment (less the pieces of the rows before) and its position (less the piece's first cell).
        first, after = self._window_pieces[windows], self._window_pieces[windows + 1]
        counts = after - first
        before = np.cumsum(counts) - counts
        piece_rows = np.repeat(np.arange(rows), counts)
        pieces = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(before - first, counts)
        cells = (piece_rows * span + self.piece_starts[pieces] - starts[piece_rows]).astype(np.int32)
        marks = np.zeros(rows * span, dtype=np.int32)
        marks[cells] = 1
        piece = (np.cumsum(marks, dtype=np.int32) - 1).reshape(rows, span)
        filled = np.arange(span) < (ends - starts)[:, None]
        segments = (piece - (before - 1).astype(np.int32)[:, None]) * filled
        positions = (np.arange(rows * span, dtype=np.int32).reshape(rows, span) - cells.take(piece)) * filled
        # A positive position is a filled token that is not its segment's first.
        loss_mask = ((positions > 0) & stream_mask).astype(np.int32)
        return DocumentBatch(tokens, segments, positions, loss_mask)


def _checked_starts(document_starts: Any, length: int) -> np.ndarray:
    """`document_starts` as int64, checked to run in order from 0 to the stream's `length`."""
    starts = np.asarray(document_starts)
    if starts.ndim != 1 or len(starts) < 1 or not np.issubdtype(starts.dtype, np.integer):
        raise InvalidInputError(
            f"document_starts must be a 1-D integer array ending with the stream's length, got shape "
            f"{starts.shape} of {starts.dtype}"
        )
    starts = starts.astype(np.int64, copy=False)
    if starts[0] != 0 or starts[-1] != length:
        raise InvalidInputError(
            f"document_starts must start at 0 and end at the stream's length {length:,} "
            f"(got {int(starts[0]):,} ... {int(starts[-1]):,})"
        )
    backwards = np.flatnonzero(np.diff(starts) < 0)
    if len(backwards):
        i = int(backwards[0])
        raise InvalidInputError(
            f"document_starts must be non-decreasing (entry {i} is {int(starts[i]):,}, entry {i + 1} is "
            f"{int(starts[i + 1]):,})"
        )
    return starts
