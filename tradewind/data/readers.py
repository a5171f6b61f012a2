"""Reading documents from text and JSONL files, plain or compressed, one line at a time.

Formats:
    text: a document is a paragraph, i.e. a run of lines ended by one or more blank (whitespace-only)
        lines or by the end of the file. The lines keep their newlines, except the paragraph's last.
    jsonl: one JSON object per line; the document is the string at `text_field`, which may be dotted
        (`meta.body`) to reach into nested objects. Blank lines are ignored.

Whitespace-only text is never a document. Compression is chosen by suffix: `.gz` (gzip) and `.zst`
(zstandard) are stripped before `format="auto"` looks at the remaining suffix (`.jsonl` and `.ndjson`
are JSONL, anything else is text). Files are opened through `open_url`, so fsspec URLs work as well as
local paths, and are streamed: memory stays bounded by the longest line, whatever the file size.

Example:
    for doc in read_documents("corpus/", format="auto"):
        print(doc.source, doc.line, len(doc.text))
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Literal

import fsspec
import zstandard

from tradewind.core import InvalidInputError, NotFoundError, open_url

Format = Literal["auto", "text", "jsonl"]
FORMATS = ("auto", "text", "jsonl")
_JSONL_SUFFIXES = (".jsonl", ".ndjson")
_UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Document:
    """One document and where it came from.

    Attributes:
        text: the document's text.
        source: the file (path or URL) it was read from.
        line: the 1-based line of that file where the document starts.
    """

    text: str
    source: str
    line: int


def read_documents(path: str | Path, *, format: Format = "auto", text_field: str = "text") -> Iterator[Document]:
    """Stream the documents of a file, or of every file beneath a folder.

    Args:
        path: a file, or a folder whose regular files are all read (recursively, in sorted order,
            skipping names that start with a dot).
        format: `"text"`, `"jsonl"`, or `"auto"` to choose by suffix (see the module docstring).
        text_field: for JSONL, the (possibly dotted) field that holds the text.

    Yields:
        The documents in file order.

    Raises:
        NotFoundError: nothing at `path`, or a folder with no files.
        InvalidInputError: an unknown format, or a bad record: malformed JSON, a missing or non-string
            field, or invalid UTF-8. The message starts with `file:line:`.
    """
    for url in list_input_files(path):
        for document, _ in read_file_documents(url, format=format, text_field=text_field):
            yield document


def list_input_files(path: str | Path) -> list[str]:
    """The files that `path` stands for: itself if a file, else every visible file beneath it, sorted.

    Raises:
        NotFoundError: nothing at `path`, or a folder holding no visible files.
    """
    fs, root = fsspec.core.url_to_fs(str(path))
    if not fs.exists(root):
        raise NotFoundError(f"no input file or folder at {str(path)!r}")
    if not fs.isdir(root):
        return [str(path)]
    files = []
    for found in sorted(fs.find(root)):
        relative = PurePosixPath(found).relative_to(root)
        if not any(part.startswith(".") for part in relative.parts):
            files.append(fs.unstrip_protocol(found) if "://" in str(path) else found)
    if not files:
        raise NotFoundError(f"the folder {str(path)!r} holds no input files (names starting with '.' are skipped)")
    return files


def detect_format(url: str, format: Format = "auto") -> Literal["text", "jsonl"]:
    """The format that `format` means for the file `url`: itself unless `"auto"`, else chosen by suffix.

    Raises:
        InvalidInputError: `format` is not one of `auto`, `text`, `jsonl`.
    """
    if format not in FORMATS:
        raise InvalidInputError(f"unknown format {format!r}; use one of {', '.join(FORMATS)}")
    if format != "auto":
        return format
    name = _strip_compression(PurePosixPath(url).name)
    return "jsonl" if name.endswith(_JSONL_SUFFIXES) else "text"


def read_file_documents(
    url: str, *, format: Format = "auto", text_field: str = "text"
) -> Iterator[tuple[Document, int]]:
    """Stream the documents of one file, each with the count of (compressed) file bytes read so far.

    The byte count lets a caller report progress against the files' sizes on disk.

    Raises:
        InvalidInputError: as `read_documents`.
    """
    kind = detect_format(url, format)
    with open_url(url, "rb") as raw:
        lines = _decompressed_lines(raw, url)
        documents = _text_documents(lines, url) if kind == "text" else _jsonl_documents(lines, url, text_field)
        for document in documents:
            yield document, raw.tell()


def _strip_compression(name: str) -> str:
    for suffix in (".gz", ".zst"):
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def _decompressed_lines(raw: BinaryIO, url: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line with its newline) pairs of a possibly compressed file."""
    name = PurePosixPath(url).name
    stream: Any
    if name.endswith(".gz"):
        stream = gzip.GzipFile(fileobj=raw, mode="rb")
    elif name.endswith(".zst"):
        # The raw zstandard reader cannot split lines; the buffered wrapper can. closefd=False because
        # the caller still asks `raw` for its position after the last line.
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False)
        stream = io.BufferedReader(reader)
    else:
        stream = raw
    try:
        for number, line in enumerate(stream, start=1):
            if number == 1:
                line = line.removeprefix(_UTF8_BOM)
            try:
                yield number, line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise InvalidInputError(f"{url}:{number}: invalid UTF-8 (byte {error.start} of the line)") from None
    except (gzip.BadGzipFile, EOFError, zstandard.ZstdError) as error:
        raise InvalidInputError(f"{url}: cannot decompress: {error}") from None


def _text_documents(lines: Iterator[tuple[int, str]], url: str) -> Iterator[Document]:
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


def _jsonl_documents(lines: Iterator[tuple[int, str]], url: str, text_field: str) -> Iterator[Document]:
    keys = text_field.split(".")
    for number, line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise InvalidInputError(f"{url}:{number}: malformed JSON: {error.msg} at column {error.colno}") from None
        value: Any = record
        for depth, key in enumerate(keys):
            if not isinstance(value, dict) or key not in value:
                where = "the record" if depth == 0 else f"field {'.'.join(keys[:depth])!r}"
                raise InvalidInputError(
                    f"{url}:{number}: missing field {text_field!r} ({where} has no key {key!r}); "
                    f"set text_field to the field that holds the text"
                )
            value = value[key]
        if not isinstance(value, str):
            raise InvalidInputError(
                f"{url}:{number}: field {text_field!r} is a {type(value).__name__}, expected a string"
            )
        if value.strip():
            yield Document(text=value, source=url, line=number)
