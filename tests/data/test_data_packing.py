import numpy as np
import pytest

from tradewind.core import InvalidInputError
from tradewind.data import ShardedTokens
from tradewind.data.packing import DocumentBatch, DocumentLoader

SEQ_LEN = 8
SPAN = SEQ_LEN + 1


def documents():
    """Short documents and some longer than a window, with the edge cases spelled out, and a random mask."""
    rng = np.random.default_rng(0)
    varied = rng.permutation(np.concatenate([rng.integers(1, 6, 60), rng.integers(SPAN + 1, 3 * SPAN, 12)]))
    lengths = [*varied.tolist(), SPAN, SPAN + 1, 2 * SPAN, 1, SPAN - 1, 2 * SPAN + 3]
    total = sum(lengths)
    # Token i of the stream is i + 1: a row's tokens say where in the stream they came from, and 0 is padding.
    tokens = np.arange(1, total + 1, dtype=np.uint32)
    mask = rng.integers(0, 2, total, dtype=np.uint8)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return lengths, tokens, mask, starts


LENGTHS, TOKENS, MASK, STARTS = documents()


def reference_windows(lengths, span):
    """The pieces `(start, end)` and the windows (lists of pieces), by the rule written out in plain Python."""
    pieces, start = [], 0
    for n in lengths:
        pieces.extend((start + offset, start + min(offset + span, n)) for offset in range(0, n, span))
        start += n
    windows = []
    for piece in pieces:
        if windows and piece[1] - windows[-1][0][0] <= span:
            windows[-1].append(piece)
        else:
            windows.append([piece])
    return pieces, windows


PIECES, WINDOWS = reference_windows(LENGTHS, SPAN)
PIECE_STARTS = np.array([start for start, _ in PIECES])


def loader(**kwargs):
    args = {"batch_size": 6, "seq_len": SEQ_LEN, **kwargs}
    return DocumentLoader(args.pop("tokens", TOKENS), args.pop("loss_mask", MASK), STARTS, **args)


def stream_rows(batch):
    """Each row's stream offsets (token - 1) of its filled part, checking that the rest is padding."""
    rows = []
    for row in range(len(batch.tokens)):
        filled = batch.tokens[row] != 0
        count = int(filled.sum())
        assert filled[:count].all(), "padding is not at the end of the row"
        for name in DocumentBatch._fields:
            assert not getattr(batch, name)[row, count:].any(), f"{name} is not 0 on padding"
        offsets = batch.tokens[row, :count].astype(np.int64) - 1
        assert np.array_equal(offsets, offsets[0] + np.arange(count)), "row is not a contiguous slice of the stream"
        rows.append(offsets)
    return rows


def window_of(offsets):
    return [start for (start, _), *_ in WINDOWS].index(int(offsets[0]))


def test_windows_are_whole_documents_packed_greedily_with_long_documents_cut_into_chunks():
    packed = loader()
    expected_starts = [window[0][0] for window in WINDOWS] + [len(TOKENS)]

    assert any(n > SPAN for n in LENGTHS) and len(WINDOWS) > len(LENGTHS) // 2  # guard: chunks and packing both
    assert packed.window_starts.tolist() == expected_starts
    assert packed.piece_starts.tolist() == [*PIECE_STARTS.tolist(), len(TOKENS)]
    assert packed.num_windows == len(WINDOWS) and packed.num_documents == len(LENGTHS)
    assert packed.tokens_per_batch == 6 * SEQ_LEN


def test_batches_are_four_int32_arrays_of_seq_len_plus_one():
    batch = loader().batch(2)

    assert isinstance(batch, DocumentBatch) and batch._fields == ("tokens", "segments", "positions", "loss_mask")
    assert all(a.dtype == np.int32 and a.shape == (6, SPAN) for a in batch)


