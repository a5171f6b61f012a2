"""Token caches: a corpus tokenized once, in parallel shards, into flat arrays that training memory-maps.

Layout of a cache folder::

    <dir>/manifest.json                     written last: its presence marks the cache complete
    <dir>/<split>/shard-NNNNN.bin           flat token ids of one shard's documents in the split,
                                            uint16 if vocab_size <= 65536 else uint32
    <dir>/<split>/shard-NNNNN.offsets.npy   int64, documents + 1 entries: where each document starts
    <dir>/shards/shard-NNNNN.json           each shard's completion record (counts, checksums, bad records)

Splits are `train` and `val`. A split's token stream is its shards' files in shard order; with
`append_eos` every document is followed by EOS (and with `prepend_bos` preceded by BOS). A document goes
to `val` iff `blake2b(text, digest_size=8)` read as a fraction of 2**64 is below `val_fraction`, so the
split depends only on the document's text.

The build runs in `.<name>.partial` beside `<dir>` and is renamed into place once the manifest is
written. Shards run through a `tradewind.cluster` `TaskRunner`; each writes its files under temporary
names, renames them, then writes its completion record. Rerunning an interrupted build (even one killed
with SIGKILL) redoes only the shards without a record, and gives the same bytes as an uninterrupted run.

The options are a `TokenizeConfig` (`tokenize_config.py`); `cache_id` names the cache they make with the
input files and the tokenizer, and keys an interrupted build, so that only the same build resumes it.

Example:
    manifest = build_token_cache(["corpus/"], "datasets/corpus", ByteTokenizer(), TokenizeConfig(val_fraction=0.05),
                                 runner=get_task_runner(workers=2))
    cache = open_token_cache("datasets/corpus")
    train = cache.tokens("train")          # read-only, memory-mapped, 1-D
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pydantic

from tradewind.cluster import LocalTaskRunner, TaskRunner
from tradewind.core import (
    InvalidInputError,
    NotFoundError,
    TradewindError,
    atomic_write_json,
    get_logger,
    parse_config,
    read_json,
)
from tradewind.data.bad_records import BadRecords
from tradewind.data.shards import (
    RECORDS_DIR,
    SPLITS,
    ShardRecord,
    ShardStats,
    ShardTask,
    plan_shards,
    tokenize_shard,
)
from tradewind.data.stream import ShardedTokens
from tradewind.data.tokenize_config import SourceFile, TokenizeConfig, source_files
from tradewind.data.tokenizers import Tokenizer

log = get_logger(__name__)

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
BUILD_KEY = "build.json"
DEFAULT_SHARD_BYTES = 64 * 2**20
_HASH_CHUNK = 8 * 2**20
_PROGRESS_INTERVAL_S = 0.25
_COUNTERS_DIR = "progress"  # in the partial folder: text bytes each running shard has encoded
_STOP_FILE = "stop"  # in the partial folder: its presence stops every running shard at its next batch


class TokenizerInfo(pydantic.BaseModel):
    """The tokenizer a cache was built with."""

    name: str
    fingerprint: str
    vocab_size: int
    bos_id: int | None
    eos_id: int


class SplitStats(pydantic.BaseModel):
    """Counts of one split and its shards.

    Attributes:
        documents: documents in the split.
        tokens: token ids in the split, BOS and EOS included.
        bytes: UTF-8 bytes of the split's document text before tokenization (for bits-per-byte).
        shards: each shard's part of the split, in stream order, with its checksum.
    """

    documents: int
    tokens: int
    bytes: int
    shards: list[ShardStats]


class CacheManifest(pydantic.BaseModel):
    """Everything needed to use, check or rebuild a token cache; stored as `manifest.json`."""

    format_version: int = FORMAT_VERSION
    created: str
    tokenizer: TokenizerInfo
    dtype: str
    append_eos: bool = True
    prepend_bos: bool = False
    val_fraction: float
    text_field: str
    format: str
    sources: list[SourceFile]
    splits: dict[str, SplitStats]
    bad_records: BadRecords = pydantic.Field(default_factory=BadRecords)


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every id of a vocabulary of `vocab_size`."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def cache_id(sources: Sequence[SourceFile], tokenizer: Tokenizer, config: TokenizeConfig) -> str:
    """The dataset id of the cache that `sources`, `tokenizer` and `config` make: `ds-` and 16 hex digits.

    It changes whenever an input file (path, size, modification time), the tokenizer's fingerprint, an
    option of `config` or `FORMAT_VERSION` does; not with how the build runs (workers, shard size).

    Args:
        sources: the inputs, as `source_files` gives them.
        tokenizer: the tokenizer (only its fingerprint counts).
        config: the options; only `TokenizeConfig`'s fields count, so a request that inherits it may be passed.
    """
    key = {
        "format_version": FORMAT_VERSION,
        "sources": [source.model_dump() for source in sources],
        "tokenizer": tokenizer.fingerprint,
        "options": config.model_dump(include=set(TokenizeConfig.model_fields)),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return f"ds-{digest[:16]}"


def build_token_cache(
    inputs: Sequence[str | Path | SourceFile],
    out_dir: str | Path,
    tokenizer: Tokenizer,
    config: TokenizeConfig | None = None,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    runner: TaskRunner | None = None,
    exist_ok: bool = False,
    progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> CacheManifest:
    """Tokenize the documents of `inputs` into a token cache at `out_dir`, resuming an interrupted build.

    Args:
        inputs: files, folders, globs or fsspec URLs, read as by `read_documents`; or the `SourceFile`s that
            `source_files` listed for them (then the cache holds exactly the files its `cache_id` was taken of).
        out_dir: the cache folder to create.
        tokenizer: the tokenizer.
        config: how to read and tokenize the documents (format, text field, validation share, BOS/EOS,
            strictness). `append_eos` must stay on for training: the loader finds document boundaries by EOS.
        options: instead of `config`, its fields as keywords: `val_fraction=0.2` stands for
            `TokenizeConfig(val_fraction=0.2)`.
        shard_bytes: uncompressed JSONL files larger than this are cut into shards of about this size;
            other files are one shard each.
        runner: runs the shards (`tradewind.cluster.get_task_runner`); defaults to this process.
        exist_ok: if a complete cache is already at `out_dir`, return its manifest instead of failing.
        progress: called as `progress(done, total)` with the input bytes tokenized so far (finished shards, and
            the text bytes of running ones, batch by batch), each time it grows. If it raises, the shards
            stop at their next batch and the error propagates (a `TradewindError`, like a cancelled call, also
            removes the partial build).

    Returns:
        The manifest, as written to `out_dir/manifest.json`.

    Raises:
        InvalidInputError: `out_dir` exists (and not `exist_ok`), a bad option (`ConfigError` names it), a bad
            record under `strict`, or a split that would be empty.
        NotFoundError: an input does not exist.
    """
    if config is not None and options:
        raise TypeError(f"pass either config or its fields as keywords, not both (got {', '.join(options)})")
    if config is None:
        config = parse_config(TokenizeConfig, options, source="build_token_cache")
    if config.prepend_bos and tokenizer.bos_id is None:
        raise InvalidInputError(f"prepend_bos: tokenizer {tokenizer.name!r} has no BOS token")
    out_dir = Path(out_dir)
    if out_dir.exists() and not exist_ok:
        raise InvalidInputError(f"{out_dir} already exists; choose a new folder or delete the old cache first")
    sources = source_files(inputs)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = out_dir.parent / f".{out_dir.name}.partial"
    with _build_lock(partial):
        if (out_dir / MANIFEST).exists() and exist_ok:
            return open_token_cache(out_dir).manifest
        if out_dir.exists():
            raise InvalidInputError(f"{out_dir} already exists; choose a new folder or delete the old cache first")
        # The shard size is no part of the id (it does not change the token streams), but a partial build
        # cut into other shards cannot be resumed.
        _start_or_resume(partial, {"key": cache_id(sources, tokenizer, config), "shard_bytes": shard_bytes})
        dtype = token_dtype(tokenizer.vocab_size)
        plan = plan_shards([(s.path, s.size) for s in sources], config.format, shard_bytes)
        tasks = [
            ShardTask(
                index=index,
                url=url,
                start=start,
                end=end,
                input_bytes=(end if end is not None else _size(sources, url)) - start,
                folder=str(partial),
                tokenizer=tokenizer,
                dtype=dtype.name,
                **config.model_dump(include=set(TokenizeConfig.model_fields)),
            )
            for index, (url, start, end) in enumerate(plan)
        ]
        try:
            records = _run_shards(tasks, runner or LocalTaskRunner(workers=1), partial, progress)
            splits = _split_stats(records, config.val_fraction)
        except TradewindError:
            shutil.rmtree(partial, ignore_errors=True)  # bad input: nothing worth resuming
            raise
        bad = BadRecords()
        for record in records:
            bad.merge(record.bad_records)
        manifest = CacheManifest(
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            tokenizer=TokenizerInfo(
                name=tokenizer.name,
                fingerprint=tokenizer.fingerprint,
                vocab_size=tokenizer.vocab_size,
                bos_id=tokenizer.bos_id,
                eos_id=tokenizer.eos_id,
            ),
            dtype=dtype.name,
            append_eos=config.append_eos,
            prepend_bos=config.prepend_bos,
            val_fraction=config.val_fraction,
            text_field=config.text_field,
            format=config.format,
            sources=sources,
            splits=splits,
            bad_records=bad,
        )
        (partial / BUILD_KEY).unlink()
        atomic_write_json(partial / MANIFEST, manifest.model_dump(mode="json"))
        os.rename(partial, out_dir)
    if bad.skipped:
        log.warning("%s: skipped %d bad record(s), e.g. %s", out_dir, bad.skipped, bad.examples[0])
    log.info("built token cache %s: %s", out_dir, {s: (v.documents, v.tokens) for s, v in splits.items()})
    return manifest


class _build_lock:
    """An exclusive lock on one cache build (a flock on the partial folder's lock file), across processes."""

    def __init__(self, partial: Path):
        self.path = partial.with_name(partial.name + ".lock")

    def __enter__(self) -> None:
        while True:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            # The holder before us unlinks the file when done; a lock on that unlinked file would not
            # exclude a newcomer who creates a new one, so lock again until the file is the one on disk.
            try:
                if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                    return
            except FileNotFoundError:
                pass
            os.close(self.fd)

    def __exit__(self, *exc: object) -> None:
        self.path.unlink(missing_ok=True)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _start_or_resume(partial: Path, key: dict[str, Any]) -> None:
    """Keep a partial build with the same key (a resume); start afresh otherwise."""
    key_path = partial / BUILD_KEY
    if partial.exists():
        if key_path.exists() and read_json(key_path) == key:
            done = len(list((partial / RECORDS_DIR).glob("*.json"))) if (partial / RECORDS_DIR).exists() else 0
            log.info("resuming the build in %s: %d shard(s) already finished", partial, done)
            for leftover in partial.glob("*/*.tmp-*"):  # a killed shard's files, never renamed into place
                leftover.unlink()
            return
        shutil.rmtree(partial)
    partial.mkdir()
    atomic_write_json(key_path, key)


def _size(sources: Sequence[SourceFile], url: str) -> int:
    return next(source.size for source in sources if source.path == url)


def _run_shards(
    tasks: list[ShardTask], runner: TaskRunner, partial: Path, progress: Callable[[int, int], None] | None
) -> list[ShardRecord]:
    total = sum(task.input_bytes for task in tasks)
    pending = [task for task in tasks if not task.record_path.exists()]
    if progress is None:
        runner.map(tokenize_shard, pending)
    else:
        # Runners return only when every task is done, so progress comes from files: each shard's completion
        # record, and, within a shard, the text bytes its tokenizer has encoded so far (`_ReportingTokenizer`).
        # The shards run in a helper thread and this thread reports, because a progress callback may only
        # work from its caller's thread (the MCP server's calls back into its event loop from there).
        counters, stop = partial / _COUNTERS_DIR, partial / _STOP_FILE
        shutil.rmtree(counters, ignore_errors=True)  # an interrupted build's counts; its shards start again
        stop.unlink(missing_ok=True)
        counters.mkdir()
        reporting = [
            dataclasses.replace(
                task, tokenizer=_ReportingTokenizer(task.tokenizer, str(counters / task.name), str(stop))
            )
            for task in pending
        ]
        failure: list[BaseException] = []

        def run() -> None:
            try:
                runner.map(tokenize_shard, reporting)
            except BaseException as error:  # re-raised below, in the caller's thread
                failure.append(error)

        worker = threading.Thread(target=run, name="cache-shards", daemon=True)
        worker.start()
        last = -1
        try:
            while worker.is_alive():
                worker.join(_PROGRESS_INTERVAL_S)
                done = sum(_bytes_done(task, counters) for task in tasks)
                if last < done < total:
                    progress(done, total)
                    last = done
        except BaseException:
            stop.touch()  # the progress callback failed (the caller cancelled): every shard stops at its next batch
            raise
        finally:
            # A failing progress callback must not leave shards being written after the build lock is released.
            worker.join()
            shutil.rmtree(counters, ignore_errors=True)
            stop.unlink(missing_ok=True)
        if failure:
            raise failure[0]
        progress(total, total)
    return [ShardRecord.model_validate(read_json(task.record_path)) for task in tasks]


def _bytes_done(task: ShardTask, counters: Path) -> int:
    """A shard's input bytes if it is finished, else the text bytes it has encoded so far (fewer or equal)."""
    if task.record_path.exists():
        return task.input_bytes
    try:
        return min(int((counters / task.name).read_text() or 0), task.input_bytes)
    except (OSError, ValueError):  # not started yet, or caught mid-write
        return 0


class _Stopped(Exception):
    """A shard stopped because its build was told to (the stop file appeared)."""


@dataclasses.dataclass(frozen=True)
class _ReportingTokenizer:
    """A tokenizer that, for each batch, first stops if `stop` exists, then counts the batch's UTF-8 bytes into
    the file `counter`: how the build follows a shard running in another process and stops it."""

    inner: Tokenizer
    counter: str
    stop: str
    encoded: list[int] = dataclasses.field(default_factory=lambda: [0])

    name = property(lambda self: self.inner.name)
    fingerprint = property(lambda self: self.inner.fingerprint)
    vocab_size = property(lambda self: self.inner.vocab_size)
    bos_id = property(lambda self: self.inner.bos_id)
    eos_id = property(lambda self: self.inner.eos_id)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if os.path.exists(self.stop):
            raise _Stopped(f"the build of {os.path.dirname(self.stop)} was stopped")
        ids = self.inner.encode_batch(texts)
        self.encoded[0] += sum(len(text.encode("utf-8")) for text in texts)
        with open(self.counter, "w") as out:
            out.write(str(self.encoded[0]))
        return ids

    def decode(self, ids: Any) -> str:
        return self.inner.decode(ids)


def _split_stats(records: list[ShardRecord], val_fraction: float) -> dict[str, SplitStats]:
    splits = {}
    for split in SPLITS:
        parts = [record.splits[split] for record in records]
        splits[split] = SplitStats(
            documents=sum(p.documents for p in parts),
            tokens=sum(p.tokens for p in parts),
            bytes=sum(p.bytes for p in parts),
            shards=parts,
        )
    documents = sum(stats.documents for stats in splits.values())
    skipped = sum(record.bad_records.skipped for record in records)
    for split, stats in splits.items():
        if stats.documents == 0:
            other = "raise" if split == "val" else "lower"
            raise InvalidInputError(
                f"the inputs hold {documents} document(s) and none went to the {split!r} split "
                f"(val_fraction={val_fraction}, {skipped} bad record(s) skipped); add more documents "
                f"(plain-text documents are separated by blank lines) or {other} val_fraction"
            )
    return splits


class TokenCache:
    """A complete token cache on disk.

    Args:
        path: the cache folder.
        manifest: its parsed `manifest.json`.
    """

    def __init__(self, path: Path, manifest: CacheManifest):
        self.path = path
        self.manifest = manifest

    def __repr__(self) -> str:
        return f"TokenCache({str(self.path)!r})"

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the token files."""
        return np.dtype(self.manifest.dtype)

    def shard_files(self, split: str) -> list[tuple[Path, Path]]:
        """The `(tokens, offsets)` files of each shard of `split`, in stream order.

        Raises:
            NotFoundError: the cache has no such split.
        """
        folder = self._split_dir(split)
        return [
            (folder / f"{shard.name}.bin", folder / f"{shard.name}.offsets.npy")
            for shard in self.manifest.splits[split].shards
        ]

    def tokens(self, split: str) -> np.memmap | ShardedTokens:
        """The split's token stream: read-only and memory-mapped, 1-D, sliceable like an array.

        A single non-empty shard comes back as its `np.memmap`; several as a `ShardedTokens` view over
        their memmaps, whose slices are copied out as arrays.

        Raises:
            NotFoundError: the cache has no such split.
        """
        parts = [
            np.memmap(path, dtype=self.dtype, mode="r")
            for (path, _), shard in zip(self.shard_files(split), self.manifest.splits[split].shards, strict=True)
            if shard.tokens
        ]
        return parts[0] if len(parts) == 1 else ShardedTokens(parts, self.dtype)

    def offsets(self, split: str) -> np.ndarray:
        """Where each document of the split starts in its token stream, plus the total length at the end.

        Raises:
            NotFoundError: the cache has no such split.
        """
        pieces, base = [np.zeros(1, dtype=np.int64)], 0
        for (_, offsets_path), shard in zip(self.shard_files(split), self.manifest.splits[split].shards, strict=True):
            pieces.append(np.load(offsets_path)[1:] + base)
            base += shard.tokens
        return np.concatenate(pieces)

    def verify(self) -> None:
        """Check every shard's files against the manifest: checksum, counts, offsets and EOS placement.

        Raises:
            InvalidInputError: a file does not match; the message names it and what differs.
        """
        for split, stats in self.manifest.splits.items():
            for (tokens_path, offsets_path), shard in zip(self.shard_files(split), stats.shards, strict=True):
                expected_size = shard.tokens * self.dtype.itemsize
                if tokens_path.stat().st_size != expected_size:
                    raise InvalidInputError(
                        f"{tokens_path}: {tokens_path.stat().st_size} bytes, the manifest says {expected_size}"
                    )
                digest = _sha256_file(tokens_path)
                if digest != shard.sha256:
                    raise InvalidInputError(f"{tokens_path}: sha256 is {digest}, the manifest says {shard.sha256}")
                offsets = np.load(offsets_path)
                if offsets.shape != (shard.documents + 1,):
                    raise InvalidInputError(
                        f"{offsets_path}: {offsets.shape[0]} entries, expected {shard.documents + 1} (documents + 1)"
                    )
                if offsets[0] != 0 or offsets[-1] != shard.tokens or np.any(np.diff(offsets) < 1):
                    raise InvalidInputError(f"{offsets_path}: offsets must rise from 0 to {shard.tokens}")
                if self.manifest.append_eos and shard.tokens:
                    ends = np.memmap(tokens_path, dtype=self.dtype, mode="r")[offsets[1:] - 1]
                    if np.any(ends != self.manifest.tokenizer.eos_id):
                        raise InvalidInputError(f"{tokens_path}: a document does not end with EOS")

    def _split_dir(self, split: str) -> Path:
        if split not in self.manifest.splits:
            raise NotFoundError(
                f"token cache {self.path} has no split {split!r}; it has {', '.join(self.manifest.splits)}"
            )
        return self.path / split


def open_token_cache(path: str | Path) -> TokenCache:
    """Open the complete token cache at `path`.

    Raises:
        NotFoundError: no `manifest.json` there (the build did not finish, or the path is wrong).
        InvalidInputError: the manifest does not parse, or comes from another cache format version.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise NotFoundError(
            f"no token cache at {path} (manifest.json missing: the build did not finish or the path is wrong)"
        )
    raw = read_json(manifest_path)
    version = raw.get("format_version", 1) if isinstance(raw, dict) else None
    if version != FORMAT_VERSION:
        raise InvalidInputError(
            f"{manifest_path}: cache format_version {version}, this Tradewind reads {FORMAT_VERSION}; "
            f"rebuild the cache (tokenize the inputs again)"
        )
    return TokenCache(path, parse_config(CacheManifest, raw, source=str(manifest_path)))


def _sha256_file(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()
