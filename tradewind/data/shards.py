"""One shard of a token cache: plan the shards of a set of inputs, and tokenize one of them.

A shard is a whole input file, or a byte range of a large uncompressed JSONL file. Tokenizing it writes,
for each split, a flat token file and its document offsets (and, for the `chat` and `prompt_completion`
formats, a loss mask: one uint8 per token, 1 where the token is a training target) under temporary names,
renames them into place, and only then writes the shard's completion record `shards/shard-NNNNN.json`. A shard whose
record exists is finished; a rerun after a crash or SIGKILL redoes only the shards without one.

`tokenize_shard` is a top-level function of one picklable `ShardTask`, so any `tradewind.cluster`
`TaskRunner` (worker processes here, Ray later) can run the shards in parallel.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pydantic

from tradewind.core import InvalidInputError, atomic_write_json, read_json
from tradewind.data.bad_records import BadRecords
from tradewind.data.chat import ChatExamples, Example, PromptCompletionExamples
from tradewind.data.readers import RECORD_FORMATS, Format, is_splittable, read_file_documents, read_file_examples
from tradewind.data.tokenizers import HFTokenizer, Tokenizer

T = TypeVar("T")

SPLITS = ("train", "val")
RECORDS_DIR = "shards"
# A tokenizer batch is flushed at whichever limit comes first, which bounds memory for huge documents.
_BATCH_DOCUMENTS = 1_000
_BATCH_CHARS = 16 * 2**20


class ShardStats(pydantic.BaseModel):
    """One split's part of one shard.

    Attributes:
        name: the shard's name; its files are `<split>/<name>.bin` and `<split>/<name>.offsets.npy`, and
            `<split>/<name>.mask.bin` in a cache with a loss mask.
        documents: documents (or examples) in this part.
        tokens: token ids in `<name>.bin` (BOS and EOS included).
        bytes: UTF-8 bytes of the documents' text before tokenization (a chat's rendered text).
        sha256: sha256 hex of `<name>.bin`.
        targets: tokens whose mask is 1 (loss targets), in a cache with a loss mask; else None.
        mask_sha256: sha256 hex of `<name>.mask.bin`, in a cache with a loss mask; else None.
    """

    name: str
    documents: int
    tokens: int
    bytes: int
    sha256: str
    targets: int | None = None
    mask_sha256: str | None = None


class ShardRecord(pydantic.BaseModel):
    """The completion record of one shard, written after its files."""

    index: int
    source: str
    start: int
    end: int | None
    input_bytes: int
    splits: dict[str, ShardStats]
    bad_records: BadRecords


@dataclass(frozen=True)
class ShardTask:
    """Everything a worker process needs to tokenize one shard into `folder`."""

    index: int
    url: str
    start: int
    end: int | None
    input_bytes: int
    folder: str
    tokenizer: Tokenizer
    format: Format
    text_field: str
    val_fraction: float
    strict: bool
    prepend_bos: bool
    append_eos: bool
    dtype: str
    # For format chat: the tokenizer itself, whose chat template renders records and whose character offsets
    # place their replies (`tokenizer` may be a wrapper that reports progress).
    chat_tokenizer: HFTokenizer | None = None

    @property
    def name(self) -> str:
        return shard_name(self.index)

    @property
    def record_path(self) -> Path:
        return Path(self.folder) / RECORDS_DIR / f"{self.name}.json"


def shard_name(index: int) -> str:
    """The file stem of shard `index`."""
    return f"shard-{index:05d}"


def shard_files(record: ShardRecord) -> tuple[str, ...]:
    """A finished shard's files, relative to its build folder, its completion record last: the order to copy them
    in, so that a copy cut off part-way is never taken for a finished shard."""
    files = []
    for split, stats in record.splits.items():
        files += [f"{split}/{stats.name}.bin", f"{split}/{stats.name}.offsets.npy"]
        if stats.mask_sha256 is not None:
            files.append(f"{split}/{stats.name}.mask.bin")
    return (*files, f"{RECORDS_DIR}/{shard_name(record.index)}.json")


def plan_shards(
    files: Sequence[tuple[str, int]], format: Format, shard_bytes: int
) -> list[tuple[str, int, int | None]]:
    """Cut `(url, size)` inputs into `(url, start, end)` shards of about `shard_bytes` each.

    Only uncompressed JSONL files are cut (at exact byte offsets; a record belongs to the range holding its
    first byte); other files are one shard each. The plan depends only on the files and their sizes.
    """
    if shard_bytes < 1:
        raise InvalidInputError(f"shard_bytes must be at least 1 (got {shard_bytes})")
    plan: list[tuple[str, int, int | None]] = []
    for url, size in files:
        pieces = -(-size // shard_bytes) if is_splittable(url, format) and size > shard_bytes else 1
        if pieces == 1:
            plan.append((url, 0, None))
            continue
        cuts = [size * k // pieces for k in range(pieces + 1)]
        plan.extend((url, a, b if b < size else None) for a, b in itertools.pairwise(cuts))
    return plan


def is_validation(text: str, val_fraction: float) -> bool:
    """Whether a document belongs to the validation split; depends only on its text."""
    return _is_validation_bytes(text.encode("utf-8"), val_fraction)


def _is_validation_bytes(data: bytes, val_fraction: float) -> bool:
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < val_fraction


def tokenize_shard(task: ShardTask) -> ShardRecord:
    """Tokenize one shard into its split files and completion record; return the record.

    Does nothing but read the record when the shard is already finished.

    Raises:
        InvalidInputError: a bad record under `strict`, or a tokenizer id outside its vocabulary.
    """
    if task.record_path.exists():
        return ShardRecord.model_validate(read_json(task.record_path))
    bad = BadRecords(strict=task.strict)
    masked = task.format in RECORD_FORMATS
    folder = Path(task.folder)
    writers = {split: _PartWriter(folder / split, task.name, np.dtype(task.dtype), masked) for split in SPLITS}
    try:
        if masked:
            _tokenize_examples(task, writers, bad)
        else:
            _tokenize_documents(task, writers, bad)
        splits = {split: writer.finish() for split, writer in writers.items()}
    finally:
        for writer in writers.values():
            writer.discard()
    record = ShardRecord(
        index=task.index,
        source=task.url,
        start=task.start,
        end=task.end,
        input_bytes=task.input_bytes,
        splits=splits,
        bad_records=bad,
    )
    task.record_path.parent.mkdir(exist_ok=True)
    atomic_write_json(task.record_path, record.model_dump(mode="json"))
    return record


def _batched(items: Iterable[T], chars: Callable[[T], int]) -> Iterator[list[T]]:
    """`items` in batches of `_BATCH_DOCUMENTS` items, or fewer holding `_BATCH_CHARS` characters."""
    batch: list[T] = []
    size = 0
    for item in items:
        batch.append(item)
        size += chars(item)
        if len(batch) >= _BATCH_DOCUMENTS or size >= _BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _by_split(keys: list[bytes], val_fraction: float) -> Iterator[tuple[str, list[int]]]:
    """Each split with the indices of the items whose key (their content) puts them there, if any."""
    in_val = [_is_validation_bytes(key, val_fraction) for key in keys]
    for split in SPLITS:
        chosen = [i for i, flag in enumerate(in_val) if flag == (split == "val")]
        if chosen:
            yield split, chosen


def _tokenize_documents(task: ShardTask, writers: dict[str, _PartWriter], bad: BadRecords) -> None:
    documents = read_file_documents(
        task.url, format=task.format, text_field=task.text_field, bad_records=bad, start=task.start, end=task.end
    )
    for texts in _batched((document.text for document, _ in documents), len):
        ids = task.tokenizer.encode_batch(texts)
        encoded = [text.encode("utf-8") for text in texts]
        for split, chosen in _by_split(encoded, task.val_fraction):
            writers[split].write([ids[i] for i in chosen], sum(len(encoded[i]) for i in chosen), task)


def _tokenize_examples(task: ShardTask, writers: dict[str, _PartWriter], bad: BadRecords) -> None:
    """A chat or prompt_completion shard: examples and their loss masks, split by the hash of their content."""
    if task.format == "chat":
        if task.chat_tokenizer is None:
            raise InvalidInputError(f"format 'chat': tokenizer {task.tokenizer.name!r} has no chat template")
        examples: ChatExamples | PromptCompletionExamples = ChatExamples(task.chat_tokenizer)
    else:
        examples = PromptCompletionExamples()
    read = read_file_examples(task.url, examples.prepare, bad_records=bad, start=task.start, end=task.end)
    for batch in _batched((example for example, _ in read), lambda example: sum(map(len, example.texts))):
        _flush_examples(batch, examples, writers, task)


def _flush_examples(
    batch: list[Example],
    examples: ChatExamples | PromptCompletionExamples,
    writers: dict[str, _PartWriter],
    task: ShardTask,
) -> None:
    encoded = examples.encode(batch, task.tokenizer)
    bos = task.tokenizer.bos_id
    if task.prepend_bos:  # a template that writes BOS itself gets no second one
        encoded = [(ids[1:], mask[1:]) if ids[:1] == [bos] else (ids, mask) for ids, mask in encoded]
    for split, chosen in _by_split([example.key for example in batch], task.val_fraction):
        writers[split].write(
            [encoded[i][0] for i in chosen],
            sum(batch[i].text_bytes for i in chosen),
            task,
            masks=[encoded[i][1] for i in chosen],
            eos_target=examples.eos_target,
        )


class _PartWriter:
    """Streams one split's tokens of one shard to `<name>.bin.tmp-PID` (and with `masked` its loss mask to
    `<name>.mask.bin.tmp-PID`); `finish` renames the files into place."""

    def __init__(self, folder: Path, name: str, dtype: np.dtype, masked: bool = False):
        folder.mkdir(parents=True, exist_ok=True)
        self.tokens_path = folder / f"{name}.bin"
        self.offsets_path = folder / f"{name}.offsets.npy"
        self.mask_path = folder / f"{name}.mask.bin"
        self.tmp = _tmp(self.tokens_path)
        self.file = open(self.tmp, "wb")  # noqa: SIM115 - closed in finish() or discard()
        self.mask_file = open(_tmp(self.mask_path), "wb") if masked else None  # noqa: SIM115 - likewise
        self.dtype = dtype
        self.hasher = hashlib.sha256()
        self.mask_hasher = hashlib.sha256()
        self.lengths: list[np.ndarray] = []
        self.documents = 0
        self.tokens = 0
        self.targets = 0
        self.text_bytes = 0

    def write(
        self,
        documents: list[list[int]],
        text_bytes: int,
        task: ShardTask,
        *,
        masks: list[np.ndarray] | None = None,
        eos_target: bool = False,
    ) -> None:
        """Append documents (each with BOS and EOS as the task says) and, in a masked part, their masks (BOS
        is never a target; EOS is one when `eos_target`)."""
        tokenizer = task.tokenizer
        bos = [tokenizer.bos_id] if task.prepend_bos and tokenizer.bos_id is not None else []
        eos = [tokenizer.eos_id] if task.append_eos else []
        lengths = np.fromiter((len(ids) for ids in documents), dtype=np.int64, count=len(documents))
        lengths += len(bos) + len(eos)
        total = int(lengths.sum())
        pieces = itertools.chain.from_iterable(itertools.chain.from_iterable((bos, ids, eos) for ids in documents))
        flat = np.fromiter(pieces, dtype=np.int64, count=total)
        if total and (flat.min() < 0 or flat.max() >= tokenizer.vocab_size):
            raise InvalidInputError(
                f"tokenizer {tokenizer.name!r} produced an id outside its vocabulary of {tokenizer.vocab_size}"
            )
        data = flat.astype(self.dtype).tobytes()
        self.file.write(data)
        self.hasher.update(data)
        if self.mask_file is not None:
            if masks is None:
                raise ValueError("a masked part needs each document's loss mask")
            bos_mask, eos_mask = np.zeros(len(bos), np.uint8), np.full(len(eos), int(eos_target), np.uint8)
            mask = np.concatenate([part for m in masks for part in (bos_mask, m, eos_mask)] or [np.zeros(0, np.uint8)])
            if len(mask) != total:
                raise ValueError(f"loss masks of {len(mask)} tokens for {total} tokens")
            mask_bytes = mask.astype(np.uint8).tobytes()
            self.mask_file.write(mask_bytes)
            self.mask_hasher.update(mask_bytes)
            self.targets += int(mask.sum())
        self.lengths.append(lengths)
        self.documents += len(documents)
        self.tokens += total
        self.text_bytes += text_bytes

    def finish(self) -> ShardStats:
        for file in (self.file, self.mask_file):
            if file is not None:
                file.flush()
                os.fsync(file.fileno())
                file.close()
        offsets = np.zeros(self.documents + 1, dtype="<i8")
        if self.lengths:
            np.cumsum(np.concatenate(self.lengths), out=offsets[1:])
        offsets_tmp = _tmp(self.offsets_path)
        with open(offsets_tmp, "wb") as out:
            np.lib.format.write_array(out, offsets, allow_pickle=False)
            out.flush()
            os.fsync(out.fileno())
        os.replace(offsets_tmp, self.offsets_path)
        if self.mask_file is not None:
            os.replace(_tmp(self.mask_path), self.mask_path)
        os.replace(self.tmp, self.tokens_path)
        masked = self.mask_file is not None
        return ShardStats(
            name=self.tokens_path.stem,
            documents=self.documents,
            tokens=self.tokens,
            bytes=self.text_bytes,
            sha256=self.hasher.hexdigest(),
            targets=self.targets if masked else None,
            mask_sha256=self.mask_hasher.hexdigest() if masked else None,
        )

    def discard(self) -> None:
        """Close and delete the temporary files if `finish` did not run."""
        for file, path in ((self.file, self.tmp), (self.mask_file, _tmp(self.mask_path))):
            if file is not None and not file.closed:
                file.close()
            path.unlink(missing_ok=True)


def _tmp(path: Path) -> Path:
    """Where this process writes `path` before renaming it into place (a resumed build deletes leftovers)."""
    return path.with_name(path.name + f".tmp-{os.getpid()}")
