"""The model registry: each architecture registers its `nnx.Module` class under its `ModelConfig.type`."""

from __future__ import annotations

from collections.abc import Callable

from flax import nnx

MODELS: dict[str, type[nnx.Module]] = {}


def register_model(name: str) -> Callable[[type[nnx.Module]], type[nnx.Module]]:
    """Class decorator: make a model buildable from a `ModelConfig` whose `type` is `name`."""

    def register(cls: type[nnx.Module]) -> type[nnx.Module]:
        MODELS[name] = cls
        return cls

    return register
