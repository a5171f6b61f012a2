import gzip
import json

import pytest
from data_helpers import RECORDS, TEXT, texts_and_lines, write_jsonl

from tradewind.core import InvalidInputError, NotFoundError
from tradewind.data import Document, read_documents


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
