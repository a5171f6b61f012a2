import hashlib
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from tradewind.core import InvalidInputError, NotFoundError
from tradewind.data import ByteTokenizer, PackedLoader, build_token_cache, open_token_cache

# More than one tokenizer batch (1,000 documents), so batch boundaries are crossed.
PARAGRAPHS = [f"Paragraph {i}: {'é' * (i % 4)}{'word ' * (i % 7)}end." for i in range(2_500)]


class WideTokenizer:
    """A real (if silly) tokenizer whose ids need 32 bits: each character becomes 65,536 + its code point."""

    name = "wide"
    vocab_size = 65_536 + 0x110000 + 1
    eos_id = vocab_size - 1
    bos_id = None
    fingerprint = hashlib.sha256(b"wide").hexdigest()

    def encode_batch(self, texts):
        return [[65_536 + ord(c) for c in text] for text in texts]

    def decode(self, ids):
        return "".join(chr(i - 65_536) for i in ids if i != self.eos_id)


def is_val(text, fraction):
    # Written out again here, from the documented rule, so that the test checks the cache against it.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") / 2**64 < fraction


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "inputs" / "corpus.txt"
    path.parent.mkdir()
    path.write_text("\n\n".join(PARAGRAPHS) + "\n")
    return path


def decoded_documents(cache, split, tokenizer):
    tokens, offsets = cache.tokens(split), cache.offsets(split)
    return [tokenizer.decode(tokens[a:b]) for a, b in itertools.pairwise(offsets)]


def test_byte_cache_holds_every_document_once_followed_by_eos_with_consistent_offsets(tmp_path, corpus):
    manifest = build_token_cache([corpus], tmp_path / "cache", ByteTokenizer(), val_fraction=0.2)
    cache = open_token_cache(tmp_path / "cache")

    train, val = manifest.splits["train"], manifest.splits["val"]
    assert cache.manifest == manifest
    assert manifest.dtype == "uint16" and cache.tokens("train").dtype == np.uint16
    assert train.documents + val.documents == len(PARAGRAPHS)
    assert train.tokens + val.tokens == sum(len(p.encode()) + 1 for p in PARAGRAPHS)
    assert train.bytes + val.bytes == sum(len(p.encode()) for p in PARAGRAPHS)
    assert 0.15 < val.documents / len(PARAGRAPHS) < 0.25
    for split in ("train", "val"):
        tokens, offsets = cache.tokens(split), cache.offsets(split)
        assert offsets.dtype == np.int64 and offsets[0] == 0 and offsets[-1] == len(tokens)
        assert np.all(tokens[offsets[1:] - 1] == 256)
        assert np.count_nonzero(tokens == 256) == manifest.splits[split].documents
        assert manifest.splits[split].sha256 == hashlib.sha256(tokens.tobytes()).hexdigest()
    assert decoded_documents(cache, "val", ByteTokenizer()) == [p for p in PARAGRAPHS if is_val(p, 0.2)]
    assert decoded_documents(cache, "train", ByteTokenizer()) == [p for p in PARAGRAPHS if not is_val(p, 0.2)]
    assert manifest.sources[0].path == str(corpus) and manifest.sources[0].size == corpus.stat().st_size
    assert json.loads((tmp_path / "cache" / "manifest.json").read_text())["splits"]["val"]["documents"] == val.documents
    cache.verify()


def test_cache_tokens_are_read_only(tmp_path, corpus):
    build_token_cache([corpus], tmp_path / "cache", ByteTokenizer())

    with pytest.raises(ValueError):
        open_token_cache(tmp_path / "cache").tokens("train")[0] = 1


def test_large_vocabularies_are_stored_as_uint32(tmp_path, corpus):
    tokenizer = WideTokenizer()

    manifest = build_token_cache([corpus], tmp_path / "cache", tokenizer, val_fraction=0.5)
    cache = open_token_cache(tmp_path / "cache")

    assert manifest.dtype == "uint32" and cache.tokens("val").dtype == np.uint32
    assert decoded_documents(cache, "val", tokenizer) == [p for p in PARAGRAPHS if is_val(p, 0.5)]
    cache.verify()


