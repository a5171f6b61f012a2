"""Tools that turn text into token caches and tokenizers: `tokenize_dataset` and `train_tokenizer`.

`TokenizeDatasetRequest` is the data layer's `TokenizeConfig` plus what only a call has (the input as the
user wrote it, the tokenizer's name, the worker count): its options are declared once, in
`tradewind/data/tokenize_config.py`, and the dataset id is the data layer's `cache_id`. Both tools read their
input the same way (`_input_sources`): a workspace file, folder or glob, or a built-in corpus.

With `output` (a bucket prefix), the cache is written to `<output>/<dataset id>/` instead of the workspace. It
is built as a local cache is, in the workspace's `datasets/.<id>.partial`, and each shard is copied to the bucket
as soon as it is finished (`build_token_cache`'s `mirror`); a call that finds a partial build there (after a
crash, a cancel or a killed worker, here or on another machine) copies its finished shards back instead of
tokenizing them again. The finished cache is then copied as any bucket copy is (`upload_folder`: only what the
bucket lacks, its marker last), exactly as `fetch_dataset` and a launch read a copy, and the local folder is
removed. A cache complete in the bucket is reused without building anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster import get_task_runner
from tradewind.core import InvalidInputError, NotFoundError, PathEscapeError
from tradewind.core.buckets import check_access, is_complete, is_remote, join_url, read_objects
from tradewind.core.workspace import check_path_text
from tradewind.data import (
    BUILTIN_CORPORA,
    GLOB_CHARS,
    BadRecords,
    CacheManifest,
    DocumentFormat,
    SourceFile,
    TokenizeConfig,
    build_token_cache,
    builtin_corpus_path,
    cache_id,
    load_tokenizer,
    open_token_cache,
    source_files,
)
from tradewind.data import (
    train_tokenizer as train_bpe_on_files,
)
from tradewind.data.bad_records import MAX_EXAMPLES
from tradewind.data.token_cache import MANIFEST  # its presence marks a finished token cache
from tradewind.tools.bounds import cut, cut_path
from tradewind.tools.buckets import copy_dataset, dataset_copies, publish_dataset
from tradewind.tools.context import Progress, ToolContext, no_progress
from tradewind.tools.spec import tool

BUILTIN_PREFIX = "builtin:"
TOKENIZERS_DIR = "tokenizers"
MAX_FILES_SHOWN = 20  # input files named in one result (a dataset may have thousands)
BUILTINS = ", ".join(BUILTIN_PREFIX + name for name in BUILTIN_CORPORA)
_INPUT_HELP = f"File, folder or glob (.gz, .zst too) or {BUILTINS}."


class BadRecordReport(BaseModel):
    skipped: int = Field(description="Bad input records skipped: malformed JSON, missing/non-string text, bad UTF-8.")
    files: int = Field(description="Input files with skipped records.")
    per_file: dict[str, int] = Field(
        description=f"Skipped records by file, for the {MAX_FILES_SHOWN} files with the most."
    )
    examples: list[str] = Field(
        description="Input files not read ('file: not read: reason': a FIFO, a device, a hard link), then the first "
        "few bad records ('file:line: reason'), each cut to 300 characters."
    )

    @classmethod
    def of(cls, bad: BadRecords, not_read: Sequence[str] = ()) -> BadRecordReport:
        most = sorted(bad.per_file.items(), key=lambda item: item[1], reverse=True)[:MAX_FILES_SHOWN]
        per_file: dict[str, int] = {}
        for file, count in most:  # two long paths may end alike once cut: count them together
            per_file[cut_path(file)] = per_file.get(cut_path(file), 0) + count
        return cls(
            skipped=bad.skipped,
            files=len(bad.per_file),
            per_file=per_file,
            examples=[cut(example) for example in [*not_read[:MAX_EXAMPLES], *bad.examples]],
        )


class _TokenizeSource(BaseModel):
    """What to tokenize, as the user names it; the first fields of `TokenizeDatasetRequest`."""

    model_config = ConfigDict(extra="forbid")

    input: str = Field(description=_INPUT_HELP)
    tokenizer: str = Field(
        default="byte",
        description="byte, a tokenizer.json, an HF folder or hf:<name>.",
    )


class TokenizeDatasetRequest(TokenizeConfig, _TokenizeSource):
    # The bases' fields come in reverse order of the bases: input and tokenizer first, then the options.
    workers: int | None = Field(default=None, ge=1, le=256, description="Processes; null: one per CPU.")
    output: str | None = Field(default=None, description="gs:// or s3:// prefix; null: workspace.")


class DatasetInfo(BaseModel):
    dataset_id: str = Field(description="Pass this to launch_training.")
    path: str
    reused: bool = Field(description="True when an identical cache existed and nothing was rebuilt.")
    tokenizer: str
    vocab_size: int
    dtype: str
    format: str
    documents: dict[str, int] = Field(description="Documents per split.")
    tokens: dict[str, int] = Field(description="Tokens per split, BOS/EOS included.")
    targets: dict[str, int] | None = Field(default=None, description="Loss-target tokens per split; null: all.")
    shards: int = Field(description="Shards the cache was built in.")
    bad_records: BadRecordReport
    copies: list[str] = Field(default_factory=list, description="Complete bucket copies.")


def builtin_corpus_file(value: str, argument: str) -> Path:
    """The packaged file of the built-in corpus `value` (`builtin:NAME`)."""
    name = value.removeprefix(BUILTIN_PREFIX)
    if name not in BUILTIN_CORPORA:
        raise NotFoundError(f"argument {argument!r}: {value!r} is not a built-in corpus; built-in corpora: {BUILTINS}")
    return builtin_corpus_path(name)


def _resolve_input(ctx: ToolContext, value: str) -> str:
    """A built-in corpus's file, or the workspace path (or glob) that `value` names."""
    check_path_text(value, "input")
    if value.startswith(BUILTIN_PREFIX):
        return str(builtin_corpus_file(value, "input"))
    if is_remote(value):
        return ctx.check_bucket(value, argument="input")
    if not any(char in value for char in GLOB_CHARS):
        return str(ctx.workspace.resolve_path(value, argument="input"))
    # A glob: the folder before its first wildcard must be allowed; the pattern may not climb out of it.
    head, _, _ = value.partition(next(char for char in value if char in GLOB_CHARS))
    folder, pattern = (value[: head.rindex("/")], value[head.rindex("/") + 1 :]) if "/" in head else (".", value)
    if ".." in Path(pattern).parts:
        raise InvalidInputError(f"argument 'input': the glob {value!r} may not contain '..' after its folder")
    return str(ctx.workspace.resolve_path(folder or "/", argument="input") / pattern)


