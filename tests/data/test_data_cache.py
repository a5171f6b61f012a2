import hashlib
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from chat_models import chat_tokenizer, chat_tokenizer_folder
from data_helpers import PARAGRAPHS, cache_files

from tradewind.cluster import get_task_runner
from tradewind.core import ConfigError, InvalidInputError
from tradewind.data import (
    ByteTokenizer,
    PackedLoader,
    TokenizeConfig,
    build_token_cache,
    cache_id,
    load_tokenizer,
    open_token_cache,
    source_files,
)


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


def decoded_documents(cache, split, tokenizer):
    tokens, offsets = cache.tokens(split), cache.document_starts(split)
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
        tokens, offsets = cache.tokens(split), cache.document_starts(split)
        assert offsets.dtype == np.int64 and offsets[0] == 0 and offsets[-1] == len(tokens)
        assert np.all(tokens[offsets[1:] - 1] == 256)
        assert np.count_nonzero(tokens == 256) == manifest.splits[split].documents
        [shard] = manifest.splits[split].shards
        assert shard.sha256 == hashlib.sha256(np.asarray(tokens).tobytes()).hexdigest()
    assert decoded_documents(cache, "val", ByteTokenizer()) == [p for p in PARAGRAPHS if is_val(p, 0.2)]
    assert decoded_documents(cache, "train", ByteTokenizer()) == [p for p in PARAGRAPHS if not is_val(p, 0.2)]
    assert manifest.sources[0].path == str(corpus) and manifest.sources[0].size == corpus.stat().st_size
    assert manifest.sources[0].mtime == corpus.stat().st_mtime
    assert manifest.tokenizer.fingerprint == ByteTokenizer.fingerprint
    assert manifest.append_eos is True and manifest.prepend_bos is False
    assert json.loads((tmp_path / "cache" / "manifest.json").read_text())["splits"]["val"]["documents"] == val.documents
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "inputs"]  # no lock or partial left
    cache.verify()


def test_a_large_jsonl_file_is_cut_into_shards_that_read_as_one_stream(tmp_path, jsonl_corpus):
    one = build_token_cache([jsonl_corpus], tmp_path / "one", ByteTokenizer())
    many = build_token_cache([jsonl_corpus], tmp_path / "many", ByteTokenizer(), shard_bytes=10_000)

    assert len(one.splits["train"].shards) == 1 and len(many.splits["train"].shards) > 5
    for split in ("train", "val"):
        whole, sharded = open_token_cache(tmp_path / "one"), open_token_cache(tmp_path / "many")
        assert np.array_equal(np.asarray(whole.tokens(split)), np.asarray(sharded.tokens(split)))
        assert np.array_equal(whole.document_starts(split), sharded.document_starts(split))
        stream = sharded.tokens(split)
        assert np.array_equal(stream[7_000:19_000], np.asarray(whole.tokens(split))[7_000:19_000])
    open_token_cache(tmp_path / "many").verify()


def test_two_worker_processes_build_the_same_bytes_as_one(tmp_path, jsonl_corpus):
    build_token_cache([jsonl_corpus], tmp_path / "one", ByteTokenizer(), shard_bytes=30_000)
    build_token_cache(
        [jsonl_corpus], tmp_path / "two", ByteTokenizer(), shard_bytes=30_000, runner=get_task_runner(workers=2)
    )

    assert cache_files(tmp_path / "one") == cache_files(tmp_path / "two")


def test_bos_and_eos_are_placed_as_asked_and_recorded(tmp_path, corpus):
    manifest = build_token_cache([corpus], tmp_path / "cache", ByteTokenizer(), prepend_bos=True, append_eos=False)
    cache = open_token_cache(tmp_path / "cache")

    assert manifest.prepend_bos is True and manifest.append_eos is False
    tokens, offsets = np.asarray(cache.tokens("train")), cache.document_starts("train")
    assert np.all(tokens[offsets[:-1]] == ByteTokenizer.bos_id)
    assert np.count_nonzero(tokens == ByteTokenizer.eos_id) == 0
    assert decoded_documents(cache, "train", ByteTokenizer()) == [p for p in PARAGRAPHS if not is_val(p, 0.1)]


