"""Token caches: a corpus tokenized once into flat arrays that training memory-maps.

Layout of a cache folder::

    <dir>/manifest.json        written last: its presence marks the cache complete
    <dir>/train/tokens.bin     flat token ids, uint16 if vocab_size <= 65536 else uint32;
                               every document is followed by EOS
    <dir>/train/offsets.npy    int64, documents + 1 entries: where each document starts in tokens.bin
    <dir>/val/tokens.bin
    <dir>/val/offsets.npy

A document goes to `val` iff `blake2b(text, digest_size=8)` read as a fraction of 2**64 is below
`val_fraction`, so the split depends only on the document's text: rebuilding, or adding files, never
moves a document from one split to the other.

Example:
    manifest = build_token_cache(["corpus/"], "datasets/corpus", ByteTokenizer(), val_fraction=0.05)
    cache = open_token_cache("datasets/corpus")
    train = cache.tokens("train")          # read-only memmap
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import numpy as np
import pydantic

from tradewind.core import InvalidInputError, NotFoundError, atomic_write_json, get_logger, parse_config, read_json
from tradewind.data.readers import Document, Format, list_input_files, read_file_documents
from tradewind.data.tokenizers import Tokenizer

log = get_logger(__name__)

FORMAT_VERSION = 1
SPLITS = ("train", "val")
MANIFEST = "manifest.json"
# A tokenizer batch is flushed at whichever limit comes first, which bounds memory for huge documents.
_BATCH_DOCUMENTS = 1_000
_BATCH_CHARS = 16 * 2**20
_HASH_CHUNK = 8 * 2**20


class TokenizerInfo(pydantic.BaseModel):
    """The tokenizer a cache was built with."""

    name: str
    fingerprint: str
    vocab_size: int
    bos_id: int | None
    eos_id: int


class SplitStats(pydantic.BaseModel):
    """Counts and checksum of one split.

    Attributes:
        documents: documents in the split.
        tokens: token ids in `tokens.bin`, EOS included.
        bytes: UTF-8 bytes of the split's document text before tokenization (for bits-per-byte).
        sha256: sha256 hex of `tokens.bin`.
    """

    documents: int
    tokens: int
    bytes: int
    sha256: str


class SourceFile(pydantic.BaseModel):
    """An input file as it was when the cache was built."""

    path: str
    size: int
    mtime: float


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


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every id of a vocabulary of `vocab_size`."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def is_validation(text: str, val_fraction: float) -> bool:
    """Whether a document belongs to the validation split; depends only on its text."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < val_fraction


