import hashlib

import pytest
import zstandard

from tradewind.core import NotFoundError
from tradewind.data import BUILTIN_CORPORA, builtin_corpus_path, read_documents


def test_tinyshakespeare_decompresses_to_the_original_file():
    data = zstandard.ZstdDecompressor().decompress(builtin_corpus_path("tinyshakespeare").read_bytes())

    assert len(data) == 1_115_394
    assert hashlib.md5(data).hexdigest() == "6fb458f1232090904fb40fe944165e91"


def test_tinyshakespeare_reads_as_one_document_per_speech():
    docs = read_documents(builtin_corpus_path("tinyshakespeare"))

    first = next(docs)
    assert first.text == "First Citizen:\nBefore we proceed any further, hear me speak."
    assert first.line == 1


def test_every_listed_corpus_is_packaged():
    assert all(builtin_corpus_path(name).is_file() for name in BUILTIN_CORPORA)


def test_unknown_corpus_lists_the_known_ones():
    with pytest.raises(NotFoundError, match="known corpora: tinyshakespeare"):
        builtin_corpus_path("wikitext")
