"""Loading pydantic configs from YAML files and `key=value` overrides, with errors that say where.

Example:
    config = load_config(TrainConfig, "train.yaml", overrides=["optimizer.learning_rate=1e-3"])
"""

from __future__ import annotations

import difflib
import json
import os
import typing
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml
from pydantic.json_schema import SkipJsonSchema

from tradewind.core.errors import ConfigError, InvalidInputError
from tradewind.core.files import Opener, open_plain, read_bounded
from tradewind.core.storage import read_json

ConfigT = TypeVar("ConfigT", bound=pydantic.BaseModel)


ECHO_LIMIT = 200  # characters of a value an error message shows
MAX_CONFIG_BYTES = 16 * 2**20  # a YAML config or settings file larger than this is not one


def cut_text(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text`, or its first `limit` characters, "…" and its length when it is longer."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def shown_value(value: Any) -> str:
    """A value as an error message echoes it: its repr, at most `ECHO_LIMIT` characters of it shown."""
    if isinstance(value, str) and len(value) > ECHO_LIMIT:
        return f"{value[:ECHO_LIMIT]!r}… ({len(value):,} characters)"
    return cut_text(repr(value))


def cut_echoes(message: str, values: Any) -> str:
    """`message` with every long string among `values` (walked through dicts and lists) cut where it is echoed."""
    stack, long = [values], []
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
        elif isinstance(value, str) and len(value) > ECHO_LIMIT:
            long.append(value)
    for value in sorted(long, key=len, reverse=True):
        message = message.replace(repr(value), shown_value(value)).replace(value, cut_text(value))
    return message


def _field_names(model: type[pydantic.BaseModel], path: tuple[str | int, ...]) -> list[str] | None:
    """The field names of the model found at `path` inside `model` (of every model, for a union of them),
    or None where the path leaves models."""
    models = [model]
    for part in path:
        fields = [found.model_fields[str(part)] for found in models if str(part) in found.model_fields]
        models = [inner for field in fields for inner in _models_in(field.annotation)]
        if not models:
            return None
    return list(dict.fromkeys(name for found in models for name in listed_fields(found)))


def _models_in(annotation: Any) -> list[type[pydantic.BaseModel]]:
    """The pydantic models an annotation is, or holds as a union member (`Annotated` and `Optional` unwrapped)."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [model for argument in typing.get_args(annotation) for model in _models_in(argument)]


def listed_fields(model: type[pydantic.BaseModel]) -> list[str]:
    """The fields of `model` its JSON schema shows: all but those marked `SkipJsonSchema` (never arguments)."""
    return [
        name
        for name, field in model.model_fields.items()
        if not any(isinstance(marker, SkipJsonSchema) for marker in field.metadata)
    ]


_WORDING = {
    "int_type": "{value} is not an integer",
    "int_parsing": "{value} is not an integer",
    "int_from_float": "{value} is not a whole number",
    "float_type": "{value} is not a number",
    "float_parsing": "{value} is not a number",
    "bool_type": "{value} is not true or false",
    "bool_parsing": "{value} is not true or false",
    "string_type": "{value} is not a string",
    "list_type": "{value} is not a list",
    "dict_type": "{value} is not an object",
    "model_type": "{value} is not an object of fields",
    "model_attributes_type": "{value} is not an object of fields",
    "greater_than": "must be greater than {gt} (got {value})",
    "greater_than_equal": "must be at least {ge} (got {value})",
    "less_than": "must be less than {lt} (got {value})",
    "less_than_equal": "must be at most {le} (got {value})",
    "multiple_of": "must be a multiple of {multiple_of} (got {value})",
    "literal_error": "{value} is not one of {expected}",
    "enum": "{value} is not one of {expected}",
    "string_too_short": "must have at least {min_length} characters (got {value})",
    "string_too_long": "must have at most {max_length} characters (got {length:,})",
    "too_short": "must have at least {min_length} items (got {actual_length})",
    "too_long": "must have at most {max_length} items (got {actual_length})",
    "string_pattern_mismatch": "{value} does not match the pattern {pattern!r}",
    "missing": "missing; this argument is required",
}


def _argument_problem(item: Any, model: type[pydantic.BaseModel], tool: str) -> str:
    """One pydantic error in Tradewind's wording: what is wrong with the value and what is allowed."""
    kind, value, context = item["type"], item.get("input"), item.get("ctx") or {}
    if kind == "extra_forbidden":
        *parents, name = item["loc"]
        allowed = _field_names(model, tuple(parents))
        if allowed is None:
            return "unknown argument"
        where = tool if not parents else f"{tool}'s {'.'.join(str(part) for part in parents)}"
        if str(name) in allowed:  # a field of another member of a union, such as another model type's
            return f"not an argument of this type of {where} (another type takes it)"
        nearest = difflib.get_close_matches(str(name), allowed, n=1, cutoff=0.6)
        hint = f"; did you mean {nearest[0]!r}?" if nearest else ""
        return f"unknown argument{hint} ({where} takes: {', '.join(allowed)})"
    if kind in ("value_error", "assertion_error"):
        message = item["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        return cut_echoes(message, value)
    wording = _WORDING.get(kind)
    if wording is not None:
        try:
            length = len(value) if isinstance(value, str | list | dict) else 0
            return wording.format(**{**context, "value": shown_value(value), "length": length})
        except (KeyError, IndexError, ValueError):
            pass
    return f"{item['msg']} (got {shown_value(value)})"


def describe_validation_error(
    error: pydantic.ValidationError,
    source: str,
    *,
    arguments_of: type[pydantic.BaseModel] | None = None,
) -> str:
    """Render a pydantic error as `source: field.path: message` lines.

    With `arguments_of`, the request model of the tool named `source`, the lines are the tool's argument
    errors in Tradewind's wording instead: `argument 'steps': must be greater than 0 (got -1)`, an unknown
    argument with the nearest valid name and the names the tool takes, nested fields dotted
    (`argument 'model.d_model'`), and every echoed value cut to `ECHO_LIMIT` characters.
    """
    lines = []
    for item in error.errors(include_url=False):
        field = ".".join(str(part) for part in item["loc"])
        if arguments_of is None:
            lines.append(f"{source}: {field or '(top level)'}: {item['msg']}")
            continue
        problem = _argument_problem(item, arguments_of, source)
        line = f"argument {field!r}: {problem}" if field else f"{source}: {problem}"
        if line not in lines:
            lines.append(line)
    return "\n".join(lines)


def parse_config(config_cls: type[ConfigT], data: Any, source: str = "config") -> ConfigT:
    """Validate `data` as `config_cls`, raising `ConfigError` that names `source` and each bad field."""
    try:
        return config_cls.model_validate(data)
    except pydantic.ValidationError as error:
        raise ConfigError(describe_validation_error(error, source)) from None


def read_json_config(config_cls: type[ConfigT], path: str | os.PathLike[str], opener: Opener = open_plain) -> ConfigT:
    """Read a JSON file written by `atomic_write_json`, opened with `opener`, and validate it as `config_cls`.

    Raises:
        ConfigError: it is not JSON, or not a `config_cls`; the message names the file and each bad field.
        Whatever `opener` raises: a workspace's reader refuses a file that leads outside (`PathEscapeError`).
    """
    try:
        data = read_json(path, opener)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:  # not a refusal, which is a ValueError too
        raise ConfigError(f"{path}: not valid JSON ({cut_text(str(error))})") from None
    return parse_config(config_cls, data, source=str(path))


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `a.b.c` in nested dicts, making the sections `data` leaves out.

    Raises:
        ValueError: a part of the key holds a value, not a section; the message names it.
    """
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ValueError(f"{part!r} is a value, not a section")
        node = child
    node[leaf] = value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides to a nested dict; values are parsed as YAML scalars."""
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {override!r}: expected key=value, e.g. optimizer.learning_rate=1e-3")
        try:
            set_dotted(data, key, yaml.safe_load(raw))
        except ValueError as error:
            raise ConfigError(f"override {override!r}: {error}") from None
    return data


def load_config(config_cls: type[ConfigT], path: str | os.PathLike[str], overrides: list[str] | None = None) -> ConfigT:
    """Load `path` (YAML), apply overrides and validate it as `config_cls`."""
    path = Path(path)
    try:
        data = yaml.safe_load(read_bounded(path, MAX_CONFIG_BYTES).decode("utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except InvalidInputError as error:  # a FIFO, a device, a hard link, or too large: its message names the path
        raise ConfigError(str(error)) from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {getattr(error, 'problem', error)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config fields at the top level")
    return parse_config(config_cls, apply_overrides(data, overrides or []), source=str(path))
