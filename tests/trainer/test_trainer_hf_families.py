"""The Llama family from Hugging Face: Mistral, Qwen2 and Qwen3 (and Llama with a head width of its own) folders
saved by `transformers` from a config (random weights, no network) import with transformers' logits and loss,
export back bitwise, and the export gives transformers' logits again. A sliding window caps `max_seq_len` where
a layer uses it; what Tradewind does not implement is refused, naming the file and the key; each family decodes
with the key/value cache as it computes a whole sequence."""

import json

import numpy as np
import pytest
from flax import nnx
from hf_models import TOKENS, flat, model_with_weights, saved_by_transformers, transformers_outputs

from tradewind.core import ConfigError
from tradewind.runs.hf import model_config_from_hf
from tradewind.trainer.hf import load_hf_params, write_hf_model
from tradewind.trainer.step import next_token_loss

# A tiny grouped-query shape; initializer_range 0.1 (and every weight jittered, biases and norms too) so that a
# weight in the wrong place moves the logits far beyond the tolerance.
SHAPE = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 50000.0,
    "initializer_range": 0.1,
}
# (HF config, what the imported model config must resolve to): tied and untied heads, each family's own
# weights, and a sliding window wider than TOKENS, within which full attention is exact.
CASES = {
    "mistral": (
        {**SHAPE, "model_type": "mistral", "sliding_window": None, "tie_word_embeddings": False},
        {"type": "mistral", "tie_embeddings": False, "max_seq_len": 64, "head_dim": 16, "kv_heads": 2},
    ),
    "mistral-window": (
        {**SHAPE, "model_type": "mistral", "sliding_window": 16, "tie_word_embeddings": True},
        {"type": "mistral", "tie_embeddings": True, "max_seq_len": 16, "head_dim": 16, "kv_heads": 2},
    ),
    "qwen2": (
        {**SHAPE, "model_type": "qwen2", "tie_word_embeddings": True},
        {"type": "qwen2", "tie_embeddings": True, "max_seq_len": 64, "head_dim": 16, "kv_heads": 2},
    ),
    "qwen3": (
        {**SHAPE, "model_type": "qwen3", "head_dim": 32, "tie_word_embeddings": False},
        {"type": "qwen3", "tie_embeddings": False, "max_seq_len": 64, "head_dim": 32, "kv_heads": 2},
    ),
    "llama-head-dim": (
        {**SHAPE, "model_type": "llama", "head_dim": 8, "tie_word_embeddings": False},
        {"type": "llama", "tie_embeddings": False, "max_seq_len": 64, "head_dim": 8, "kv_heads": 2},
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def saved(request, tmp_path_factory):
    """(case name, folder saved by transformers, its logits and loss for TOKENS)."""
    folder = tmp_path_factory.mktemp("hf") / request.param
    logits, loss = saved_by_transformers(folder, CASES[request.param][0], TOKENS)
    return request.param, folder, logits, loss


def resolved(config):
    """Every field of `config` as the model is built with it (a None `d_head` is d_model / n_heads)."""
    return {name: config.resolved(name) for name in type(config).model_fields}


@nnx.jit
def logits_and_loss(model, tokens):
    """`model`'s logits for `tokens` [batch, seq] and the trainer's mean next-token cross-entropy on them."""
    graphdef, params = nnx.split(model)
    return model(tokens), next_token_loss(graphdef, params, tokens)[1]


@pytest.mark.slow
def test_a_folder_saved_by_transformers_imports_with_its_logits_and_loss(saved):
    name, folder, logits, loss = saved
    config, _ = load_hf_params(folder)
    expected = CASES[name][1]
    assert {field: getattr(config, field) for field in expected} == expected

    ours, our_loss = logits_and_loss(model_with_weights(config, folder), TOKENS)

    np.testing.assert_allclose(np.asarray(ours), logits, rtol=0, atol=1e-4)
    assert float(our_loss) == pytest.approx(loss, abs=1e-5)


@pytest.mark.slow
def test_an_imported_folder_exports_bitwise_and_transformers_gives_the_same_logits(saved, tmp_path):
    _, folder, logits, loss = saved
    config, params = load_hf_params(folder)

    write_hf_model(tmp_path, config, params)

    again, params_again = load_hf_params(tmp_path)
    assert resolved(again) == resolved(config)  # a head width the folder left to be derived is written out
    assert [path for path, _ in flat(params_again)] == [path for path, _ in flat(params)]
    for (path, ours), (_, back) in zip(flat(params), flat(params_again), strict=True):
        assert np.array_equal(np.asarray(ours), np.asarray(back)), path
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [json.loads((folder / "config.json").read_text())["architectures"][0]]
    exported_logits, exported_loss = transformers_outputs(tmp_path, TOKENS)
    np.testing.assert_allclose(exported_logits, logits, rtol=0, atol=1e-5)
    assert exported_loss == pytest.approx(loss, abs=1e-6)


def hf_config(**changes):
    """A config.json of the shape above, with `changes`."""
    return {**SHAPE, **changes}


@pytest.mark.parametrize(
    ("data", "max_seq_len"),
    [
        (hf_config(model_type="mistral", sliding_window=16), 16),
        (hf_config(model_type="mistral", sliding_window=None), 64),
        (hf_config(model_type="mistral", max_position_embeddings=32768), 4096),  # transformers' default window
        (hf_config(model_type="qwen2", use_sliding_window=False, sliding_window=16), 64),
        (hf_config(model_type="qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=1), 16),
        (hf_config(model_type="qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=2), 64),
        (
            hf_config(
                model_type="qwen3", use_sliding_window=True, sliding_window=16, layer_types=["full_attention"] * 2
            ),
            64,
        ),
        (
            hf_config(
                model_type="qwen3",
                use_sliding_window=True,
                sliding_window=16,
                layer_types=["full_attention", "sliding_attention"],
            ),
            16,
        ),
    ],
    ids=[
        "mistral-16",
        "mistral-null",
        "mistral-absent",
        "qwen2-off",
        "qwen2-second-layer",
        "qwen2-no-layer",
        "qwen3-full-layers",
        "qwen3-sliding-layer",
    ],
)
def test_a_sliding_window_caps_max_seq_len_only_where_some_layer_uses_it(data, max_seq_len):
    config = model_config_from_hf(data)

    assert config.max_seq_len == max_seq_len
    # What export writes turns the window off: the model it describes attends as Tradewind's does.
    assert resolved(model_config_from_hf(config.hf_config())) == resolved(config)


def test_an_absent_key_takes_the_default_of_its_family_in_transformers():
    bare = {key: SHAPE[key] for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")}
    bare["num_attention_heads"] = 4

    qwen3 = model_config_from_hf({**bare, "model_type": "qwen3"})
    mistral = model_config_from_hf({**bare, "model_type": "mistral"})

    assert (qwen3.head_dim, qwen3.max_seq_len, qwen3.tie_embeddings, qwen3.rope_theta) == (128, 32768, False, 10000.0)
    assert (mistral.head_dim, mistral.max_seq_len, mistral.kv_heads) == (16, 4096, 4)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (hf_config(model_type="qwen3", attention_bias=True), "attention_bias is True; Tradewind implements only False"),
        (hf_config(model_type="mistral", hidden_act="gelu"), "hidden_act is 'gelu'"),
        (
            hf_config(model_type="qwen2", rope_parameters={"rope_type": "yarn", "factor": 4.0}),
            "rope_type 'yarn' is not supported",
        ),
        (hf_config(model_type="qwen3", head_dim=15), r"head_dim: Value error, d_head \(15\) must be even"),
        (
            {key: value for key, value in hf_config(model_type="mistral").items() if key != "intermediate_size"},
            "no 'intermediate_size'",
        ),
        (
            hf_config(model_type="phi3", architectures=["Phi3ForCausalLM"]),
            r"model_type 'phi3' \(Phi3ForCausalLM\) is not one of 'llama', 'gpt2', 'mistral', 'qwen2', 'qwen3'",
        ),
    ],
    ids=["qwen3-bias", "activation", "rope-type", "odd-head-dim", "missing-key", "unknown-family"],
)
def test_a_family_setting_tradewind_does_not_implement_is_refused_naming_the_file_and_key(data, message):
    with pytest.raises(ConfigError, match=rf"^config\.json: {message}"):
        model_config_from_hf(data)
