import gzip
import itertools
import json

import numpy as np
import pytest
import zstandard

from tradewind.core import InvalidInputError, NotFoundError
from tradewind.data import Document, read_documents

TEXT = "First para,\nline two.\n\n\n   \nSecond para.\n\t\n\nThird\npara\n"
RECORDS = [{"meta": {"body": "alpha"}}, {"meta": {"body": "beta\ngamma"}}, {"meta": {"body": "   "}}]


def texts_and_lines(docs):
    return [(doc.text, doc.line) for doc in docs]


def write_jsonl(path, records, blank_line_after_first=True):
    lines = [json.dumps(r) for r in records]
    if blank_line_after_first:
        lines.insert(1, "")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_plain_text_documents_are_paragraphs_split_by_blank_or_whitespace_lines(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT)

    docs = list(read_documents(path))

    assert docs == [
        Document("First para,\nline two.", str(path), 1),
        Document("Second para.", str(path), 6),
        Document("Third\npara", str(path), 9),
    ]


def test_plain_text_file_of_only_whitespace_has_no_documents(tmp_path):
    path = tmp_path / "blank.txt"
    path.write_text("\n  \n\t\n")

    assert list(read_documents(path)) == []


def test_jsonl_reads_a_dotted_field_skipping_blank_lines_and_whitespace_text(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", RECORDS)

    docs = list(read_documents(path, text_field="meta.body"))

    assert texts_and_lines(docs) == [("alpha", 1), ("beta\ngamma", 3)]


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


def test_explicit_format_overrides_the_suffix(tmp_path):
    path = write_jsonl(tmp_path / "docs.txt", RECORDS[:1], blank_line_after_first=False)

    docs = list(read_documents(path, format="jsonl", text_field="meta.body"))

    assert [doc.text for doc in docs] == ["alpha"]


def test_folder_input_reads_visible_files_recursively_in_sorted_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "a.txt").write_text("from a")
    (tmp_path / "b" / "c.txt").write_text("from b/c")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "from c"}) + "\n")
    (tmp_path / ".secret.txt").write_text("hidden file")
    (tmp_path / ".hidden" / "x.txt").write_text("hidden folder")

    docs = list(read_documents(tmp_path))

    assert [doc.text for doc in docs] == ["from a", "from b/c", "from c"]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"text": "unterminated', "malformed JSON"),
        (b'{"other": "x"}', "missing field 'text'"),
        (b'{"text": 42}', "is a int, expected a string"),
        (b'["text"]', "missing field 'text'"),
        (b'{"text": "caf\xe9"}', "invalid UTF-8"),
    ],
)
def test_each_kind_of_bad_jsonl_record_raises_an_error_naming_file_and_line(tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "fine"}\n\n' + line + b"\n")

    with pytest.raises(InvalidInputError) as error:
        list(read_documents(path))

    assert str(error.value).startswith(f"{path}:3: ")
    assert reason in str(error.value)


def test_missing_nested_field_names_where_the_path_stopped(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", [{"meta": {"title": "x"}}])

    with pytest.raises(InvalidInputError, match=r"docs.jsonl:1: missing field 'meta.body' \(field 'meta' has no"):
        list(read_documents(path, text_field="meta.body"))


def test_missing_input_raises_not_found_naming_the_path(tmp_path):
    with pytest.raises(NotFoundError, match=r"nowhere\.txt"):
        list(read_documents(tmp_path / "nowhere.txt"))


def test_unknown_format_is_refused(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("x")

    with pytest.raises(InvalidInputError, match="unknown format 'csv'"):
        list(read_documents(path, format="csv"))


def test_a_truncated_compressed_file_raises_an_error_naming_it(tmp_path):
    path = tmp_path / "cut.txt.gz"
    path.write_bytes(gzip.compress(TEXT.encode())[:-8])

    with pytest.raises(InvalidInputError, match=r"cut\.txt\.gz:\d+: truncated gzip file"):
        list(read_documents(path))


def test_bad_records_are_skipped_and_counted_when_a_collector_is_given(tmp_path):
    from tradewind.data import BadRecords

    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"text": "one"}\n{"text": 5}\nnot json\n{"text": "two"}\n')
    bad = BadRecords()

    docs = list(read_documents(path, bad_records=bad))

    assert [d.text for d in docs] == ["one", "two"] and [d.line for d in docs] == [1, 4]
    assert bad.skipped == 2 and bad.per_file == {str(path): 2}
    assert bad.examples[0] == f"{path}:2: field 'text' is a int, expected a string"
    assert bad.examples[1].startswith(f"{path}:3: malformed JSON")


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


def test_parquet_reads_only_the_text_column_dotted_into_structs_in_row_groups(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"meta": {"body": f"row {i}"}, "other": i} for i in range(2500)]
    rows[7]["meta"]["body"] = None
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1000)
    from tradewind.data import BadRecords

    bad = BadRecords()
    docs = list(read_documents(path, text_field="meta.body", bad_records=bad))

    assert len(docs) == 2499 and docs[0] == Document(text="row 0", source=str(path), line=1)
    assert docs[-1].text == "row 2499" and docs[-1].line == 2500
    assert bad.examples == [f"{path}:8: field 'meta.body' is a NoneType, expected a string"]


def test_globs_memory_urls_and_file_urls_are_inputs_too(tmp_path):
    import fsspec

    for name in ("a.jsonl", "b.jsonl", "c.txt"):
        write_jsonl(tmp_path / name, [{"text": name}], blank_line_after_first=False)
    memory = fsspec.filesystem("memory")
    with memory.open("/corpus/x.jsonl.gz", "wb") as f:
        f.write(gzip.compress(b'{"text": "in memory"}\n'))

    assert [d.text for d in read_documents(str(tmp_path / "*.jsonl"))] == ["a.jsonl", "b.jsonl"]
    assert [d.text for d in read_documents(f"file://{tmp_path}/b.jsonl")] == ["b.jsonl"]
    docs = list(read_documents("memory://corpus"))
    assert [(d.text, d.source) for d in docs] == [("in memory", "memory:///corpus/x.jsonl.gz")]
    with pytest.raises(NotFoundError, match="no input files match"):
        list(read_documents(str(tmp_path / "*.parquet")))


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
