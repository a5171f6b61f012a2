"""Reading and writing files so that a reader never sees half of one.

Writes go to a temporary file beside the target, are flushed to disk, then renamed over the target:
a crash leaves either the old file or the new one, never a torn one. Appends (metrics, logs) are
line-oriented, and readers skip a last line that is still being written.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

import fsspec

from tradewind.core.files import Opener, open_append, open_plain, open_regular, read_bounded


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write `obj` as indented, strict JSON to `path` atomically (NaN or infinity raise `ValueError`)."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


MAX_JSON_BYTES = 256 * 2**20  # a record, config or manifest larger than this is not one of ours
MAX_LINES_BYTES = 2**30  # an append-only file read whole (metrics.jsonl: about 5 million rows)


def read_json(path: str | os.PathLike[str], opener: Opener = open_plain) -> Any:
    """Read a JSON file written by `atomic_write_json`, opened with `opener` (at most `MAX_JSON_BYTES`)."""
    return json.loads(read_bounded(path, MAX_JSON_BYTES, opener).decode("utf-8"))


def append_jsonl(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Append one record as a single strict JSON line, flushed so that readers in other processes see it; a file
    swapped for a FIFO or a hard link meanwhile is refused, not written into (`open_append`)."""
    with open_append(path) as f:
        f.write((json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode("utf-8"))
        f.flush()


def complete_lines(path: str | os.PathLike[str], opener: Opener = open_plain) -> list[tuple[int, str]]:
    """The complete lines of an append-only file (at most `MAX_LINES_BYTES`) with their line numbers (from 1),
    blank ones left out; a last line without its newline is still being written and is left out too. None when
    the file does not exist."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):  # what is there, a FIFO or a link, `opener` judges
        return []
    text = read_bounded(path, MAX_LINES_BYTES, opener).decode("utf-8", errors="replace")
    complete = text[: text.rfind("\n") + 1]
    return [(number, line) for number, line in enumerate(complete.splitlines(), 1) if line.strip()]


def read_jsonl(path: str | os.PathLike[str], opener: Opener = open_plain) -> list[dict[str, Any]]:
    """Read complete JSON lines; a last line without its newline is still being written and is skipped."""
    return [json.loads(line) for _, line in complete_lines(path, opener)]


def tail_lines(path: str | os.PathLike[str], count: int, opener: Opener = open_plain) -> list[str]:
    """The last `count` lines of a text file (fewer if it is shorter; none if it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    with opener(path) as raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n") for line in deque(f, maxlen=count)]


def open_url(url: str, mode: str = "rb", **kwargs: Any):
    """Open a local path or any fsspec URL (`file://`, `memory://`, `gs://` with the `gcs` extra, ...); a local
    path to read only if it is a regular file with one link (`open_regular`)."""
    if mode == "rb" and not kwargs and "://" not in url:
        return open_regular(url)
    return fsspec.open(url, mode, **kwargs).open()
