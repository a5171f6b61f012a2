"""Building a token cache: a corpus tokenized once, in parallel shards, into the layout `token_cache.py` reads.

The build runs in `.<name>.partial` beside `<dir>` and is renamed into place once the manifest is
written. Shards run through a `tradewind.cluster` `TaskRunner` (`shard_runs.py`); each writes its files
under temporary names, renames them, then writes its completion record. Rerunning an interrupted build
(even one killed with SIGKILL) redoes only the shards without a record, and gives the same bytes as an
uninterrupted run.

With `mirror`, a bucket prefix keeps the build's finished shards as they finish (`build_mirror.py`), so that a
build interrupted on one machine (or whose partial folder was lost) resumes from the bucket.

The options are a `TokenizeConfig` (`tokenize_config.py`); `cache_id` names the cache they make with the
input files and the tokenizer, and keys an interrupted build, so that only the same build resumes it.

Example:
    manifest = build_token_cache(["corpus/"], "datasets/corpus", ByteTokenizer(), TokenizeConfig(val_fraction=0.05),
                                 runner=get_task_runner(workers=2))
    cache = open_token_cache("datasets/corpus")
    train = cache.tokens("train")          # read-only, memory-mapped, 1-D
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tradewind.cluster import LocalTaskRunner, TaskRunner
from tradewind.core import (
    InvalidInputError,
    TradewindError,
    atomic_write_json,
    get_logger,
    parse_config,
    read_json,
)
from tradewind.data.bad_records import BadRecords
from tradewind.data.build_mirror import BUILD_KEY, BuildMirror
from tradewind.data.chat import ChatTemplate, ChatTemplateError
from tradewind.data.readers import RECORD_FORMATS
from tradewind.data.shard_runs import run_shards
from tradewind.data.shards import RECORDS_DIR, SPLITS, ShardRecord, ShardTask, plan_shards
from tradewind.data.token_cache import (
    FORMAT_VERSION,
    MANIFEST,
    TOKENIZER_DIR,
    CacheManifest,
    SplitStats,
    TokenizerInfo,
    open_token_cache,
    token_dtype,
)
from tradewind.data.tokenize_config import SourceFile, TokenizeConfig, source_files
from tradewind.data.tokenizers import HFTokenizer, Tokenizer, load_tokenizer, write_hf_tokenizer_files

log = get_logger(__name__)

DEFAULT_SHARD_BYTES = 64 * 2**20


def cache_id(sources: Sequence[SourceFile], tokenizer: Tokenizer, config: TokenizeConfig) -> str:
    """The dataset id of the cache that `sources`, `tokenizer` and `config` make: `ds-` and 16 hex digits.

    It changes whenever an input file (path, size, modification time, a bucket object's version), the
    tokenizer's fingerprint, an option of `config` or `FORMAT_VERSION` does; not with how the build runs
    (workers, shard size).

    Args:
        sources: the inputs, as `source_files` gives them.
        tokenizer: the tokenizer (only its fingerprint counts).
        config: the options; only `TokenizeConfig`'s fields count, so a request that inherits it may be passed.
    """
    key = {
        "format_version": FORMAT_VERSION,
        "sources": [source.model_dump(exclude_none=True) for source in sources],  # a local file has no version
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
    mirror: str | None = None,
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
            The formats `chat` and `prompt_completion` make a cache with a loss mask (see `chat.py`); `chat`
            needs a tokenizer with a chat template.
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
        mirror: a bucket prefix (`gs://`, `s3://`) that keeps the partial build: each shard is copied there once
            finished, and a build with the same id and shard size resumes from the shards there (see
            `build_mirror.py`). The finished cache is not copied: the caller's `upload_folder` sends what the
            prefix lacks, marker last.

    Returns:
        The manifest, as written to `out_dir/manifest.json`.

    Raises:
        InvalidInputError: `out_dir` exists (and not `exist_ok`), a bad option (`ConfigError` names it), format
            `chat` with a tokenizer that has no (valid) chat template, a bad record under `strict`, or a split
            that would be empty.
        NotFoundError: an input does not exist.
    """
    if config is not None and options:
        raise TypeError(f"pass either config or its fields as keywords, not both (got {', '.join(options)})")
    if config is None:
        config = parse_config(TokenizeConfig, options, source="build_token_cache")
    if config.prepend_bos and tokenizer.bos_id is None:
        raise InvalidInputError(f"prepend_bos: tokenizer {tokenizer.name!r} has no BOS token")
    chat_tokenizer = _chat_tokenizer(tokenizer) if config.format == "chat" else None
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
        key = {"key": cache_id(sources, tokenizer, config), "shard_bytes": shard_bytes}
        _start_or_resume(partial, key)
        kept = BuildMirror(mirror, partial, key) if mirror is not None else None
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
                chat_tokenizer=chat_tokenizer,
                dtype=dtype.name,
                **config.model_dump(include=set(TokenizeConfig.model_fields) - {"val_tokens"}),
            )
            for index, (url, start, end) in enumerate(plan)
        ]
        try:
            records = run_shards(
                tasks, runner or LocalTaskRunner(workers=1), partial, progress, kept.keep if kept else None
            )
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
            val_tokens=config.val_tokens,
            loss_mask=config.format in RECORD_FORMATS,
        )
        keep_tokenizer(tokenizer, partial / TOKENIZER_DIR)
        (partial / BUILD_KEY).unlink()
        if kept is not None:
            kept.finish()
        atomic_write_json(partial / MANIFEST, manifest.model_dump(mode="json"))
        os.rename(partial, out_dir)
    if bad.skipped:
        log.warning("%s: skipped %d bad record(s), e.g. %s", out_dir, bad.skipped, bad.examples[0])
    log.info("built token cache %s: %s", out_dir, {s: (v.documents, v.tokens) for s, v in splits.items()})
    return manifest


