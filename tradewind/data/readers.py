"""Reading documents from text, JSONL and Parquet files, local or behind any fsspec URL, in bounded memory.

Formats:
    text: a document is a paragraph, i.e. a run of lines ended by one or more blank (whitespace-only)
        lines or by the end of the file. The lines keep their newlines, except the paragraph's last.
    jsonl: one JSON object per line; the document is the string at `text_field`, which may be dotted
        (`meta.body`) to reach into nested objects. Blank lines are ignored.
    parquet: the document is the string at `text_field` of each row (dotted into struct columns). Only
        that column is read, one row group at a time.

Whitespace-only text is never a document. The formats `chat` and `prompt_completion` are JSONL files of
training examples rather than documents; `read_file_examples` reads them (see `chat.py`).

Compression is chosen by suffix: `.gz` (gzip) and `.zst` (zstandard) are stripped before `format="auto"`
looks at the remaining suffix (`.jsonl` and `.ndjson` are JSONL, `.parquet` and `.pq` Parquet, anything else
text). Inputs are local paths or fsspec URLs (`file://`, `memory://`, and `gs://` / `s3://` when gcsfs / s3fs
are installed); a folder stands for every visible file beneath it and a glob (`data/*.jsonl.gz`) for the files
it matches.

Text and JSONL files are streamed line by line by a `LineReader` (`line_reader.py`), so memory is bounded
by its buffer plus the longest record (or one Parquet row group), whatever the file size.

Bad records (malformed JSON, a missing or non-string field, invalid UTF-8, an empty or truncated
compressed file) go to a `BadRecords` collector: skipped and counted when one is given, else raised
as `InvalidInputError("file:line: reason")`.

Example:
    for doc in read_documents("corpus/", format="auto"):
        print(doc.source, doc.line, len(doc.text))
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeVar

import fsspec

from tradewind.core import InvalidInputError, NotFoundError, open_url
from tradewind.core.files import refusal
from tradewind.data.bad_records import BadRecords, RecordError
from tradewind.data.line_reader import LineReader

T = TypeVar("T")

Format = Literal["auto", "text", "jsonl", "parquet", "chat", "prompt_completion"]
FORMATS = ("auto", "text", "jsonl", "parquet", "chat", "prompt_completion")
DocumentFormat = Literal["auto", "text", "jsonl", "parquet"]  # the formats whose records are documents
RECORD_FORMATS = ("chat", "prompt_completion")  # JSONL files of training examples (`read_file_examples`)
PARQUET_BATCH_ROWS = 1024
_JSONL_SUFFIXES = (".jsonl", ".ndjson")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_COMPRESSION_SUFFIXES = (".gz", ".zst")
GLOB_CHARS = "*?["  # characters that make an input a glob pattern


@dataclass(frozen=True)
class Document:
    """One document and where it came from.

    Attributes:
        text: the document's text.
        source: the file (path or URL) it was read from.
        line: the 1-based line of that file where the document starts (the row, for Parquet).
    """

    text: str
    source: str
    line: int


def read_documents(
    path: str | Path,
    *,
    format: Format = "auto",
    text_field: str = "text",
    bad_records: BadRecords | None = None,
) -> Iterator[Document]:
    """Stream the documents of a file, of every file beneath a folder, or of every file a glob matches.

    Args:
        path: a path or fsspec URL: a file, a folder (its visible files, recursively, in sorted order)
            or a glob.
        format: `"text"`, `"jsonl"`, `"parquet"`, or `"auto"` to choose by suffix.
        text_field: for JSONL and Parquet, the (possibly dotted) field that holds the text.
        bad_records: where to count bad records, which are then skipped; None raises on the first.

    Yields:
        The documents in file order.

    Raises:
        NotFoundError: nothing at `path`, or a folder or glob with no files.
        InvalidInputError: an unknown format, or (without `bad_records`, or with a strict one) a bad
            record; the message starts with `file:line:`.
    """
    for url in list_input_files(path):
        for document, _ in read_file_documents(url, format=format, text_field=text_field, bad_records=bad_records):
            yield document


def list_input_files(path: str | Path, not_read: list[str] | None = None) -> list[str]:
    """The files that `path` stands for: itself if a file; every visible file beneath a folder or
    matched by a glob, sorted.

    A local file is read only if it is a regular file with one link (`core.files.refusal`): one that is not is
    refused when named alone, and left out of a folder or glob, with the reason appended to `not_read`.

    Raises:
        NotFoundError: nothing at `path`, or a folder or glob holding no visible files.
        InvalidInputError: `path` names a local file that may not be read (a FIFO, a device, a hard link).
    """
    text = str(path)
    fs, root = fsspec.core.url_to_fs(text)
    remote = "://" in text
    left_out: list[str] = []
    if any(char in root for char in GLOB_CHARS):
        found = sorted(p for p in fs.glob(root) if not fs.isdir(p))
        found = [fs.unstrip_protocol(p) for p in found] if remote else _readable(found, left_out)
        if not found:
            raise NotFoundError(f"no input files match {text!r}{_none_readable(left_out)}")
        if not_read is not None:
            not_read.extend(left_out)
        return found
    if not fs.exists(root):
        raise NotFoundError(f"no input file or folder at {text!r}")
    if not fs.isdir(root):
        if not remote and (reason := refusal(os.stat(text))) is not None:
            raise InvalidInputError(f"{text} is refused: {reason}")
        return [text]
    files = []
    for found in sorted(fs.find(root)):
        relative = PurePosixPath(found).relative_to(PurePosixPath(root))
        if not any(part.startswith(".") for part in relative.parts):
            files.append(fs.unstrip_protocol(found) if remote else found)
    files = files if remote else _readable(files, left_out)
    if not files:
        raise NotFoundError(
            f"the folder {text!r} holds no input files (names starting with '.' are skipped){_none_readable(left_out)}"
        )
    if not_read is not None:
        not_read.extend(left_out)
    return files


def _none_readable(left_out: list[str]) -> str:
    """The end of a no-input-files message, naming the first file left out (and how many), if any was."""
    if not left_out:
        return ""
    more = f" (and {len(left_out) - 1} more)" if len(left_out) > 1 else ""
    return f"; {left_out[0]}{more}"


def _readable(paths: list[str], not_read: list[str]) -> list[str]:
    """The local files of `paths` that may be read (`refusal`); each other one appended to `not_read` with why."""
    readable = []
    for path in paths:
        reason = refusal(os.stat(path))
        if reason is None:
            readable.append(path)
        else:
            not_read.append(f"{path}: not read: {reason}")
    return readable


def detect_format(url: str, format: Format = "auto") -> Literal["text", "jsonl", "parquet"]:
    """The file format that `format` means for the file `url`: itself unless `"auto"` (else chosen by suffix),
    `"jsonl"` for the example formats (`RECORD_FORMATS`).

    Raises:
        InvalidInputError: `format` is not one of `FORMATS`.
    """
    if format not in FORMATS:
        raise InvalidInputError(f"unknown format {format!r}; use one of {', '.join(FORMATS)}")
    if format in RECORD_FORMATS:
        return "jsonl"
    if format != "auto":
        return format
    name = strip_compression(PurePosixPath(url).name)
    if name.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    return "parquet" if name.endswith(_PARQUET_SUFFIXES) else "text"


def strip_compression(name: str) -> str:
    """`name` without a `.gz` or `.zst` suffix."""
    for suffix in _COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def is_splittable(url: str, format: Format = "auto") -> bool:
    """Whether `read_file_documents` can read `url` by byte ranges (uncompressed JSONL only)."""
    return detect_format(url, format) == "jsonl" and strip_compression(url) == url


def read_file_documents(
    url: str,
    *,
    format: Format = "auto",
    text_field: str = "text",
    bad_records: BadRecords | None = None,
    start: int = 0,
    end: int | None = None,
) -> Iterator[tuple[Document, int]]:
    """Stream the documents of one file, each with the count of (compressed) file bytes read so far.

    Args:
        url: the file.
        format, text_field, bad_records: as in `read_documents`.
        start, end: read only the records whose first byte lies in `[start, end)`; for files that
            `is_splittable`. Documents of a range starting past 0 carry line numbers counted from the
            range's first line; bad-record messages still carry the file's line numbers.

    Raises:
        InvalidInputError: as `read_documents`, or a byte range on a file that cannot be split.
    """
    kind = detect_format(url, format)
    if format in RECORD_FORMATS:
        raise InvalidInputError(f"format {format!r} holds training examples, not documents (see read_file_examples)")
    if (start or end is not None) and not is_splittable(url, format):
        raise InvalidInputError(f"{url}: only uncompressed JSONL files can be read by byte range")
    bad = bad_records if bad_records is not None else BadRecords(strict=True)
    if kind == "parquet":
        yield from _parquet_documents(url, text_field, bad)
        return
    with open_url(url, "rb") as raw:
        reader = LineReader(raw, url, bad, start, end)
        lines = reader.lines()
        documents = (
            _text_documents(lines, url, reader) if kind == "text" else _jsonl_documents(lines, url, text_field, reader)
        )
        for document in documents:
            yield document, reader.position


def _text_documents(lines: Iterator[tuple[int, str]], url: str, reader: LineReader) -> Iterator[Document]:
    paragraph: list[str] = []
    start = 0
    for number, line in lines:
        if line.strip():
            if not paragraph:
                start = number
            paragraph.append(line)
        elif paragraph:
            yield _paragraph(paragraph, url, start)
            paragraph = []
    if paragraph:
        yield _paragraph(paragraph, url, start)


def _paragraph(lines: list[str], url: str, start: int) -> Document:
    text = "".join(lines).removesuffix("\n").removesuffix("\r")
    return Document(text=text, source=url, line=start)


def _field(record: Any, keys: list[str], text_field: str) -> tuple[Any, str | None]:
    """The value at the dotted path `keys` in `record`, or None and the reason it is missing."""
    value = record
    for depth, key in enumerate(keys):
        if not isinstance(value, dict) or key not in value:
            where = "the record" if depth == 0 else f"field {'.'.join(keys[:depth])!r}"
            return None, (
                f"missing field {text_field!r} ({where} has no key {key!r}); "
                "set text_field to the field that holds the text"
            )
        value = value[key]
    if not isinstance(value, str):
        return None, f"field {text_field!r} is a {type(value).__name__}, expected a string"
    return value, None


def _jsonl_values(lines: Iterator[tuple[int, str]], reader: LineReader) -> Iterator[tuple[int, Any]]:
    """`(line number, parsed JSON)` of each non-blank line; a malformed line is reported as a bad record."""
    for number, line in lines:
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            reader.report(number, f"malformed JSON: {error.msg} (column {error.colno})")
            continue
        yield number, value


def _jsonl_documents(
    lines: Iterator[tuple[int, str]], url: str, text_field: str, reader: LineReader
) -> Iterator[Document]:
    keys = text_field.split(".")
    for number, record in _jsonl_values(lines, reader):
        value, problem = _field(record, keys, text_field)
        if problem is not None:
            reader.report(number, problem)
        elif value.strip():
            yield Document(text=value, source=url, line=number)


def read_file_examples(
    url: str,
    prepare: Callable[[dict[str, Any]], T],
    *,
    bad_records: BadRecords | None = None,
    start: int = 0,
    end: int | None = None,
) -> Iterator[tuple[T, int]]:
    """Stream the examples of one JSONL file of `chat` or `prompt_completion` records, each with the count of
    (compressed) file bytes read so far.

    Args:
        url: the file.
        prepare: turns a record (a JSON object) into an example, or raises `RecordError(reason)`: the record
            is then a bad record at its file and line.
        bad_records: as in `read_documents`.
        start, end: as in `read_file_documents`.

    Raises:
        InvalidInputError: as `read_documents`.
    """
    if (start or end is not None) and not is_splittable(url, "jsonl"):
        raise InvalidInputError(f"{url}: only uncompressed JSONL files can be read by byte range")
    bad = bad_records if bad_records is not None else BadRecords(strict=True)
    with open_url(url, "rb") as raw:
        reader = LineReader(raw, url, bad, start, end)
        for number, record in _jsonl_values(reader.lines(), reader):
            if not isinstance(record, dict):
                reader.report(number, f"a JSON {type(record).__name__}, expected an object")
                continue
            try:
                example = prepare(record)
            except RecordError as error:
                reader.report(number, str(error))
                continue
            yield example, reader.position


def _open_parquet(raw: Any, url: str, bad: BadRecords) -> Any:
    """The Parquet file over `raw`, or None (a bad record) when it is not one."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(raw)
    except Exception as error:  # pyarrow raises its own ArrowInvalid for a file that is not Parquet
        bad.add(url, 1, f"not a readable Parquet file: {error}")
        return None


