"""LineReader: gzip and zstandard inputs, truncated or empty compressed files and invalid UTF-8 lines as bad
records, byte ranges that partition a file, and reading in bounded buffers."""

import gzip
import itertools
import json

import numpy as np
import pytest
import zstandard
from data_helpers import RECORDS, TEXT, texts_and_lines, write_jsonl

from tradewind.core import InvalidInputError
from tradewind.data import read_documents


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_compressed_inputs_give_the_same_documents_as_plain(tmp_path, suffix, kind):
    plain = tmp_path / f"docs.{kind}"
    if kind == "txt":
        plain.write_text(TEXT)
    else:
        write_jsonl(plain, RECORDS)
    data = plain.read_bytes()
    packed = tmp_path / f"docs.{kind}{suffix}"
    packed.write_bytes(gzip.compress(data) if suffix == ".gz" else zstandard.ZstdCompressor().compress(data))

    expected = list(read_documents(plain, text_field="meta.body"))
    got = list(read_documents(packed, text_field="meta.body"))

    assert len(expected) == (3 if kind == "txt" else 2)
    assert texts_and_lines(got) == texts_and_lines(expected)


def test_a_truncated_compressed_file_raises_an_error_naming_it(tmp_path):
    path = tmp_path / "cut.txt.gz"
    path.write_bytes(gzip.compress(TEXT.encode())[:-8])

    with pytest.raises(InvalidInputError, match=r"cut\.txt\.gz:\d+: truncated gzip file"):
        list(read_documents(path))


def test_invalid_utf8_in_plain_text_skips_only_that_line(tmp_path):
    from tradewind.data import BadRecords

    path = tmp_path / "t.txt"
    path.write_bytes(b"good line\nbad \xff line\nstill good\n\nnext para\n")
    bad = BadRecords()

    assert [d.text for d in read_documents(path, bad_records=bad)] == ["good line\nstill good", "next para"]
    assert bad.examples == [f"{path}:2: invalid UTF-8 (byte 4 of the line)"]


def test_an_empty_compressed_file_is_a_bad_record_not_a_silent_empty_input(tmp_path):
    from tradewind.data import BadRecords

    path = tmp_path / "nothing.jsonl.zst"
    path.write_bytes(b"")
    bad = BadRecords()

    assert list(read_documents(path, bad_records=bad)) == []
    assert bad.examples == [f"{path}:1: empty zstandard file (0 bytes)"]


def test_a_truncated_zstandard_file_keeps_what_was_read_and_reports_the_cut(tmp_path):
    from tradewind.data import BadRecords

    lines = "".join(json.dumps({"text": f"doc {i} " + "y" * 50}) + "\n" for i in range(5000))
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(zstandard.compress(lines.encode())[:-40])
    bad = BadRecords()

    docs = list(read_documents(path, bad_records=bad))

    assert 0 < len(docs) < 5000 and docs[0].text.startswith("doc 0")
    assert bad.skipped == 1 and "truncated zstandard file" in bad.examples[0]


def test_byte_ranges_of_a_jsonl_file_partition_its_records(tmp_path):
    from tradewind.data.readers import read_file_documents

    path = write_jsonl(tmp_path / "d.jsonl", [{"text": f"record {i} " + "z" * (i % 13)} for i in range(300)])
    size = path.stat().st_size
    cuts = [0, 1, 17, 18, 500, 2049, size // 2, size - 3, size]

    pieces = [
        d.text
        for a, b in itertools.pairwise(cuts)
        for d, _ in read_file_documents(str(path), start=a, end=b if b < size else None)
    ]

    assert pieces == [d.text for d in read_documents(path)]


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_reading_a_file_many_times_the_buffer_budget_keeps_memory_bounded(tmp_path, suffix):
    import random
    import tracemalloc

    from tradewind.data.line_reader import READ_BUFFER_BYTES

    words = random.Random(0).choices(["alpha", "beta", "gamma", "delta", "to", "be", "or", "not"], k=40 * 100_000)
    lines = [json.dumps({"text": " ".join(words[i : i + 40])}) + "\n" for i in range(0, len(words), 40)]
    line_count = 1 + int(np.searchsorted(np.cumsum([len(line) for line in lines]), 8 * READ_BUFFER_BYTES))
    data = "".join(lines[:line_count]).encode()
    compress = {"": bytes, ".gz": gzip.compress, ".zst": zstandard.compress}[suffix]
    path = tmp_path / f"big.jsonl{suffix}"
    path.write_bytes(compress(data))

    tracemalloc.start()
    try:
        count = sum(1 for _ in read_documents(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert count == line_count  # more than 8x the buffer was read...
    assert peak < 4 * READ_BUFFER_BYTES  # ...holding at most a few buffers at once


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_paragraph_is_whole_when_a_read_buffer_ends_right_after_one_of_its_lines(tmp_path, suffix):
    from tradewind.data.line_reader import READ_BUFFER_BYTES

    first = "a" * (READ_BUFFER_BYTES - 1) + "\n"  # its newline is the buffer's last byte
    text = first + "same paragraph\n\nnext paragraph\n"
    path = tmp_path / f"edge.txt{suffix}"
    path.write_bytes(gzip.compress(text.encode()) + gzip.compress(b"\nthird\n") if suffix else text.encode())

    texts = [d.text for d in read_documents(path)]

    assert texts[:2] == [first + "same paragraph", "next paragraph"]
    assert texts[2:] == (["third"] if suffix else [])
