"""A run's data: its token cache opened with a shuffled train loader and an in-order val loader."""

import numpy as np
import pytest

from tradewind.core import InvalidInputError, NotFoundError
from tradewind.data import TokenizeConfig, build_token_cache, load_tokenizer
from tradewind.runs import TrainConfig, open_run_data


@pytest.fixture(scope="module")
def cache(small_corpus, tmp_path_factory):
    """A byte-level cache of the suite's small corpus, 20% of its documents held out."""
    folder = tmp_path_factory.mktemp("batches") / "cache"
    build_token_cache([small_corpus], folder, load_tokenizer("byte"), TokenizeConfig(val_fraction=0.2))
    return folder


def config(cache, **fields) -> TrainConfig:
    return TrainConfig(dataset=str(cache), batch_size=4, seq_len=16, **fields)


def test_the_loaders_read_batches_of_the_configured_shape_from_the_caches_splits(cache):
    data = open_run_data(config(cache))
    assert data.cache.path == cache
    for loader, split in ((data.train, "train"), (data.val, "val")):
        batch = loader.batch(0)
        assert batch.shape == (4, 17) and batch.dtype == np.int32
        tokens = np.asarray(data.cache.tokens(split))
        assert loader.num_windows == (len(tokens) - 1) // 16
        # Every row is a window of the split's own tokens.
        for row in batch:
            starts = np.flatnonzero(tokens[: len(tokens) - 16] == row[0])
            assert any(np.array_equal(tokens[s : s + 17], row) for s in starts)


def test_val_reads_windows_in_order_and_train_shuffles_them_by_seed(cache):
    data = open_run_data(config(cache))
    val_tokens = np.asarray(data.cache.tokens("val"))
    np.testing.assert_array_equal(data.val.batch(0)[1], val_tokens[16:33])  # row 1 is window 1
    reseeded = open_run_data(config(cache, seed=1))
    np.testing.assert_array_equal(open_run_data(config(cache)).train.batch(3), data.train.batch(3))
    assert not np.array_equal(reseeded.train.batch(0), data.train.batch(0))


def test_a_split_too_short_for_one_batch_is_refused_naming_the_dataset_and_split(cache):
    with pytest.raises(InvalidInputError, match=rf"dataset {cache}, split 'val': "):
        # About 63 windows of 1,024 tokens in train, a quarter of that in val: only val is short of 32.
        open_run_data(config(cache).model_copy(update={"batch_size": 32, "seq_len": 1024}))


def test_a_folder_without_a_token_cache_is_not_found(tmp_path):
    with pytest.raises(NotFoundError):
        open_run_data(config(tmp_path / "nowhere"))
