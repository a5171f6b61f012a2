"""`LineReader`: the decompressed, numbered, UTF-8 lines of one file, in bounded memory.

A file is read in chunks of `READ_BUFFER_BYTES`, so memory is bounded by that buffer plus the longest
line, whatever the file size. Compression is chosen by suffix: `.gz` (gzip) and `.zst` (zstandard), whose
members or frames may be concatenated. An uncompressed file can be read by byte range: a range holds the
lines whose first byte lies in it, so consecutive ranges split a file's lines between them exactly.

A line that is not UTF-8, and a compressed file that is empty, corrupt or cut short, are bad records: they
go to the reader's `BadRecords` as `file:line: reason` (with the file's line number, even in a range).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any, BinaryIO

import zstandard

from tradewind.core import open_url
from tradewind.data.bad_records import BadRecords

READ_BUFFER_BYTES = 1 << 20
_UTF8_BOM = b"\xef\xbb\xbf"
_ZSTD_PIECE = 8 * 1024
_OUTPUT_BYTES = READ_BUFFER_BYTES // 2


class LineReader:
    """Decompressed, numbered lines of one file, read in `READ_BUFFER_BYTES` chunks.

    Args:
        raw: the file, opened in binary mode.
        url: its path or URL, for bad-record messages and the compression suffix.
        bad: where bad lines go.
        start, end: read only the lines whose first byte lies in `[start, end)` (`end` None: to the end).
    """

    def __init__(self, raw: BinaryIO, url: str, bad: BadRecords, start: int, end: int | None):
        self.raw = raw
        self.url = url
        self.bad = bad
        self.start = start
        self.end = end
        self.position = 0  # compressed bytes read, for progress
        self._line_base: int | None = 0 if start == 0 else None

    def report(self, line: int, reason: str) -> None:
        """Hand a bad record at range-relative `line` to the collector, with the file's line number."""
        self.bad.add(self.url, self.line_base() + line, reason)

    def line_base(self) -> int:
        # Counting the lines before a range costs a pass over them, so only bad records pay for it.
        if self._line_base is None:
            with open_url(self.url, "rb") as f:
                remaining, count = self.start - 1, 0
                while remaining > 0 and (chunk := f.read(min(READ_BUFFER_BYTES, remaining))):
                    count += chunk.count(b"\n")
                    remaining -= len(chunk)
            self._line_base = count + 1
        return self._line_base

    def _chunks(self) -> Iterator[bytes]:
        name = PurePosixPath(self.url).name
        if self.start:
            self.raw.seek(self.start - 1)
            self.position = self.start - 1
        if name.endswith(".gz"):
            yield from self._decompressed(lambda: zlib.decompressobj(wbits=31), "gzip")
        elif name.endswith(".zst"):
            yield from self._decompressed(lambda: zstandard.ZstdDecompressor().decompressobj(), "zstandard")
        else:
            while chunk := self.raw.read(READ_BUFFER_BYTES):
                self.position += len(chunk)
                yield chunk

    def _decompressed(self, make: Any, kind: str) -> Iterator[bytes]:
        # Decompression objects, rather than file wrappers, because only they tell a clean end of
        # stream (`eof`) from a file cut short; gzip members and zstandard frames may be concatenated.
        # zlib bounds each output by `max_length`; zstandard cannot, so it gets small input pieces, which
        # bound each output by the piece's size times the compression ratio.
        bounded = kind == "gzip"
        decompressor, in_stream = make(), False
        try:
            # Compressed input is read in quarter buffers, and gzip output comes in half buffers.
            while chunk := self.raw.read(READ_BUFFER_BYTES // 4):
                self.position += len(chunk)
                pieces = [chunk] if bounded else [chunk[i : i + _ZSTD_PIECE] for i in range(0, len(chunk), _ZSTD_PIECE)]
                for piece in pieces:
                    data = piece
                    while True:
                        in_stream = in_stream or bool(data)
                        if bounded:
                            out = decompressor.decompress(data, _OUTPUT_BYTES)
                            data = decompressor.unconsumed_tail
                            more = len(out) == _OUTPUT_BYTES  # zlib may hold more output for this input
                        else:
                            out, data, more = decompressor.decompress(data), b"", False
                        if out:
                            yield out
                        if decompressor.eof:
                            data = decompressor.unused_data
                            decompressor, in_stream = make(), False
                            if not data:
                                break
                        elif not data and not more:
                            break
        except (zlib.error, zstandard.ZstdError) as error:
            raise _Corrupt(f"corrupt {kind} data: {error}") from None
        if self.position == 0:
            raise _Corrupt(f"empty {kind} file (0 bytes)")
        if in_stream:
            raise _Corrupt(f"truncated {kind} file: the stream ends before its end marker")

    def lines(self) -> Iterator[tuple[int, str]]:
        """(range-relative 1-based line number, decoded line with its newline) pairs; bad ones reported."""
        number = 0
        offset = self.start - 1 if self.start else 0  # file offset of the next line's first byte
        skip_first = bool(self.start)
        pending: list[bytes] = []
        try:
            for chunk in self._chunks():
                parts = chunk.split(b"\n")
                if len(parts) == 1:
                    pending.append(chunk)
                    continue
                parts[0] = b"".join([*pending, parts[0]])
                tail = parts.pop()
                pending = [tail] if tail else []
                for part in parts:
                    line = part + b"\n"
                    if skip_first:  # the tail of the line before the range: the previous range's
                        skip_first = False
                        offset += len(line)
                        continue
                    if self.end is not None and offset >= self.end:
                        return
                    offset += len(line)
                    number += 1
                    decoded = self._decode(number, line)
                    if decoded is not None:
                        yield number, decoded
        except _Corrupt as error:
            self.report(number + 1, str(error))
            return
        last = b"".join(pending)
        if last and not skip_first and (self.end is None or offset < self.end):
            decoded = self._decode(number + 1, last)
            if decoded is not None:
                yield number + 1, decoded

    def _decode(self, number: int, line: bytes) -> str | None:
        if number == 1 and not self.start:
            line = line.removeprefix(_UTF8_BOM)
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError as error:
            self.report(number, f"invalid UTF-8 (byte {error.start} of the line)")
            return None


class _Corrupt(Exception):
    """A compressed stream that cannot be read to its end."""
