"""Training a byte-level BPE tokenizer (GPT-2 style) on a corpus, saved as a Hugging Face `tokenizer.json`.

`train_tokenizer` reads documents as `tokenize_dataset` does (files, folders, globs, URLs; bad records
counted) and reports progress in input bytes; `train_bpe_tokenizer` trains on any stream of texts. The result
loads as an `HFTokenizer` (`tokenizers.py`).

Example:
    tokenizer = train_tokenizer(["data/*.jsonl"], "tokenizers/bpe-8k/tokenizer.json", vocab_size=8192)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import fsspec
import tokenizers as hf

from tradewind.core import InvalidInputError, atomic_write_text
from tradewind.data.bad_records import BadRecords
from tradewind.data.readers import Format, list_input_files, read_file_documents
from tradewind.data.tokenizers import HFTokenizer


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    out_path: str | Path,
    *,
    eos_token: str = "<|endoftext|>",
    bos_token: str | None = "<|begin_of_text|>",
    min_frequency: int = 2,
) -> HFTokenizer:
    """Train a byte-level BPE tokenizer (GPT-2 style) on `texts` and save it as a `tokenizer.json`.

    Byte-level means every string is encodable: the 256 byte symbols are always in the vocabulary, and
    merges are learned on top until `vocab_size` (special tokens included) is reached or no pair occurs
    `min_frequency` times.

    Args:
        texts: the training documents (streamed once).
        vocab_size: the vocabulary size to reach, at least 256 + the special tokens.
        out_path: where to write the `tokenizer.json`; written whole or not at all.
        eos_token: the end-of-document token (id 0).
        bos_token: the begin-of-document token (id 1), or None for none.
        min_frequency: the fewest occurrences for a pair to be merged.

    Returns:
        The trained tokenizer, loaded from `out_path`.

    Raises:
        InvalidInputError: `vocab_size` too small to hold the bytes and special tokens.
    """
    specials = [eos_token] + ([bos_token] if bos_token else [])
    if vocab_size < 256 + len(specials):
        raise InvalidInputError(f"vocab_size must be at least {256 + len(specials)} (256 bytes + special tokens)")
    tokenizer = hf.Tokenizer(hf.models.BPE())
    tokenizer.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = hf.decoders.ByteLevel()
    trainer = hf.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_path, tokenizer.to_str())
    return HFTokenizer(out_path, eos_token=eos_token)


def train_tokenizer(
    inputs: Sequence[str | Path],
    out_path: str | Path,
    vocab_size: int,
    *,
    format: Format = "auto",
    text_field: str = "text",
    max_documents: int | None = None,
    min_frequency: int = 2,
    bad_records: BadRecords | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> HFTokenizer:
    """Train a byte-level BPE tokenizer of `vocab_size` on the documents of `inputs` (see `train_bpe_tokenizer`).

    Args:
        inputs: files, folders, globs or URLs, read as by `read_documents`.
        out_path: the `tokenizer.json` to write.
        vocab_size: the vocabulary size, special tokens included.
        format, text_field: as in `read_documents`.
        max_documents: train on at most this many documents (the first ones), or all if None.
        min_frequency: the fewest occurrences for a pair to be merged; 1 reaches a large `vocab_size`
            on a small corpus.
        bad_records: collects skipped bad records; None fails on the first.
        progress: called as `progress(done, total)` with input bytes read, every 1,000 documents.

    Raises:
        NotFoundError: an input does not exist.
        InvalidInputError: a bad option, or a bad record without `bad_records`.
    """
    files = [url for item in inputs for url in list_input_files(item)]
    sizes = [_size(url) for url in files]
    total = sum(sizes)

    def texts() -> Iterator[str]:
        count, before = 0, 0
        for url, size in zip(files, sizes, strict=True):
            for document, position in read_file_documents(
                url, format=format, text_field=text_field, bad_records=bad_records
            ):
                if max_documents is not None and count >= max_documents:
                    return
                count += 1
                if progress and count % 1_000 == 0:
                    progress(min(before + position, total), total)
                yield document.text
            before += size

    tokenizer = train_bpe_tokenizer(texts(), vocab_size, out_path, min_frequency=min_frequency)
    if progress:
        progress(total, total)
    return tokenizer


def _size(url: str) -> int:
    fs, path = fsspec.core.url_to_fs(url)
    return int(fs.info(path).get("size") or 0)
