"""Hugging Face interop: an exported run (Llama or GPT-2) loads in `transformers` with the same logits and
tokenizer, and HF weights are only loaded into the model their config.json describes."""

import json

import jax
import numpy as np
import pytest
from flax import nnx
from hf_models import TOKENS, flat, logits_with_weights, transformers_folder, transformers_logits

from tradewind.core import ConfigError, NotFoundError
from tradewind.data import build_token_cache, load_tokenizer, train_bpe_tokenizer
from tradewind.runs import GPT2Config, RunLayout, model_config, read_record
from tradewind.runs.hf import check_matches_hf, model_for_init_from, read_hf_config, weights_digest
from tradewind.runs.models.configs import Llama3RopeScaling
from tradewind.trainer import train
from tradewind.trainer.export import export_hf
from tradewind.trainer.hf import load_hf_params, read_hf_tensors, read_safetensors, write_hf_model, write_safetensors
from tradewind.trainer.models import build_model, init_cache
from tradewind.trainer.restore import load_run_model
from tradewind.trainer.setup import setup_training

# Llama 3's rotary base and norm epsilon, both unlike ModelConfig's defaults, on random weights large
# enough (init_std 0.1) that either setting moves the logits far beyond the comparison's tolerance.
LLAMA3_STYLE = model_config(
    vocab_size=258,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    max_seq_len=64,
    rope_theta=500000.0,
    norm_eps=1e-5,
    tie_embeddings=False,
    init_std=0.1,
)
# GPT-2 with untied output weights and its own LayerNorm epsilon, also far from the defaults.
GPT2_STYLE = GPT2Config(
    vocab_size=258, d_model=32, n_layers=2, n_heads=4, max_seq_len=64, norm_eps=1e-5, tie_embeddings=False, init_std=0.1
)
# The same shape with the defaults a run config falls back to.
DEFAULTS_SAME_SHAPE = LLAMA3_STYLE.model_copy(update={"rope_theta": 10000.0, "norm_eps": 1e-6})
TEXTS = ["plain ASCII, don't stop .", "é, naïve café", "emoji 🎉🚀 and CJK 中文字符", "  spaces\n\nnewlines\ttab \r\n"]


def assert_auto_tokenizer_matches(folder, tokenizer, eos_id, bos_id):
    """`AutoTokenizer` loads `folder` as `tokenizer`: same ids for TEXTS, text back on decoding, same EOS/BOS."""
    transformers = pytest.importorskip("transformers")
    loaded = transformers.AutoTokenizer.from_pretrained(folder)
    for text in TEXTS:
        ids = loaded.encode(text, add_special_tokens=False)
        assert ids == tokenizer.encode_batch([text])[0], text
        assert loaded.decode(ids) == text
    assert (loaded.eos_token_id, loaded.bos_token_id) == (eos_id, bos_id)


def random_hf_folder(folder, config, seed):
    """An HF folder (config.json, model.safetensors) of a model built from `config` with random weights."""
    params = nnx.to_pure_dict(nnx.state(build_model(config, rngs=nnx.Rngs(seed)), nnx.Param))
    write_hf_model(folder, config, params)
    return folder


@pytest.fixture(scope="module")
def llama3_folder(tmp_path_factory):
    return random_hf_folder(tmp_path_factory.mktemp("hf") / "llama3", LLAMA3_STYLE, seed=1)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    return random_hf_folder(tmp_path_factory.mktemp("hf") / "gpt2", GPT2_STYLE, seed=2)


@pytest.fixture(scope="module")
def gqa_run(tiny_config, tmp_path_factory):
    """A finished 6-step run of an untied, grouped-query Llama."""
    config = tiny_config(
        steps=6, eval_every=6, model={"n_heads": 4, "n_kv_heads": 2, "tie_embeddings": False}, tensorboard=False
    )
    run_dir = tmp_path_factory.mktemp("hf") / "run"
    train(config, run_dir)
    return run_dir


def test_safetensors_files_round_trip_names_shapes_and_values(tmp_path):
    tensors = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.full((5,), -1.5, np.float32)}
    write_safetensors(tmp_path / "m.safetensors", tensors)
    back = read_safetensors(tmp_path / "m.safetensors")
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(back[name], value)


