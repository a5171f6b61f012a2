import numpy as np
import pytest

from tradewind.core import InvalidInputError
from tradewind.data import PackedLoader

SEQ_LEN = 4
# 23 windows: a batch of 5 does not divide an epoch, so batches straddle epochs.
STREAM = np.arange(23 * SEQ_LEN + 3, dtype=np.uint16)


def window_ids(batch):
    """The window index of each row, checking on the way that the row is a contiguous slice of STREAM."""
    starts = batch[:, 0]
    assert np.array_equal(batch, starts[:, None] + np.arange(SEQ_LEN + 1)), "row is not a contiguous slice"
    assert np.all(starts % SEQ_LEN == 0)
    return (starts // SEQ_LEN).tolist()


def loader(tokens=STREAM, **kwargs):
    return PackedLoader(tokens, **{"batch_size": 5, "seq_len": SEQ_LEN, **kwargs})


def test_batches_are_int32_rows_of_seq_len_plus_one_contiguous_tokens():
    batch = loader().batch(3)

    assert batch.dtype == np.int32 and batch.shape == (5, SEQ_LEN + 1)
    window_ids(batch)
    assert loader().num_windows == 23 and loader().tokens_per_batch == 5 * SEQ_LEN


def test_each_epoch_visits_every_window_exactly_once():
    samples = [w for step in range(20) for w in window_ids(loader(seed=3).batch(step))]  # 100 samples

    epochs = [samples[0:23], samples[23:46], samples[46:69], samples[69:92]]
    assert all(sorted(epoch) == list(range(23)) for epoch in epochs)
    assert epochs[0] != epochs[1] and epochs[0] != list(range(23))


def test_same_seed_gives_the_same_batches_and_another_seed_different_ones():
    first = [loader(seed=7).batch(s) for s in range(10)]
    again = [loader(seed=7).batch(s) for s in range(10)]
    other = [loader(seed=8).batch(s) for s in range(10)]

    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_batch_n_does_not_depend_on_which_batches_were_read_before():
    fresh = loader(seed=1).batch(9)
    used = loader(seed=1)
    for step in (30, 0, 17, 9, 50):  # later epochs first, so cached permutations are evicted
        used.batch(step)

    assert np.array_equal(used.batch(9), fresh)


def test_iter_batches_resumes_at_a_step_with_the_same_batches():
    batches = loader(seed=2).iter_batches(start_step=6)

    for step in range(6, 12):
        assert np.array_equal(next(batches), loader(seed=2).batch(step))


def test_without_shuffle_windows_come_in_stream_order_and_wrap_at_the_epoch():
    unshuffled = loader(shuffle=False)

    assert window_ids(unshuffled.batch(0)) == [0, 1, 2, 3, 4]
    assert window_ids(unshuffled.batch(4)) == [20, 21, 22, 0, 1]


def test_neighbouring_windows_share_one_token_so_every_token_is_a_target():
    rows = loader(shuffle=False).batch(0)

    assert np.array_equal(rows[:-1, -1], rows[1:, 0])


def test_too_few_windows_for_a_batch_says_the_numbers_and_the_fix():
    with pytest.raises(InvalidInputError, match=r"10 tokens.*3 windows of seq_len=3, fewer than batch_size=4.*smaller"):
        PackedLoader(np.arange(10), batch_size=4, seq_len=3)


def test_negative_step_is_refused():
    with pytest.raises(InvalidInputError, match="step"):
        loader().batch(-1)


def test_iter_batches_with_background_prefetch_gives_the_same_batches_as_direct_reads():
    prefetched = loader(seed=4).iter_batches(start_step=3, prefetch=3)
    direct = loader(seed=4).iter_batches(start_step=3, prefetch=0)

    for _ in range(30):
        assert np.array_equal(next(prefetched), next(direct))
    prefetched.close()


def test_an_error_while_prefetching_reaches_the_consumer():
    batches = loader().iter_batches(start_step=-2, prefetch=2)

    with pytest.raises(InvalidInputError, match="step must be non-negative"):
        next(batches)


def test_processes_read_disjoint_slices_that_together_make_the_global_batch():
    stream = np.arange(100 * SEQ_LEN + 1, dtype=np.uint16)
    whole = PackedLoader(stream, batch_size=8, seq_len=SEQ_LEN, seed=5)
    parts = [
        PackedLoader(stream, batch_size=8, seq_len=SEQ_LEN, seed=5, process_index=i, process_count=4) for i in range(4)
    ]

    seen = []
    for step in range(12):  # 96 samples: within one epoch of 100 windows
        slices = [part.batch(step) for part in parts]
        assert all(s.shape == (2, SEQ_LEN + 1) for s in slices)
        assert np.array_equal(np.concatenate(slices), whole.batch(step))
        seen.extend(w for s in slices for w in (s[:, 0] // SEQ_LEN).tolist())
    assert len(seen) == len(set(seen)) == 96


def test_a_batch_size_that_processes_cannot_share_evenly_is_refused():
    with pytest.raises(InvalidInputError, match="batch_size 5 must be divisible by process_count 2"):
        loader(process_index=0, process_count=2)
    with pytest.raises(InvalidInputError, match="process_index must be in"):
        loader(process_index=2, process_count=2, batch_size=4)


def test_loader_over_a_sharded_stream_reads_windows_across_shard_boundaries():
    from tradewind.data import ShardedTokens

    parts = [STREAM[:10], STREAM[10:10], STREAM[10:41], STREAM[41:]]
    sharded = ShardedTokens(parts, STREAM.dtype)

    assert len(sharded) == len(STREAM) and sharded[37] == STREAM[37] and sharded[-1] == STREAM[-1]
    for step in range(10):
        assert np.array_equal(loader(seed=9, tokens=sharded).batch(step), loader(seed=9).batch(step))


def test_windows_come_from_the_same_feistel_permutation_whether_tabled_or_computed_per_batch():
    from tradewind.data import FeistelPermutation
    from tradewind.data.loader import _TABLE_LIMIT, TokenWindows

    small = TokenWindows(np.zeros(1000 * SEQ_LEN + 1, dtype=np.uint16), SEQ_LEN, key=(7,))
    assert np.array_equal(small.windows(np.arange(1000, 2000)), FeistelPermutation(1000, (7, 1))(np.arange(1000)))

    huge = TokenWindows(np.zeros(_TABLE_LIMIT + 10, dtype=np.uint16), 1, key=(7,))  # too many windows to table
    samples = np.arange(0, 3 * huge.num_windows, 9_973)
    expected = FeistelPermutation(huge.num_windows, (7, 0))(samples % huge.num_windows)
    first_epoch = samples < huge.num_windows
    assert np.array_equal(huge.windows(samples[first_epoch]), expected[first_epoch])
    assert np.array_equal(
        huge.windows(samples),
        np.concatenate(
            [
                FeistelPermutation(huge.num_windows, (7, e))(
                    samples[samples // huge.num_windows == e] % huge.num_windows
                )
                for e in range(3)
            ]
        ),
    )
