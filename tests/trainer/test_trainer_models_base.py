"""What every architecture's model config shares (models/base.py): presets, FLOPs per token from the matmul
count, and the frame of the Hugging Face config.json."""

import pytest

from tradewind.runs import GPT2Config, LlamaConfig, model_config


def test_presets_fill_the_shape_and_explicit_fields_override_them():
    config = model_config(preset="llama-1b", n_layers=2)
    assert (config.d_model, config.n_layers, config.n_kv_heads, config.d_ff) == (2048, 2, 8, 8192)
    assert model_config(preset="gpt2-small").type == "gpt2"
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        model_config(preset="huge")


@pytest.mark.parametrize(("preset", "low", "high"), [("nano", 0.5e6, 2e6), ("llama-1b", 0.9e9, 1.3e9)])
def test_presets_span_about_a_million_to_a_billion_parameters(preset, low, high):
    vocab = 258 if preset == "nano" else 32_000
    assert low <= model_config(preset=preset, vocab_size=vocab).count_params() <= high


def test_the_350m_preset_has_heads_as_wide_as_a_tpus_matrix_unit_and_the_parameters_of_64_wide_ones():
    # 64-wide heads fill half of a TPU's 128-wide matrix unit: on a v5e the 350M ran at 52.8% MFU in 16 heads of
    # 64 and at 72.3% in 8 of 128 (docs/reports/benchmarks.md); the split does not change a weight's shape.
    preset = model_config(preset="llama-350m", vocab_size=32768)
    assert (preset.d_model // preset.n_heads, preset.n_heads // preset.n_kv_heads) == (128, 2)
    narrow = model_config(preset="llama-350m", vocab_size=32768, n_heads=16, n_kv_heads=8)
    assert preset.count_params() == narrow.count_params()


def test_flops_per_token_is_six_times_matmul_weights_plus_the_attention_term():
    config = model_config(vocab_size=100, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)
    matmul = 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 64 * 100
    assert config.flops_per_token(seq_len=256) == 6 * matmul + 12 * 2 * 64 * 256


def test_flops_per_token_counts_the_query_heads_width_when_the_head_width_is_its_own():
    config = model_config(
        type="qwen3", vocab_size=100, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_head=32, d_ff=128
    )
    q, kv = 4 * 32, 2 * 32  # query and key/value widths: wider than d_model
    matmul = 2 * (2 * 64 * q + 2 * 64 * kv + 3 * 64 * 128) + 64 * 100
    assert config.flops_per_token(seq_len=256) == 6 * matmul + 12 * 2 * q * 256


def test_flops_per_token_of_gpt2_is_the_same_formula_over_its_own_matmul_weights():
    config = GPT2Config(vocab_size=100, d_model=64, n_layers=2, n_heads=4, d_ff=128)
    matmul = 2 * (4 * 64 * 64 + 2 * 64 * 128) + 64 * 100  # qkv and out; MLP in and out; the output head
    assert config.flops_per_token(seq_len=256) == 6 * matmul + 12 * 2 * 64 * 256


@pytest.mark.parametrize(
    ("config", "architecture", "model_type"),
    [
        (LlamaConfig(vocab_size=300, tie_embeddings=False, init_std=0.01), "LlamaForCausalLM", "llama"),
        (GPT2Config(vocab_size=300, tie_embeddings=True, init_std=0.03), "GPT2LMHeadModel", "gpt2"),
        (model_config(type="mistral", vocab_size=300, tie_embeddings=False), "MistralForCausalLM", "mistral"),
        (model_config(type="qwen2", vocab_size=300, tie_embeddings=True), "Qwen2ForCausalLM", "qwen2"),
        (model_config(type="qwen3", vocab_size=300, tie_embeddings=False), "Qwen3ForCausalLM", "qwen3"),
    ],
    ids=["llama", "gpt2", "mistral", "qwen2", "qwen3"],
)
def test_the_hf_config_names_the_architecture_and_carries_the_shared_fields(config, architecture, model_type):
    hf = config.hf_config()
    assert (hf["architectures"], hf["model_type"]) == ([architecture], model_type)
    assert (hf["vocab_size"], hf["tie_word_embeddings"]) == (300, config.tie_embeddings)
    assert (hf["initializer_range"], hf["torch_dtype"]) == (config.init_std, "float32")
