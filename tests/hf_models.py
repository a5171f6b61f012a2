"""Hugging Face models for the interop tests: folders saved by `transformers` (random weights, no network) and
their logits and loss, computed in an interpreter of their own that imports only torch, transformers and peft
(a test that asks for one is skipped where torch and transformers are not installed), and Tradewind models loaded
from such folders."""

import atexit
import contextlib
import importlib.util
import json
import select
import subprocess
import sys
import tempfile

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

# The model of an HF folder, with a PEFT adapter folder on top when one is given.
HF_CHECK = f"""
import json, sys
import torch, transformers
{_OUTPUTS}
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
if sys.argv[3]:
    import peft
    model = peft.PeftModel.from_pretrained(model, sys.argv[3]).eval()
outputs(model, json.loads(sys.argv[2]))
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


# The torch interpreter's loop: each request (a line of JSON) is a script and its arguments; the script runs as
# `python -c script args...` would, in globals of its own, and the reply (a line of JSON) holds what it printed,
# or its traceback.
_SERVE = """
import contextlib, io, json, sys, traceback
import torch, transformers
for line in sys.stdin:
    request = json.loads(line)
    sys.argv = ["-c", *request["args"]]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(request["script"], {"__name__": "__main__"})
        error = None
    except Exception:
        error = traceback.format_exc()
    print(json.dumps({"stdout": printed.getvalue(), "error": error}), flush=True)
"""


class TorchInterpreter:
    """One interpreter for a test process's torch scripts, started by the first: importing torch and transformers
    (and the model classes a config names) takes 10 s of CPU, and the interop tests run over thirty scripts.
    Neither JAX nor the tests' modules are loaded in it."""

    def __init__(self):
        self.process = None
        # A file, not a pipe (which would fill and block the interpreter): read only once it has ended.
        self.stderr = tempfile.TemporaryFile("w+", errors="replace")  # noqa: SIM115 (it lives as long as this object)

    def run(self, script, args, timeout_s=300):
        if self.process is None or self.process.poll() is not None:
            # -P: not the working folder's modules; PYTHONPATH stays (on a TPU VM it may hold the machine's numpy).
            command = [sys.executable, "-P", "-c", _SERVE]
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True
            )
        self.process.stdin.write(json.dumps({"script": script, "args": [str(arg) for arg in args]}) + "\n")
        self.process.stdin.flush()
        answered, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline() if answered else ""
        if not line:
            self.close()
            self.stderr.seek(0)
            what = "ended" if answered else f"gave no answer in {timeout_s} s"
            pytest.fail(f"the torch interpreter {what}: {self.stderr.read()[-3000:]}")
        reply = json.loads(line)
        assert reply["error"] is None, reply["error"][-3000:]
        return reply["stdout"]

    def close(self):
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            self.process.kill()
            self.process.wait()


_TORCH = TorchInterpreter()
atexit.register(_TORCH.close)


def require(*modules):
    """Skip the test where one of `modules` is not installed, without importing them into the test's process."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")


def run_torch_script(script, *args):
    """What `script` prints, run with `args` as `python -c script args...` would run it, in the torch interpreter
    (the test is skipped where torch or transformers is not installed)."""
    require("torch", "transformers")
    return _TORCH.run(script, args)


def _outputs(stdout):
    found = json.loads(stdout.strip().splitlines()[-1])
    return np.array(found["logits"]), found["loss"]


def transformers_folder(folder, config, max_shard_size="5GB"):
    """An HF folder saved by `transformers` of a random model with `config` (a config.json's keys), in shards of
    at most `max_shard_size`."""
    run_torch_script(HF_SAVE, str(folder), json.dumps(config), max_shard_size, "0", "null")
    return folder


def saved_by_transformers(folder, config, tokens, jitter=0.1):
    """Save a random model with `config` in `folder` as `transformers_folder` does, every parameter then moved by
    `jitter` standard deviations; its `(logits, loss)` for `tokens` [batch, seq]."""
    return _outputs(run_torch_script(HF_SAVE, folder, json.dumps(config), "5GB", jitter, json.dumps(tokens.tolist())))


def transformers_outputs(folder, tokens, adapter=None):
    """`(logits, mean next-token loss)` of the `transformers` model in `folder` for `tokens` [batch, seq], with the
    PEFT adapter in folder `adapter` on top when one is given (the test is skipped where peft is not installed)."""
    if adapter:
        require("peft")
    return _outputs(run_torch_script(HF_CHECK, folder, json.dumps(tokens.tolist()), adapter or ""))


def transformers_logits(folder, tokens, adapter=None):
    """The `transformers` model's logits for `tokens` (with `adapter`, as `transformers_outputs`)."""
    return transformers_outputs(folder, tokens, adapter)[0]


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
