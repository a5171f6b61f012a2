"""The tiktoken encoder for byte-level BPE gives `tokenizers`' ids, or is not used."""

import json
import pickle
import random

import pytest
import tokenizers as hf

from tradewind.data import builtin_corpus_path, read_documents
from tradewind.data.bpe_training import train_bpe_tokenizer
from tradewind.data.fast_bpe import build_fast_encoder
from tradewind.data.tokenizers import HFTokenizer

pytest.importorskip("tiktoken")

# Code point ranges of many scripts, symbols and emoji; the generator also mixes in whitespace and digits.
RANGES = [
    (0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x530, 0x58F),
    (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0x980, 0x9FF), (0xE00, 0xE7F), (0x10A0, 0x10FF),
    (0x1100, 0x11FF), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x2070, 0x218F), (0x2190, 0x23FF),
    (0x2460, 0x27BF), (0x3000, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0xFB00, 0xFB4F),
    (0xFE00, 0xFE0F), (0xFF00, 0xFFEF), (0x10000, 0x1007F), (0x1D400, 0x1D7FF), (0x1F300, 0x1F6FF),
    (0x1F900, 0x1FAFF), (0xE0000, 0xE007F),
]  # fmt: skip
WHITESPACE = [" ", "  ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u3000", "\u2028", "\x85", "\x0b", "   \n "]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return [document.text for document in read_documents(builtin_corpus_path("tinyshakespeare"))]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> HFTokenizer:
    return train_bpe_tokenizer(corpus, 2000, tmp_path_factory.mktemp("bpe") / "tokenizer.json")


def reference(tokenizer: HFTokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tokenizer._tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


def random_texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 30)):
            roll = rng.random()
            if roll < 0.2:
                parts.append(rng.choice(WHITESPACE))
            elif roll < 0.3:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 8))))
            elif roll < 0.4:
                parts.append(rng.choice(["'s", "'ll", "'VE", " the", "<|endoftext|>", "<|begin_of_text|>", "e\u0301"]))
            else:
                low, high = rng.choice(RANGES)
                parts.append("".join(chr(rng.randint(low, high)) for _ in range(rng.randint(1, 12))))
        texts.append("".join(parts))
    return texts


def test_a_trained_tokenizer_is_encoded_by_tiktoken(trained):
    assert trained.encoder == "tiktoken"


def test_the_whole_corpus_encodes_to_the_same_ids(trained, corpus):
    lines = [line for text in corpus for line in text.splitlines(keepends=True)]
    assert trained.encode_batch(corpus) == reference(trained, corpus)
    assert trained.encode_batch(lines) == reference(trained, lines)


def test_generated_unicode_encodes_to_the_same_ids(trained):
    texts = random_texts(0, 3000)
    assert trained.encode_batch(texts) == reference(trained, texts)


def test_a_larger_vocabulary_on_generated_unicode(tmp_path, corpus):
    tokenizer = train_bpe_tokenizer([*corpus, *random_texts(1, 2000)], 6000, tmp_path / "t.json", min_frequency=1)
    assert tokenizer.encoder == "tiktoken"
    texts = random_texts(2, 2000) + corpus[:500]
    assert tokenizer.encode_batch(texts) == reference(tokenizer, texts)


def test_the_environment_variable_forces_tokenizers(trained, monkeypatch):
    monkeypatch.setenv("TRADEWIND_FAST_BPE", "0")
    tokenizer = HFTokenizer(trained.name)
    assert tokenizer.encoder == "tokenizers"
    assert tokenizer.encode_batch(["To be, or not"]) == reference(tokenizer, ["To be, or not"])


def test_pickling_keeps_the_fast_path_and_the_ids(trained, corpus):
    restored = pickle.loads(pickle.dumps(trained))
    assert restored.encoder == "tiktoken"
    assert restored._fast_checked is not None  # the probes ran in the sending process, not again here
    assert restored.fingerprint == trained.fingerprint
    assert restored.encode_batch(corpus[:200]) == reference(trained, corpus[:200])


def write(path, spec: dict) -> HFTokenizer:
    path.write_text(json.dumps(spec))
    return HFTokenizer(path)


def test_merges_out_of_rank_order_fall_back(trained, tmp_path, corpus):
    spec = json.loads(trained.hf_definition())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    # Swap the ids of the first two merge results: each merge still exists, but ids no longer follow merge order.
    first, second = ("".join(merges[0]), "".join(merges[1]))
    vocab[first], vocab[second] = vocab[second], vocab[first]
    tokenizer = write(tmp_path / "swapped.json", spec)
    assert tokenizer.encoder == "tokenizers"
    assert tokenizer.encode_batch(corpus[:100]) == reference(tokenizer, corpus[:100])


def test_a_missing_byte_falls_back(trained, tmp_path):
    spec = json.loads(trained.hf_definition())
    vocab = spec["model"]["vocab"]
    vocab["\u0100"] = vocab.pop("\u0100")  # still there: a no-op edit keeps the fast path
    assert write(tmp_path / "same.json", spec).encoder == "tiktoken"
    spec["model"]["merges"] = [m for m in spec["model"]["merges"] if "\u0100" not in "".join(m)]
    del vocab["\u0100"]  # byte 0x00 has no token
    assert write(tmp_path / "nobyte.json", spec).encoder == "tokenizers"


def test_a_word_level_tokenizer_falls_back(tmp_path):
    model = hf.models.WordLevel({"<|endoftext|>": 0, "[UNK]": 1, "to": 2, "be": 3}, unk_token="[UNK]")
    tokenizer = hf.Tokenizer(model)
    tokenizer.pre_tokenizer = hf.pre_tokenizers.Whitespace()
    path = tmp_path / "wordlevel.json"
    tokenizer.save(str(path))
    loaded = HFTokenizer(path)
    assert loaded.encoder == "tokenizers"
    assert loaded.encode_batch(["to be or"]) == [[2, 3, 1]]


def test_a_tokenizer_that_tiktoken_would_encode_differently_falls_back(tmp_path):
    # Merges (b,c) then (a,b) then (ab,c): tokenizers never joins "a" and "bc", tiktoken joins any pair whose
    # concatenation is a token, so it reads "abc" as one token. The structure passes; the probes catch it.
    from tradewind.data.byte_level import byte_symbols

    vocab = {"<|endoftext|>": 0} | {symbol: i + 1 for i, symbol in enumerate(byte_symbols())}
    vocab |= {"bc": 257, "ab": 258, "abc": 259}
    tokenizer = hf.Tokenizer(hf.models.BPE(vocab=vocab, merges=[("b", "c"), ("a", "b"), ("ab", "c")]))
    tokenizer.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = hf.decoders.ByteLevel()
    tokenizer.add_special_tokens([hf.AddedToken("<|endoftext|>", special=True)])
    assert tokenizer.encode("xabc", add_special_tokens=False).ids != [vocab["x"], 259]
    path = tmp_path / "inconsistent.json"
    tokenizer.save(str(path))
    loaded = HFTokenizer(path)
    assert loaded.encoder == "tokenizers"
    # Without the probes, tiktoken would have differed.
    fast = build_fast_encoder(path.read_text(), loaded._tokenizer, checked=True)
    assert fast is not None
    assert fast.encode_batch(["xabc"]) != loaded.encode_batch(["xabc"])
