"""Model configs: `type` (or a preset) picks the architecture's class, errors name the field without
pydantic's union tag, and each class's HF mapping names every parameter of the model it builds, once."""

import jax
import pydantic
import pytest
from flax import nnx

from tradewind.core import ConfigError, parse_config
from tradewind.core.config import describe_validation_error
from tradewind.runs import ARCHITECTURES, GPT2Config, LlamaConfig, TrainConfig, model_config
from tradewind.trainer import Llama, build_model, count_params

SHAPE = {"vocab_size": 40, "d_model": 16, "n_layers": 2, "n_heads": 2, "max_seq_len": 8}


def test_type_or_a_preset_picks_the_architectures_class_and_llama_is_the_default():
    assert type(model_config()) is LlamaConfig
    assert type(model_config(type="gpt2")) is GPT2Config
    assert type(model_config(preset="gpt2-small")) is GPT2Config
    assert type(TrainConfig(dataset="d", model={"type": "gpt2"}).model) is GPT2Config
    assert type(TrainConfig(dataset="d").model) is LlamaConfig


def test_each_architecture_defaults_its_own_mlp_width():
    assert LlamaConfig(d_model=96).ff_dim == 256  # 8/3 * 96 = 256
    assert GPT2Config(d_model=96).ff_dim == 384


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ({"type": "gpt2", "n_kv_heads": 2}, "run.yaml: model.n_kv_heads: Extra inputs are not permitted"),
        ({"type": "mamba"}, "run.yaml: model: type 'mamba' is not a model type; choose one of 'llama', 'gpt2'"),
        ({"d_model": 100, "n_heads": 3}, "run.yaml: model.n_heads: Value error, d_model (100) must be divisible"),
    ],
)
def test_a_bad_model_field_is_named_without_the_union_tag(model, expected):
    with pytest.raises(ConfigError) as raised:
        parse_config(TrainConfig, {"dataset": "d", "model": model}, source="run.yaml")
    assert str(raised.value).startswith(expected)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ({"d_modl": 3}, "argument 'model.d_modl': unknown argument; did you mean 'd_model'?"),
        ({"type": "gpt2", "rope_theta": 5.0}, "argument 'model.rope_theta': not an argument of this type of"),
    ],
)
def test_a_tool_argument_error_suggests_a_field_of_any_architecture(model, expected):
    with pytest.raises(pydantic.ValidationError) as raised:
        TrainConfig.model_validate({"dataset": "d", "model": model}, strict=True)
    assert describe_validation_error(raised.value, "launch_training", arguments_of=TrainConfig).startswith(expected)


def test_the_listed_schema_is_one_object_with_every_architectures_fields():
    listed = TrainConfig.model_json_schema()["properties"]["model"]
    assert listed["properties"]["type"]["enum"] == list(ARCHITECTURES)
    for config_class in ARCHITECTURES.values():
        assert set(config_class.model_fields) <= set(listed["properties"])
    assert listed["additionalProperties"] is False


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
@pytest.mark.parametrize("tied", [True, False])
def test_the_hf_mapping_names_every_parameter_of_the_built_model_once(model_type, tied):
    config = model_config(type=model_type, tie_embeddings=tied, **SHAPE)
    params = nnx.to_pure_dict(nnx.state(build_model(config, rngs=nnx.Rngs(0)), nnx.Param))
    leaves = {
        tuple(getattr(key, "key", getattr(key, "idx", None)) for key in path)
        for path, _ in jax.tree_util.tree_leaves_with_path(params)
    }

    mapped = [weight.path for weight in config.hf_weights()]

    assert sorted(mapped, key=str) == sorted(leaves, key=str)
    assert len({weight.name for weight in config.hf_weights()}) == len(mapped)


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "mistral", "n_kv_heads": 2, "tie_embeddings": False},
        {"type": "qwen2", "n_kv_heads": 2},
        {"type": "qwen2", "n_kv_heads": 1, "d_head": 4, "tie_embeddings": False},
        {"type": "qwen3", "n_kv_heads": 2, "d_head": 32},
        {"type": "llama", "d_head": 16, "d_ff": 80},
    ],
)
def test_the_llama_kin_count_their_biases_norms_and_head_width_as_the_built_model_has_them(fields):
    config = model_config(vocab_size=258, d_model=32, n_layers=2, n_heads=4, max_seq_len=64, **fields)

    model = build_model(config, rngs=nnx.Rngs(0))

    assert type(model) is Llama
    assert model.blocks[0].attn.q_proj.kernel.shape == (32, 4 * config.head_dim)
    assert config.count_params() == count_params(model)


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "gpt2"},
        {"type": "llama", "n_kv_heads": 1, "d_ff": 40},
        {"type": "mistral", "n_kv_heads": 1},
        {"type": "qwen2", "n_kv_heads": 1, "d_head": 4},
        {"type": "qwen3", "n_kv_heads": 1, "d_head": 12},
    ],
)
def test_projection_shapes_are_the_built_blocks_kernels_and_add_up_to_its_matmul_weights(fields):
    config = model_config(**{**SHAPE, **fields})
    block = build_model(config, rngs=nnx.Rngs(0)).blocks[0]
    kernels = {
        name: child.kernel.shape
        for _, module in nnx.iter_modules(block)
        for name, child in vars(module).items()
        if isinstance(child, nnx.Linear)
    }

    assert kernels == config.projection_shapes()
    assert sum(fan_in * fan_out for fan_in, fan_out in kernels.values()) == config.block_matmul_params()


def test_qwen2_has_query_key_value_biases_and_qwen3_query_key_norms_where_llama_has_neither():
    def attention(model_type):
        return build_model(model_config(type=model_type, **SHAPE), rngs=nnx.Rngs(0)).blocks[0].attn

    llama, qwen2, qwen3 = attention("llama"), attention("qwen2"), attention("qwen3")

    assert [llama.q_proj.bias, llama.q_norm, qwen3.q_proj.bias, qwen2.q_norm] == [None] * 4
    assert qwen2.q_proj.bias.shape == (16,) and qwen2.o_proj.bias is None
    assert qwen3.q_norm.scale.shape == qwen3.k_norm.scale.shape == (8,)  # one head's width


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"d_model": 36, "n_heads": 4}, r"n_heads\n.*head size d_model / n_heads = 9 must be even"),
        ({"d_head": 9}, r"d_head\n.*d_head \(9\) must be even"),
    ],
)
def test_an_odd_head_width_is_refused_for_rotary_embeddings(fields, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        model_config(**fields)


@pytest.mark.parametrize("preset", ["llama-125m", "llama-1b", "gpt2-small"])
def test_the_flops_by_part_of_a_model_sum_to_its_flops_per_token(preset):
    config = model_config(preset=preset, vocab_size=32768)
    parts = config.flops_by_part(2048)
    assert set(parts) == {"attention", "mlp", "loss"} and all(flops > 0 for flops in parts.values())
    assert sum(parts.values()) == config.flops_per_token(2048)
    assert parts["loss"] == 6 * config.d_model * 32768
    assert parts["mlp"] == 6 * config.n_layers * config.mlp_matmul_params()
