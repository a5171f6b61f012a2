import gzip
import json

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

    with pytest.raises(InvalidInputError, match=r"cut\.txt\.gz: cannot decompress"):
        list(read_documents(path))
