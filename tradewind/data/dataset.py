"""`Dataset`: lazy record pipelines over files, run shard by shard on a `tradewind.cluster` task runner.

In the spirit of Zephyr (Marin's data library): a pipeline starts from files, chains per-record
transforms, and ends in a writer. Each input file is a shard; the transforms run on every shard
independently, in parallel worker processes through a `TaskRunner` (local processes now, Ray once that
backend exists), and each shard becomes one output file. Records are dicts: a JSONL object, a Parquet
row, or `{"text": paragraph}` for plain text.

The functions given to `map`, `flat_map` and `filter` travel to worker processes, so with more than one
worker they must be picklable: top-level functions (or `functools.partial` of them), not lambdas.

Example:
    from tradewind.cluster import get_task_runner

    def long_enough(record): return len(record["text"]) > 200
    def lowercase(record): return {**record, "text": record["text"].lower()}

    result = (
        Dataset.from_files("raw/*.jsonl.gz")
        .filter(long_enough)
        .map(lowercase)
        .write_jsonl("clean/", compression="zst", runner=get_task_runner(workers=8))
    )
    print(result.files, result.records, result.bad_records.skipped)
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

import fsspec
import zstandard

from tradewind.cluster import LocalTaskRunner, TaskRunner
from tradewind.core import InvalidInputError, get_logger
from tradewind.data.bad_records import BadRecords
from tradewind.data.readers import Format, detect_format, list_input_files, read_file_records

log = get_logger(__name__)

Record = dict[str, Any]
Compression = Literal["none", "gz", "zst"]
_PARQUET_BATCH = 4096
_WRITE_BUFFER_BYTES = 1 << 20


@dataclass(frozen=True)
class _Op:
    kind: Literal["map", "flat_map", "filter", "take"]
    fn: Any


@dataclass(frozen=True)
class WriteResult:
    """What a writer produced.

    Attributes:
        files: the output files, one per input shard, in shard order.
        records: records written, per output file.
        bad_records: bad input records skipped (all shards together).
    """

    files: list[str]
    records: list[int]
    bad_records: BadRecords = field(default_factory=BadRecords)


@dataclass(frozen=True)
class Dataset:
    """A lazy pipeline: input shards (files) and the transforms to apply to each shard's records.

    Build one with `Dataset.from_files`; every method returns a new `Dataset`; nothing runs until it is
    iterated or written.
    """

    shards: tuple[str, ...]
    format: Format = "auto"
    strict: bool = False
    ops: tuple[_Op, ...] = ()

    @classmethod
    def from_files(cls, inputs: str | Path | Sequence[str | Path], *, format: Format = "auto", strict: bool = False):
        """A dataset with one shard per file of `inputs` (paths, folders, globs or fsspec URLs).

        Args:
            inputs: one input or a list of them.
            format: as in `read_documents`.
            strict: fail on the first bad record instead of skipping and counting it.

        Raises:
            NotFoundError: an input matches nothing.
        """
        items = [inputs] if isinstance(inputs, str | Path) else list(inputs)
        files = tuple(url for item in items for url in list_input_files(item))
        for url in files:
            detect_format(url, format)
        return cls(shards=files, format=format, strict=strict)

    def map(self, fn: Callable[[Record], Record]) -> Dataset:
        """Replace each record by `fn(record)`."""
        return self._then("map", fn)

    def flat_map(self, fn: Callable[[Record], Iterable[Record]]) -> Dataset:
        """Replace each record by the records `fn(record)` yields (none, one or many)."""
        return self._then("flat_map", fn)

    def filter(self, fn: Callable[[Record], bool]) -> Dataset:
        """Keep the records for which `fn(record)` is true."""
        return self._then("filter", fn)

    def take(self, n: int) -> Dataset:
        """Keep the first `n` records of each shard (shards run independently, so the cut is per shard)."""
        if n < 0:
            raise InvalidInputError(f"take: n must be non-negative (got {n})")
        return self._then("take", n)

    def shard(self, index: int, count: int) -> Dataset:
        """Keep every `count`-th shard starting at `index`: this worker's or host's part of the inputs."""
        if count < 1 or not 0 <= index < count:
            raise InvalidInputError(f"shard: index must be in [0, count) (got {index} of {count})")
        return replace(self, shards=self.shards[index::count])

    def __iter__(self) -> Iterator[Record]:
        """The records of every shard, in shard order, computed in this process.

        Bad records are skipped as in the writers (or raise, with `strict`); after the last record a
        warning gives their count and first examples, since a plain iterator has no result to report in.
        """
        bad = self._bad()
        for url in self.shards:
            yield from _apply(self.ops, read_file_records(url, format=self.format, bad_records=bad))
        if bad.skipped:
            log.warning("skipped %d bad records: %s", bad.skipped, "; ".join(bad.examples))

    def write_jsonl(
        self, out_dir: str | Path, *, compression: Compression = "none", runner: TaskRunner | None = None
    ) -> WriteResult:
        """Write each shard to `out_dir/part-NNNNN.jsonl[.gz|.zst]`, shards in parallel on `runner`.

        Each file is written under a temporary name and renamed when complete.
        """
        if compression not in ("none", "gz", "zst"):
            raise InvalidInputError(f"compression must be 'none', 'gz' or 'zst' (got {compression!r})")
        suffix = ".jsonl" + ("" if compression == "none" else f".{compression}")
        return self._write(out_dir, "jsonl", suffix, compression, runner)

    def write_parquet(self, out_dir: str | Path, *, runner: TaskRunner | None = None) -> WriteResult:
        """Write each shard to `out_dir/part-NNNNN.parquet`, shards in parallel on `runner`."""
        return self._write(out_dir, "parquet", ".parquet", "none", runner)

    def _write(
        self, out_dir: str | Path, kind: str, suffix: str, compression: Compression, runner: TaskRunner | None
    ) -> WriteResult:
        out = str(out_dir).rstrip("/")
        fs, root = fsspec.core.url_to_fs(out)
        fs.makedirs(root, exist_ok=True)
        tasks = [
            _ShardJob(url, f"{out}/part-{i:05d}{suffix}", kind, compression, self.format, self.strict, self.ops)
            for i, url in enumerate(self.shards)
        ]
        outcomes = (runner or LocalTaskRunner(workers=1)).map(_run_shard, tasks)
        bad = BadRecords()
        for _, _, shard_bad in outcomes:
            bad.merge(shard_bad)
        return WriteResult(files=[o[0] for o in outcomes], records=[o[1] for o in outcomes], bad_records=bad)

    def _then(self, kind: str, fn: Any) -> Dataset:
        return replace(self, ops=(*self.ops, _Op(kind, fn)))  # type: ignore[arg-type]

    def _bad(self) -> BadRecords:
        return BadRecords(strict=self.strict)


def _apply(ops: Sequence[_Op], records: Iterable[Record]) -> Iterator[Record]:
    stream: Iterable[Record] = records
    for op in ops:
        if op.kind == "map":
            stream = map(op.fn, stream)
        elif op.kind == "flat_map":
            stream = itertools.chain.from_iterable(map(op.fn, stream))
        elif op.kind == "filter":
            stream = filter(op.fn, stream)
        else:
            stream = itertools.islice(stream, op.fn)
    yield from stream


@dataclass(frozen=True)
class _ShardJob:
    source: str
    target: str
    kind: str
    compression: Compression
    format: Format
    strict: bool
    ops: tuple[_Op, ...]


def _run_shard(job: _ShardJob) -> tuple[str, int, BadRecords]:
    """Read, transform and write one shard; a top-level function so that any task runner can ship it."""
    bad = BadRecords(strict=job.strict)
    records = _apply(job.ops, read_file_records(job.source, format=job.format, bad_records=bad))
    fs, target = fsspec.core.url_to_fs(job.target)
    temporary = f"{target}.tmp"
    try:
        with fs.open(temporary, "wb") as raw:
            write = _write_parquet if job.kind == "parquet" else partial(_write_jsonl, compression=job.compression)
            count = write(records, raw)
    except BaseException:
        if fs.exists(temporary):
            fs.rm(temporary)
        raise
    fs.mv(temporary, target)
    bad.strict = False
    return job.target, count, bad


def _write_jsonl(records: Iterable[Record], raw: Any, compression: Compression) -> int:
    if compression == "gz":
        # An empty file name and mtime 0 in the header: the same bytes on every run.
        stream: Any = gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0)
    elif compression == "zst":
        stream = zstandard.ZstdCompressor().stream_writer(raw, closefd=False)
    else:
        stream = raw
    count, pending, size = 0, [], 0
    for record in records:
        line = json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n"
        pending.append(line)
        size += len(line)
        count += 1
        if size >= _WRITE_BUFFER_BYTES:
            stream.write(b"".join(pending))
            pending, size = [], 0
    stream.write(b"".join(pending))
    if stream is not raw:
        stream.close()
    return count


def _write_parquet(records: Iterable[Record], raw: Any) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    count, writer = 0, None
    iterator = iter(records)
    while batch := list(itertools.islice(iterator, _PARQUET_BATCH)):
        table = pa.Table.from_pylist(batch, schema=writer.schema if writer else None)
        if writer is None:
            writer = pq.ParquetWriter(raw, table.schema)
        writer.write_table(table)
        count += len(batch)
    if writer is None:  # no records: still a valid (empty) Parquet file
        writer = pq.ParquetWriter(raw, pa.schema([("text", pa.string())]))
    writer.close()
    return count
