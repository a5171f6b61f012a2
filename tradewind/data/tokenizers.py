"""Tokenizers: the built-in byte tokenizer and Hugging Face `tokenizer.json` files.

Every tokenizer has an EOS id (the cache puts one after each document) and a fingerprint, the sha256 of
its definition, so that a token cache records exactly which tokenizer made it.

Example:
    tokenizer = load_tokenizer("byte")                   # or "path/to/tokenizer.json", or its folder
    ids = tokenizer.encode_batch(["To be, or not to be"])[0]
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import tokenizers as hf

from tradewind.core import InvalidInputError, NotFoundError

# Tried in order when a tokenizer.json does not say which token ends a document.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "[CLS]")


@runtime_checkable
class Tokenizer(Protocol):
    """What the data layer needs from a tokenizer.

    Attributes:
        name: a short label (`"byte"`, or the tokenizer file's path).
        vocab_size: ids are in `[0, vocab_size)`.
        bos_id: the begin-of-sequence id, or None if the tokenizer has none.
        eos_id: the end-of-sequence id, placed after every document in a token cache.
        fingerprint: sha256 hex of the tokenizer's definition.
    """

    name: str
    vocab_size: int
    bos_id: int | None
    eos_id: int
    fingerprint: str

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`; special tokens are dropped."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0-255 are bytes, 256 is EOS, 257 is BOS (vocabulary of 258).

    Needs no files and never fails, so it is the default for small experiments.
    """

    name = "byte"
    vocab_size = 258
    eos_id = 256
    bos_id = 257
    # The definition is fixed, so its fingerprint is the hash of a description of it.
    fingerprint = hashlib.sha256(b"tradewind byte tokenizer v1: utf-8 bytes 0-255, eos 256, bos 257").hexdigest()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """The UTF-8 bytes of each text, as ids."""
        return [list(text.encode("utf-8")) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Decode byte ids as UTF-8 (invalid sequences become U+FFFD); EOS, BOS and anything else
        outside 0-255 is dropped."""
        array = np.asarray(ids, dtype=np.int64)
        return array[(array >= 0) & (array < 256)].astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer loaded from a `tokenizer.json` file.

    Args:
        path: the `tokenizer.json` file.
        eos_token: the token that ends a document; detected from common names
            (`<|endoftext|>`, `</s>`, `<eos>`, `[SEP]`) when not given.

    Raises:
        NotFoundError: no file at `path`.
        InvalidInputError: the file is not a tokenizer, `eos_token` is not in its vocabulary, or no EOS
            token could be detected.
    """

    def __init__(self, path: str | Path, eos_token: str | None = None):
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"no tokenizer file at {path}") from None
        try:
            self._tokenizer = hf.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as error:  # the Rust library raises plain Exception subclasses
            raise InvalidInputError(f"{path}: not a valid tokenizer.json: {error}") from None
        self.name = str(path)
        self.fingerprint = hashlib.sha256(data).hexdigest()
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._find_eos(path, eos_token)
        self.bos_id = self._first_id(BOS_CANDIDATES)

    def _first_id(self, tokens: Sequence[str]) -> int | None:
        return next((i for t in tokens if (i := self._tokenizer.token_to_id(t)) is not None), None)

    def _find_eos(self, path: Path, eos_token: str | None) -> int:
        if eos_token is not None:
            eos_id = self._tokenizer.token_to_id(eos_token)
            if eos_id is None:
                raise InvalidInputError(f"{path}: eos_token {eos_token!r} is not in the tokenizer's vocabulary")
            return eos_id
        eos_id = self._first_id(EOS_CANDIDATES)
        if eos_id is not None:
            return eos_id
        raise InvalidInputError(
            f"{path}: cannot tell which token ends a document (none of {', '.join(EOS_CANDIDATES)} is in the "
            f"vocabulary); pass eos_token with the tokenizer's end-of-text token"
        )

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        return [encoding.ids for encoding in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`; special tokens are dropped."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r})"


def load_tokenizer(spec: str, eos_token: str | None = None) -> Tokenizer:
    """The tokenizer that `spec` names.

    Args:
        spec: `"byte"` for the byte tokenizer, else a path to a `tokenizer.json` file or to a folder
            that holds one.
        eos_token: passed to `HFTokenizer` for tokenizer files whose EOS token is not detected.

    Returns:
        The tokenizer.

    Raises:
        NotFoundError: nothing at the path, or a folder without `tokenizer.json`.
        InvalidInputError: the file is not a usable tokenizer.
    """
    if spec == "byte":
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise NotFoundError(
            f"no tokenizer at {spec!r} (expected 'byte', a tokenizer.json file, or a folder containing one; "
            f"looked for {path})"
        )
    return HFTokenizer(path, eos_token=eos_token)
