"""Loading pydantic configs from YAML files and `key=value` overrides, with errors that say where.

Example:
    config = load_config(TrainConfig, "train.yaml", overrides=["optimizer.learning_rate=1e-3"])
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

from tradewind.core.errors import ConfigError

ConfigT = TypeVar("ConfigT", bound=pydantic.BaseModel)


def describe_validation_error(error: pydantic.ValidationError, source: str) -> str:
    """Render a pydantic error as `source: field.path: message` lines."""
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"{source}: {field}: {item['msg']}")
    return "\n".join(lines)


def parse_config(config_cls: type[ConfigT], data: Any, source: str = "config") -> ConfigT:
    """Validate `data` as `config_cls`, raising `ConfigError` that names `source` and each bad field."""
    try:
        return config_cls.model_validate(data)
    except pydantic.ValidationError as error:
        raise ConfigError(describe_validation_error(error, source)) from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides to a nested dict; values are parsed as YAML scalars."""
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {override!r}: expected key=value, e.g. optimizer.learning_rate=1e-3")
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {override!r}: {part!r} is not a section")
            node = child
        node[leaf] = yaml.safe_load(raw)
    return data


def load_config(config_cls: type[ConfigT], path: str | os.PathLike[str], overrides: list[str] | None = None) -> ConfigT:
    """Load `path` (YAML), apply overrides and validate it as `config_cls`."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {getattr(error, 'problem', error)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config fields at the top level")
    return parse_config(config_cls, apply_overrides(data, overrides or []), source=str(path))
