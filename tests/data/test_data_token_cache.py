"""The finished token cache: its read-only token streams, `verify`, and opening a missing, unfinished or
older-format cache or an unknown split."""

import json

import pytest

from tradewind.core import InvalidInputError, NotFoundError
from tradewind.data import ByteTokenizer, build_token_cache, open_token_cache


def test_cache_tokens_are_read_only(tmp_path, corpus):
    build_token_cache([corpus], tmp_path / "cache", ByteTokenizer())

    with pytest.raises(ValueError):
        open_token_cache(tmp_path / "cache").tokens("train")[0] = 1


def test_verify_catches_one_flipped_byte(tmp_path, corpus):
    build_token_cache([corpus], tmp_path / "cache", ByteTokenizer())
    tokens_bin = tmp_path / "cache" / "val" / "shard-00000.bin"
    data = bytearray(tokens_bin.read_bytes())
    data[len(data) // 2] ^= 0x01
    tokens_bin.write_bytes(bytes(data))

    with pytest.raises(InvalidInputError, match=r"val/shard-00000.bin: sha256 is"):
        open_token_cache(tmp_path / "cache").verify()


def test_opening_an_unfinished_cache_says_the_manifest_is_missing(tmp_path):
    (tmp_path / "cache" / "train").mkdir(parents=True)

    with pytest.raises(NotFoundError, match=r"no token cache at .*manifest.json missing"):
        open_token_cache(tmp_path / "cache")


def test_a_cache_of_an_older_format_asks_to_be_rebuilt(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "manifest.json").write_text(json.dumps({"format_version": 1}))

    with pytest.raises(InvalidInputError, match="format_version 1, this Tradewind reads 2; rebuild the cache"):
        open_token_cache(tmp_path / "cache")


def test_unknown_split_lists_the_splits_there_are(tmp_path, corpus):
    build_token_cache([corpus], tmp_path / "cache", ByteTokenizer())

    with pytest.raises(NotFoundError, match="no split 'test'; it has train, val"):
        open_token_cache(tmp_path / "cache").tokens("test")