def keep_tokenizer(tokenizer: Tokenizer, folder: Path) -> None:
    """Write a Hugging Face tokenizer's files into `folder` (the cache's `tokenizer/`), so that the cache alone
    decodes its tokens and counts their bytes (val_bpb) on any host; the byte tokenizer is built in and needs none.
    A copy that would load as another tokenizer (another fingerprint) is not kept, and the log says so."""
    if not isinstance(tokenizer, HFTokenizer):
        return
    folder.mkdir(exist_ok=True)
    write_hf_tokenizer_files(tokenizer, folder)
    if (copied := load_tokenizer(str(folder)).fingerprint) != tokenizer.fingerprint:
        shutil.rmtree(folder)
        log.warning(
            "%s: its files, written into the cache, load as another tokenizer (fingerprint %s, not %s): the cache "
            "names it instead, and needs it where it is read",
            tokenizer.name,
            copied[:12],
            tokenizer.fingerprint[:12],
        )


def _chat_tokenizer(tokenizer: Tokenizer) -> HFTokenizer:
    """`tokenizer`, checked to render chats: a Hugging Face tokenizer with a chat template that compiles.

    Raises:
        InvalidInputError: it has no chat template, or one that is not valid Jinja; the message says what to use.
    """
    if not isinstance(tokenizer, HFTokenizer) or tokenizer.chat_template is None:
        raise InvalidInputError(
            f"format 'chat' renders messages with the tokenizer's chat template, and tokenizer {tokenizer.name!r} "
            "has none; pass as tokenizer a Hugging Face folder whose tokenizer_config.json (or chat_template.jinja) "
            "has one (a chat model's folder), or use format 'prompt_completion', which any tokenizer can encode"
        )
    try:
        ChatTemplate(tokenizer.chat_template, {}).compile()
    except ChatTemplateError as error:
        raise InvalidInputError(f"format 'chat': tokenizer {tokenizer.name!r}: {error}") from None
    return tokenizer


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


def _split_stats(records: list[ShardRecord], val_fraction: float) -> dict[str, SplitStats]:
    splits = {}
    for split in SPLITS:
        parts = [record.splits[split] for record in records]
        masked = all(p.targets is not None for p in parts)
        splits[split] = SplitStats(
            documents=sum(p.documents for p in parts),
            tokens=sum(p.tokens for p in parts),
            bytes=sum(p.bytes for p in parts),
            shards=parts,
            targets=sum(p.targets or 0 for p in parts) if masked else None,
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
