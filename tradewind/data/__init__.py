"""Data: reading corpora, tokenizing them into token caches, and packing caches into training batches.

This layer owns everything between a text file and a `[batch, seq_len + 1]` array of token ids:
readers (text, JSONL and Parquet over fsspec URLs, plain, gzip or zstandard, with a bad-record policy),
`Dataset` transform pipelines, tokenizers (bytes, Hugging Face files and folders, BPE training, chat
templates), chat and prompt-completion examples with their loss masks, the sharded, resumable on-disk token
cache and its manifest, the step-addressed loaders (packed windows, whole documents with segment ids,
mixtures), and the built-in corpora. Parallel work goes through `tradewind.cluster`'s task runners. It may
import only `tradewind.core` and `tradewind.cluster` (never the trainer, tools, server or prompts), plus
numpy, pyarrow, tokenizers, jinja2, zstandard, fsspec and pydantic; it never imports jax, so data work runs
on machines without an accelerator. See `docs/data.md`.
"""

from tradewind.data.bad_records import BadRecords
from tradewind.data.bpe_training import train_bpe_tokenizer, train_tokenizer
from tradewind.data.cache import build_token_cache, cache_id
from tradewind.data.chat import ChatTemplateError
from tradewind.data.corpora import BUILTIN_CORPORA, builtin_corpus_path
from tradewind.data.dataset import Dataset, WriteResult
from tradewind.data.loader import PackedLoader, StepLoader
from tradewind.data.mixture import MixtureLoader
from tradewind.data.packing import DocumentBatch, DocumentLoader
from tradewind.data.permutation import FeistelPermutation
from tradewind.data.readers import GLOB_CHARS, Document, DocumentFormat, Format, list_input_files, read_documents
from tradewind.data.shards import ShardStats
from tradewind.data.stream import ShardedTokens
from tradewind.data.token_cache import CacheManifest, SplitStats, TokenCache, TokenizerInfo, open_token_cache
from tradewind.data.tokenize_config import SourceFile, TokenizeConfig, source_files
from tradewind.data.tokenizers import (
    ByteTokenizer,
    HFTokenizer,
    HFTokenizerConfig,
    Tokenizer,
    load_tokenizer,
    write_hf_tokenizer_files,
)

__all__ = [
    "BUILTIN_CORPORA",
    "BadRecords",
    "ByteTokenizer",
    "CacheManifest",
    "ChatTemplateError",
    "Dataset",
    "Document",
    "DocumentBatch",
    "DocumentLoader",
    "DocumentFormat",
    "FeistelPermutation",
    "Format",
    "HFTokenizer",
    "HFTokenizerConfig",
    "MixtureLoader",
    "PackedLoader",
    "ShardStats",
    "ShardedTokens",
    "SourceFile",
    "SplitStats",
    "StepLoader",
    "TokenCache",
    "TokenizeConfig",
    "Tokenizer",
    "TokenizerInfo",
    "WriteResult",
    "build_token_cache",
    "builtin_corpus_path",
    "cache_id",
    "GLOB_CHARS",
    "list_input_files",
    "load_tokenizer",
    "open_token_cache",
    "read_documents",
    "source_files",
    "train_bpe_tokenizer",
    "train_tokenizer",
    "write_hf_tokenizer_files",
]
