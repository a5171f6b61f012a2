"""Packed documents through the model and the loss: attention never crosses a document, positions restart per
document, and only the targets a loss mask marks are scored (a chat's assistant tokens)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tradewind.data import DocumentBatch
from tradewind.runs import model_config
from tradewind.trainer.models import build_model
from tradewind.trainer.step import loss_and_grads, next_token_loss

LLAMA = model_config(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=256)
GPT2 = model_config(type="gpt2", vocab_size=64, d_model=32, n_layers=2, n_heads=4, max_seq_len=256)


def packed_row(lengths, seq, seed=0):
    """One row of documents of `lengths` packed back to back and padded to `seq`: (tokens, segments, positions)."""
    rng = np.random.default_rng(seed)
    tokens, segments, positions = np.zeros(seq, np.int32), np.zeros(seq, np.int32), np.zeros(seq, np.int32)
    start = 0
    for number, length in enumerate(lengths, start=1):
        tokens[start : start + length] = rng.integers(1, 64, length)
        segments[start : start + length] = number
        positions[start : start + length] = np.arange(length)
        start += length
    return tokens, segments, positions


@pytest.mark.parametrize(
    ("config", "attention", "scan_layers", "seq"),
    [
        (LLAMA, "reference", False, 32),
        (LLAMA, "reference", True, 32),
        (GPT2, "reference", False, 32),
        (LLAMA, "dot_product", False, 32),
        (LLAMA, "splash_interpret", False, 256),  # splash takes whole 128-token blocks
    ],
    ids=["llama", "llama-scanned", "gpt2", "llama-dot-product", "llama-splash"],
)
def test_each_packed_document_gives_the_hidden_states_it_gives_alone(config, attention, scan_layers, seq):
    lengths = [seq // 2 - 3, seq // 4 + 1, 5]  # the rest of the row is padding
    tokens, segments, positions = packed_row(lengths, seq)
    model = build_model(config, rngs=nnx.Rngs(0), attention=attention, scan_layers=scan_layers)
    reference = build_model(config, rngs=nnx.Rngs(0), scan_layers=scan_layers)  # the same weights
    packed, _ = jax.jit(lambda t, s, p: model.features(t, segments=s, positions=p))(
        tokens[None], segments[None], positions[None]
    )
    start = 0
    for length in lengths:
        alone, _ = reference.features(jnp.asarray(tokens[None, start : start + length]))
        np.testing.assert_allclose(packed[0, start : start + length], alone[0], rtol=0, atol=2e-5)
        start += length


def document_batch(rows=4, seq=32, seed=0):
    rng = np.random.default_rng(seed)
    rows_of = [packed_row([seq // 2, seq // 2 - 4], seq + 1, seed=seed + row) for row in range(rows)]
    tokens, segments, positions = (np.stack(parts) for parts in zip(*rows_of, strict=True))
    first_of_segment = positions == 0
    loss_mask = (rng.random(tokens.shape) < 0.5) & (segments > 0) & ~first_of_segment
    return DocumentBatch(tokens, segments, positions, loss_mask.astype(np.int32))


def test_a_masked_loss_is_the_mean_cross_entropy_of_the_marked_targets_and_its_gradient_is_exact():
    graphdef, params = nnx.split(build_model(LLAMA, rngs=nnx.Rngs(0)))
    batch = document_batch()

    def plain(params):  # the whole logits, then the mean over the marked targets
        model = nnx.merge(graphdef, params)
        hidden, _ = model.features(
            batch.tokens[:, :-1], segments=batch.segments[:, :-1], positions=batch.positions[:, :-1]
        )
        logits = hidden @ model.head_weight()
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(log_probs, batch.tokens[:, 1:, None], axis=-1)[..., 0]
        marked = batch.loss_mask[:, 1:]
        return -jnp.sum(picked * marked) / jnp.sum(marked)

    expected, expected_grads = jax.value_and_grad(plain)(params)
    (loss, grads) = jax.value_and_grad(lambda p: next_token_loss(graphdef, p, batch)[1])(params)
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    unmasked = batch._replace(loss_mask=(batch.segments > 0).astype(np.int32))
    assert float(next_token_loss(graphdef, params, unmasked)[1]) != pytest.approx(float(loss), rel=1e-3)


def test_accumulating_document_batches_gives_the_whole_batchs_mean_over_its_targets():
    graphdef, params = nnx.split(build_model(LLAMA, rngs=nnx.Rngs(0)))
    batch = document_batch(rows=4)
    # The first two rows score fewer targets than the last two: equal weights per microbatch would be wrong.
    batch = batch._replace(loss_mask=batch.loss_mask * (np.arange(4)[:, None] >= 1))
    whole, whole_grads = jax.jit(lambda p, b: loss_and_grads(graphdef, p, b, 1, 0.0))(params, batch)
    loss, grads = jax.jit(lambda p, b: loss_and_grads(graphdef, p, b, 2, 0.0))(params, batch)
    assert float(loss) == pytest.approx(float(whole), rel=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(whole_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
