"""Tools that describe the token caches there are, and `resolve_dataset`, the one way a dataset is named.

A dataset is a token cache: a folder with a `manifest.json`, built by `tokenize_dataset` (see
`tradewind.tools.tokenizing`). Wherever a tool takes a dataset, `resolve_dataset` turns the value (an id, a
path or `builtin:NAME`) into that folder; `inspect_dataset` and `list_datasets` read the caches it finds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tradewind.core import InvalidInputError, NotFoundError, TradewindError, check_id, names_a_path
from tradewind.core.buckets import is_remote
from tradewind.data import open_token_cache
from tradewind.tools.bounds import PAGE_CHARS, RESULT_CHARS, PageRequest, cut, cut_path, fitting
from tradewind.tools.buckets import dataset_copies, fetch_dataset
from tradewind.tools.context import Progress, ToolContext, no_progress
from tradewind.tools.spec import tool
from tradewind.tools.tokenizing import (
    BUILTIN_PREFIX,
    BUILTINS,
    MANIFEST,
    MAX_FILES_SHOWN,
    BadRecordReport,
    TokenizeDatasetRequest,
    builtin_corpus_file,
    loss_targets,
    tokenize_dataset,
)

DATASET_HELP = f"Dataset id, cache folder or {BUILTINS}."


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
    - a bucket URL (`gs://`, `s3://`) under an allowed prefix: a cache copied there (by `tokenize_dataset` with
      `storage`, or a run's launch), downloaded into `datasets/<id>` unless the workspace has it.
    - otherwise a dataset id, as `tokenize_dataset` returns: the folder `datasets/<id>` of the workspace.

    Args:
        ctx: the tool context whose workspace the value is resolved in.
        value: the dataset as the user wrote it.
        progress: `progress(done, total, message)` while a built-in corpus is tokenized.
        argument: the argument's name, for error messages.

    Returns:
        The absolute folder of a finished token cache (one with a `manifest.json`).

    Raises:
        NotFoundError: an unknown id, built-in corpus or path (the message lists the datasets there are), or
            a URL that holds no complete copy.
        InvalidInputError: the value is not a valid id, or names a file or a folder that is not a token cache.
        PathEscapeError: the path lands outside the workspace and the allowed roots (or the URL under no
            allowed bucket prefix).
    """
    if value.startswith(BUILTIN_PREFIX):
        builtin_corpus_file(value, argument)  # fail on an unknown name before tokenize_dataset calls it 'input'
        return Path(tokenize_dataset(ctx, TokenizeDatasetRequest(input=value), progress).path)
    if is_remote(value):
        return fetch_dataset(ctx, value, argument, progress)
    is_path = names_a_path(value)
    path = value if is_path else ctx.workspace.datasets_dir / check_id(value, argument)
    folder = ctx.workspace.resolve_path(path, argument=argument, must_exist=False)
    if (folder / MANIFEST).exists() or (folder / MANIFEST).is_symlink():  # check_tree judges what is there
        # The trainer and the samples read the whole cache: nothing in it may lead outside.
        return ctx.workspace.check_tree(folder, argument=argument)
    raise _not_a_cache(ctx, value, folder, argument, is_path)


def _not_a_cache(ctx: ToolContext, value: str, folder: Path, argument: str, is_path: bool) -> TradewindError:
    """The error for a dataset value that names no finished token cache, saying which datasets there are."""
    if folder.is_dir():
        error, why = InvalidInputError, f"{value!r} ({folder}) is not a token cache: it has no {MANIFEST}"
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
    return f"{known}; built-in corpora, tokenized on first use: {BUILTINS}"


class InspectDatasetRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset_id: str = Field(description=DATASET_HELP)
    split: Literal["train", "val"] = "train"
    samples: int = Field(default=3, ge=0, le=20, description="Documents to decode, evenly spaced.")
    sample_chars: int = Field(default=400, ge=1, le=10_000)


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
    format: str
    prepend_bos: bool
    append_eos: bool
    documents: dict[str, int] = Field(description="Documents per split.")
    tokens: dict[str, int] = Field(description="Tokens per split, BOS/EOS included.")
    targets: dict[str, int] | None = Field(default=None, description="Loss-target tokens per split; null: all.")
    bytes: dict[str, int] = Field(description="UTF-8 bytes of text per split, before tokenization.")
    shards: int
    sources: list[str] = Field(description=f"The first {MAX_FILES_SHOWN} input files, with their sizes in bytes.")
    sources_total: int = Field(description="Input files in all.")
    histogram: LengthHistogram = Field(description="Document lengths in tokens, in power-of-two bins, of the split.")
    samples: list[SampleDocument]
    note: str | None = Field(default=None, description="Why samples are missing, when they are.")
    bad_records: BadRecordReport


@tool("Inspect a dataset", read_only=True, idempotent=True, links=("manifest",))
def inspect_dataset(ctx: ToolContext, request: InspectDatasetRequest) -> DatasetReport:
    """A token cache's counts, length histogram, samples and bad records. Use it before training.

    Fast: reads only the offsets and the sampled documents
    (a built-in corpus is tokenized first, once).
    """
    path = resolve_dataset(ctx, request.dataset_id, argument="dataset_id")
    cache = open_token_cache(path, ctx.workspace.reader("dataset_id"))
    manifest = cache.manifest
    offsets = cache.document_starts(request.split)
    lengths = np.diff(offsets)
    top = max(int(lengths.max()) if len(lengths) else 1, 1)
    edges = [0] + [2**k for k in range(top.bit_length() + 1)]
    counts, _ = np.histogram(lengths, bins=edges)
    texts, note = [], None
    if request.samples:
        try:
            if Path(cache.tokenizer_source()).is_dir():  # read whole by the tokenizers library, not confined
                ctx.workspace.check_tree(cache.tokenizer_source(), argument="dataset_id")
            tokenizer = cache.tokenizer()
        except TradewindError as error:  # not the one it was built with, or gone (another host, a hub offline)
            tokenizer, note = None, cut(f"samples not decoded: {error}")
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
        format=manifest.format,
        prepend_bos=manifest.prepend_bos,
        append_eos=manifest.append_eos,
        documents={split: stats.documents for split, stats in manifest.splits.items()},
        tokens={split: stats.tokens for split, stats in manifest.splits.items()},
        targets=loss_targets(manifest),
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
    copies: list[str] = Field(default_factory=list, description="Complete bucket copies.")


class DatasetList(BaseModel):
    datasets: list[DatasetSummary] = Field(description="Newest first.")
    total: int = Field(description="Complete datasets in the workspace.")
    next_cursor: str | None = Field(
        description="Pass as cursor to list the datasets after this page; null when there are none."
    )


@tool("List datasets", read_only=True, idempotent=True)
def list_datasets(ctx: ToolContext, request: ListDatasetsRequest) -> DatasetList:
    """Token caches, newest first. Use it to find a dataset id.

    A page at a time. Unfinished builds are not listed. Pass next_cursor
    on for older datasets.
    """
    found = []
    root = ctx.workspace.datasets_dir
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if folder.name.startswith(".") or not (folder / MANIFEST).is_file():
            continue
        try:
            ctx.workspace.dataset_dir(folder.name)  # a valid id, and no symlink out of the workspace
            manifest = open_token_cache(folder, ctx.workspace.reader("dataset_id")).manifest
            copies = dataset_copies(ctx, folder, "dataset_id")
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
                copies=copies,
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
