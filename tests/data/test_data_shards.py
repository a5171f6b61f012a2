"""One shard of a token cache: how inputs are cut, how documents split, and what tokenizing a shard writes."""

import hashlib
import itertools
import json

import numpy as np
import pytest

from tradewind.core import InvalidInputError
from tradewind.data import load_tokenizer
from tradewind.data.shards import ShardTask, is_validation, plan_shards, shard_name, tokenize_shard


def test_plan_cuts_only_large_uncompressed_jsonl_into_about_equal_byte_ranges():
    plan = plan_shards([("a.jsonl", 1000), ("b.txt", 1000), ("c.jsonl.zst", 1000), ("d.jsonl", 10)], "auto", 300)
    assert plan == [
        ("a.jsonl", 0, 250),
        ("a.jsonl", 250, 500),
        ("a.jsonl", 500, 750),
        ("a.jsonl", 750, None),  # the last range runs to the end of the file
        ("b.txt", 0, None),
        ("c.jsonl.zst", 0, None),
        ("d.jsonl", 0, None),
    ]


def test_plan_refuses_a_shard_size_below_one_byte():
    with pytest.raises(InvalidInputError, match="shard_bytes must be at least 1"):
        plan_shards([("a.jsonl", 10)], "auto", 0)


def test_the_validation_split_depends_only_on_the_text_and_holds_about_the_fraction_asked():
    texts = [f"document number {i}" for i in range(4000)]
    held_out = [is_validation(text, 0.2) for text in texts]
    assert held_out == [is_validation(text, 0.2) for text in texts]
    assert 0.17 < sum(held_out) / len(texts) < 0.23
    # A larger fraction holds out a superset: the hash is compared against the fraction.
    assert all(is_validation(text, 0.5) for text, held in zip(texts, held_out, strict=True) if held)


def task(tmp_path, source, **overrides) -> ShardTask:
    fields = {
        "index": 3,
        "url": str(source),
        "start": 0,
        "end": None,
        "input_bytes": source.stat().st_size,
        "folder": str(tmp_path / "cache"),
        "tokenizer": load_tokenizer("byte"),
        "format": "auto",
        "text_field": "text",
        "val_fraction": 0.3,
        "strict": False,
        "prepend_bos": False,
        "append_eos": True,
        "dtype": "uint16",
    }
    return ShardTask(**{**fields, **overrides})


def read_split(folder, split: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.fromfile(folder / split / f"{name}.bin", dtype=np.uint16)
    offsets = np.load(folder / split / f"{name}.offsets.npy")
    return tokens, offsets


def test_a_shard_writes_each_split_with_offsets_eos_and_a_record_matching_its_files(tmp_path):
    texts = [f"line {i}: to be or not" for i in range(40)]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts) + "{broken\n", encoding="utf-8")
    record = tokenize_shard(task(tmp_path, source))
    folder = tmp_path / "cache"
    assert record.index == 3 and record.source == str(source) and shard_name(3) == "shard-00003"
    assert record.bad_records.skipped == 1 and ":41: malformed JSON" in record.bad_records.examples[0]
    byte = load_tokenizer("byte")
    for split in ("train", "val"):
        stats = record.splits[split]
        expected = [t for t in texts if is_validation(t, 0.3) == (split == "val")]
        tokens, offsets = read_split(folder, split, "shard-00003")
        documents = [tokens[a:b].tolist() for a, b in itertools.pairwise(offsets)]
        assert documents == [[*ids, byte.eos_id] for ids in byte.encode_batch(expected)]
        assert (stats.documents, stats.tokens) == (len(expected), len(tokens))
        assert stats.bytes == sum(len(t.encode()) for t in expected)
        assert stats.sha256 == hashlib.sha256(tokens.tobytes()).hexdigest()
    written = json.loads((folder / "shards" / "shard-00003.json").read_text())
    assert written == record.model_dump(mode="json")
    assert not list(folder.rglob("*.tmp-*"))  # no temporary file left


def test_bos_is_prepended_when_asked_and_eos_left_out_when_not(tmp_path):
    source = tmp_path / "one.txt"
    source.write_text("hello\n", encoding="utf-8")
    tokenize_shard(task(tmp_path, source, val_fraction=1e-9, prepend_bos=True, append_eos=False))
    tokens, offsets = read_split(tmp_path / "cache", "train", "shard-00003")
    byte = load_tokenizer("byte")
    assert tokens.tolist() == [byte.bos_id, *byte.encode_batch(["hello"])[0]] and offsets.tolist() == [0, 6]


def test_a_finished_shard_is_not_tokenized_again(tmp_path):
    source = tmp_path / "docs.txt"
    source.write_text("first paragraph\n\nsecond paragraph\n", encoding="utf-8")
    first = tokenize_shard(task(tmp_path, source))
    source.write_text("changed entirely\n", encoding="utf-8")  # a finished shard reads only its record
    assert tokenize_shard(task(tmp_path, source)) == first


def test_a_strict_shard_fails_on_a_bad_record_and_leaves_no_record_or_temporary_file(tmp_path):
    source = tmp_path / "docs.jsonl"
    source.write_text('{"text": "fine"}\n{"body": "no text"}\n', encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r"docs\.jsonl:2: "):
        tokenize_shard(task(tmp_path, source, strict=True))
    folder = tmp_path / "cache"
    assert not (folder / "shards").exists() and not list(folder.rglob("*.tmp-*"))
