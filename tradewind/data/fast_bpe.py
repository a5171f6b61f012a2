"""A faster encoder for byte-level BPE `tokenizer.json` files: the same merges run by `tiktoken`.

`tiktoken` merges the adjacent pair whose concatenation has the lowest rank; Hugging Face's BPE merges the
pair that comes first in its merge list. With rank = token id, the two agree when the merge results have
ids in merge order, as `tokenizers`' `BpeTrainer` makes them (merge i creates token 256 + specials + i).
`build_fast_encoder` takes only tokenizers it can map (byte-level BPE with GPT-2's split pattern, no
normalizer, dropout, truncation or padding, each merge result a new token with a larger id than the one
before), then encodes a fixed probe text and the text of every token pair both ways, and returns None
unless every id agrees. `HFTokenizer` uses the result when there is one; `TRADEWIND_FAST_BPE=0` turns it off.

Example:
    fast = build_fast_encoder(Path("tokenizer.json").read_text(), tokenizers.Tokenizer.from_file(...))
    ids = fast.encode_batch(["To be, or not to be"]) if fast else ...
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import tokenizers as hf

from tradewind.data.byte_level import byte_symbols

log = logging.getLogger(__name__)

# Set to 0 (or false/no/off) to always encode with `tokenizers`.
ENV_VAR = "TRADEWIND_FAST_BPE"
# GPT-2's split pattern, as tiktoken's r50k writes it; Hugging Face's ByteLevel pre-tokenizer (use_regex)
# lists the same contractions one by one.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Checked on every tokenizer before the fast path is used: whitespace runs, digits, contractions, scripts
# with and without spaces, combining marks, emoji with joiners and skin tones, controls.
PROBE_TEXTS = (
    "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer\n\n",
    "I'll, you've, we're, he's, she'd, they'm 'S 'T 'LL DON'T\t\ttabs   spaces    \r\n\r\n  \n ",
    "0 1 12 123 1234 12345 3.14159 1,000,000 -42 +7 0x1F 2024-01-01 ١٢٣ 一二三 ⅫⅣ ½",
    "Ünïcödé naïve café résumé Ångström straße ÆØÅ æøå ĳ ǅ ﬁ",
    "Привет, мир! Ελληνικά γράμματα. עברית שלום. مرحبا بالعالم. हिन्दी भाषा। ภาษาไทย",
    "中文文本没有空格。日本語のテキスト、カタカナ。한국어 텍스트입니다.",
    "e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937 Z\u0351\u0352\u0353 \u200b\u200c\u200d \ufeff \u00a0\u2009\u3000",
    "😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 ❤️ ✨ \U0001d518\U0001d52b\U0001d526 𐍈 \U0001f9ea\U0001fae0",
    "\x00\x01\x07\x1b[0m\x7f\x85 \u2028\u2029 <|endoftext|> <|begin_of_text|>x< |endoftext| >",
    "    def f(x):\n        return x ** 2  # comment\n\n\n{'a': [1, 2]}; $@%^&*()_+=~`|\\/",
)


def fast_bpe_enabled() -> bool:
    """False when `TRADEWIND_FAST_BPE` is set to 0, false, no or off."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