def test_prepend_bos_with_a_tokenizer_without_bos_is_refused(tmp_path, corpus):
    with pytest.raises(InvalidInputError, match="prepend_bos: tokenizer 'wide' has no BOS"):
        build_token_cache([corpus], tmp_path / "cache", WideTokenizer(), prepend_bos=True)


def test_large_vocabularies_are_stored_as_uint32(tmp_path, corpus):
    tokenizer = WideTokenizer()

    manifest = build_token_cache([corpus], tmp_path / "cache", tokenizer, val_fraction=0.5)
    cache = open_token_cache(tmp_path / "cache")

    assert manifest.dtype == "uint32" and cache.tokens("val").dtype == np.uint32
    assert decoded_documents(cache, "val", tokenizer) == [p for p in PARAGRAPHS if is_val(p, 0.5)]
    cache.verify()


def test_two_builds_of_the_same_inputs_are_byte_identical(tmp_path, corpus):
    build_token_cache([corpus], tmp_path / "one", ByteTokenizer())
    build_token_cache([corpus.parent], tmp_path / "two", ByteTokenizer())

    assert cache_files(tmp_path / "one") == cache_files(tmp_path / "two")


def test_a_document_stays_in_its_split_when_other_documents_are_added(tmp_path, corpus):
    small = tmp_path / "small.txt"
    small.write_text("\n\n".join(PARAGRAPHS[:1_200]))
    build_token_cache([small], tmp_path / "small", ByteTokenizer())
    build_token_cache([corpus], tmp_path / "full", ByteTokenizer())

    small_val = decoded_documents(open_token_cache(tmp_path / "small"), "val", ByteTokenizer())
    full_val = decoded_documents(open_token_cache(tmp_path / "full"), "val", ByteTokenizer())

    assert small_val and full_val[: len(small_val)] == small_val


def test_the_cache_id_changes_with_inputs_tokenizer_and_options_only(tmp_path, corpus):
    sources = source_files([corpus])
    base = cache_id(sources, ByteTokenizer(), TokenizeConfig())

    assert cache_id(source_files([corpus.parent]), ByteTokenizer(), TokenizeConfig(val_fraction=0.1)) == base
    assert cache_id(sources, WideTokenizer(), TokenizeConfig()) != base
    assert cache_id(sources, ByteTokenizer(), TokenizeConfig(val_fraction=0.2)) != base
    corpus.write_text("changed\n\nagain")
    assert cache_id(source_files([corpus]), ByteTokenizer(), TokenizeConfig()) != base


def test_a_config_and_its_fields_as_keywords_build_the_same_cache(tmp_path, corpus):
    config = TokenizeConfig(val_fraction=0.3, prepend_bos=True)
    by_config = build_token_cache([corpus], tmp_path / "one", ByteTokenizer(), config)
    by_keywords = build_token_cache([corpus], tmp_path / "two", ByteTokenizer(), val_fraction=0.3, prepend_bos=True)

    assert cache_files(tmp_path / "one") == cache_files(tmp_path / "two")
    assert by_config.model_dump(exclude={"created"}) == by_keywords.model_dump(exclude={"created"})
    with pytest.raises(TypeError, match="not both"):
        build_token_cache([corpus], tmp_path / "three", ByteTokenizer(), config, strict=True)


def test_exist_ok_returns_the_finished_cache_without_rebuilding(tmp_path, corpus):
    first = build_token_cache([corpus], tmp_path / "cache", ByteTokenizer())
    shard = tmp_path / "cache" / "train" / "shard-00000.bin"
    inode = shard.stat().st_ino

    again = build_token_cache([corpus], tmp_path / "cache", ByteTokenizer(), exist_ok=True)

    assert again == first and shard.stat().st_ino == inode


KILLED_BUILD = """
import os, signal, sys
from tradewind.data import ByteTokenizer, build_token_cache

class DiesOnMarker(ByteTokenizer):
    # The byte tokenizer (same fingerprint), except that it SIGKILLs its process on a marked document.
    def encode_batch(self, texts):
        if any("KILL" in text for text in texts):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().encode_batch(texts)

build_token_cache([sys.argv[1]], sys.argv[2], DiesOnMarker())
"""


