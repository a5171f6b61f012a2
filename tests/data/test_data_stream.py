"""`ShardedTokens`: shards read as one token stream agree with their concatenation, index by index."""

import numpy as np
import pytest

from tradewind.data.stream import ShardedTokens

SHARDS = [np.arange(0, 5, dtype=np.uint16), np.arange(5, 6, dtype=np.uint16), np.arange(6, 13, dtype=np.uint16)]


@pytest.fixture
def stream() -> ShardedTokens:
    # An empty shard in the middle, as a cache split can have; it must not shift the boundaries.
    return ShardedTokens([SHARDS[0], np.empty(0, dtype=np.uint16), SHARDS[1], SHARDS[2]], np.uint16)


def test_the_stream_has_the_concatenations_length_shape_and_dtype_and_drops_empty_shards(stream):
    assert len(stream) == 13 and stream.shape == (13,) and stream.ndim == 1 and stream.dtype == np.uint16
    assert len(stream.parts) == 3
    assert repr(stream) == "ShardedTokens(3 shards, 13 tokens, uint16)"


def test_every_index_positive_and_negative_reads_the_concatenations_token(stream):
    whole = np.concatenate(SHARDS)
    for index in range(-13, 13):
        assert stream[index] == whole[index], index


@pytest.mark.parametrize("index", [13, -14, 100])
def test_an_index_past_either_end_is_an_index_error(stream, index):
    with pytest.raises(IndexError, match=f"index {index} is out of bounds for 13 tokens"):
        stream[index]


def test_every_slice_within_across_and_past_the_shards_equals_the_concatenations_slice(stream):
    whole = np.concatenate(SHARDS)
    for start in [None, *range(-15, 16)]:
        for stop in [None, *range(-15, 16)]:
            for step in (None, 1, 2, 3):
                got = stream[start:stop:step]
                np.testing.assert_array_equal(got, whole[start:stop:step], err_msg=f"[{start}:{stop}:{step}]")
                assert got.dtype == np.uint16


def test_a_slice_across_shards_is_a_new_array_and_writing_to_it_leaves_the_shards_untouched():
    parts = [np.arange(4, dtype=np.int32), np.arange(4, 8, dtype=np.int32)]
    stream = ShardedTokens(parts, np.int32)
    across = stream[2:6]
    across[:] = -1
    np.testing.assert_array_equal(np.concatenate(parts), np.arange(8))


def test_a_stream_of_no_shards_is_empty_and_converts_to_an_empty_array():
    empty = ShardedTokens([np.empty(0, dtype=np.uint32)], np.uint32)
    assert len(empty) == 0 and empty[0:5].shape == (0,)
    converted = np.asarray(empty)
    assert converted.shape == (0,) and converted.dtype == np.uint32


def test_converting_to_an_array_concatenates_and_honours_a_requested_dtype(stream):
    np.testing.assert_array_equal(np.asarray(stream), np.arange(13))
    as_int64 = np.asarray(stream, dtype=np.int64)
    assert as_int64.dtype == np.int64 and as_int64.tolist() == list(range(13))
