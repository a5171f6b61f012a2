"""LoRA adapters: a fresh adapter changes nothing, only adapters get gradients, stacked and unrolled models agree,
dropout is a function of the state, and both exports (merged weights, a PEFT folder) give the adapted logits in
`transformers`."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hf_models import require, run_torch_script, transformers_logits
from pydantic import ValidationError

from tradewind.core import ConfigError
from tradewind.runs import GPT2Config, TrainConfig, model_config
from tradewind.runs.config import LoraConfig
from tradewind.trainer import build_model
from tradewind.trainer.hf import load_hf_params, write_hf_model
from tradewind.trainer.lora import (
    FROZEN,
    LoRALinear,
    adapter_state,
    add_adapters,
    advance_dropout,
    count_frozen,
    count_trainable,
    merged_params,
    write_peft_adapter,
)
from tradewind.trainer.models.layers import stacked_params

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Grouped-query attention (k and v narrower than q) and an MLP width unlike d_model, so every projection has
# its own shape; weights large enough (init_std 0.1) that a wrong adapter moves the logits visibly.
CONFIG = model_config(
    vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=16, init_std=0.1
)
TOKENS = np.array([[5, 17, 3, 42, 8, 60, 1, 9, 33, 12]], np.int32)

# A random Llama saved by `transformers` (no network); its weights are the base the adapters go on.
HF_SAVE = """
import json, sys
import torch, transformers
torch.manual_seed(0)
config = transformers.AutoConfig.for_model(**json.loads(sys.argv[2]))
transformers.AutoModelForCausalLM.from_config(config).save_pretrained(sys.argv[1])
"""
HF_LLAMA = {
    "model_type": "llama",
    "vocab_size": 61,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 16,
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.1,
    "tie_word_embeddings": False,
}


def hf_logits(folder, adapter=None):
    return transformers_logits(folder, TOKENS, adapter)


def adapted(lora=None, *, scan_layers=False, config=CONFIG, seed=0):
    """A model of `config` with adapters (`lora`, by default rank 4 on all seven projections)."""
    model = build_model(config, rngs=nnx.Rngs(seed), scan_layers=scan_layers)
    add_adapters(model, lora or LoraConfig(rank=4, alpha=12.0, targets=ALL_TARGETS), nnx.Rngs(seed + 1))
    return model


def randomise_adapters(model, seed=7, scale=0.3):
    """Give every adapter (B too, which starts at zero) random values."""
    leaves, tree = jax.tree.flatten(adapter_state(model))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    values = [jax.random.normal(key, leaf.shape) * scale for key, leaf in zip(keys, leaves, strict=True)]
    nnx.update(model, jax.tree.unflatten(tree, values))


def logits(model):
    return np.asarray(model(jnp.asarray(TOKENS)))


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ALL_TARGETS])
def test_fresh_adapters_leave_the_logits_unchanged_and_count_rank_times_in_plus_out_per_layer(scan_layers, targets):
    model = build_model(CONFIG, rngs=nnx.Rngs(0), scan_layers=scan_layers)
    before = logits(model)

    paths = add_adapters(model, LoraConfig(rank=4, targets=targets), nnx.Rngs(1))

    np.testing.assert_array_equal(logits(model), before)
    shapes = CONFIG.projection_shapes()
    assert count_trainable(model) == sum(4 * sum(shapes[name]) * CONFIG.n_layers for name in targets)
    assert count_frozen(model) == CONFIG.count_params()
    assert len(paths) == len(targets) * (1 if scan_layers else CONFIG.n_layers)
    where = "blocks.layer" if scan_layers else "blocks.1"
    assert f"{where}.attn.q_proj" in paths
    # A starts random (so B's first gradient is not zero), B at zero.
    a, b = model.blocks[1].attn.q_proj.lora_a[...], model.blocks[1].attn.q_proj.lora_b[...]
    assert a.shape == (32, 4) and b.shape == (4, 32)
    assert 0.5 / np.sqrt(32) < float(jnp.abs(a).max()) <= 1 / np.sqrt(32)  # PEFT's uniform(+-1/sqrt(in))
    assert not bool(jnp.any(b))


def test_adapters_of_a_stacked_model_carry_its_layer_axis_and_the_frozen_filter_excludes_them():
    model = adapted(scan_layers=True)
    q_proj = model.blocks.layer.attn.q_proj
    assert isinstance(q_proj, LoRALinear)
    assert (q_proj.base.kernel.shape, q_proj.lora_a.shape, q_proj.lora_b.shape) == ((2, 32, 32), (2, 32, 4), (2, 4, 32))
    frozen = nnx.to_pure_dict(nnx.state(model, FROZEN))["blocks"]["layer"]["attn"]["q_proj"]
    assert set(frozen) == {"base"}
    # No dropout: no random state at all.
    assert jax.tree.leaves(nnx.state(model, nnx.RngState)) == []


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_a_stacked_and_an_unrolled_model_with_the_same_adapters_give_the_same_logits(dropout):
    lora = LoraConfig(rank=4, alpha=12.0, dropout=dropout, targets=ALL_TARGETS)
    unrolled, stacked = adapted(lora), adapted(lora, scan_layers=True)
    # The layouts draw the same initial adapters (and dropout keys): layer i of the stack is block i.
    ours, theirs = nnx.to_pure_dict(adapter_state(unrolled)), nnx.to_pure_dict(adapter_state(stacked))
    for a, b in zip(jax.tree.leaves(stacked_params(ours)), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    randomise_adapters(unrolled)
    nnx.update(stacked, nnx.State(stacked_params(nnx.to_pure_dict(adapter_state(unrolled)))))

    assert np.abs(logits(unrolled) - logits(build_model(CONFIG, rngs=nnx.Rngs(0)))).max() > 1e-2
    # Float error of the scan's other order of operations only; a wrong adapter or mask is off by ~0.1.
    np.testing.assert_allclose(logits(stacked), logits(unrolled), rtol=1e-4, atol=1e-4)


def test_only_adapters_get_gradients_and_sgd_on_them_lowers_the_loss_with_the_base_bitwise_unchanged():
    model = adapted()
    randomise_adapters(model, scale=0.05)
    graphdef, adapters, frozen = nnx.split(model, nnx.LoRAParam, nnx.Param)
    frozen_before = jax.tree.map(np.array, nnx.to_pure_dict(frozen))
    batch = jnp.asarray(TOKENS)

    @jax.jit
    def loss_and_grads(adapters, frozen):
        def loss(adapters):
            out = nnx.merge(graphdef, adapters, frozen)(batch[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(out, batch[:, 1:]).mean()

        return jax.value_and_grad(loss)(adapters)

    losses = []
    for _ in range(3):
        loss, grads = loss_and_grads(adapters, frozen)
        losses.append(float(loss))
        assert jax.tree.structure(grads) == jax.tree.structure(adapters)
        assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))
        adapters = jax.tree.map(lambda p, g: p - 0.05 * g, adapters, grads)

    assert losses[2] < losses[1] < losses[0]
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(frozen_before), jax.tree.leaves(nnx.to_pure_dict(frozen)), strict=True
    ):
        assert np.array_equal(a, np.asarray(b)), jax.tree_util.keystr(path)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_dropout_masks_follow_the_state_advance_per_update_and_eval_mode_is_plain_lora(scan_layers):
    lora = LoraConfig(rank=4, alpha=12.0, dropout=0.5, targets=ALL_TARGETS)
    model = adapted(lora, scan_layers=scan_layers)
    randomise_adapters(model)
    without = adapted(lora.model_copy(update={"dropout": 0.0}), scan_layers=scan_layers)
    nnx.update(without, adapter_state(model))

    first = logits(model)
    np.testing.assert_array_equal(logits(model), first)  # the same state, the same masks: a pass changes nothing
    rng = nnx.state(model, nnx.RngState)
    nnx.update(model, jax.jit(advance_dropout)(rng))
    second = logits(model)
    assert np.abs(second - first).max() > 1e-3
    assert np.abs(first - logits(without)).max() > 1e-3

    view = nnx.view(model, deterministic=True, raise_if_not_found=False)
    np.testing.assert_allclose(logits(view), logits(without), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(logits(model), second)  # the view left the model in training mode
    model.eval()
    np.testing.assert_allclose(logits(model), logits(without), rtol=1e-6, atol=1e-6)
    nnx.update(model, advance_dropout(rng, 5))
    np.testing.assert_allclose(logits(model), logits(without), rtol=1e-6, atol=1e-6)


def test_a_jitted_step_threads_the_dropout_state_and_draws_new_masks_each_update():
    model = adapted(LoraConfig(rank=4, dropout=0.5, targets=["q_proj", "up_proj"]))
    randomise_adapters(model)
    graphdef, adapters, frozen, rng = nnx.split(model, nnx.LoRAParam, nnx.Param, nnx.RngState)

    @jax.jit
    def step(adapters, rng):
        out = nnx.merge(graphdef, adapters, frozen, rng)(jnp.asarray(TOKENS))
        return out, advance_dropout(rng)

    first, rng = step(adapters, rng)
    second, rng = step(adapters, rng)
    assert np.abs(np.asarray(second - first)).max() > 1e-3
    counts = {int(c) for c in jax.tree.leaves(nnx.to_pure_dict(nnx.filter_state(rng, nnx.RngCount)))}
    assert counts == {2}


@pytest.mark.parametrize("scan_layers", [False, True])
def test_merged_params_fold_each_adapter_into_its_kernel_and_drop_the_adapters(scan_layers):
    model = adapted(scan_layers=scan_layers)
    randomise_adapters(model)
    plain = build_model(CONFIG, rngs=nnx.Rngs(0), scan_layers=scan_layers)
    merged = merged_params(model)

    assert jax.tree.structure(merged) == jax.tree.structure(nnx.to_pure_dict(nnx.state(plain, nnx.Param)))
    nnx.update(plain, nnx.State(merged))
    np.testing.assert_allclose(logits(plain), logits(model), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
def test_a_merged_export_loads_in_transformers_with_the_adapted_models_logits(scan_layers, tmp_path):
    model = adapted(scan_layers=scan_layers)
    randomise_adapters(model)
    ours = logits(model)

    write_hf_model(tmp_path / "merged", CONFIG, merged_params(model))

    theirs = hf_logits(tmp_path / "merged")
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
def test_a_peft_adapter_folder_on_the_transformers_base_gives_the_adapted_models_logits(scan_layers, tmp_path):
    require("peft")
    base = tmp_path / "base"
    run_torch_script(HF_SAVE, base, json.dumps(HF_LLAMA))
    config, pure = load_hf_params(base)
    model = build_model(config, rngs=nnx.Rngs(0), scan_layers=scan_layers)
    params = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(params, jax.tree.map(jnp.asarray, stacked_params(pure) if scan_layers else pure))
    nnx.update(model, params)
    lora = LoraConfig(rank=4, alpha=12.0, dropout=0.1, targets=ALL_TARGETS)
    add_adapters(model, lora, nnx.Rngs(1))
    randomise_adapters(model)
    model.eval()
    ours = logits(model)

    out = write_peft_adapter(tmp_path / "adapter", config, lora, model, base_model_name_or_path=str(base))

    written = json.loads((out / "adapter_config.json").read_text())
    assert {k: written[k] for k in ("peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "bias")} == {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": 4,
        "lora_alpha": 12.0,
        "lora_dropout": 0.1,
        "bias": "none",
    }
    assert written["target_modules"] == sorted(ALL_TARGETS)
    base_logits = hf_logits(base)
    assert np.abs(base_logits - ours).max() > 1e-2  # the adapters matter, so the match below is not vacuous
    np.testing.assert_allclose(hf_logits(base, out), ours, rtol=1e-4, atol=1e-4)


def test_lora_is_off_by_default_and_its_config_refuses_unknown_or_repeated_targets():
    assert TrainConfig(dataset="d").lora is None
    assert LoraConfig().targets == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert TrainConfig(dataset="d", lora={"rank": 16}).lora == LoraConfig(rank=16)

    with pytest.raises(ValidationError, match=r"targets\.1\n.*'q_proj', 'k_proj', .*'up_proj' or 'down_proj'"):
        LoraConfig(targets=["q_proj", "qkv"])
    with pytest.raises(ValidationError, match="v_proj named more than once"):
        LoraConfig(targets=["v_proj", "q_proj", "v_proj"])
    for bad in ({"rank": 0}, {"alpha": 0}, {"dropout": 1.0}, {"targets": []}):
        with pytest.raises(ValidationError):
            LoraConfig(**bad)


@pytest.mark.parametrize(
    "config",
    [
        CONFIG,  # grouped-query attention: k and v narrower than q
        model_config(type="qwen3", vocab_size=61, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_head=12, d_ff=40),
        model_config(type="mistral", vocab_size=61, d_model=48, n_layers=1, n_heads=6, n_kv_heads=3),
    ],
    ids=["llama-gqa", "qwen3-own-head-width", "mistral"],
)
@pytest.mark.parametrize(
    "lora", [LoraConfig(rank=4, targets=ALL_TARGETS), LoraConfig(rank=3, targets=["o_proj", "k_proj", "down_proj"])]
)
def test_the_configs_adapter_count_is_what_a_built_adapted_model_trains_and_its_base_what_it_freezes(config, lora):
    model = build_model(config, rngs=nnx.Rngs(0))
    add_adapters(model, lora, nnx.Rngs(1))

    assert lora.count_params(config) == count_trainable(model) > 0
    assert config.count_params() == count_frozen(model)


def test_counting_adapters_on_a_gpt2_config_is_refused_naming_its_projections():
    gpt2 = GPT2Config(vocab_size=61, d_model=32, n_layers=2, n_heads=2, max_seq_len=16)

    with pytest.raises(ConfigError, match=r"a gpt2 model has no q_proj, v_proj; its projections are fc, fc_out, proj"):
        LoraConfig(targets=["q_proj", "v_proj"]).count_params(gpt2)


def test_adapters_on_a_model_without_the_target_projections_are_refused_naming_its_projections():
    gpt2 = build_model(GPT2Config(vocab_size=61, d_model=32, n_layers=2, n_heads=2, max_seq_len=16), rngs=nnx.Rngs(0))

    with pytest.raises(ConfigError, match=r"a GPT2 model has no q_proj, v_proj; its projections are fc, fc_out, proj"):
        add_adapters(gpt2, LoraConfig(targets=["q_proj", "v_proj"]), nnx.Rngs(0))
    model = adapted()
    with pytest.raises(ValueError, match="has LoRA adapters already"):
        add_adapters(model, LoraConfig(), nnx.Rngs(0))


def final_adapters(run_dir):
    from tradewind.trainer.restore import load_run_model

    return [np.asarray(leaf) for leaf in jax.tree.leaves(adapter_state(load_run_model(run_dir).model()))]


@pytest.mark.slow
def test_a_lora_run_with_dropout_resumed_from_its_checkpoint_ends_bitwise_as_an_uninterrupted_one(
    tiny_config, tmp_path
):
    from tradewind.runs import RunLayout, read_metrics
    from tradewind.trainer import train

    def config(steps, dropout=0.2):
        lora = {"rank": 4, "alpha": 8, "dropout": dropout, "targets": ["q_proj", "v_proj"]}
        optimizer = {"schedule": "constant", "warmup_steps": 0}  # the same rates whatever `steps` says
        return tiny_config(steps=steps, lora=lora, optimizer=optimizer, log_every=2, eval_every=4)

    train(config(8), tmp_path / "straight")
    train(config(4), tmp_path / "resumed")
    RunLayout(tmp_path / "resumed").summary.unlink()  # an unfinished run resumes from its newest checkpoint
    summary = train(config(8), tmp_path / "resumed")
    train(config(8, dropout=0.0), tmp_path / "no-dropout")

    assert summary.resumed_from_step == 4
    for a, b in zip(final_adapters(tmp_path / "resumed"), final_adapters(tmp_path / "straight"), strict=True):
        np.testing.assert_array_equal(a, b)
    losses = {
        run.name: [row.loss for row in read_metrics(RunLayout(run).metrics) if row.loss is not None]
        for run in tmp_path.iterdir()
    }
    assert losses["resumed"][-2:] == losses["straight"][-2:]  # the rows after the resume, drawn with the same masks
    assert losses["no-dropout"][-1] != losses["straight"][-1]  # dropout is on
