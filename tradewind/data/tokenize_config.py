"""What a token cache is made from: the input files, the tokenizer, and the `TokenizeConfig`.

A cache is a function of three things: the input files (`source_files`: path, size and modification time
of each), the tokenizer (its fingerprint) and the `TokenizeConfig`. `cache.cache_id` hashes exactly these,
so the `tokenize_dataset` tool names a dataset by the same id that `build_token_cache` keys an interrupted
build by, and an unchanged request finds the finished cache instead of building it again.

`TokenizeConfig` is declared once, here: the tool's request inherits it (so every field is a tool
argument with its description), `tradewind tokenize` generates its options from that request, and
`build_token_cache` takes it. A new option added here appears in all three, and in the cache id.

Example:
    config = TokenizeConfig(format="jsonl", text_field="meta.body", val_fraction=0.05)
    dataset_id = cache_id(source_files(["data/*.jsonl.zst"]), load_tokenizer("byte"), config)
    build_token_cache(["data/*.jsonl.zst"], f"datasets/{dataset_id}", load_tokenizer("byte"), config)
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import fsspec
from pydantic import BaseModel, ConfigDict, Field

from tradewind.core import InvalidInputError
from tradewind.core.buckets import object_version
from tradewind.data.readers import Format, list_input_files

VAL_TOKENS = 32_768  # the fixed val token set's default size: the demo model scores it in about a second


class TokenizeConfig(BaseModel):
    """How documents are read and tokenized into a cache: everything besides the files and the tokenizer that
    changes what the cache holds (and so its id)."""

    model_config = ConfigDict(extra="forbid")

    format: Format = Field(
        default="auto",
        description="auto: by extension; chat (JSONL messages) and prompt_completion train on replies only.",
    )
    text_field: str = Field(default="text", description="JSONL/Parquet text field; dotted if nested.")
    val_fraction: float = Field(default=0.1, gt=0, lt=1, description="Share of documents held out.")
    strict: bool = Field(default=False, description="Fail on a bad record instead of skipping it.")
    prepend_bos: bool = Field(default=False, description="Start each document with BOS.")
    append_eos: bool = Field(default=True, description="End each document with EOS.")
    val_tokens: int = Field(
        default=VAL_TOKENS,
        gt=0,
        le=2**30,
        description="Fixed val tokens scored for val_bpb.",
    )


class SourceFile(BaseModel):
    """An input file as it was when the cache was built; an object in a bucket also has the version the bucket
    gives it (GCS generation, S3 ETag), which changes whenever the object does."""

    path: str
    size: int
    mtime: float
    version: str | None = None


def source_files(inputs: Sequence[str | Path | SourceFile], not_read: list[str] | None = None) -> list[SourceFile]:
    """Every file the inputs stand for (see `list_input_files`, which appends the files it leaves out, and why,
    to `not_read`), with its size and modification time.

    A `SourceFile` in `inputs` is taken as it is: a caller that has listed the inputs already (to compute the
    cache id) passes that listing on, so the cache is built from exactly the files its id was computed from.

    Raises:
        InvalidInputError: no inputs.
        NotFoundError: an input matches nothing.
    """
    if not inputs:
        raise InvalidInputError("no inputs given; pass at least one file, folder or glob")
    sources = []
    for item in inputs:
        if isinstance(item, SourceFile):
            sources.append(item)
            continue
        for url in list_input_files(item, not_read):
            fs, path = fsspec.core.url_to_fs(url)
            info = fs.info(path)
            mtime = info.get("mtime") or info.get("updated") or info.get("LastModified") or 0.0
            if not isinstance(mtime, int | float):
                mtime = datetime.fromisoformat(str(mtime)).timestamp() if isinstance(mtime, str) else mtime.timestamp()
            size = int(info.get("size") or 0)
            sources.append(SourceFile(path=url, size=size, mtime=float(mtime), version=object_version(info)))
    return sources
