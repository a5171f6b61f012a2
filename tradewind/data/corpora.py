"""Corpora shipped with Tradewind, so that a first training run needs no download.

tinyshakespeare: the works of Shakespeare concatenated into one 1,115,394-byte text file, as
    collected by Andrej Karpathy for char-rnn (https://github.com/karpathy/char-rnn,
    `data/tinyshakespeare/input.txt`). The plays are in the public domain. Stored compressed with
    zstandard (level 19); `read_documents` reads it directly, one speech (paragraph) per document.

Example:
    build_token_cache([builtin_corpus_path("tinyshakespeare")], "datasets/shakespeare", ByteTokenizer())
"""

from __future__ import annotations

from pathlib import Path

from tradewind.core import NotFoundError

BUILTIN_CORPORA = ("tinyshakespeare",)
_CORPORA_DIR = Path(__file__).with_name("corpora")


def builtin_corpus_path(name: str) -> Path:
    """The packaged file of the built-in corpus `name` (a `.txt.zst` file).

    Raises:
        NotFoundError: `name` is not a built-in corpus; the message lists the known ones.
    """
    if name not in BUILTIN_CORPORA:
        raise NotFoundError(f"unknown built-in corpus {name!r}; known corpora: {', '.join(BUILTIN_CORPORA)}")
    return _CORPORA_DIR / f"{name}.txt.zst"