def _input_sources(ctx: ToolContext, value: str) -> tuple[list[SourceFile], list[str]]:
    """The files `value` stands for (see `_resolve_input`), listed once: what the cache or tokenizer id is taken
    of and what is read; and the files of a folder or glob left out, each with why (a FIFO, a device, a hard
    link: `list_input_files`). Refuses a folder or glob that reaches a file through an escaping symlink, or that
    would read workspace internals (the job database and logs in `jobs/`, token-cache files in `datasets/`)."""
    resolved, not_read = _resolve_input(ctx, value), []
    try:
        sources = source_files([resolved], not_read)
    except InvalidInputError as error:  # a file that may not be read (a FIFO, a device, a hard link), named alone
        raise InvalidInputError(f"argument 'input': {error}") from None
    if not value.startswith(BUILTIN_PREFIX) and not is_remote(value):
        for source in sources:
            ctx.workspace.resolve_input(source.path, argument="input")
    return sources, not_read


def _resolve_tokenizer(ctx: ToolContext, value: str) -> str:
    """A tokenizer name as `load_tokenizer` takes it; a file or folder is checked whole, since the tokenizer
    library opens what is in it (a folder's `tokenizer.json` that links out is refused, as that file would be)."""
    if value == "byte" or value.startswith("hf:"):
        return value
    if is_remote(value):
        return ctx.check_bucket(value, argument="tokenizer")
    return str(ctx.workspace.check_tree(ctx.workspace.resolve_input(value, argument="tokenizer"), argument="tokenizer"))