def test_init_from_takes_rope_theta_norm_eps_and_shape_from_the_folders_config(llama3_folder):
    model = model_for_init_from(model_config(), set(), llama3_folder)

    assert (model.rope_theta, model.norm_eps) == (500000.0, 1e-5)
    assert model == read_hf_config(llama3_folder)
    assert (model.vocab_size, model.d_model, model.n_kv_heads, model.tie_embeddings) == (258, 32, 2, False)


def test_init_from_keeps_agreeing_fields_a_shorter_max_seq_len_and_init_std(llama3_folder):
    requested = model_config(rope_theta=500000.0, n_heads=4, max_seq_len=32, init_std=0.01)

    model = model_for_init_from(requested, requested.model_fields_set, llama3_folder)

    assert (model.max_seq_len, model.init_std, model.rope_theta, model.d_model) == (32, 0.01, 500000.0, 32)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"rope_theta": 10000.0},
            r"model\.rope_theta is 10000\.0 but \S+config\.json has 500000\.0: remove "
            r"model\.rope_theta or set it to 500000\.0",
        ),
        (
            {"norm_eps": 1e-6, "d_model": 64},
            r"model\.d_model is 64 .*: remove model\.d_model or set it to 32; "
            r"model\.norm_eps is 1e-06 .* has 1e-05: remove model\.norm_eps or set it to 1e-05",
        ),
        ({"max_seq_len": 128}, r"model\.max_seq_len is 128 .*set it to at most 64"),
        ({"preset": "nano"}, r"remove model\.d_model and model\.preset or set it to 32"),
    ],
)
def test_init_from_refuses_a_field_the_user_set_to_another_value_naming_it_and_the_fix(llama3_folder, fields, message):
    requested = model_config(**fields)

    with pytest.raises(ConfigError, match=message):
        model_for_init_from(requested, requested.model_fields_set, llama3_folder)


def test_loading_hf_weights_into_another_model_config_is_refused_naming_every_difference(llama3_folder):
    with pytest.raises(
        ConfigError, match=r"model\.norm_eps is 1e-06 .* 1e-05; model\.rope_theta is 10000\.0 .* 500000\.0"
    ):
        check_matches_hf(DEFAULTS_SAME_SHAPE, llama3_folder)
    check_matches_hf(LLAMA3_STYLE.model_copy(update={"vocab_size": None, "max_seq_len": 32}), llama3_folder)


def test_a_gpt2_folder_reads_back_as_the_gpt2_config_and_the_same_weights(gpt2_folder):
    params = nnx.to_pure_dict(nnx.state(build_model(GPT2_STYLE, rngs=nnx.Rngs(2)), nnx.Param))

    config, pure = load_hf_params(gpt2_folder)

    # The folder states the MLP width; init_std is not HF's to say.
    assert config == GPT2_STYLE.model_copy(update={"d_ff": GPT2_STYLE.ff_dim, "init_std": 0.02})
    assert jax.tree.structure(pure) == jax.tree.structure(params)
    for ours, back in zip(jax.tree.leaves(params), jax.tree.leaves(pure), strict=True):
        np.testing.assert_array_equal(np.asarray(ours), back)


def test_init_from_a_gpt2_folder_refuses_a_llama_only_field_the_user_set(gpt2_folder):
    assert model_for_init_from(model_config(), set(), gpt2_folder).type == "gpt2"
    requested = model_config(n_kv_heads=2)

    with pytest.raises(ConfigError, match=r"describes a 'gpt2' model, which has no model\.n_kv_heads; remove it"):
        model_for_init_from(requested, requested.model_fields_set, gpt2_folder)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_parameters": {"rope_type": "yarn", "factor": 8.0}}, "rope_type 'yarn' is not supported"),
        (
            {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0}},
            r"rope_parameters of rope_type 'llama3': .*high_freq_factor \(4\.0\) must exceed low_freq_factor",
        ),
        ({"hidden_act": "gelu"}, "hidden_act is 'gelu'"),
        ({"attention_bias": True}, "attention_bias is True; Tradewind implements only False"),
        ({"head_dim": 15}, r"head_dim: Value error, d_head \(15\) must be even"),
        ({"num_attention_heads": 3}, r"num_attention_heads: Value error, d_model \(32\) must be divisible"),
        (
            {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]},
            r"model_type 'phi3' \(Phi3ForCausalLM\) is not one of 'llama', 'gpt2', 'mistral', 'qwen2', 'qwen3'",
        ),
    ],
)
def test_an_hf_config_tradewind_cannot_build_is_refused_naming_the_key(tmp_path, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA3_STYLE.hf_config(), **change}))

    with pytest.raises(ConfigError, match=rf"config\.json: {message}"):
        read_hf_config(tmp_path)


