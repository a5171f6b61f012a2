"""Data: reading corpora, tokenizing them into token caches, and packing caches into training batches.

This layer owns everything between a text file and a `[batch, seq_len + 1]` array of token ids:
readers (text and JSONL, plain, gzip or zstandard), tokenizers (bytes and Hugging Face files), the
on-disk token cache and its manifest, the step-addressed packed loader, and the built-in corpora.
It may import only `tradewind.core` and `tradewind.cluster` (never the trainer, tools, server or
prompts), plus numpy, tokenizers, zstandard, fsspec and pydantic; it never imports jax, so data work
runs on machines without an accelerator.
"""

from tradewind.data.cache import (
    CacheManifest,
    SourceFile,
    SplitStats,
    TokenCache,
    TokenizerInfo,
    build_token_cache,
    open_token_cache,
)
from tradewind.data.corpora import BUILTIN_CORPORA, builtin_corpus_path
from tradewind.data.loader import PackedLoader
from tradewind.data.readers import Document, read_documents
from tradewind.data.tokenizers import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

__all__ = [
    "BUILTIN_CORPORA",
    "ByteTokenizer",
    "CacheManifest",
    "Document",
    "HFTokenizer",
    "PackedLoader",
    "SourceFile",
    "SplitStats",
    "TokenCache",
    "Tokenizer",
    "TokenizerInfo",
    "build_token_cache",
    "builtin_corpus_path",
    "load_tokenizer",
    "open_token_cache",
    "read_documents",
]
