"""Tools that turn text into token caches and tokenizers, and describe the caches there are.

`TokenizeDatasetRequest` is the data layer's `TokenizeConfig` plus what only a call has (the input as the
user wrote it, the tokenizer's name, the worker count): its options are declared once, in
`tradewind/data/tokenize_config.py`, and the dataset id is the data layer's `cache_id`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster import get_task_runner
from tradewind.core import InvalidInputError, NotFoundError, PathEscapeError, TradewindError, check_id, names_a_path
from tradewind.core.workspace import check_path_text
from tradewind.data import (
    BUILTIN_CORPORA,
    GLOB_CHARS,
    BadRecords,
    CacheManifest,
    Format,
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
from tradewind.tools.bounds import PAGE_CHARS, RESULT_CHARS, PageRequest, cut, cut_path, fitting
from tradewind.tools.context import Progress, ToolContext, no_progress

BUILTIN_PREFIX = "builtin:"
TOKENIZERS_DIR = "tokenizers"
_MANIFEST = "manifest.json"  # its presence marks a finished token cache
MAX_FILES_SHOWN = 20  # input files named in one result (a dataset may have thousands)
_BUILTINS = ", ".join(BUILTIN_PREFIX + name for name in BUILTIN_CORPORA)
_INPUT_HELP = (
    "A text, JSONL or Parquet file (.gz/.zst too), a folder of them or a glob ('data/*.jsonl.gz'), in the "
    f"workspace or an allowed root; or {_BUILTINS}."
)
DATASET_HELP = (
    "A dataset id (from tokenize_dataset or list_datasets), a token-cache folder in the workspace or an allowed "
    f"root, or {_BUILTINS} (tokenized on first use)."
)


class BadRecordReport(BaseModel):
    skipped: int = Field(description="Bad input records skipped: malformed JSON, missing/non-string text, bad UTF-8.")
    files: int = Field(description="Input files with skipped records.")
    per_file: dict[str, int] = Field(
        description=f"Skipped records by file, for the {MAX_FILES_SHOWN} files with the most."
    )
    examples: list[str] = Field(description="The first few, each 'file:line: reason', cut to 300 characters.")

    @classmethod
    def of(cls, bad: BadRecords) -> BadRecordReport:
        most = sorted(bad.per_file.items(), key=lambda item: item[1], reverse=True)[:MAX_FILES_SHOWN]
        per_file: dict[str, int] = {}
        for file, count in most:  # two long paths may end alike once cut: count them together
            per_file[cut_path(file)] = per_file.get(cut_path(file), 0) + count
        return cls(
            skipped=bad.skipped,
            files=len(bad.per_file),
            per_file=per_file,
            examples=[cut(example) for example in bad.examples],
        )


class _TokenizeSource(BaseModel):
    """What to tokenize, as the user names it; the first fields of `TokenizeDatasetRequest`."""

    model_config = ConfigDict(extra="forbid")

    input: str = Field(description=_INPUT_HELP)
    tokenizer: str = Field(
        default="byte",
        description="'byte' (built in), a tokenizer.json path (e.g. from train_tokenizer), or 'hf:<name>' when "
        "the Hugging Face Hub is reachable.",
    )


class TokenizeDatasetRequest(TokenizeConfig, _TokenizeSource):
    # The bases' fields come in reverse order of the bases: input and tokenizer first, then the options.
    workers: int | None = Field(
        default=None, ge=1, le=256, description="Worker processes for tokenization; default: one per CPU."
    )


class DatasetInfo(BaseModel):
    dataset_id: str = Field(description="Pass this to launch_training.")
    path: str
    reused: bool = Field(description="True when an identical cache existed and nothing was rebuilt.")
    tokenizer: str
    vocab_size: int
    dtype: str
    documents: dict[str, int] = Field(description="Documents per split.")
    tokens: dict[str, int] = Field(description="Tokens per split, BOS/EOS included.")
    shards: int = Field(description="Shards the cache was built in.")
    bad_records: BadRecordReport


def _builtin_corpus(value: str, argument: str) -> Path:
    """The packaged file of the built-in corpus `value` (`builtin:NAME`)."""
    name = value.removeprefix(BUILTIN_PREFIX)
    if name not in BUILTIN_CORPORA:
        raise NotFoundError(f"argument {argument!r}: {value!r} is not a built-in corpus; built-in corpora: {_BUILTINS}")
    return builtin_corpus_path(name)


def _resolve_input(ctx: ToolContext, value: str) -> str:
    """A built-in corpus's file, or the workspace path (or glob) that `value` names."""
    check_path_text(value, "input")
    if value.startswith(BUILTIN_PREFIX):
        return str(_builtin_corpus(value, "input"))
    if not any(char in value for char in GLOB_CHARS):
        return str(ctx.workspace.resolve_path(value, argument="input"))
    # A glob: the folder before its first wildcard must be allowed; the pattern may not climb out of it.
    head, _, _ = value.partition(next(char for char in value if char in GLOB_CHARS))
    folder, pattern = (value[: head.rindex("/")], value[head.rindex("/") + 1 :]) if "/" in head else (".", value)
    if ".." in Path(pattern).parts:
        raise InvalidInputError(f"argument 'input': the glob {value!r} may not contain '..' after its folder")
    return str(ctx.workspace.resolve_path(folder or "/", argument="input") / pattern)