def build_token_cache(
    inputs: list[str | Path],
    out_dir: str | Path,
    tokenizer: Tokenizer,
    *,
    format: Format = "auto",
    text_field: str = "text",
    val_fraction: float = 0.1,
    progress: Callable[[int, int], None] | None = None,
) -> CacheManifest:
    """Tokenize the documents of `inputs` into a new token cache at `out_dir`.

    The cache is built in a hidden sibling folder and renamed into place only once complete, so
    `out_dir` either does not exist or holds a whole cache. Memory stays bounded: documents are
    tokenized in batches and written as they go.

    Args:
        inputs: files or folders, read as by `read_documents`.
        out_dir: the cache folder to create; it must not exist.
        tokenizer: the tokenizer; its EOS id follows every document.
        format: `"auto"`, `"text"` or `"jsonl"`, as in `read_documents`.
        text_field: the JSONL field holding the text (may be dotted).
        val_fraction: the share of documents, chosen by a hash of their text, that go to `val`.
        progress: called as `progress(done, total)` with input bytes read and the inputs' total size,
            after every batch.

    Returns:
        The manifest, as written to `out_dir/manifest.json`.

    Raises:
        InvalidInputError: `out_dir` exists, `val_fraction` is not in (0, 1), an input record is bad,
            or a split would be empty.
        NotFoundError: an input does not exist.
    """
    if not 0 < val_fraction < 1:
        raise InvalidInputError(f"val_fraction must be between 0 and 1, exclusive (got {val_fraction})")
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise InvalidInputError(f"{out_dir} already exists; choose a new folder or delete the old cache first")
    if not inputs:
        raise InvalidInputError("no inputs given; pass at least one file or folder")
    files = [url for item in inputs for url in list_input_files(item)]
    sources = [_source_file(url) for url in files]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = out_dir.parent / f".{out_dir.name}.partial-{secrets.token_hex(4)}"
    partial.mkdir()
    try:
        dtype = token_dtype(tokenizer.vocab_size)
        writers = {split: _SplitWriter(partial / split, dtype) for split in SPLITS}
        _tokenize_into(files, sources, writers, tokenizer, format, text_field, val_fraction, progress)
        splits = {split: writer.close() for split, writer in writers.items()}
        _check_splits(splits, val_fraction)
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
            val_fraction=val_fraction,
            text_field=text_field,
            format=format,
            sources=sources,
            splits=splits,
        )
        atomic_write_json(partial / MANIFEST, manifest.model_dump(mode="json"))
        if out_dir.exists():
            raise InvalidInputError(f"{out_dir} appeared while the cache was being built; it was left untouched")
        os.rename(partial, out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log.info("built token cache %s: %s", out_dir, {s: (v.documents, v.tokens) for s, v in splits.items()})
    return manifest


def _tokenize_into(
    files: list[str],
    sources: list[SourceFile],
    writers: dict[str, _SplitWriter],
    tokenizer: Tokenizer,
    format: Format,
    text_field: str,
    val_fraction: float,
    progress: Callable[[int, int], None] | None,
) -> None:
    total = sum(source.size for source in sources)
    done_before = 0
    batch: list[Document] = []
    chars = 0

    def flush() -> None:
        nonlocal chars
        ids = tokenizer.encode_batch([doc.text for doc in batch])
        for split in SPLITS:
            chosen = [i for i, doc in enumerate(batch) if is_validation(doc.text, val_fraction) == (split == "val")]
            writers[split].write(
                [ids[i] for i in chosen], [len(batch[i].text.encode("utf-8")) for i in chosen], tokenizer
            )
        batch.clear()
        chars = 0

    for url, source in zip(files, sources, strict=True):
        position = 0
        for document, position in read_file_documents(url, format=format, text_field=text_field):
            batch.append(document)
            chars += len(document.text)
            if len(batch) >= _BATCH_DOCUMENTS or chars >= _BATCH_CHARS:
                flush()
                if progress:
                    progress(min(done_before + position, total), total)
        done_before += source.size
    if batch:
        flush()
    if progress:
        progress(total, total)


def _check_splits(splits: dict[str, SplitStats], val_fraction: float) -> None:
    documents = sum(stats.documents for stats in splits.values())
    for split, stats in splits.items():
        if stats.documents == 0:
            other = "raise" if split == "val" else "lower"
            raise InvalidInputError(
                f"the inputs hold {documents} document(s) and none went to the {split!r} split "
                f"(val_fraction={val_fraction}); add more documents (plain-text documents are separated by "
                f"blank lines) or {other} val_fraction"
            )


def _source_file(url: str) -> SourceFile:
    fs, path = fsspec.core.url_to_fs(url)
    info = fs.info(path)
    mtime = info.get("mtime", 0.0)
    return SourceFile(path=url, size=int(info.get("size") or 0), mtime=float(mtime if mtime is not None else 0.0))


class _SplitWriter:
    """Appends documents to one split's `tokens.bin`, hashing as it goes, and writes `offsets.npy`."""

    def __init__(self, folder: Path, dtype: np.dtype):
        folder.mkdir()
        self.folder = folder
        self.dtype = dtype
        self.tokens_file = open(folder / "tokens.bin", "wb")  # noqa: SIM115 - closed in close()
        # Offsets go to a raw file first because the .npy header needs the final count.
        self.offsets_file = open(folder / "offsets.raw", "wb")  # noqa: SIM115 - closed in close()
        self.offsets_file.write(np.zeros(1, dtype="<i8").tobytes())
        self.hasher = hashlib.sha256()
        self.documents = 0
        self.tokens = 0
        self.text_bytes = 0

    def write(self, documents: list[list[int]], text_bytes: list[int], tokenizer: Tokenizer) -> None:
        if not documents:
            return
        lengths = np.array([len(ids) + 1 for ids in documents], dtype=np.int64)
        joined: list[int] = []
        for ids in documents:
            joined.extend(ids)
            joined.append(tokenizer.eos_id)
        flat = np.array(joined, dtype=np.int64)
        if flat.min() < 0 or flat.max() >= tokenizer.vocab_size:
            raise InvalidInputError(
                f"tokenizer {tokenizer.name!r} produced an id outside its vocabulary of {tokenizer.vocab_size}"
            )
        data = flat.astype(self.dtype).tobytes()
        self.tokens_file.write(data)
        self.hasher.update(data)
        self.offsets_file.write((self.tokens + np.cumsum(lengths)).astype("<i8").tobytes())
        self.documents += len(documents)
        self.tokens += int(lengths.sum())
        self.text_bytes += sum(text_bytes)

    def close(self) -> SplitStats:
        for f in (self.tokens_file, self.offsets_file):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        raw = self.folder / "offsets.raw"
        with open(self.folder / "offsets.npy", "wb") as out, open(raw, "rb") as src:
            header = {"descr": "<i8", "fortran_order": False, "shape": (self.documents + 1,)}
            np.lib.format.write_array_header_1_0(out, header)
            shutil.copyfileobj(src, out)
            out.flush()
            os.fsync(out.fileno())
        raw.unlink()
        return SplitStats(
            documents=self.documents, tokens=self.tokens, bytes=self.text_bytes, sha256=self.hasher.hexdigest()
        )


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
        """The dtype of `tokens.bin`."""
        return np.dtype(self.manifest.dtype)

    def tokens(self, split: str) -> np.memmap:
        """The split's token stream as a read-only memmap.

        Raises:
            NotFoundError: the cache has no such split.
        """
        return np.memmap(self._split_dir(split) / "tokens.bin", dtype=self.dtype, mode="r")

    def offsets(self, split: str) -> np.ndarray:
        """Where each document of the split starts in its token stream, plus the total length at the end.

        Raises:
            NotFoundError: the cache has no such split.
        """
        return np.load(self._split_dir(split) / "offsets.npy", mmap_mode="r")

    def verify(self) -> None:
        """Check every split's files against the manifest: checksum, counts, offsets and EOS placement.

        Raises:
            InvalidInputError: a file does not match; the message names it and what differs.
        """
        for split, stats in self.manifest.splits.items():
            tokens_path = self._split_dir(split) / "tokens.bin"
            expected_size = stats.tokens * self.dtype.itemsize
            if tokens_path.stat().st_size != expected_size:
                raise InvalidInputError(
                    f"{tokens_path}: {tokens_path.stat().st_size} bytes, the manifest says {expected_size}"
                )
            digest = _sha256_file(tokens_path)
            if digest != stats.sha256:
                raise InvalidInputError(f"{tokens_path}: sha256 is {digest}, the manifest says {stats.sha256}")
            offsets = self.offsets(split)
            offsets_path = self._split_dir(split) / "offsets.npy"
            if offsets.shape != (stats.documents + 1,):
                raise InvalidInputError(
                    f"{offsets_path}: {offsets.shape[0]} entries, expected {stats.documents + 1} (documents + 1)"
                )
            if offsets[0] != 0 or offsets[-1] != stats.tokens or np.any(np.diff(offsets) < 1):
                raise InvalidInputError(f"{offsets_path}: offsets must rise from 0 to {stats.tokens}")
            if self.manifest.append_eos:
                ends = self.tokens(split)[np.asarray(offsets[1:]) - 1]
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
        InvalidInputError: the manifest does not parse, or comes from a newer Tradewind.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise NotFoundError(
            f"no token cache at {path} (manifest.json missing: the build did not finish or the path is wrong)"
        )
    manifest = parse_config(CacheManifest, read_json(manifest_path), source=str(manifest_path))
    if manifest.format_version > FORMAT_VERSION:
        raise InvalidInputError(
            f"{manifest_path}: format_version {manifest.format_version} is newer than this Tradewind reads "
            f"({FORMAT_VERSION}); upgrade Tradewind or rebuild the cache"
        )
    return TokenCache(path, manifest)


def _sha256_file(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()