def test_every_token_appears_in_exactly_one_window_per_epoch():
    packed = loader(seed=3)
    assert packed.num_windows % 6, "guard: batches must straddle epochs"
    rows = [r for step in range(3 * packed.num_windows // 6 + 1) for r in stream_rows(packed.batch(step))]

    epochs = [rows[e * packed.num_windows : (e + 1) * packed.num_windows] for e in range(3)]
    for epoch in epochs:
        assert np.array_equal(np.sort(np.concatenate(epoch)), np.arange(len(TOKENS)))
        assert sorted(window_of(r) for r in epoch) == list(range(packed.num_windows))
    assert [window_of(r) for r in epochs[0]] != [window_of(r) for r in epochs[1]]


def test_segments_change_and_positions_restart_exactly_at_document_and_chunk_starts():
    packed = loader(seed=1)
    checked_rows_with_several_segments = 0
    for step in range(packed.num_windows // 6 + 1):
        batch = packed.batch(step)
        for row, offsets in enumerate(stream_rows(batch)):
            starts_here = np.isin(offsets, PIECE_STARTS)
            latest_start = np.maximum.accumulate(np.where(starts_here, offsets, 0))
            count = len(offsets)

            assert starts_here[0], "a window starts where a document or chunk starts"
            assert offsets[-1] + 1 in PIECE_STARTS or offsets[-1] + 1 == len(TOKENS), "a window ends on a boundary"
            assert np.array_equal(batch.segments[row, :count], np.cumsum(starts_here))
            assert np.array_equal(batch.positions[row, :count], offsets - latest_start)
            checked_rows_with_several_segments += batch.segments[row].max() > 1
    assert checked_rows_with_several_segments > 10


def test_loss_mask_is_the_streams_mask_except_at_each_segments_first_token_and_on_padding():
    packed = loader(seed=2)
    for step in range(packed.num_windows // 6 + 1):
        batch = packed.batch(step)
        for row, offsets in enumerate(stream_rows(batch)):
            expected = (MASK[offsets] == 1) & ~np.isin(offsets, PIECE_STARTS)
            assert np.array_equal(batch.loss_mask[row, : len(offsets)], expected)
            assert not batch.loss_mask[row, len(offsets) :].any()


def test_without_a_loss_mask_every_token_but_each_segments_first_is_a_target():
    batch = loader(loss_mask=None, seed=2).batch(4)

    assert np.array_equal(batch.loss_mask, (batch.positions > 0).astype(np.int32))
    assert batch.loss_mask.sum() == (batch.tokens != 0).sum() - (batch.positions[batch.tokens != 0] == 0).sum()


def test_the_module_docstrings_example_gives_the_arrays_it_shows():
    a, b, c, d = 100, 200, 300, 400  # documents of 3, 4, 10 and 2 tokens, numbered by their first digit
    tokens = np.array([a, a + 1, a + 2, b, b + 1, b + 2, b + 3, *range(c, c + 10), d, d + 1])
    mask = np.ones(len(tokens), dtype=np.uint8)
    mask[4] = 0  # b1
    packed = DocumentLoader(tokens, mask, [0, 3, 7, 17, 19], batch_size=3, seq_len=7, shuffle=False)

    first, chunk, last = (np.stack(arrays) for arrays in zip(*packed.batch(0), strict=True))
    assert np.array_equal(
        first,
        [
            [a, a + 1, a + 2, b, b + 1, b + 2, b + 3, 0],
            [1, 1, 1, 2, 2, 2, 2, 0],
            [0, 1, 2, 0, 1, 2, 3, 0],
            [0, 1, 1, 0, 0, 1, 1, 0],
        ],
    )
    assert np.array_equal(chunk[0], np.arange(c, c + 8)) and np.array_equal(chunk[2], np.arange(8))
    assert np.array_equal(
        last,
        [
            [c + 8, c + 9, d, d + 1, 0, 0, 0, 0],
            [1, 1, 2, 2, 0, 0, 0, 0],
            [0, 1, 0, 1, 0, 0, 0, 0],
            [0, 1, 0, 1, 0, 0, 0, 0],
        ],
    )


def test_empty_documents_have_no_segment():
    starts = [0, 0, 3, 3, 3, 5]
    batch = DocumentLoader(np.arange(1, 6), None, starts, batch_size=1, seq_len=7).batch(0)

    assert batch.segments[0].tolist() == [1, 1, 1, 2, 2, 0, 0, 0]


def test_same_seed_gives_the_same_batches_and_another_seed_different_ones():
    first = [loader(seed=7).batch(s) for s in range(10)]
    again = [loader(seed=7).batch(s) for s in range(10)]
    other = [loader(seed=8).batch(s) for s in range(10)]

    assert all(np.array_equal(x, y) for a, b in zip(first, again, strict=True) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(a.tokens, b.tokens) for a, b in zip(first, other, strict=True))


def test_batch_n_does_not_depend_on_which_batches_were_read_before():
    fresh = loader(seed=1).batch(9)
    used = loader(seed=1)
    for step in (90, 0, 51, 9, 150):  # later epochs first, so cached permutations are evicted
        used.batch(step)

    assert all(np.array_equal(x, y) for x, y in zip(used.batch(9), fresh, strict=True))


def test_without_shuffle_windows_come_in_stream_order_and_wrap_at_the_epoch():
    packed = loader(shuffle=False)
    steps_per_epoch = packed.num_windows // 6

    assert [window_of(r) for r in stream_rows(packed.batch(0))] == list(range(6))
    wrapping = [window_of(r) for r in stream_rows(packed.batch(steps_per_epoch))]
    assert wrapping == [(6 * steps_per_epoch + i) % packed.num_windows for i in range(6)]
    assert wrapping[-1] < wrapping[0], "guard: this batch must wrap"


def test_iter_batches_resumed_at_step_n_gives_the_tail_of_an_uninterrupted_iteration():
    whole = loader(seed=2).iter_batches(start_step=0, prefetch=2)
    uninterrupted = [next(whole) for _ in range(40)]
    whole.close()
    resumed = loader(seed=2).iter_batches(start_step=25, prefetch=3)

    for expected in uninterrupted[25:]:
        assert all(np.array_equal(x, y) for x, y in zip(next(resumed), expected, strict=True))
    resumed.close()


def test_processes_read_disjoint_slices_that_together_make_the_global_batch():
    whole = loader(seed=5, batch_size=8)
    parts = [loader(seed=5, batch_size=8, process_index=i, process_count=2) for i in range(2)]

    for step in range(20):
        slices = [part.batch(step) for part in parts]
        assert all(s.tokens.shape == (4, SPAN) for s in slices)
        for name, expected in zip(DocumentBatch._fields, whole.batch(step), strict=True):
            assert np.array_equal(np.concatenate([getattr(s, name) for s in slices]), expected)


class RecordingStream:
    """A 1-D stream that notes every slice read from it."""

    ndim = 1

    def __init__(self, values):
        self.values = values
        self.shape = values.shape
        self.reads = []

    def __len__(self):
        return len(self.values)

    def __getitem__(self, key):
        assert isinstance(key, slice), "only slices may be read"
        self.reads.append((key.start, key.stop))
        return self.values[key]


def test_a_batch_reads_only_its_own_windows_from_the_stream_and_mask():
    tokens, mask = RecordingStream(TOKENS), RecordingStream(MASK)
    packed = loader(tokens=tokens, loss_mask=mask, seed=4)
    assert tokens.reads == [] and mask.reads == []

    batch = packed.batch(3)
    windows = [window_of(r) for r in stream_rows(batch)]
    expected = [(WINDOWS[w][0][0], WINDOWS[w][-1][1]) for w in windows]
    assert tokens.reads == expected and mask.reads == expected


def test_a_sharded_stream_gives_the_same_batches_as_one_array():
    sharded = ShardedTokens([TOKENS[:100], TOKENS[100:101], TOKENS[101:]], TOKENS.dtype)

    for step in range(5):
        assert all(
            np.array_equal(x, y) for x, y in zip(loader(tokens=sharded).batch(step), loader().batch(step), strict=True)
        )


def test_too_few_windows_for_a_batch_says_the_numbers_and_the_fix():
    with pytest.raises(
        InvalidInputError, match=r"10 tokens in 3 documents.*3 windows of seq_len=3, fewer than batch_size=4.*smaller"
    ):
        DocumentLoader(np.arange(10), None, [0, 4, 7, 10], batch_size=4, seq_len=3)


@pytest.mark.parametrize(
    ("mask", "starts", "message"),
    [
        (None, [3, 10], "document_starts must start at 0 and end at the stream's length 10"),
        (None, [0, 4, 9], r"document_starts must start at 0 and end at the stream's length 10 \(got 0 ... 9\)"),
        (None, [0, 6, 4, 10], r"document_starts must be non-decreasing \(entry 1 is 6, entry 2 is 4\)"),
        (None, [[0, 10]], "document_starts must be a 1-D integer array"),
        (None, [0.0, 10.0], "document_starts must be a 1-D integer array"),
        (np.ones(9, dtype=np.uint8), [0, 10], r"loss_mask must be a 1-D stream as long as tokens \(10\)"),
    ],
)
def test_inconsistent_documents_or_mask_are_refused_by_name(mask, starts, message):
    with pytest.raises(InvalidInputError, match=message):
        DocumentLoader(np.arange(10), mask, starts, batch_size=1, seq_len=3)


def test_negative_step_is_refused():
    with pytest.raises(InvalidInputError, match="step"):
        loader().batch(-1)
