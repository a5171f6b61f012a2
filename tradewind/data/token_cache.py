"""A finished token cache on disk: its layout, its manifest, and `TokenCache`, which reads and checks it.

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

`manifest.json` is a `CacheManifest`; `open_token_cache` reads only caches of this `FORMAT_VERSION`.
`build_token_cache` (`cache.py`) writes them.

Example:
    cache = open_token_cache("datasets/corpus")
    train = cache.tokens("train")          # read-only, memory-mapped, 1-D
    cache.verify()                         # every shard against its checksum and counts
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pydantic

from tradewind.core import InvalidInputError, NotFoundError, parse_config, read_json
from tradewind.core.files import Opener, open_plain
from tradewind.data.bad_records import BadRecords
from tradewind.data.shards import ShardStats
from tradewind.data.stream import ShardedTokens
from tradewind.data.tokenize_config import VAL_TOKENS, SourceFile

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
_HASH_CHUNK = 8 * 2**20


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
    val_tokens: int = VAL_TOKENS  # the fixed val token set's size (TokenizeConfig.val_tokens)


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every id of a vocabulary of `vocab_size`."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


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


def open_token_cache(path: str | Path, opener: Opener = open_plain) -> TokenCache:
    """Open the complete token cache at `path`, reading its manifest with `opener` (a workspace's confined reader,
    for a cache a tool names).

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
    try:
        raw = read_json(manifest_path, opener)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidInputError(f"{manifest_path}: not valid JSON ({error})") from None
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