class FastBPE:
    """Encodes as the `tokenizers` tokenizer it was built from does, without special tokens added."""

    def __init__(self, encoding: Any):
        self._encoding = encoding

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text; added tokens written in a text (e.g. `<|endoftext|>`) become their ids."""
        encode = self._encoding.encode
        # One call per text on this thread: shard workers are already one process per core.
        return [encode(text, allowed_special="all") for text in texts]


def library_versions() -> str:
    """The tiktoken and tokenizers versions: a check made under other versions does not carry over."""
    try:
        import tiktoken
    except ImportError:
        return "no tiktoken"
    return f"tiktoken {tiktoken.__version__}, tokenizers {hf.__version__}"


def build_fast_encoder(definition: str, tokenizer: hf.Tokenizer, *, checked: bool = False) -> FastBPE | None:
    """A `FastBPE` giving `tokenizer`'s ids, or None when tiktoken is missing, the tokenizer is not a
    byte-level BPE it can represent, or any probe encodes differently (the reason is logged at debug).

    Args:
        definition: the `tokenizer.json` text `tokenizer` was loaded from.
        tokenizer: the `tokenizers` tokenizer, the reference for the probes.
        checked: the probes already passed for this definition under the same `library_versions()`
            (in the process that sent this tokenizer to a worker), so only the structure is checked.
    """
    try:
        import tiktoken
    except ImportError:
        log.debug("fast BPE off: tiktoken is not installed")
        return None
    try:
        ranks, specials = _ranks(json.loads(definition))
        encoding = tiktoken.Encoding(
            "tradewind-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=specials
        )
    except (_Unsupported, ValueError, KeyError, TypeError) as error:
        log.debug("fast BPE off: %s", error)
        return None
    fast = FastBPE(encoding)
    if checked:
        return fast
    probes = [*PROBE_TEXTS, *_vocabulary_texts(ranks)]
    expected = [e.ids for e in tokenizer.encode_batch_fast(probes, add_special_tokens=False)]
    for text, want, got in zip(probes, expected, fast.encode_batch(probes), strict=True):
        if want != got:
            log.debug("fast BPE off: tiktoken encodes %r differently from tokenizers", text[:80])
            return None
    return fast


class _Unsupported(Exception):
    pass


def _require(condition: bool, reason: str) -> None:
    if not condition:
        raise _Unsupported(reason)


def _ranks(spec: dict) -> tuple[dict[bytes, int], dict[str, int]]:
    """tiktoken's mergeable ranks (token bytes -> id) and special tokens of a `tokenizer.json`."""
    _require(spec.get("normalizer") is None, "has a normalizer")
    _require(spec.get("truncation") is None and spec.get("padding") is None, "truncates or pads")
    pre = spec.get("pre_tokenizer") or {}
    _require(
        pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space"),
        "the pre-tokenizer is not ByteLevel with GPT-2's regex and no prefix space",
    )
    post = spec.get("post_processor")
    _require(post is None or post.get("type") == "ByteLevel", "has a post-processor other than ByteLevel")
    model = spec["model"]
    _require(model.get("type") == "BPE", "the model is not BPE")
    _require(not model.get("dropout"), "uses BPE dropout")
    _require(not model.get("continuing_subword_prefix") and not model.get("end_of_word_suffix"), "has affixes")
    _require(not model.get("byte_fallback") and not model.get("ignore_merges"), "uses byte_fallback/ignore_merges")

    specials: dict[str, int] = {}
    for added in spec.get("added_tokens") or []:
        _require(
            not (added["single_word"] or added["lstrip"] or added["rstrip"]), "an added token strips or is single_word"
        )
        specials[added["content"]] = added["id"]
    contents = list(specials)
    # tiktoken matches added tokens by a plain alternation; HF takes the longest. They agree if none contains another.
    _require(not any(a != b and a in b for a in contents for b in contents), "one added token contains another")

    vocab: dict[str, int] = model["vocab"]
    symbols = byte_symbols()
    _require(all(symbol in vocab for symbol in symbols), "a byte symbol is missing from the vocabulary")
    ranks = {bytes([byte]): vocab[symbol] for byte, symbol in enumerate(symbols)}
    # Byte-level text to bytes: each symbol becomes its byte as a Latin-1 character; any other character
    # becomes U+FFFF, which Latin-1 cannot encode.
    table = {code: "\uffff" for code in range(256)} | {ord(symbol): chr(byte) for byte, symbol in enumerate(symbols)}
    last = max(ranks.values())
    for merge in model["merges"]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        token = left + right
        if left not in vocab or right not in vocab or token not in vocab:
            raise _Unsupported(f"merge {left!r} {right!r} is not in the vocabulary")
        try:
            data = token.translate(table).encode("latin-1")
        except UnicodeEncodeError:
            raise _Unsupported(f"{token!r} is not byte-level text") from None
        if data in ranks:
            raise _Unsupported(f"{token!r} is made by two merges or is a byte")
        if vocab[token] <= last:
            raise _Unsupported(f"{token!r} (id {vocab[token]}) is out of merge order")
        ranks[data] = last = vocab[token]
    _require(not set(specials.values()) & set(ranks.values()), "an added token's id is also a mergeable token's")
    return ranks, specials


def _vocabulary_texts(ranks: dict[bytes, int], chunk: int = 4096) -> list[str]:
    """Every token's text, with each next to the one after it in id order, and each alone, in chunks."""
    tokens = [data for data, _ in sorted(ranks.items(), key=lambda item: item[1])]
    joined = b"".join(tokens).decode("utf-8", errors="replace")
    spaced = b" ".join(tokens).decode("utf-8", errors="replace")
    return [text[i : i + chunk] for text in (joined, spaced) for i in range(0, len(text), chunk)]