def _input_sources(ctx: ToolContext, value: str) -> list[SourceFile]:
    """The files `value` stands for (see `_resolve_input`), listed once: what the cache or tokenizer id is taken
    of and what is read. Refuses a folder or glob that reaches a file through an escaping symlink, or that would
    read workspace internals (the job database and logs in `jobs/`, token-cache files in `datasets/`)."""
    sources = source_files([_resolve_input(ctx, value)])
    if not value.startswith(BUILTIN_PREFIX):
        for source in sources:
            internal = ctx.workspace.internal_input(ctx.workspace.resolve_path(source.path, argument="input"))
            if internal is not None:
                raise InvalidInputError(
                    f"argument 'input': {value!r} is refused because it would read workspace internals: {internal}; "
                    "workspace internals are never an input: name your text files, or a folder or glob of only them"
                )
    return sources


def _resolve_tokenizer(ctx: ToolContext, value: str) -> str:
    if value == "byte" or value.startswith("hf:"):
        return value
    return str(ctx.workspace.resolve_path(value, argument="tokenizer"))


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


def _info(dataset_id: str, path: Path, reused: bool, manifest: CacheManifest) -> DatasetInfo:
    return DatasetInfo(
        dataset_id=dataset_id,
        path=str(path),
        reused=reused,
        tokenizer=manifest.tokenizer.name,
        vocab_size=manifest.tokenizer.vocab_size,
        dtype=manifest.dtype,
        documents={split: stats.documents for split, stats in manifest.splits.items()},
        tokens={split: stats.tokens for split, stats in manifest.splits.items()},
        shards=len(manifest.splits["train"].shards),
        bad_records=BadRecordReport.of(manifest.bad_records),
    )


def tokenize_dataset(
    ctx: ToolContext, request: TokenizeDatasetRequest, progress: Progress = no_progress
) -> DatasetInfo:
    """Tokenize text, JSONL or Parquet files into a token cache; returns its dataset id. Use it before
    training on your own files; an unchanged request reuses the finished cache.

    The cache is reused when the input files, tokenizer and options are unchanged, and an interrupted
    build resumes where it stopped. Runs in parallel worker processes; takes seconds per
    megabyte of text per worker and reports progress in input bytes. Bad records are skipped and
    reported (set strict to fail instead).
    """
    sources = _input_sources(ctx, request.input)
    tokenizer = load_tokenizer(_resolve_tokenizer(ctx, request.tokenizer))
    dataset_id = cache_id(sources, tokenizer, request)
    out_dir = ctx.workspace.dataset_dir(dataset_id, must_exist=False)
    if (out_dir / _MANIFEST).exists():
        return _info(dataset_id, out_dir, True, open_token_cache(out_dir).manifest)
    manifest = build_token_cache(
        sources,
        out_dir,
        tokenizer,
        request,
        runner=get_task_runner("local", workers=request.workers or os.cpu_count() or 1),
        exist_ok=True,  # another call may finish the same cache first; then it is reused
        progress=lambda done, total: progress(done, total, "input bytes tokenized"),
    )
    return _info(dataset_id, out_dir, False, manifest)


