"""build_model builds the module its config's class names, in the compute dtype asked for with float32
parameters; count_params counts the scalars of trainable parameters only."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from tradewind.runs import GPT2Config, LlamaConfig
from tradewind.trainer import GPT2, Llama, build_model, count_params

SHAPE = {"vocab_size": 40, "d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 8}


@pytest.mark.parametrize(("config_class", "module_class"), [(LlamaConfig, Llama), (GPT2Config, GPT2)])
def test_build_model_builds_the_module_the_config_class_names_in_the_compute_dtype(config_class, module_class):
    model = build_model(config_class(**SHAPE), rngs=nnx.Rngs(0), dtype=jnp.bfloat16)

    assert type(model) is module_class
    layers = [m for _, m in nnx.iter_graph(model) if isinstance(m, nnx.Linear | nnx.Embed)]
    assert layers and {layer.dtype for layer in layers} == {jnp.bfloat16}
    params = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert {leaf.dtype for leaf in params} == {jnp.dtype(jnp.float32)}


def test_count_params_counts_trainable_parameters_and_not_other_state():
    class Tiny(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.linear = nnx.Linear(3, 4, rngs=rngs)  # 3 * 4 weights + 4 biases
            self.norm = nnx.BatchNorm(5, rngs=rngs)  # 5 scales + 5 biases; its mean and var are not parameters

    assert count_params(Tiny(nnx.Rngs(0))) == 3 * 4 + 4 + 5 + 5
