"""TrainConfig and its parts validate themselves, name bad fields, and parse from YAML."""

import pytest

from tradewind.core import ConfigError, NotFoundError, load_config, parse_config
from tradewind.runs import GPT2Config, LlamaConfig, OptimizerConfig, TrainConfig, model_config, read_train_config


def test_mlp_width_defaults_to_eight_thirds_of_d_model_rounded_up_to_32():
    assert model_config(d_model=128).ff_dim == 352  # 341.3 -> 352
    assert model_config(d_model=192).ff_dim == 512  # exactly 512
    assert model_config(d_model=192, d_ff=100).ff_dim == 100


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"model": {"d_model": 100, "n_heads": 3}}, "model.n_heads", "divisible"),
        ({"model": {"d_model": 12, "n_heads": 4}}, "model.n_heads", "even"),
        ({"seq_len": 512}, "seq_len", "max_seq_len"),
        ({"steps": 0}, "steps", "greater than 0"),
        ({"batch_size": -1}, "batch_size", "greater than 0"),
        ({"model": {"d_model": 0}}, "model.d_model", "greater than 0"),
        ({"model": {"vocab_size": 0}}, "model.vocab_size", "greater than 0"),
        ({"optimizer": {"learning_rate": 0}}, "optimizer.learning_rate", "greater than 0"),
        ({"optimizer": {"min_lr_ratio": 1.5}}, "optimizer.min_lr_ratio", "less than or equal to 1"),
        ({"optimizer": {"b2": 1.0}}, "optimizer.b2", "less than 1"),
        ({"optimizr": {}}, "optimizr", "Extra inputs are not permitted"),
    ],
)
def test_invalid_config_raises_config_error_naming_the_source_and_field(fields, field, words):
    with pytest.raises(ConfigError) as raised:
        parse_config(TrainConfig, {"dataset": "datasets/x", **fields}, source="run.json")
    message = str(raised.value)
    assert f"run.json: {field}: " in message
    assert words in message


def test_yaml_config_parses_through_load_config_with_overrides(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(
        "dataset: datasets/shakespeare\n"
        "steps: 300\n"
        "model:\n  d_model: 192\n  n_heads: 4\n  tie_embeddings: false\n"
        "optimizer:\n  learning_rate: 1.0e-3\n",
        encoding="utf-8",
    )
    config = load_config(TrainConfig, path, overrides=["model.n_layers=6", "optimizer.warmup_steps=5"])
    assert config == TrainConfig(
        dataset="datasets/shakespeare",
        steps=300,
        model=model_config(d_model=192, n_heads=4, n_layers=6, tie_embeddings=False),
        optimizer=OptimizerConfig(learning_rate=1e-3, warmup_steps=5),
    )


def test_config_survives_a_json_round_trip_unchanged():
    config = TrainConfig(dataset="d", model=model_config(vocab_size=300, d_ff=96), seed=3)
    assert TrainConfig.model_validate_json(config.model_dump_json()) == config


def test_every_config_field_has_a_description_for_the_tool_schemas():
    for cls in (LlamaConfig, GPT2Config, OptimizerConfig, TrainConfig):
        undescribed = [name for name, field in cls.model_fields.items() if not field.description]
        assert undescribed == [], f"{cls.__name__} fields without a description: {undescribed}"


def test_reading_a_missing_run_config_raises_not_found(tmp_path):
    with pytest.raises(NotFoundError, match="no run config"):
        read_train_config(tmp_path / "config.json")


def test_the_trainer_docs_page_embeds_the_current_generated_config_reference():
    from pathlib import Path

    from tradewind.runs.reference import reference_markdown

    page = (Path(__file__).parents[2] / "docs" / "trainer.md").read_text(encoding="utf-8")
    generated = page.split("keeps it in sync -->\n", 1)[1].split("<!-- END GENERATED -->", 1)[0]
    assert generated == reference_markdown(), "run `python -m tradewind.runs.reference` and paste it in"