def resolve_dataset(
    ctx: ToolContext, value: str, progress: Progress = no_progress, *, argument: str = "dataset"
) -> Path:
    """The folder of the token cache that `value` names, the same way wherever a dataset is expected.

    `value` is one of:

    - `builtin:NAME`: a built-in corpus, tokenized on first use as `tokenize_dataset` does by default
      (byte tokenizer); later calls reuse that cache. `progress` follows the tokenization.
    - a path: anything with a `/`, or starting with `.` or `~`. A relative path is taken from the
      workspace root (never the current folder), e.g. `datasets/ds-0123abcd` or `steps/tokenize-ab/cache`;
      an absolute one must lie inside the workspace or an allowed root.
    - otherwise a dataset id, as `tokenize_dataset` returns: the folder `datasets/<id>` of the workspace.

    Args:
        ctx: the tool context whose workspace the value is resolved in.
        value: the dataset as the user wrote it.
        progress: `progress(done, total, message)` while a built-in corpus is tokenized.
        argument: the argument's name, for error messages.

    Returns:
        The absolute folder of a finished token cache (one with a `manifest.json`).

    Raises:
        NotFoundError: an unknown id, built-in corpus or path; the message lists the datasets there are.
        InvalidInputError: the value is not a valid id, or names a file or a folder that is not a token cache.
        PathEscapeError: the path lands outside the workspace and the allowed roots.
    """
    if value.startswith(BUILTIN_PREFIX):
        _builtin_corpus(value, argument)  # fail on an unknown name before tokenize_dataset calls it 'input'
        return Path(tokenize_dataset(ctx, TokenizeDatasetRequest(input=value), progress).path)
    is_path = names_a_path(value)
    path = value if is_path else ctx.workspace.datasets_dir / check_id(value, argument)
    folder = ctx.workspace.resolve_path(path, argument=argument, must_exist=False)
    if (folder / _MANIFEST).is_file():
        return folder
    raise _not_a_cache(ctx, value, folder, argument, is_path)


def _not_a_cache(ctx: ToolContext, value: str, folder: Path, argument: str, is_path: bool) -> TradewindError:
    """The error for a dataset value that names no finished token cache, saying which datasets there are."""
    if folder.is_dir():
        error, why = InvalidInputError, f"{value!r} ({folder}) is not a token cache: it has no {_MANIFEST}"
    elif folder.exists():
        error, why = (
            InvalidInputError,
            f"{value!r} ({folder}) is a file, not a token cache; tokenize it first (tokenize_dataset or "
            "`tradewind tokenize`) and pass the dataset id it returns",
        )
    elif is_path:
        error, why = NotFoundError, f"nothing is at {value!r} ({folder}; relative paths start at the workspace root)"
    else:
        error, why = NotFoundError, f"unknown dataset id {value!r} (no folder {folder}; a path needs a '/')"
    return error(f"argument {argument!r}: {why}; {_known_datasets(ctx)}")


def _known_datasets(ctx: ToolContext) -> str:
    """The few newest dataset ids of the workspace and the built-in corpora, for error messages."""
    ids = [summary.dataset_id for summary in list_datasets(ctx, ListDatasetsRequest(limit=5)).datasets]
    known = f"recent dataset ids, newest first: {', '.join(ids)}" if ids else "no datasets in the workspace yet"
    return f"{known}; built-in corpora, tokenized on first use: {_BUILTINS}"


class TrainTokenizerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str = Field(description=_INPUT_HELP)
    vocab_size: int = Field(
        default=32_000, ge=258, le=1_000_000, description="Vocabulary size, including the EOS and BOS tokens."
    )
    format: Format = Field(default="auto", description="Input format, as in tokenize_dataset.")
    text_field: str = Field(default="text", description="JSONL/Parquet field with the text; dotted for nested fields.")
    max_documents: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000_000,
        description="Train on at most this many documents (the first ones); default: all.",
    )
    min_frequency: int = Field(
        default=2,
        ge=1,
        le=1_000_000,
        description="Fewest occurrences for a pair of tokens to be merged.",
    )