@pytest.mark.slow
def test_a_model_built_from_the_resolved_config_gives_transformers_logits_on_the_folder(llama3_folder):
    theirs = transformers_logits(llama3_folder, TOKENS)

    resolved = model_for_init_from(model_config(), set(), llama3_folder)

    np.testing.assert_allclose(logits_with_weights(resolved, llama3_folder, TOKENS), theirs, rtol=1e-4, atol=1e-4)
    # What training with the run config's defaults did: the same weights give other logits.
    assert np.abs(logits_with_weights(DEFAULTS_SAME_SHAPE, llama3_folder, TOKENS) - theirs).max() > 1e-2


# Llama 3.1: its rotary scaling, over an original context short enough (16) that it changes every frequency.
LLAMA31 = {
    "model_type": "llama",
    "vocab_size": 258,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.1,
    "tie_word_embeddings": False,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
}


@pytest.mark.slow
def test_a_llama_3_1_folder_saved_by_transformers_imports_with_its_rope_scaling_and_exports_bitwise(tmp_path):
    folder = transformers_folder(tmp_path / "llama31", LLAMA31)
    theirs = transformers_logits(folder, TOKENS)

    resolved = model_for_init_from(model_config(), set(), folder)
    assert resolved.rope_scaling == Llama3RopeScaling(factor=8.0, original_max_position_embeddings=16)
    np.testing.assert_allclose(logits_with_weights(resolved, folder, TOKENS), theirs, rtol=1e-4, atol=1e-4)
    unscaled = resolved.model_copy(update={"rope_scaling": None})
    assert np.abs(logits_with_weights(unscaled, folder, TOKENS) - theirs).max() > 1e-2

    config, params = load_hf_params(folder)
    write_hf_model(tmp_path / "exported", config, params)
    again, params_again = load_hf_params(tmp_path / "exported")
    assert again == config
    for (name, ours), (_, back) in zip(flat(params), flat(params_again), strict=True):
        assert np.array_equal(np.asarray(ours), np.asarray(back)), name
    np.testing.assert_allclose(transformers_logits(tmp_path / "exported", TOKENS), theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_folder_saved_in_shards_imports_from_its_index_and_a_missing_shard_is_named(tmp_path):
    folder = transformers_folder(tmp_path / "sharded", LLAMA31, max_shard_size="50KB")
    shards = sorted(set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values()))
    assert len(shards) > 1 and not (folder / "model.safetensors").exists()

    resolved = model_for_init_from(model_config(), set(), folder)
    theirs = transformers_logits(folder, TOKENS)
    np.testing.assert_allclose(logits_with_weights(resolved, folder, TOKENS), theirs, rtol=1e-4, atol=1e-4)

    (folder / shards[-1]).unlink()
    with pytest.raises(NotFoundError, match=rf"index\.json names the shard {shards[-1]}, which is not in"):
        load_hf_params(folder)