def test_verify_catches_one_flipped_byte(tmp_path, corpus):
    build_token_cache([corpus], tmp_path / "cache", ByteTokenizer())
    tokens_bin = tmp_path / "cache" / "val" / "tokens.bin"
    data = bytearray(tokens_bin.read_bytes())
    data[len(data) // 2] ^= 0x01
    tokens_bin.write_bytes(bytes(data))

    with pytest.raises(InvalidInputError, match=r"val/tokens.bin: sha256 is"):
        open_token_cache(tmp_path / "cache").verify()


def test_two_builds_of_the_same_inputs_are_byte_identical(tmp_path, corpus):
    build_token_cache([corpus], tmp_path / "one", ByteTokenizer())
    build_token_cache([corpus.parent], tmp_path / "two", ByteTokenizer())

    for name in ("train/tokens.bin", "train/offsets.npy", "val/tokens.bin", "val/offsets.npy"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_a_document_stays_in_its_split_when_other_documents_are_added(tmp_path, corpus):
    small = tmp_path / "small.txt"
    small.write_text("\n\n".join(PARAGRAPHS[:1_200]))
    build_token_cache([small], tmp_path / "small", ByteTokenizer())
    build_token_cache([corpus], tmp_path / "full", ByteTokenizer())

    small_val = decoded_documents(open_token_cache(tmp_path / "small"), "val", ByteTokenizer())
    full_val = decoded_documents(open_token_cache(tmp_path / "full"), "val", ByteTokenizer())

    assert small_val and full_val[: len(small_val)] == small_val


def test_progress_rises_to_the_total_input_size(tmp_path, corpus):
    calls = []

    build_token_cache([corpus], tmp_path / "cache", ByteTokenizer(), progress=lambda done, total: calls.append(done))

    assert len(calls) >= 3  # one per batch of 1,000 documents, then the end
    assert calls == sorted(calls) and calls[-1] == corpus.stat().st_size


def test_failed_build_leaves_neither_the_cache_nor_its_temporary_folder(tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    good = "".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(1_500))
    (inputs / "data.jsonl").write_text(good + '{"text": 7}\n')

    with pytest.raises(InvalidInputError, match=r"data.jsonl:1501: field 'text' is a int"):
        build_token_cache([inputs], tmp_path / "cache", ByteTokenizer())

    assert sorted(p.name for p in tmp_path.iterdir()) == ["inputs"]


def test_build_refuses_an_existing_out_dir_and_leaves_it_alone(tmp_path, corpus):
    out = tmp_path / "cache"
    out.mkdir()
    (out / "keep.txt").write_text("mine")

    with pytest.raises(InvalidInputError, match="already exists"):
        build_token_cache([corpus], out, ByteTokenizer())

    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_an_empty_split_is_an_error_that_says_how_many_documents_there_were(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("a single paragraph")
    empty = "train" if is_val("a single paragraph", 0.1) else "val"

    with pytest.raises(InvalidInputError, match=rf"hold 1 document\(s\) and none went to the '{empty}' split"):
        build_token_cache([path], tmp_path / "cache", ByteTokenizer())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.txt"]


@pytest.mark.parametrize("val_fraction", [0.0, 1.0, -0.1, 1.5])
def test_val_fraction_outside_zero_to_one_is_refused(tmp_path, corpus, val_fraction):
    with pytest.raises(InvalidInputError, match="val_fraction"):
        build_token_cache([corpus], tmp_path / "cache", ByteTokenizer(), val_fraction=val_fraction)


def test_opening_an_unfinished_cache_says_the_manifest_is_missing(tmp_path):
    (tmp_path / "cache" / "train").mkdir(parents=True)

    with pytest.raises(NotFoundError, match=r"no token cache at .*manifest.json missing"):
        open_token_cache(tmp_path / "cache")


def test_unknown_split_lists_the_splits_there_are(tmp_path, corpus):
    build_token_cache([corpus], tmp_path / "cache", ByteTokenizer())

    with pytest.raises(NotFoundError, match="no split 'test'; it has train, val"):
        open_token_cache(tmp_path / "cache").tokens("test")


def test_packed_loader_reads_windows_of_a_cache_split(tmp_path, corpus):
    build_token_cache([corpus], tmp_path / "cache", ByteTokenizer())
    tokens = open_token_cache(tmp_path / "cache").tokens("train")

    batch = PackedLoader(tokens, batch_size=2, seq_len=16, shuffle=False).batch(1)

    assert np.array_equal(batch, np.stack([tokens[32:49], tokens[48:65]]).astype(np.int32))
