import numpy as np
import pytest

from tradewind.core import InvalidInputError
from tradewind.data import MixtureLoader

SEQ_LEN = 4


def streams():
    # Each source's tokens are offset by a million times its index, so a row tells where it came from.
    sizes = (50, 300, 20)
    return [np.arange(n * SEQ_LEN + 1, dtype=np.int64) + 1_000_000 * i for i, n in enumerate(sizes)]


def source_of(batch):
    return (batch[:, 0] // 1_000_000).tolist()


def mixture(**kwargs):
    return MixtureLoader(streams(), [0.25, 0.5, 0.25], **{"batch_size": 8, "seq_len": SEQ_LEN, "block": 16, **kwargs})


def test_mixture_draws_sources_in_the_weighted_proportions_exactly_per_block():
    rows = [s for step in range(40) for s in source_of(mixture().batch(step))]  # 320 samples, 20 blocks

    for block in range(20):
        chunk = rows[block * 16 : (block + 1) * 16]
        assert [chunk.count(i) for i in range(3)] == [4, 8, 4]


def test_mixture_rows_are_whole_windows_of_their_source_each_once_per_that_sources_epoch():
    loader = mixture(seed=3)
    windows = {0: [], 1: [], 2: []}
    for step in range(40):
        batch = loader.batch(step)
        assert np.array_equal(batch - batch[:, :1], np.broadcast_to(np.arange(SEQ_LEN + 1), batch.shape))
        for row in batch:
            source = int(row[0] // 1_000_000)
            windows[source].append(int(row[0] % 1_000_000) // SEQ_LEN)
    # source 2 has 20 windows and got 80 samples: four full epochs, each a permutation.
    for epoch in range(4):
        assert sorted(windows[2][epoch * 20 : (epoch + 1) * 20]) == list(range(20))
    assert sorted(windows[0][:50]) == list(range(50))


def test_mixture_batches_depend_only_on_seed_and_step():
    fresh = mixture(seed=1).batch(17)
    used = mixture(seed=1)
    for step in (90, 3, 17, 40):
        used.batch(step)

    assert np.array_equal(used.batch(17), fresh)
    assert not np.array_equal(mixture(seed=2).batch(17), fresh)


def test_mixture_processes_read_disjoint_slices_of_the_global_batch():
    whole = mixture(seed=4)
    halves = [mixture(seed=4, process_index=i, process_count=2) for i in range(2)]

    for step in range(10):
        assert np.array_equal(np.concatenate([h.batch(step) for h in halves]), whole.batch(step))


def test_mixture_iter_batches_resumes_at_a_step():
    resumed = mixture(seed=6).iter_batches(start_step=5)

    for step in range(5, 15):
        assert np.array_equal(next(resumed), mixture(seed=6).batch(step))
    resumed.close()


@pytest.mark.parametrize(
    ("weights", "message"),
    [([1.0], "one weight per source"), ([0, 0, 0], "not all zero"), ([1, -1, 1], "non-negative")],
)
def test_mixture_refuses_bad_weights(weights, message):
    with pytest.raises(InvalidInputError, match=message):
        MixtureLoader(streams(), weights, batch_size=8, seq_len=SEQ_LEN)