def _parquet_documents(url: str, text_field: str, bad: BadRecords) -> Iterator[tuple[Document, int]]:
    keys = text_field.split(".")
    with open_url(url, "rb") as raw:
        parquet = _open_parquet(raw, url, bad)
        if parquet is None:
            return
        columns = parquet.schema_arrow.names
        if keys[0] not in columns:
            rows = parquet.metadata.num_rows
            bad.add(url, 1, f"no column {keys[0]!r} (columns: {', '.join(columns)}); its {rows} row(s) skipped")
            return
        size = raw.size if hasattr(raw, "size") else 0
        total_groups = max(parquet.num_row_groups, 1)
        row = 0
        for group in range(parquet.num_row_groups):
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=[group], columns=[keys[0]]):
                for item in batch.column(0).to_pylist():
                    row += 1
                    value, problem = _field({keys[0]: item}, keys, text_field)
                    if problem is not None:
                        bad.add(url, row, problem)
                    elif value.strip():
                        yield Document(text=value, source=url, line=row), size * (group + 1) // total_groups


def read_file_records(
    url: str, *, format: Format = "auto", bad_records: BadRecords | None = None
) -> Iterator[dict[str, Any]]:
    """Stream the records of one file as dicts: JSONL objects, Parquet rows, or `{"text": paragraph}`.

    Raises:
        InvalidInputError: as `read_documents` (a JSONL line that is not an object is a bad record).
    """
    kind = detect_format(url, format)
    bad = bad_records if bad_records is not None else BadRecords(strict=True)
    if kind == "parquet":
        with open_url(url, "rb") as raw:
            parquet = _open_parquet(raw, url, bad)
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS) if parquet else ():
                yield from batch.to_pylist()
        return
    with open_url(url, "rb") as raw:
        reader = LineReader(raw, url, bad, 0, None)
        if kind == "text":
            for document in _text_documents(reader.lines(), url, reader):
                yield {"text": document.text}
            return
        for number, record in _jsonl_values(reader.lines(), reader):
            if isinstance(record, dict):
                yield record
            else:
                reader.report(number, f"a JSON {type(record).__name__}, expected an object")