def _tokenizer_dir(ctx: ToolContext, tokenizer_id: str) -> Path:
    """`<workspace>/tokenizers/<tokenizer_id>`, refused if a symlink leads it out of the workspace."""
    folder = ctx.workspace.root / TOKENIZERS_DIR / tokenizer_id
    target = folder.resolve()
    if not target.is_relative_to(ctx.workspace.root):
        raise PathEscapeError(
            f"argument 'input': the tokenizer folder {folder} is refused because it is a symlink that leads to "
            f"{target}, outside the workspace; remove the link"
        )
    return folder


def _info(
    dataset_id: str, path: Path | str, reused: bool, manifest: CacheManifest, copies: list[str], not_read: Sequence[str]
) -> DatasetInfo:
    return DatasetInfo(
        dataset_id=dataset_id,
        path=str(path),
        reused=reused,
        tokenizer=manifest.tokenizer.name,
        vocab_size=manifest.tokenizer.vocab_size,
        dtype=manifest.dtype,
        format=manifest.format,
        documents={split: stats.documents for split, stats in manifest.splits.items()},
        tokens={split: stats.tokens for split, stats in manifest.splits.items()},
        targets=loss_targets(manifest),
        shards=len(manifest.splits["train"].shards),
        bad_records=BadRecordReport.of(manifest.bad_records, not_read),
        copies=copies,
    )


def loss_targets(manifest: CacheManifest) -> dict[str, int] | None:
    """The loss-target tokens per split of a cache with a loss mask; None when every token is one."""
    if not manifest.loss_mask:
        return None
    return {split: stats.targets or 0 for split, stats in manifest.splits.items()}


@tool("Tokenize a dataset", idempotent=True, links=("manifest",))
def tokenize_dataset(
    ctx: ToolContext, request: TokenizeDatasetRequest, progress: Progress = no_progress
) -> DatasetInfo:
    """Tokenize text/JSONL/Parquet files into a token cache. Use it to train on your own files.

    The cache is reused when the input files, tokenizer and options are unchanged, and an interrupted
    build resumes where it stopped. Runs in parallel worker processes; takes seconds per
    megabyte of text per worker and reports progress in input bytes. Bad records are skipped and
    reported (set strict to fail instead). With settings.yaml's `storage`, the cache is also copied to
    `<storage>/datasets/<id>`.

    With `output` (gs:// or s3://), the cache is written to `<output>/<id>` instead, and an interrupted build
    resumes from the shards it finished there. The build is staged in the workspace's `datasets/` and each shard
    is uploaded as it finishes; the local folder is removed once the bucket holds the whole cache (one kept from
    an earlier call stays). Pass the result's `path` (the URL) as the dataset: a launch reads it from the bucket.
    """
    output = None if request.output is None else ctx.check_bucket(request.output, argument="output")
    sources, not_read = _input_sources(ctx, request.input)
    tokenizer = load_tokenizer(_resolve_tokenizer(ctx, request.tokenizer))
    dataset_id = cache_id(sources, tokenizer, request)
    out_dir = ctx.workspace.dataset_dir(dataset_id, must_exist=False)

    def build(mirror: str | None = None) -> CacheManifest:
        return build_token_cache(
            sources,
            out_dir,
            tokenizer,
            request,
            runner=get_task_runner("local", workers=request.workers or os.cpu_count() or 1),
            exist_ok=True,  # another call may finish the same cache first; then it is reused
            progress=lambda done, total: progress(done, total, "input bytes tokenized"),
            mirror=mirror,
        )

    if output is not None:
        url = join_url(output, dataset_id)
        if is_complete(url):
            manifest = CacheManifest.model_validate_json(read_objects(url, (MANIFEST,))[MANIFEST])
            return _info(dataset_id, url, True, manifest, [], not_read)
        check_access(url, argument="output")  # before the work, not after it
        reused = (out_dir / MANIFEST).exists()  # the workspace's own cache: copied, and kept
        manifest = build(mirror=url)
        copy_dataset(ctx, out_dir, url, progress, argument="output")
        if not reused:
            shutil.rmtree(out_dir)
        return _info(dataset_id, url, reused, manifest, [], not_read)

    storage = ctx.settings().storage
    # A cache copied there before is not probed or copied again (a launch checks that its copy is complete).
    copied = storage is not None and join_url(storage, "datasets", dataset_id) in dataset_copies(ctx, out_dir, "input")
    copy_to = None if copied else storage
    if copy_to is not None:
        check_access(copy_to, argument="storage")  # before the work, not after it
    reused = (out_dir / MANIFEST).exists()
    manifest = open_token_cache(out_dir, ctx.workspace.reader("input")).manifest if reused else build()
    if copy_to is not None:
        publish_dataset(ctx, out_dir, copy_to, progress)
    return _info(dataset_id, out_dir, reused, manifest, dataset_copies(ctx, out_dir, "input"), not_read)


class TrainTokenizerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str = Field(description=_INPUT_HELP)
    vocab_size: int = Field(default=32_000, ge=258, le=1_000_000, description="Including EOS and BOS.")
    format: DocumentFormat = "auto"
    text_field: str = Field(default="text", description="JSONL/Parquet text field; dotted if nested.")
    max_documents: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000_000,
        description="First documents only; null: all.",
    )
    min_frequency: int = Field(
        default=2,
        ge=1,
        le=1_000_000,
        description="Fewest occurrences of a merged pair.",
    )


class TrainedTokenizer(BaseModel):
    tokenizer: str = Field(description="Path of the tokenizer.json; pass it as 'tokenizer' to tokenize_dataset.")
    reused: bool = Field(description="True when the same request had trained it before.")
    vocab_size: int = Field(description="Vocabulary reached; below the request when the text has too few pairs.")
    eos_id: int
    bos_id: int | None
    fingerprint: str
    bad_records: BadRecordReport


@tool("Train a BPE tokenizer", idempotent=True)
def train_tokenizer(
    ctx: ToolContext, request: TrainTokenizerRequest, progress: Progress = no_progress
) -> TrainedTokenizer:
    """Train a byte-level BPE tokenizer. Use it when byte tokens make sequences too long.

    EOS is '<|endoftext|>' (id 0) and BOS
    '<|begin_of_text|>' (id 1). The same request reuses the tokenizer it trained before. Takes about a
    second per megabyte of text.
    """
    sources, not_read = _input_sources(ctx, request.input)
    key = {
        "sources": [source.model_dump() for source in sources],
        "options": request.model_dump(exclude={"input"}),
    }
    tokenizer_id = "tok-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = _tokenizer_dir(ctx, tokenizer_id) / "tokenizer.json"
    reused = path.exists()
    bad = BadRecords()
    if reused:
        tokenizer = load_tokenizer(str(path))
    else:
        tokenizer = train_bpe_on_files(
            [source.path for source in sources],
            path,
            request.vocab_size,
            format=request.format,
            text_field=request.text_field,
            max_documents=request.max_documents,
            min_frequency=request.min_frequency,
            bad_records=bad,
            progress=lambda done, total: progress(done, total, "input bytes read"),
        )
    return TrainedTokenizer(
        tokenizer=str(path),
        reused=reused,
        vocab_size=tokenizer.vocab_size,
        eos_id=tokenizer.eos_id,
        bos_id=tokenizer.bos_id,
        fingerprint=tokenizer.fingerprint,
        bad_records=BadRecordReport.of(bad, not_read),
    )