def test_a_build_killed_part_way_resumes_only_missing_shards_and_matches_an_uninterrupted_one(tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for i in range(6):
        text = "\n\n".join(f"shard {i} paragraph {j} " + "x" * (j % 50) for j in range(400))
        (inputs / f"part{i}.txt").write_text(text + ("\n\nKILL here" if i == 3 else ""))
    killed = subprocess.run([sys.executable, "-c", KILLED_BUILD, str(inputs), str(tmp_path / "cache")])
    partial = tmp_path / ".cache.partial"

    assert killed.returncode == -9
    assert not (tmp_path / "cache").exists()
    assert sorted(p.name for p in (partial / "shards").iterdir()) == [f"shard-0000{i}.json" for i in range(3)]
    assert list(partial.glob("*/shard-00003.bin.tmp-*"))  # the shard it died in, never marked complete
    finished = {p.name: p.stat().st_ino for p in (partial / "train").glob("*.bin")}
    # The partial build is keyed by the cache id (what tokenize_dataset names the dataset by) and the shard size.
    key = {"key": cache_id(source_files([inputs]), ByteTokenizer(), TokenizeConfig()), "shard_bytes": 64 * 2**20}
    assert json.loads((partial / "build.json").read_text()) == key

    # The marked paragraph is still in the input, so the resumed run must give the same cache as a clean one.
    build_token_cache([inputs], tmp_path / "cache", ByteTokenizer())
    build_token_cache([inputs], tmp_path / "clean", ByteTokenizer())

    assert cache_files(tmp_path / "cache") == cache_files(tmp_path / "clean")
    resumed = {name: (tmp_path / "cache" / "train" / name).stat().st_ino for name in finished}
    assert resumed == finished  # shards 0-2 were not rewritten
    assert not partial.exists()
    open_token_cache(tmp_path / "cache").verify()


def test_a_leftover_partial_build_with_other_options_is_started_afresh(tmp_path, corpus):
    partial = tmp_path / ".cache.partial"
    (partial / "shards").mkdir(parents=True)
    (partial / "build.json").write_text(json.dumps({"key": "something else"}))
    (partial / "shards" / "shard-00000.json").write_text("{}")

    manifest = build_token_cache([corpus], tmp_path / "cache", ByteTokenizer())

    assert manifest.splits["train"].documents + manifest.splits["val"].documents == len(PARAGRAPHS)


def write_bad_inputs(folder: Path) -> None:
    import gzip

    import zstandard

    folder.mkdir()
    lines = [
        json.dumps({"text": "good one"}).encode(),
        b'{"text": "unterminated',
        json.dumps({"body": "no text"}).encode(),
        json.dumps({"text": 42}).encode(),
        b'{"text": "caf\xe9"}',
    ] + [json.dumps({"text": f"good {i}"}).encode() for i in range(60)]
    (folder / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (folder / "empty.jsonl.gz").write_bytes(b"")
    (folder / "cut.jsonl.zst").write_bytes(zstandard.compress(b"".join(lines[5:]) * 50)[:-12])
    (folder / "fine.jsonl.gz").write_bytes(gzip.compress(b"\n".join(lines[5:]) + b"\n"))


def test_bad_records_are_skipped_counted_per_file_and_reported_as_file_line_reason(tmp_path):
    write_bad_inputs(tmp_path / "in")

    manifest = build_token_cache([tmp_path / "in"], tmp_path / "cache", ByteTokenizer())

    bad = manifest.bad_records
    a, empty, cut = (str(tmp_path / "in" / name) for name in ("a.jsonl", "empty.jsonl.gz", "cut.jsonl.zst"))
    assert bad.skipped == 6
    assert bad.per_file == {a: 4, cut: 1, empty: 1}
    assert bad.examples[:4] == [
        f"{a}:2: malformed JSON: Invalid control character at (column 23)",
        f"{a}:3: missing field 'text' (the record has no key 'text'); set text_field to the field that holds the text",
        f"{a}:4: field 'text' is a int, expected a string",
        f"{a}:5: invalid UTF-8 (byte 13 of the line)",
    ]
    assert any(e.startswith(f"{cut}:") and "truncated zstandard file" in e for e in bad.examples)
    assert f"{empty}:1: empty gzip file (0 bytes)" in bad.examples
    assert manifest.splits["train"].documents + manifest.splits["val"].documents == 1 + 60 + 60


def test_strict_fails_on_the_first_bad_record_with_file_line_reason_and_leaves_nothing(tmp_path):
    write_bad_inputs(tmp_path / "in")

    with pytest.raises(InvalidInputError, match=r"a\.jsonl:2: malformed JSON"):
        build_token_cache([tmp_path / "in"], tmp_path / "cache", ByteTokenizer(), strict=True)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


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


def test_packed_loader_reads_windows_of_a_sharded_cache_split(tmp_path, jsonl_corpus):
    build_token_cache([jsonl_corpus], tmp_path / "cache", ByteTokenizer(), shard_bytes=10_000)
    tokens = open_token_cache(tmp_path / "cache").tokens("train")
    whole = np.asarray(tokens)

    batch = PackedLoader(tokens, batch_size=2, seq_len=1000, shuffle=False).batch(4)

    assert np.array_equal(batch, np.stack([whole[8000:9001], whole[9000:10001]]).astype(np.int32))


CONCURRENT_BUILD = """
import json, sys
from tradewind.data import ByteTokenizer, build_token_cache
manifest = build_token_cache([sys.argv[1]], sys.argv[2], ByteTokenizer(), shard_bytes=20_000, exist_ok=True)
print(json.dumps(manifest.splits["train"].model_dump()))
"""


def test_two_processes_building_the_same_cache_at_once_both_get_the_one_complete_cache(tmp_path, jsonl_corpus):
    out = tmp_path / "cache"
    builders = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT_BUILD, str(jsonl_corpus), str(out)], stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    results = [json.loads(b.communicate(timeout=120)[0]) for b in builders]

    assert [b.returncode for b in builders] == [0, 0]
    assert results[0] == results[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "inputs"]
    open_token_cache(out).verify()


@pytest.mark.parametrize("form", ["tokenizer.json", "folder with a chat template"])
def test_a_cache_holds_its_tokenizer_so_that_a_copy_of_it_alone_decodes_as_the_original(tmp_path, corpus, form):
    words = PARAGRAPHS[:200]
    if form == "tokenizer.json":
        (tmp_path / "tok").mkdir()
        spec = tmp_path / "tok" / "tokenizer.json"
        chat_tokenizer(words, vocab_size=300).save(str(spec))
    else:
        spec = chat_tokenizer_folder(tmp_path / "tok", words, vocab_size=300)
    tokenizer = load_tokenizer(str(spec))
    build_token_cache([str(corpus)], tmp_path / "cache", tokenizer, val_fraction=0.2)
    built = open_token_cache(tmp_path / "cache")
    expected = decoded_documents(built, "val", tokenizer)

    shutil.copytree(built.path, tmp_path / "elsewhere")  # the cache alone, as another host would get it
    shutil.rmtree(tmp_path / "tok")
    shutil.rmtree(built.path)
    moved = open_token_cache(tmp_path / "elsewhere")
    copy = moved.tokenizer()
    assert copy.fingerprint == tokenizer.fingerprint == moved.manifest.tokenizer.fingerprint
    assert (copy.eos_id, copy.bos_id, copy.chat_template) == (
        tokenizer.eos_id,
        tokenizer.bos_id,
        tokenizer.chat_template,
    )
    assert decoded_documents(moved, "val", copy) == expected


def test_a_byte_cache_needs_no_copy_and_a_changed_copy_is_refused_by_name(tmp_path, corpus):
    build_token_cache([str(corpus)], tmp_path / "bytes", ByteTokenizer())
    byte = open_token_cache(tmp_path / "bytes")
    assert not (byte.path / "tokenizer").exists() and byte.tokenizer().fingerprint == ByteTokenizer.fingerprint
    spec = tmp_path / "tokenizer.json"
    chat_tokenizer(PARAGRAPHS[:200], vocab_size=300).save(str(spec))
    build_token_cache([str(corpus)], tmp_path / "cache", load_tokenizer(str(spec)))
    built = open_token_cache(tmp_path / "cache")
    chat_tokenizer(PARAGRAPHS[:100], vocab_size=280).save(str(built.path / "tokenizer" / "tokenizer.json"))
    with pytest.raises(ConfigError, match=r"not the one .*cache was built with \(fingerprint"):
        built.tokenizer()
