"""Trainer fixtures: a small byte-level token cache and a factory of tiny training configs."""

from pathlib import Path

import pytest

from tradewind.data import build_token_cache, load_tokenizer
from tradewind.runs import TrainConfig


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory, small_corpus) -> Path:
    """A byte-level token cache of the suite's small corpus (about 75k tokens)."""
    folder = tmp_path_factory.mktemp("trainer-data")
    build_token_cache([small_corpus], folder / "cache", load_tokenizer("byte"))
    return folder / "cache"


@pytest.fixture(scope="session")
def tiny_config(tiny_cache):
    """Make a TrainConfig for a 2-layer, 32-wide model on `tiny_cache`; keyword arguments override fields."""

    def make(**overrides) -> TrainConfig:
        fields = {
            "dataset": str(tiny_cache),
            "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
            "optimizer": {"learning_rate": 1e-2, "warmup_steps": 2},
            "steps": 20,
            "batch_size": 8,
            "seq_len": 32,
            "eval_every": 10,
            "eval_batches": 2,
            "log_every": 5,
        }
        for key, value in overrides.items():
            fields[key] = {**fields.get(key, {}), **value} if isinstance(value, dict) else value
        return TrainConfig.model_validate(fields)

    return make
