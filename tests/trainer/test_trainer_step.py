"""The pure train step: accumulation, z-loss, optimizers, schedules, decay mask, precision, skip policy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tradewind.core import ConfigError
from tradewind.runs import OptimizerConfig, model_config
from tradewind.trainer.models import build_model
from tradewind.trainer.models.layers import per_layer_params, stacked_params
from tradewind.trainer.optimizer import OPTIMIZERS, build_optimizer, build_schedule, decay_mask
from tradewind.trainer.setup import attention_kernel, compute_dtype
from tradewind.trainer.step import loss_and_grads, make_train_step, next_token_loss

CONFIG = model_config(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32)


def split_model(config=CONFIG, dtype=jnp.float32):
    return nnx.split(build_model(config, rngs=nnx.Rngs(0), dtype=dtype))


def batch(rows=8, seq=16, seed=1):
    return np.asarray(jax.random.randint(jax.random.key(seed), (rows, seq + 1), 0, CONFIG.vocab_size), np.int32)


def run_steps(step_fn, params, opt_state, batches, learning_rate=1e-2):
    step_fn = jax.jit(step_fn)
    losses = []
    for tokens in batches:
        params, opt_state, metrics = step_fn(params, opt_state, tokens, learning_rate)
        losses.append(float(metrics["loss"]))
    return params, losses


@pytest.mark.slow
def test_gradient_accumulation_over_four_microbatches_equals_the_full_batch_gradient():
    graphdef, params = split_model()
    tokens = batch()
    full_loss, full_grads = jax.jit(lambda p, b: loss_and_grads(graphdef, p, b, 1, 1e-3))(params, tokens)
    accum_loss, accum_grads = jax.jit(lambda p, b: loss_and_grads(graphdef, p, b, 4, 1e-3))(params, tokens)
    assert float(accum_loss) == pytest.approx(float(full_loss), rel=1e-6)
    for a, b in zip(jax.tree.leaves(accum_grads), jax.tree.leaves(full_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_an_accumulating_train_step_tracks_the_full_batch_step_over_three_updates():
    graphdef, params = split_model()
    optimizer = build_optimizer(OptimizerConfig(learning_rate=1e-2, warmup_steps=0))
    batches = [batch(seed=s) for s in range(3)]
    _, full_losses = run_steps(make_train_step(graphdef, optimizer), params, optimizer.init(params), batches)
    _, accum_losses = run_steps(
        make_train_step(graphdef, optimizer, grad_accum=4), params, optimizer.init(params), batches
    )
    np.testing.assert_allclose(accum_losses, full_losses, rtol=1e-6)


def test_z_loss_adds_the_mean_squared_log_normaliser_to_the_objective():
    graphdef, params = split_model()
    tokens = batch()
    objective, cross_entropy = next_token_loss(graphdef, params, tokens, z_loss=1e-2)
    logits = nnx.merge(graphdef, params)(tokens[:, :-1])
    expected_z = jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
    assert float(objective) == pytest.approx(float(cross_entropy) + 1e-2 * float(expected_z), rel=1e-6)
    assert next_token_loss(graphdef, params, tokens)[0] == cross_entropy


@pytest.mark.slow  # trains each optimizer for 30 steps
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_lowers_the_loss_keeps_float32_and_compiles_once(name):
    graphdef, params = split_model()
    lr = 3e-3 if name == "lion" else 1e-2
    optimizer = build_optimizer(OptimizerConfig(type=name, learning_rate=lr, warmup_steps=0))
    step_fn = jax.jit(make_train_step(graphdef, optimizer), donate_argnums=(0, 1))
    opt_state = optimizer.init(params)
    tokens = batch()
    losses = []
    for _ in range(30):
        params, opt_state, metrics = step_fn(params, opt_state, tokens, lr)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    assert step_fn._cache_size() == 1


@pytest.mark.parametrize(("schedule", "end"), [("cosine", 0.1), ("linear", 0.1), ("constant", 1.0)])
def test_schedules_warm_up_to_the_peak_then_end_where_configured(schedule, end):
    fn = build_schedule(OptimizerConfig(learning_rate=1.0, warmup_steps=10, schedule=schedule), total_steps=100)
    assert float(fn(0)) == 0.0 and float(fn(5)) == pytest.approx(0.5)
    assert float(fn(10)) == pytest.approx(1.0)
    assert float(fn(100)) == pytest.approx(end)
    middle = float(fn(55))
    expected_middle = {"cosine": 0.1 + 0.9 * 0.5, "linear": 0.55, "constant": 1.0}[schedule]
    assert middle == pytest.approx(expected_middle, rel=1e-5)


@pytest.mark.slow
def test_weight_decay_skips_norm_scales_and_biases_but_not_matrices():
    _, params = split_model(model_config(type="gpt2", vocab_size=64, d_model=32, n_layers=1, n_heads=2))
    flat = jax.tree_util.tree_flatten_with_path(decay_mask(nnx.to_pure_dict(params)))[0]
    decayed = {jax.tree_util.keystr(path) for path, value in flat if value}
    assert "['blocks'][0]['fc']['kernel']" in decayed and "['wte']['embedding']" in decayed
    assert not any("bias" in name or "ln_" in name or "scale" in name for name in decayed)

    # A decaying update with zero gradient shrinks the matrices only.
    optimizer = build_optimizer(OptimizerConfig(learning_rate=0.1, warmup_steps=0, weight_decay=0.5))
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(optimizer.update)(zero, optimizer.init(params), params)
    moved = {
        jax.tree_util.keystr(p)
        for p, u in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(updates))[0]
        if np.any(np.asarray(u) != 0)
    }
    assert moved == decayed


def test_precision_policy_keeps_params_float32_and_computes_in_bfloat16_when_asked():
    assert compute_dtype("auto") == jnp.float32  # the tests run on CPU
    graphdef, params = split_model(dtype=jnp.bfloat16)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    model = nnx.merge(graphdef, params)
    hidden = model.blocks[0].mlp.up_proj(jnp.ones((1, 2, 32), jnp.float32))
    assert hidden.dtype == jnp.bfloat16
    assert model(batch()[:, :-1]).dtype == jnp.float32
    loss_bf16 = float(next_token_loss(graphdef, params, batch())[1])
    loss_fp32 = float(next_token_loss(*split_model(), batch())[1])
    assert loss_bf16 == pytest.approx(loss_fp32, rel=2e-2) and loss_bf16 != loss_fp32


@pytest.mark.slow
def test_skip_policy_drops_a_non_finite_update_and_keeps_the_state():
    graphdef, params = split_model()
    optimizer = build_optimizer(OptimizerConfig(warmup_steps=0))
    opt_state = optimizer.init(params)
    poisoned = jax.tree.map(lambda p: p, params)
    poisoned["embed"]["embedding"][...] = poisoned["embed"]["embedding"][...].at[0, 0].set(jnp.nan)
    step_fn = jax.jit(make_train_step(graphdef, optimizer, skip_nonfinite=True))
    new_params, new_state, metrics = step_fn(poisoned, opt_state, batch(), 1e-3)
    assert float(metrics["skipped"]) == 1.0 and not np.isfinite(float(metrics["loss"]))
    for a, b in zip(jax.tree.leaves((new_params, new_state)), jax.tree.leaves((poisoned, opt_state)), strict=True):
        np.testing.assert_array_equal(a, b)
    _, _, metrics = step_fn(params, opt_state, batch(), 1e-3)
    assert float(metrics["skipped"]) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["full", "save_matmuls"])
@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_rematerialising_blocks_changes_no_loss_and_no_gradient(remat, architecture):
    config = model_config(type=architecture, vocab_size=64, d_model=32, n_layers=3, n_heads=4, max_seq_len=32)
    graphdef, params = split_model(config)
    tokens = batch()
    kept_loss, kept_grads = jax.jit(lambda p, b: loss_and_grads(graphdef, p, b, 2, 1e-3))(params, tokens)
    loss, grads = jax.jit(lambda p, b: loss_and_grads(graphdef, p, b, 2, 1e-3, remat))(params, tokens)
    assert abs(float(loss) - float(kept_loss)) <= 1e-6
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(kept_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_remat_of_the_first_blocks_recomputes_those_alone_and_changes_no_loss_and_no_gradient():
    config = model_config(vocab_size=64, d_model=32, n_layers=3, n_heads=4, max_seq_len=32)
    graphdef, params = split_model(config)
    tokens = batch()

    def step(remat):
        return lambda p, b: loss_and_grads(graphdef, p, b, 1, 1e-3, remat)

    def recomputed_blocks(remat) -> int:  # the checkpointed calls in the step's program
        return str(jax.make_jaxpr(step(remat))(params, tokens)).count("remat2[")

    first_block = ("full", "none", "none")
    assert (recomputed_blocks("none"), recomputed_blocks(first_block), recomputed_blocks("full")) == (0, 1, 3)
    kept_loss, kept_grads = jax.jit(step("none"))(params, tokens)
    loss, grads = jax.jit(step(first_block))(params, tokens)
    assert abs(float(loss) - float(kept_loss)) <= 1e-6
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(kept_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


GPT2_CONFIG = model_config(type="gpt2", vocab_size=64, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)
# Splash's code runs in Pallas's interpreter on the CPU; it takes whole 128-token blocks (two here) and groups heads.
SPLASH_CONFIG = model_config(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=256)


@pytest.mark.parametrize(
    ("config", "seq", "attention"),
    [(CONFIG, 16, "dot_product"), (GPT2_CONFIG, 16, "dot_product"), (SPLASH_CONFIG, 256, "splash_interpret")],
    ids=["llama-gqa-dot-product", "gpt2-dot-product", "llama-gqa-splash"],
)
def test_each_attention_kernel_gives_the_reference_loss_and_gradients(config, seq, attention):
    tokens = batch(rows=2, seq=seq)
    results = []
    for implementation in ("reference", attention):
        graphdef, params = nnx.split(build_model(config, rngs=nnx.Rngs(0), attention=implementation))
        results.append(jax.jit(lambda p, b, g=graphdef: loss_and_grads(g, p, b, 1, 1e-3))(params, tokens))
    (reference_loss, reference_grads), (loss, grads) = results
    assert abs(float(loss) - float(reference_loss)) <= 1e-6
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(reference_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_auto_attention_is_cudnn_on_a_gpu_in_16_bit_splash_on_a_tpu_and_the_reference_elsewhere():
    bf16, f32 = jnp.bfloat16, jnp.float32
    cases = [(bf16, 128, "gpu"), (f32, 128, "gpu"), (bf16, 2048, "tpu"), (bf16, 100, "tpu"), (f32, 128, "cpu")]
    assert [attention_kernel("auto", dtype, seq, platform) for dtype, seq, platform in cases] == [
        "dot_product",
        "reference",
        "splash",
        "reference",
        "reference",
    ]
    assert attention_kernel("dot_product", f32, 128, "cpu") == "dot_product"
    assert attention_kernel("splash", f32, 256, "cpu") == "splash_interpret"
    with pytest.raises(ConfigError, match="seq_len 100 is not a multiple of 128"):
        attention_kernel("splash", bf16, 100, "tpu")
    with pytest.raises(ConfigError, match="splash is a TPU kernel"):
        attention_kernel("splash", bf16, 128, "gpu")


@pytest.mark.parametrize(("architecture", "remat"), [("llama", "full"), ("gpt2", "none")])
def test_scanning_the_blocks_changes_no_loss_and_no_gradient(architecture, remat):
    config = model_config(type=architecture, vocab_size=64, d_model=32, n_layers=3, n_heads=4, max_seq_len=32)
    tokens = batch()
    results = []
    for scan_layers in (False, True):
        graphdef, params = nnx.split(build_model(config, rngs=nnx.Rngs(0), scan_layers=scan_layers))
        loss, grads = jax.jit(lambda p, b, g=graphdef: loss_and_grads(g, p, b, 2, 1e-3, remat))(params, tokens)
        results.append((loss, per_layer_params(nnx.to_pure_dict(grads))))  # the scanned model's are stacked
    (unrolled_loss, unrolled_grads), (loss, grads) = results
    assert abs(float(loss) - float(unrolled_loss)) <= 1e-6
    assert jax.tree.structure(grads) == jax.tree.structure(unrolled_grads)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(unrolled_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_a_scanned_model_holds_each_weight_once_stacked_over_its_layers_and_reads_back_per_layer():
    config = model_config(vocab_size=64, d_model=32, n_layers=3, n_heads=4, max_seq_len=32)
    unrolled = nnx.to_pure_dict(nnx.state(build_model(config, rngs=nnx.Rngs(0))))
    scanned = nnx.to_pure_dict(nnx.state(build_model(config, rngs=nnx.Rngs(0), scan_layers=True)))
    assert scanned["blocks"].keys() == {"layer"}
    assert scanned["blocks"]["layer"]["attn"]["q_proj"]["kernel"].shape == (3, 32, 32)
    assert jax.tree.all(jax.tree.map(np.array_equal, per_layer_params(scanned), unrolled))  # the same initial weights
    assert jax.tree.all(jax.tree.map(np.array_equal, stacked_params(unrolled), scanned))


def compiled_dots(n_layers, scan_layers):
    config = model_config(vocab_size=64, d_model=32, n_layers=n_layers, n_heads=4, max_seq_len=32)
    graphdef, params = nnx.split(build_model(config, rngs=nnx.Rngs(0), scan_layers=scan_layers))
    step = jax.jit(lambda p, b: loss_and_grads(graphdef, p, b, 1, 0.0))
    return step.lower(params, batch()).compile().as_text().count(" dot(")


def test_a_scanned_model_compiles_one_block_however_deep_it_is():
    assert compiled_dots(2, scan_layers=True) == compiled_dots(6, scan_layers=True)
    assert compiled_dots(6, scan_layers=False) > compiled_dots(2, scan_layers=False)


def test_splash_with_separate_backward_kernels_gives_the_reference_loss_and_gradients(monkeypatch):
    monkeypatch.setattr("tradewind.trainer.models.layers.SPLASH_FUSED_BACKWARD", False)
    test_each_attention_kernel_gives_the_reference_loss_and_gradients(SPLASH_CONFIG, 256, "splash_interpret")


def test_splash_over_several_blocks_a_row_gives_the_reference_loss_and_gradients(monkeypatch):
    # Blocks of 128 at sequence 256: two query and two key blocks, the one above the diagonal skipped, the fused
    # backward summing dq over key blocks (the chip runs blocks of 1024 at sequence 2048 the same way).
    monkeypatch.setattr("tradewind.trainer.models.layers.SPLASH_BLOCKS", (128,))
    test_each_attention_kernel_gives_the_reference_loss_and_gradients(SPLASH_CONFIG, 256, "splash_interpret")


@pytest.mark.parametrize(("scan_layers", "remat"), [(False, "none"), (True, "full")])
def test_rotating_by_a_matmul_gives_the_losses_and_gradients_of_rotating_by_slices(monkeypatch, scan_layers, remat):
    config = model_config(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32)
    tokens = batch()
    results = []
    for by_matmul in (False, True):
        monkeypatch.setattr("tradewind.trainer.models.layers.ROTATE_BY_MATMUL", by_matmul)
        graphdef, params = nnx.split(build_model(config, rngs=nnx.Rngs(0), scan_layers=scan_layers))
        results.append(jax.jit(lambda p, b, g=graphdef: loss_and_grads(g, p, b, 1, 1e-3, remat))(params, tokens))
    (sliced_loss, sliced_grads), (loss, grads) = results
    assert abs(float(loss) - float(sliced_loss)) <= 1e-6
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(sliced_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