class TrainedTokenizer(BaseModel):
    tokenizer: str = Field(description="Path of the tokenizer.json; pass it as 'tokenizer' to tokenize_dataset.")
    reused: bool = Field(description="True when the same request had trained it before.")
    vocab_size: int = Field(description="Vocabulary reached; below the request when the text has too few pairs.")
    eos_id: int
    bos_id: int | None
    fingerprint: str
    bad_records: BadRecordReport


def train_tokenizer(
    ctx: ToolContext, request: TrainTokenizerRequest, progress: Progress = no_progress
) -> TrainedTokenizer:
    """Train a byte-level BPE tokenizer on text files; returns its path. Use it when the byte tokenizer
    makes sequences too long, then pass the path to tokenize_dataset.

    EOS is '<|endoftext|>' (id 0) and BOS
    '<|begin_of_text|>' (id 1). The same request reuses the tokenizer it trained before. Takes about a
    second per megabyte of text.
    """
    sources = _input_sources(ctx, request.input)
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
        bad_records=BadRecordReport.of(bad),
    )


class InspectDatasetRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset_id: str = Field(description=DATASET_HELP)
    split: Literal["train", "val"] = Field(default="train", description="The split to histogram and sample.")
    samples: int = Field(default=3, ge=0, le=20, description="Documents to decode and show, evenly spaced.")
    sample_chars: int = Field(
        default=400,
        ge=1,
        le=10_000,
        description="Characters shown of each sample; all samples share what is left of 32,000.",
    )


class LengthHistogram(BaseModel):
    edges: list[int] = Field(description="Bin edges in tokens: bin i holds lengths in [edges[i], edges[i+1]).")
    counts: list[int] = Field(description="Documents per bin.")
    min: int
    median: float
    mean: float
    max: int


_SAMPLE_FIELDS_CHARS = 100  # a SampleDocument's JSON less its text's: keys, numbers, quotes, a comma


class SampleDocument(BaseModel):
    index: int = Field(description="The document's index in the split.")
    tokens: int
    text: str = Field(description="Decoded text, cut to sample_chars or to its share of the result.")
    truncated: bool = Field(description="True when the document goes on past `text`.")


class DatasetReport(BaseModel):
    dataset_id: str
    path: str
    tokenizer: str
    vocab_size: int
    dtype: str
    prepend_bos: bool
    append_eos: bool
    documents: dict[str, int] = Field(description="Documents per split.")
    tokens: dict[str, int] = Field(description="Tokens per split, BOS/EOS included.")
    bytes: dict[str, int] = Field(description="UTF-8 bytes of text per split, before tokenization.")
    shards: int
    sources: list[str] = Field(description=f"The first {MAX_FILES_SHOWN} input files, with their sizes in bytes.")
    sources_total: int = Field(description="Input files in all.")
    histogram: LengthHistogram = Field(description="Document lengths in tokens, in power-of-two bins, of the split.")
    samples: list[SampleDocument]
    note: str | None = Field(default=None, description="Why samples are missing, when they are.")
    bad_records: BadRecordReport


