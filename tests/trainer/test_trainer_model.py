"""Every registered model maps tokens to causal next-token logits; the Llama pieces compute what they claim."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tradewind.core import ConfigError
from tradewind.runs import ARCHITECTURES, model_config
from tradewind.runs.flops import cpu_peak_flops, peak_flops
from tradewind.trainer import build_model, count_params
from tradewind.trainer.models.layers import RMSNorm, apply_rotary, causal_attention, masked_attention, rotary_angles

TINY = {"vocab_size": 61, "d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 16}


def tiny_model(model_type: str, **overrides) -> nnx.Module:
    return build_model(model_config(type=model_type, **{**TINY, **overrides}), rngs=nnx.Rngs(0))


@nnx.jit
def forward(model: nnx.Module, tokens: jax.Array) -> jax.Array:
    return model(tokens)


def random_tokens(seed: int, shape=(2, 12)) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), shape, 0, TINY["vocab_size"], dtype=jnp.int32)


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_model_maps_int_tokens_to_float32_logits_over_the_vocabulary(model_type):
    logits = forward(tiny_model(model_type), random_tokens(0))
    assert logits.shape == (2, 12, TINY["vocab_size"])
    assert logits.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logits)))


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_changing_a_later_token_leaves_the_logits_of_earlier_positions_unchanged(model_type):
    model = tiny_model(model_type)
    tokens = random_tokens(1)
    changed = tokens.at[:, 7].set((tokens[:, 7] + 1) % TINY["vocab_size"])
    before, after = forward(model, tokens), forward(model, changed)
    np.testing.assert_allclose(before[:, :7], after[:, :7], rtol=0, atol=1e-6)
    # The change does reach position 7 and later, so the check above is not vacuous.
    assert float(jnp.max(jnp.abs(before[:, 7:] - after[:, 7:]))) > 1e-4


def test_attention_in_query_halves_equals_attention_over_the_whole_masked_score_matrix():
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (2, 16, 4, 8))  # 4 query heads over 2 key/value heads
    k, v = (jax.random.normal(key, (2, 16, 2, 8)) for key in keys[1:])
    positions = jnp.arange(16)
    halves = causal_attention(q, k, v, positions, positions)
    whole = masked_attention(q, k, v, positions, positions)
    np.testing.assert_allclose(halves, whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_sequences_longer_than_max_seq_len_are_refused(model_type):
    with pytest.raises(ValueError, match="max_seq_len"):
        forward(tiny_model(model_type), random_tokens(0, shape=(1, TINY["max_seq_len"] + 1)))


def test_building_a_model_without_a_vocab_size_is_refused():
    with pytest.raises(ConfigError, match="vocab_size"):
        build_model(model_config(**{**TINY, "vocab_size": None}), rngs=nnx.Rngs(0))


def test_rotary_query_key_products_depend_only_on_the_distance_between_positions():
    head_dim = 8
    q = jax.random.normal(jax.random.key(0), (1, 1, 1, head_dim))
    k = jax.random.normal(jax.random.key(1), (1, 1, 1, head_dim))

    def score(q_pos: int, k_pos: int) -> float:
        q_cos, q_sin = rotary_angles(jnp.array([q_pos]), head_dim, 10000.0)
        k_cos, k_sin = rotary_angles(jnp.array([k_pos]), head_dim, 10000.0)
        return float(jnp.sum(apply_rotary(q, q_cos, q_sin) * apply_rotary(k, k_cos, k_sin)))

    np.testing.assert_allclose(score(5, 2), score(105, 102), rtol=1e-4)
    np.testing.assert_allclose(score(0, 0), float(jnp.sum(q * k)), rtol=1e-5)
    assert abs(score(5, 2) - score(5, 4)) > 1e-3  # a different distance gives a different score


def test_rms_norm_divides_by_the_root_mean_square_and_applies_the_scale():
    norm = RMSNorm(4, eps=1e-6)
    norm.scale[...] = jnp.array([1.0, 2.0, 0.5, -1.0])
    x = np.array([[1.0, -2.0, 3.0, 4.0], [0.1, 0.2, 0.3, 0.4]], dtype=np.float32)
    expected = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-6) * np.array([1.0, 2.0, 0.5, -1.0])
    np.testing.assert_allclose(norm(jnp.asarray(x)), expected, rtol=1e-5)


def test_llama_has_the_parameter_count_of_its_shape_and_untied_adds_an_output_matrix():
    vocab, d, layers, ff = TINY["vocab_size"], TINY["d_model"], TINY["n_layers"], model_config(**TINY).ff_dim
    per_block = 4 * d * d + 3 * d * ff + 2 * d  # q, k, v, o; gate, up, down; two norm scales
    tied = vocab * d + layers * per_block + d
    assert count_params(tiny_model("llama")) == tied
    assert count_params(tiny_model("llama", tie_embeddings=False)) == tied + d * vocab


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "llama", "n_heads": 4, "n_kv_heads": 2},
        {"type": "llama", "n_heads": 4, "n_kv_heads": 1, "tie_embeddings": False},
        {"type": "gpt2", "n_heads": 4},
        {"type": "gpt2", "n_heads": 2, "tie_embeddings": False, "d_ff": 80},
    ],
)
def test_the_analytic_parameter_count_equals_the_built_models(fields):
    config = model_config(vocab_size=258, d_model=32, n_layers=2, max_seq_len=64, **fields)
    assert config.count_params() == count_params(build_model(config, rngs=nnx.Rngs(0)))


def test_grouped_query_attention_shrinks_the_key_and_value_projections():
    config = model_config(vocab_size=258, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2)
    model = build_model(config, rngs=nnx.Rngs(0))
    assert model.blocks[0].attn.k_proj.kernel.shape == (32, 16)
    assert model.blocks[0].attn.q_proj.kernel.shape == (32, 32)
    with pytest.raises(ValueError, match="divisible by n_kv_heads"):
        model_config(n_heads=4, n_kv_heads=3)


def test_peak_flops_come_from_the_table_for_accelerators_and_an_estimate_for_cpus():
    assert peak_flops("NVIDIA H100 80GB HBM3", 16)[0] == 989e12
    assert peak_flops("TPU v5 lite", 1)[0] == 197e12
    flops, source = peak_flops("cpu", 4)
    assert flops > 0 and "estimate" in source and "GHz" in source


def test_cpu_peak_estimate_reads_vector_width_and_clock_from_cpuinfo():
    avx512 = "processor\t: 0\ncpu MHz\t\t: 2600.000\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n"
    flops, source = cpu_peak_flops(2, cpuinfo=avx512)
    assert flops == 2 * 2 * 2 * 16 * 2.6e9
    assert "16 float32 lanes (avx512f)" in source and "2.60 GHz (cpu MHz in /proc/cpuinfo)" in source
    avx2 = "cpu MHz\t\t: 3000.0\nflags\t\t: fpu sse2 avx avx2 fma\n"
    assert cpu_peak_flops(1, cpuinfo=avx2)[0] == 2 * 2 * 8 * 3.0e9
    arm = "Features\t: fp asimd evtstrm\n"  # no clock listed: assumed 3 GHz, and the sentence says so
    flops, source = cpu_peak_flops(4, cpuinfo=arm)
    assert flops == 4 * 2 * 2 * 4 * 3.0e9 and "(assumed)" in source
    flops, source = cpu_peak_flops(1, cpuinfo="")  # no /proc/cpuinfo at all
    assert flops == 2 * 2 * 8 * 3.0e9 and "avx2, assumed" in source and "(assumed)" in source
