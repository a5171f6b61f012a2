"""A finished token cache on disk: its layout, its manifest, and `TokenCache`, which reads and checks it.

Layout of a cache folder::

    <dir>/manifest.json                     written last: its presence marks the cache complete
    <dir>/<split>/shard-NNNNN.bin           flat token ids of one shard's documents in the split,
                                            uint16 if vocab_size <= 65536 else uint32
    <dir>/<split>/shard-NNNNN.offsets.npy   int64, documents + 1 entries: where each document starts
    <dir>/<split>/shard-NNNNN.mask.bin      with a loss mask only: uint8, one per token, 1 = a loss target
    <dir>/shards/shard-NNNNN.json           each shard's completion record (counts, checksums, bad records)
    <dir>/tokenizer/                        a Hugging Face tokenizer's files (not the byte tokenizer's, which
                                            is built in): what `TokenCache.tokenizer` loads on any host

Splits are `train` and `val`. A split's token stream is its shards' files in shard order; with
`append_eos` every document is followed by EOS (and with `prepend_bos` preceded by BOS). A document goes
to `val` iff `blake2b(text, digest_size=8)` read as a fraction of 2**64 is below `val_fraction`, so the
split depends only on the document's text (an example's: its record's content).

A cache of the `chat` or `prompt_completion` format has a loss mask (`CacheManifest.loss_mask`): a file beside
each token file, aligned token for token, that marks the tokens a model learns to predict (the replies, the
completions); `TokenCache.loss_mask(split)` reads it as one stream. A cache without one (every other format,
and every cache built before masks) trains on every token.

`manifest.json` is a `CacheManifest`; `open_token_cache` reads only caches of this `FORMAT_VERSION` (a loss
mask is an addition the manifest declares, so caches without one kept the version).
`build_token_cache` (`cache.py`) writes them.

Example:
    cache = open_token_cache("datasets/corpus")
    train = cache.tokens("train")          # read-only, memory-mapped, 1-D
    mask = cache.loss_mask("train")        # aligned with train, or None
    cache.verify()                         # every shard against its checksum and counts
    tokenizer = cache.tokenizer()          # the one it was built with, from the cache itself
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pydantic

from tradewind.core import ConfigError, InvalidInputError, NotFoundError, parse_config, read_json
from tradewind.core.files import Opener, open_plain
from tradewind.data.bad_records import BadRecords
from tradewind.data.shards import ShardStats
from tradewind.data.stream import ShardedTokens
from tradewind.data.tokenize_config import VAL_TOKENS, SourceFile
from tradewind.data.tokenizers import TOKENIZER_FILE, Tokenizer, load_tokenizer

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"
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
        targets: loss-target tokens in the split, in a cache with a loss mask; else None.
    """

    documents: int
    tokens: int
    bytes: int
    shards: list[ShardStats]
    targets: int | None = None


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
    loss_mask: bool = False  # each shard has a `.mask.bin` (formats chat and prompt_completion)


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

    def tokenizer_source(self) -> str:
        """What `tokenizer` loads: the cache's own copy (a folder), else the manifest's tokenizer name."""
        copy = self.path / TOKENIZER_DIR
        return str(copy) if (copy / TOKENIZER_FILE).is_file() else self.manifest.tokenizer.name

    def tokenizer(self) -> Tokenizer:
        """The tokenizer the cache was built with: the copy in its `tokenizer/` folder, else (the byte tokenizer,
        a cache built before copies) the one its manifest names.

        Raises:
            NotFoundError: no copy, and nothing where the manifest's tokenizer was (another host, a hub offline).
            ConfigError: the tokenizer found is not the one the cache was built with (another fingerprint).
        """
        info = self.manifest.tokenizer
        tokenizer = load_tokenizer(self.tokenizer_source())
        if tokenizer.fingerprint != info.fingerprint:
            raise ConfigError(
                f"tokenizer {tokenizer.name}: not the one {self.path} was built with (fingerprint "
                f"{tokenizer.fingerprint[:12]}, the cache's {info.fingerprint[:12]}): it changed since"
            )
        return tokenizer

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

    def mask_files(self, split: str) -> list[Path]:
        """The loss-mask file of each shard of `split`, in stream order (present only if `manifest.loss_mask`).

        Raises:
            NotFoundError: the cache has no such split.
        """
        folder = self._split_dir(split)
        return [folder / f"{shard.name}.mask.bin" for shard in self.manifest.splits[split].shards]

    def tokens(self, split: str) -> np.memmap | ShardedTokens:
        """The split's token stream: read-only and memory-mapped, 1-D, sliceable like an array.

        A single non-empty shard comes back as its `np.memmap`; several as a `ShardedTokens` view over
        their memmaps, whose slices are copied out as arrays.

        Raises:
            NotFoundError: the cache has no such split.
        """
        return self._stream([path for path, _ in self.shard_files(split)], split, self.dtype)

    def loss_mask(self, split: str) -> np.memmap | ShardedTokens | None:
        """The split's loss mask, aligned with `tokens(split)` and read the same way (memory-mapped, 1-D): uint8,
        1 where the token is a loss target (a reply's or a completion's), 0 elsewhere; None for a cache without
        a loss mask (every token is a target).

        Raises:
            NotFoundError: the cache has no such split.
        """
        if not self.manifest.loss_mask:
            return None
        return self._stream(self.mask_files(split), split, np.dtype(np.uint8))

    def _stream(self, paths: list[Path], split: str, dtype: np.dtype) -> np.memmap | ShardedTokens:
        shards = self.manifest.splits[split].shards
        parts = [
            np.memmap(path, dtype=dtype, mode="r") for path, shard in zip(paths, shards, strict=True) if shard.tokens
        ]
        return parts[0] if len(parts) == 1 else ShardedTokens(parts, dtype)

    def document_starts(self, split: str) -> np.ndarray:
        """int64: where each document (or example) of the split starts in its token stream, then the stream's
        length (so document i is `tokens[starts[i]:starts[i + 1]]`), from the shards' offsets files.

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
            if self.manifest.loss_mask:
                for mask_path, shard in zip(self.mask_files(split), stats.shards, strict=True):
                    _verify_mask(mask_path, shard)

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
    if not (manifest_path.exists() or manifest_path.is_symlink()):  # what is there, `opener` judges
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


def _verify_mask(path: Path, shard: ShardStats) -> None:
    """Check a shard's loss-mask file: one byte per token, its checksum, its targets (0s and 1s only)."""
    if not path.is_file():
        raise InvalidInputError(f"{path}: missing; the manifest says the cache has a loss mask")
    if path.stat().st_size != shard.tokens:
        raise InvalidInputError(f"{path}: {path.stat().st_size} bytes, the manifest says {shard.tokens} (one a token)")
    digest = _sha256_file(path)
    if digest != shard.mask_sha256:
        raise InvalidInputError(f"{path}: sha256 is {digest}, the manifest says {shard.mask_sha256}")
    mask = np.memmap(path, dtype=np.uint8, mode="r") if shard.tokens else np.zeros(0, np.uint8)
    if np.any(mask > 1) or int(mask.sum(dtype=np.int64)) != shard.targets:
        raise InvalidInputError(f"{path}: the mask must hold 0s and 1s, {shard.targets} of them 1s")


def _sha256_file(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()
