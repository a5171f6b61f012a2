"""Hugging Face models for the interop tests: folders saved by `transformers` (random weights, no network) and
their logits and loss, each computed in a fresh interpreter that imports only torch and transformers (a test
that calls one is skipped where they are not installed), and Tradewind models loaded from such folders."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from tradewind.trainer.hf import load_hf_params
from tradewind.trainer.models import build_model
from tradewind.trainer.setup import replace_params

# The transformers model's logits and mean next-token loss for `tokens`, as JSON on the last line of stdout.
_OUTPUTS = """
def outputs(model, tokens):
    tokens = torch.tensor(tokens)
    with torch.no_grad():
        result = model(tokens, labels=tokens)
    print(json.dumps({"logits": result.logits.numpy().tolist(), "loss": result.loss.item()}))
"""

HF_CHECK = f"""
import json, sys
import torch, transformers
{_OUTPUTS}
outputs(transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval(), json.loads(sys.argv[2]))
"""

# Every parameter moved by `jitter` standard deviations, so that those transformers starts at zero or one (biases,
# norm scales) are random too; with `tokens`, the saved model's outputs for them.
HF_SAVE = f"""
import json, sys
import torch, transformers
{_OUTPUTS}
torch.manual_seed(0)
config = transformers.AutoConfig.for_model(**json.loads(sys.argv[2]))
model = transformers.AutoModelForCausalLM.from_config(config).eval()
with torch.no_grad():
    for parameter in model.parameters():
        parameter.add_(float(sys.argv[4]) * torch.randn_like(parameter))
model.save_pretrained(sys.argv[1], max_shard_size=sys.argv[3])
if sys.argv[5] != "null":
    outputs(model, json.loads(sys.argv[5]))
"""

TOKENS = np.array([[5, 72, 101, 108, 108, 111, 32, 119, 33, 200, 3, 9]], np.int32)


def _run(script, *args):
    """stdout of `script` run with `args` in a fresh interpreter that imports nothing of the tests' folders."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    # -P: not the working folder's modules; PYTHONPATH stays (on a TPU VM it may hold the machine's numpy).
    result = subprocess.run([sys.executable, "-P", "-c", script, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _outputs(stdout):
    found = json.loads(stdout.strip().splitlines()[-1])
    return np.array(found["logits"]), found["loss"]


def transformers_folder(folder, config, max_shard_size="5GB"):
    """An HF folder saved by `transformers` of a random model with `config` (a config.json's keys), in shards of
    at most `max_shard_size`."""
    _run(HF_SAVE, str(folder), json.dumps(config), max_shard_size, "0", "null")
    return folder


def saved_by_transformers(folder, config, tokens, jitter=0.1):
    """Save a random model with `config` in `folder` as `transformers_folder` does, every parameter then moved by
    `jitter` standard deviations; its `(logits, loss)` for `tokens` [batch, seq]."""
    return _outputs(_run(HF_SAVE, str(folder), json.dumps(config), "5GB", str(jitter), json.dumps(tokens.tolist())))


def transformers_outputs(folder, tokens):
    """`(logits, mean next-token loss)` of the `transformers` model in `folder` for `tokens` [batch, seq]."""
    return _outputs(_run(HF_CHECK, str(folder), json.dumps(tokens.tolist())))


def transformers_logits(folder, tokens):
    """The `transformers` model's logits for `tokens`."""
    return transformers_outputs(folder, tokens)[0]


def model_with_weights(config, folder):
    """A model built from `config` holding the weights of HF folder `folder`."""
    graphdef, params = nnx.split(build_model(config, rngs=nnx.Rngs(0)))
    _, pure = load_hf_params(folder)
    return nnx.merge(graphdef, replace_params(params, pure))


def logits_with_weights(config, folder, tokens):
    """Logits of a model built from `config` with the weights of HF folder `folder`."""
    return np.asarray(model_with_weights(config, folder)(tokens))


def flat(params):
    """The leaves of a parameter tree, by their paths, in order."""
    return sorted((jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(params))