def inspect_dataset(ctx: ToolContext, request: InspectDatasetRequest) -> DatasetReport:
    """Describe a token cache: counts, length histogram, decoded samples, skipped records. Use it to check a
    dataset before training on it.

    Fast: reads only the offsets and the sampled documents
    (a built-in corpus is tokenized first, once).
    """
    path = resolve_dataset(ctx, request.dataset_id, argument="dataset_id")
    cache = open_token_cache(path)
    manifest = cache.manifest
    offsets = cache.offsets(request.split)
    lengths = np.diff(offsets)
    top = max(int(lengths.max()) if len(lengths) else 1, 1)
    edges = [0] + [2**k for k in range(top.bit_length() + 1)]
    counts, _ = np.histogram(lengths, bins=edges)
    texts, note = [], None
    if request.samples:
        try:
            tokenizer = load_tokenizer(manifest.tokenizer.name)
        except TradewindError as error:
            tokenizer, note = None, cut(f"samples not decoded: {error}")
        if tokenizer is not None and tokenizer.fingerprint != manifest.tokenizer.fingerprint:
            tokenizer, note = None, f"samples not decoded: {manifest.tokenizer.name} changed since the cache was built"
        if tokenizer is not None:
            tokens = cache.tokens(request.split)
            picks = np.unique(np.linspace(0, len(lengths) - 1, num=min(request.samples, len(lengths))).astype(int))
            for index in picks.tolist():
                ids = np.asarray(tokens[int(offsets[index]) : int(offsets[index + 1])])
                texts.append((index, len(ids), tokenizer.decode(ids.tolist())))
    report = DatasetReport(
        dataset_id=request.dataset_id,
        path=str(path),
        tokenizer=manifest.tokenizer.name,
        vocab_size=manifest.tokenizer.vocab_size,
        dtype=manifest.dtype,
        prepend_bos=manifest.prepend_bos,
        append_eos=manifest.append_eos,
        documents={split: stats.documents for split, stats in manifest.splits.items()},
        tokens={split: stats.tokens for split, stats in manifest.splits.items()},
        bytes={split: stats.bytes for split, stats in manifest.splits.items()},
        shards=len(manifest.splits[request.split].shards),
        sources=[cut_path(f"{source.path} ({source.size} bytes)") for source in manifest.sources[:MAX_FILES_SHOWN]],
        sources_total=len(manifest.sources),
        histogram=LengthHistogram(
            edges=edges,
            counts=counts.tolist(),
            min=int(lengths.min()),
            median=float(np.median(lengths)),
            mean=float(lengths.mean()),
            max=int(lengths.max()),
        ),
        samples=[],
        note=note,
        bad_records=BadRecordReport.of(manifest.bad_records),
    )
    # The samples share what the rest leaves of the result's budget (and a sample's other fields need room).
    share = (RESULT_CHARS - len(report.model_dump_json())) // max(len(texts), 1) - _SAMPLE_FIELDS_CHARS
    for index, tokens_in_it, text in texts:
        shown = cut(text[: request.sample_chars], share)
        report.samples.append(SampleDocument(index=index, tokens=tokens_in_it, text=shown, truncated=shown != text))
    return report


class ListDatasetsRequest(PageRequest):
    """list_datasets's page of the listing."""


class DatasetSummary(BaseModel):
    dataset_id: str
    created: str
    tokenizer: str
    vocab_size: int
    documents: int = Field(description="Documents in all splits.")
    tokens: int = Field(description="Tokens in all splits.")
    sources: list[str] = Field(description="The first few input files.")


class DatasetList(BaseModel):
    datasets: list[DatasetSummary] = Field(description="Newest first.")
    total: int = Field(description="Complete datasets in the workspace.")
    next_cursor: str | None = Field(
        description="Pass as cursor to list the datasets after this page; null when there are none."
    )


def list_datasets(ctx: ToolContext, request: ListDatasetsRequest) -> DatasetList:
    """List the workspace's token caches, newest first, a page at a time. Use it to find a dataset id to
    train on or inspect.

    Unfinished builds are not listed. Pass next_cursor
    on for older datasets.
    """
    found = []
    root = ctx.workspace.datasets_dir
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if folder.name.startswith(".") or not (folder / _MANIFEST).is_file():
            continue
        try:
            ctx.workspace.dataset_dir(folder.name)  # a valid id, and no symlink out of the workspace
            manifest = open_token_cache(folder).manifest
        except TradewindError:
            continue  # a cache of another format, or a stray folder: not something to train on
        found.append(
            DatasetSummary(
                dataset_id=folder.name,
                created=manifest.created,
                tokenizer=cut_path(manifest.tokenizer.name),
                vocab_size=manifest.tokenizer.vocab_size,
                documents=sum(s.documents for s in manifest.splits.values()),
                tokens=sum(s.tokens for s in manifest.splits.values()),
                sources=[cut_path(source.path) for source in manifest.sources[:3]],
            )
        )
    found.sort(key=lambda summary: (summary.created, summary.dataset_id), reverse=True)
    start = 0
    if request.cursor is not None:
        ids = [summary.dataset_id for summary in found]
        if request.cursor not in ids:
            raise NotFoundError(
                f"argument 'cursor': no dataset {cut(request.cursor, 200)!r} to continue after (was it deleted?); "
                "list again without a cursor"
            )
        start = ids.index(request.cursor) + 1
    left = found[start:]
    page = fitting(left[: request.limit], PAGE_CHARS)
    return DatasetList(
        datasets=page, total=len(found), next_cursor=page[-1].dataset_id if len(page) < len(left) else None
    )
