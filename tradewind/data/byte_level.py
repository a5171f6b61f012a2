"""GPT-2's byte-level alphabet: the printable character that stands for each byte in a byte-level BPE vocabulary.

Both `tokenizers.ByteTokenizer` (its Hugging Face export) and `fast_bpe` (mapping a `tokenizer.json`'s tokens back
to bytes for tiktoken) read vocabularies written in it.

Example:
    symbols = byte_symbols()   # symbols[32] == "Ġ", symbols[ord("a")] == "a"
"""

from __future__ import annotations


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte 0-255: itself if printable Latin-1, else a character from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = iter(range(256, 512))
    return [chr(byte) if byte in printable else chr(next(others)) for byte in range(256)]
