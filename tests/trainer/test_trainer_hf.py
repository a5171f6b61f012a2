"""Hugging Face interop: an exported Llama run loads in `transformers` and gives the same logits."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from tradewind.core import ConfigError
from tradewind.trainer import train
from tradewind.trainer.hf import export_hf, load_hf_params, read_safetensors, write_safetensors
from tradewind.trainer.restore import load_run_model
from tradewind.trainer.step import setup_training

HF_CHECK = """
import json, sys
import torch, transformers
model = transformers.LlamaForCausalLM.from_pretrained(sys.argv[1]).eval()
tokens = torch.tensor(json.loads(sys.argv[2]))
with torch.no_grad():
    print(json.dumps(model(tokens).logits.numpy().tolist()))
"""


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


@pytest.mark.slow
def test_exported_llama_loads_in_transformers_and_matches_the_trainers_logits(gqa_run, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    out = export_hf(gqa_run, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    loaded = load_run_model(gqa_run)
    tokens = np.array([[5, 72, 101, 108, 108, 111, 32, 119]], np.int32)
    ours = np.asarray(nnx.merge(loaded.graphdef, loaded.params)(tokens))
    # A fresh interpreter that imports only torch and transformers.
    result = subprocess.run(
        [sys.executable, "-I", "-c", HF_CHECK, str(out), json.dumps(tokens.tolist())],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    theirs = np.array(json.loads(result.stdout.strip().splitlines()[-1]))
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_imported_weights_start_training_with_the_exported_parameters(gqa_run, tiny_config, tmp_path):
    out = export_hf(gqa_run, tmp_path / "hf")
    imported_config, pure = load_hf_params(out)
    assert imported_config.n_kv_heads == 2 and not imported_config.tie_embeddings
    loaded = load_run_model(gqa_run)
    config = tiny_config(init_from=str(out), model={"n_heads": 4, "n_kv_heads": 2, "tie_embeddings": False})
    setup = setup_training(config, initial_params=pure)
    ours, theirs = nnx.to_pure_dict(setup.params), nnx.to_pure_dict(loaded.params)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_importing_weights_of_another_shape_names_the_parameter(gqa_run, tiny_config, tmp_path):
    out = export_hf(gqa_run, tmp_path / "hf")
    _, pure = load_hf_params(out)
    with pytest.raises(ConfigError, match=r"init_from: parameter .*k_proj.* has shape"):
        setup_training(tiny_config(model={"n_heads": 4, "tie_embeddings": False}), initial_params=pure)