@pytest.mark.slow
def test_a_gpt2_folder_gives_transformers_logits_in_tradewind(gpt2_folder):
    assert json.loads((gpt2_folder / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]
    theirs = transformers_logits(gpt2_folder, TOKENS)

    resolved = model_for_init_from(model_config(), set(), gpt2_folder)

    np.testing.assert_allclose(logits_with_weights(resolved, gpt2_folder, TOKENS), theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_exported_llama_loads_in_transformers_and_matches_the_trainers_logits(gqa_run, tmp_path):
    out = export_hf(gqa_run, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    loaded = load_run_model(gqa_run)
    ours = np.asarray(nnx.merge(loaded.graphdef, loaded.params)(TOKENS))
    np.testing.assert_allclose(transformers_logits(out, TOKENS), ours, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_the_export_of_a_byte_tokenizer_run_loads_in_auto_tokenizer(gqa_run, tmp_path):
    out = export_hf(gqa_run, tmp_path / "hf")

    assert_auto_tokenizer_matches(out, load_tokenizer("byte"), eos_id=256, bos_id=257)


@pytest.mark.slow
def test_the_export_of_a_bpe_tokenizer_run_loads_in_auto_tokenizer(small_corpus, tiny_config, tmp_path):
    tokenizer = train_bpe_tokenizer([small_corpus.read_text()], 300, tmp_path / "tokenizer.json")
    build_token_cache([small_corpus], tmp_path / "cache", tokenizer)
    train(
        tiny_config(dataset=str(tmp_path / "cache"), steps=2, eval_every=2, eval_batches=1, tensorboard=False),
        tmp_path / "run",
    )

    out = export_hf(tmp_path / "run", tmp_path / "hf")

    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "tokenizer.json").read_bytes()
    assert_auto_tokenizer_matches(out, tokenizer, eos_id=tokenizer.eos_id, bos_id=tokenizer.bos_id)


@pytest.mark.slow
def test_imported_weights_start_training_with_the_exported_parameters(gqa_run, tiny_config, tmp_path):
    out = export_hf(gqa_run, tmp_path / "hf")
    imported_config, pure = load_hf_params(out)
    assert imported_config.n_kv_heads == 2 and not imported_config.tie_embeddings
    loaded = load_run_model(gqa_run)
    config = tiny_config(init_from=str(out), model={"n_heads": 4, "n_kv_heads": 2, "tie_embeddings": False})
    setup = setup_training(config, initial_params=pure)
    ours, theirs = nnx.to_pure_dict(setup.state.params), nnx.to_pure_dict(loaded.params)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_a_scanned_run_exports_per_layer_imports_stacked_and_decodes_with_a_cache(tiny_config, tmp_path):
    model = {"n_heads": 4, "n_kv_heads": 2, "tie_embeddings": False}
    config = tiny_config(steps=3, eval_every=3, scan_layers=True, model=model, tensorboard=False)
    train(config, tmp_path / "run")
    out = export_hf(tmp_path / "run", tmp_path / "hf")
    loaded = load_run_model(tmp_path / "run")
    scanned = nnx.merge(loaded.graphdef, loaded.params)
    ours = np.asarray(scanned(TOKENS))
    np.testing.assert_allclose(transformers_logits(out, TOKENS), ours, rtol=1e-4, atol=1e-4)
    # Sampling's path: token by token through a key/value cache, each stacked layer in turn.
    cache = init_cache(loaded.model_config, 1, TOKENS.shape[1])
    for position in range(TOKENS.shape[1]):
        step_logits, cache = scanned(TOKENS[:, position : position + 1], cache)
    np.testing.assert_allclose(np.asarray(step_logits[0, -1]), ours[0, -1], rtol=1e-4, atol=1e-4)
    # init_from a per-layer Hugging Face folder into a scanned run: the same weights, stacked.
    _, pure = load_hf_params(out)
    setup = setup_training(config.model_copy(update={"init_from": str(out)}), initial_params=pure)
    for a, b in zip(jax.tree.leaves(setup.state.params), jax.tree.leaves(loaded.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_importing_weights_of_another_shape_names_the_parameter(gqa_run, tiny_config, tmp_path):
    out = export_hf(gqa_run, tmp_path / "hf")
    _, pure = load_hf_params(out)
    with pytest.raises(ConfigError, match=r"init_from: parameter .*k_proj.* has shape"):
        setup_training(tiny_config(model={"n_heads": 4, "tie_embeddings": False}), initial_params=pure)


@pytest.mark.slow
def test_a_lora_run_records_its_bases_digest_and_refuses_to_resume_or_export_on_another_base(
    gqa_run, tiny_config, tmp_path
):
    base = export_hf(gqa_run, tmp_path / "base")
    shape = {"n_heads": 4, "n_kv_heads": 2, "tie_embeddings": False}
    lora = {"rank": 2, "targets": ["q_proj", "v_proj"]}

    def config(steps):
        return tiny_config(steps=steps, eval_every=4, init_from=str(base), model=shape, lora=lora, tensorboard=False)

    run = tmp_path / "lora"
    train(config(4), run)
    assert read_record(RunLayout(run).record).base_digest == weights_digest(base)
    export_hf(run, tmp_path / "merged")  # on its own base: exported

    tensors = read_hf_tensors(base)  # the base changes under the run: one weight moves
    name = sorted(tensors)[0]
    write_safetensors(base / "model.safetensors", {**tensors, name: tensors[name] + 1.0})
    with pytest.raises(ConfigError, match=r"is not the one run lora trained its LoRA adapters on \(weights sha256"):
        export_hf(run, tmp_path / "again")
    RunLayout(run).summary.unlink()  # an unfinished run: training it again resumes it
    with pytest.raises(ConfigError, match="is not the one this run trained its LoRA adapters on"):
        train(config(8), run)
    assert "put that base back" in read_record(RunLayout(run).record).reason
