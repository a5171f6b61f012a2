"""The final evaluation every run ends with: its loss on the dataset's fixed val tokens, in nats and in bits
per byte.

The set is the first `val_tokens` tokens of the val split (the dataset's `TokenizeConfig.val_tokens`, at most
the split), as the val loader's first windows of the run's `seq_len`: the same tokens for every run on the
dataset whatever its batch size, so the metric compares runs. (A dataset with a loss mask, such as chat, packs
whole records into its windows and scores only the tokens the mask marks.) Bits per byte divide the summed loss
(in bits) by the UTF-8 bytes of the text the scored tokens decode to, so tokenizers with other vocabularies
compare too.

    windows [n, seq_len + 1] -> full batches (the run's compiled eval step) + the rest (one more compilation)
    -> val_loss = mean loss per scored token; val_bpb = val_loss * scored tokens / ln 2 / bytes
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import jax
import numpy as np

from tradewind.core import InvalidInputError, TradewindError
from tradewind.data import DocumentBatch, TokenCache
from tradewind.runs.batches import split_loader
from tradewind.runs.flops import block_logits
from tradewind.trainer.setup import TrainSetup
from tradewind.trainer.step import Batch, Params, make_eval_step


@dataclass(frozen=True)
class ValTokens:
    """The windows of the fixed val token set, and the UTF-8 bytes of the text their targets decode to."""

    windows: Batch  # [n, seq_len + 1] (the val loader's first n windows, in order), or a DocumentBatch of such
    bytes: int | None  # None when the dataset's tokenizer cannot be loaded here

    @property
    def scored(self) -> int:
        """Tokens predicted and scored."""
        return len(scored_targets(self.windows))


def scored_targets(windows: Batch) -> np.ndarray:
    """The targets a batch of windows scores, in order (1-D): every window's last seq_len tokens, or those its
    loss mask marks."""
    if isinstance(windows, DocumentBatch):
        return windows.tokens[:, 1:][windows.loss_mask[:, 1:] > 0]
    return windows[:, 1:].ravel()


@dataclass(frozen=True)
class ValScore:
    """The final evaluation: mean loss per token and bits per byte (None when not finite), tokens, seconds."""

    loss: float | None
    bits_per_byte: float | None
    tokens: int
    seconds: float


def fixed_val_tokens(cache: TokenCache, seq_len: int, rows_multiple: int = 1) -> ValTokens | None:
    """The fixed val token set of `cache` in windows of `seq_len` (a multiple of `rows_multiple` of them, so
    they shard over the mesh); None when the val split holds no whole window, or nothing in it is scored."""
    try:
        loader = split_loader(cache, "val", 1, seq_len, 0, shuffle=False)  # window i is batch i
    except InvalidInputError:
        return None
    count = min(cache.manifest.val_tokens // seq_len, loader.num_windows) // rows_multiple * rows_multiple
    if count <= 0:
        return None
    windows = jax.tree.map(lambda *rows: np.concatenate(rows), *(loader.batch(i) for i in range(count)))
    if not len(scored_targets(windows)):  # records whose masks mark nothing
        return None
    try:
        tokenizer = cache.tokenizer()
    except (TradewindError, OSError) as error:  # a hub tokenizer offline, a tokenizer.json on another host
        print(f"val_bpb: no tokenizer to count the val text's bytes ({error}); val_loss only", flush=True)
        return ValTokens(windows, None)
    return ValTokens(windows, len(tokenizer.decode(scored_targets(windows).tolist()).encode("utf-8")))


def score_val_tokens(setup: TrainSetup, params: Params, val: ValTokens) -> ValScore:
    """Mean loss per token of `params` on `val` (batches of the run's batch size), and bits per byte.

    `setup` is the run's `TrainSetup`: its compiled eval step takes the full batches, a jitted one the rest.
    """
    start = time.perf_counter()
    rows = setup.config.batch_size
    rest_step = jax.jit(make_eval_step(setup.eval_graphdef, block_logits(setup.mesh.devices.flat[0].platform)))
    total = 0.0
    count = len(jax.tree.leaves(val.windows)[0])
    for first in range(0, count, rows):
        batch = jax.tree.map(lambda windows, first=first: windows[first : first + rows], val.windows)
        step = setup.eval_step if count - first >= rows else rest_step
        loss = step(params, setup.put_batch(batch), setup.frozen)
        host = loss if loss.is_fully_addressable else loss.addressable_data(0)
        total += float(np.asarray(host)) * len(scored_targets(batch))  # the batch's mean, weighed by its targets
    mean = total / val.scored
    if not math.isfinite(mean):  # diverged weights (a run that skipped non-finite updates)
        return ValScore(None, None, val.scored, time.perf_counter() - start)
    bpb = mean * val.scored / math.log(2) / val.bytes if val.bytes else None
    return ValScore(mean, bpb, val.scored, time.perf_counter() - start)
