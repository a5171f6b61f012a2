"""The final evaluation every run ends with: its loss on the dataset's fixed val tokens, in nats and in bits
per byte.

The set is the first `val_tokens` tokens of the val split (the dataset's `TokenizeConfig.val_tokens`, at most
the split), cut into windows of the run's `seq_len`: the same tokens for every run on the dataset whatever its
batch size, so the metric compares runs. Bits per byte divide the summed loss (in bits) by the UTF-8 bytes of
the text the scored tokens decode to, so tokenizers with other vocabularies compare too.

    windows [n, seq_len + 1] -> full batches (the run's compiled eval step) + the rest (one more compilation)
    -> val_loss = mean loss per scored token; val_bpb = val_loss * scored tokens / ln 2 / bytes
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import jax
import numpy as np

from tradewind.core import TradewindError
from tradewind.data import TokenCache, load_tokenizer
from tradewind.trainer.setup import TrainSetup
from tradewind.trainer.step import Params, make_eval_step


@dataclass(frozen=True)
class ValTokens:
    """The windows of the fixed val token set, and the UTF-8 bytes of the text their targets decode to."""

    windows: np.ndarray  # [n, seq_len + 1]; window i starts at token i * seq_len
    bytes: int | None  # None when the dataset's tokenizer cannot be loaded here

    @property
    def scored(self) -> int:
        """Tokens predicted: each window's last seq_len."""
        return self.windows.shape[0] * (self.windows.shape[1] - 1)


@dataclass(frozen=True)
class ValScore:
    """The final evaluation: mean loss per token and bits per byte (None when not finite), tokens, seconds."""

    loss: float | None
    bits_per_byte: float | None
    tokens: int
    seconds: float


def fixed_val_tokens(cache: TokenCache, seq_len: int, rows_multiple: int = 1) -> ValTokens | None:
    """The fixed val token set of `cache` in windows of `seq_len` (a multiple of `rows_multiple` of them, so
    they shard over the mesh); None when the val split holds no whole window."""
    tokens = cache.tokens("val")
    count = min(cache.manifest.val_tokens, len(tokens) - 1) // seq_len // rows_multiple * rows_multiple
    if count <= 0:
        return None
    stream = np.asarray(tokens[: count * seq_len + 1], dtype=np.int32)
    starts = np.arange(count) * seq_len
    windows = stream[starts[:, None] + np.arange(seq_len + 1)]
    try:
        tokenizer = load_tokenizer(cache.manifest.tokenizer.name)
    except (TradewindError, OSError) as error:  # a hub tokenizer offline, a tokenizer.json on another host
        print(f"val_bpb: no tokenizer to count the val text's bytes ({error}); val_loss only", flush=True)
        return ValTokens(windows, None)
    return ValTokens(windows, len(tokenizer.decode(stream[1:].tolist()).encode("utf-8")))


def score_val_tokens(setup: TrainSetup, params: Params, val: ValTokens) -> ValScore:
    """Mean loss per token of `params` on `val` (batches of the run's batch size), and bits per byte.

    `setup` is the run's `TrainSetup`: its compiled eval step takes the full batches, a jitted one the rest.
    """
    start = time.perf_counter()
    rows = setup.config.batch_size
    rest_step = jax.jit(make_eval_step(setup.graphdef))
    total = 0.0
    for first in range(0, len(val.windows), rows):
        batch = val.windows[first : first + rows]
        step = setup.eval_step if len(batch) == rows else rest_step
        loss = step(params, setup.put_batch(batch))
        host = loss if loss.is_fully_addressable else loss.addressable_data(0)
        total += float(np.asarray(host)) * len(batch)
    mean = total / len(val.windows)
    if not math.isfinite(mean):  # diverged weights (a run that skipped non-finite updates)
        return ValScore(None, None, val.scored, time.perf_counter() - start)
    bpb = mean * val.scored / math.log(2) / val.bytes if val.bytes else None
    return ValScore(mean, bpb, val.scored, time.perf_counter() - start)
