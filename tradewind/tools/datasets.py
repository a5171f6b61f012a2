"""Tools that turn text into token caches."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tradewind.core import NotFoundError
from tradewind.data import BUILTIN_CORPORA, build_token_cache, builtin_corpus_path, load_tokenizer, open_token_cache
from tradewind.tools.context import Progress, ToolContext, no_progress

BUILTIN_PREFIX = "builtin:"
# Bump when the cache layout changes, so that old caches are not reused for new code.
CACHE_FORMAT = 1


class TokenizeDatasetRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str = Field(
        description="A text or JSONL file, or a folder of them, inside the workspace or an allowed root; "
        f"or a built-in corpus: {', '.join(BUILTIN_PREFIX + name for name in BUILTIN_CORPORA)}."
    )
    tokenizer: str = Field(
        default="byte", description="'byte' for the built-in byte-level tokenizer, or a path to a tokenizer.json."
    )
    format: Literal["auto", "text", "jsonl"] = Field(
        default="auto", description="Input format; 'auto' picks JSONL for .jsonl/.ndjson files, else plain text."
    )
    text_field: str = Field(default="text", description="JSONL field with the text; dotted for nested fields.")
    val_fraction: float = Field(
        default=0.1, gt=0, lt=1, description="Share of documents held out for validation (chosen by content hash)."
    )


class DatasetInfo(BaseModel):
    dataset_id: str = Field(description="Pass this to launch_training.")
    path: str
    reused: bool = Field(description="True when an identical cache existed and nothing was rebuilt.")
    tokenizer: str
    vocab_size: int
    dtype: str
    documents: dict[str, int] = Field(description="Documents per split.")
    tokens: dict[str, int] = Field(description="Tokens per split, EOS separators included.")


def _resolve_input(ctx: ToolContext, value: str) -> Path:
    if value.startswith(BUILTIN_PREFIX):
        return builtin_corpus_path(value.removeprefix(BUILTIN_PREFIX))
    return ctx.workspace.resolve_path(value, argument="input")


def _input_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    if not files:
        raise NotFoundError(f"argument 'input': folder {path} holds no files")
    return files


def _dataset_id(files: list[Path], tokenizer_fingerprint: str, request: TokenizeDatasetRequest) -> str:
    """An id that changes whenever the inputs, the tokenizer or the options do."""
    key = {
        "cache_format": CACHE_FORMAT,
        "files": [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files],
        "tokenizer": tokenizer_fingerprint,
        "options": request.model_dump(exclude={"input", "tokenizer"}),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return f"ds-{digest[:16]}"


def tokenize_dataset(
    ctx: ToolContext, request: TokenizeDatasetRequest, progress: Progress = no_progress
) -> DatasetInfo:
    """Tokenize text or JSONL files into a token cache for training; returns the dataset id.

    Reuses an identical cache instantly when the inputs, tokenizer and options are unchanged. Takes
    seconds per megabyte of text and reports progress in bytes read.
    """
    source = _resolve_input(ctx, request.input)
    tokenizer_spec = request.tokenizer
    if tokenizer_spec != "byte":
        tokenizer_spec = str(ctx.workspace.resolve_path(tokenizer_spec, argument="tokenizer"))
    tokenizer = load_tokenizer(tokenizer_spec)
    dataset_id = _dataset_id(_input_files(source), tokenizer.fingerprint, request)
    out_dir = ctx.workspace.dataset_dir(dataset_id, must_exist=False)

    reused = (out_dir / "manifest.json").exists()
    if reused:
        manifest = open_token_cache(out_dir).manifest
    else:
        manifest = build_token_cache(
            [source],
            out_dir,
            tokenizer,
            format=request.format,
            text_field=request.text_field,
            val_fraction=request.val_fraction,
            progress=lambda done, total: progress(done, total, "bytes tokenized"),
        )
    return DatasetInfo(
        dataset_id=dataset_id,
        path=str(out_dir),
        reused=reused,
        tokenizer=manifest.tokenizer.name,
        vocab_size=manifest.tokenizer.vocab_size,
        dtype=manifest.dtype,
        documents={split: stats.documents for split, stats in manifest.splits.items()},
        tokens={split: stats.tokens for split, stats in manifest.splits.items()},
    )
