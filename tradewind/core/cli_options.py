"""Command-line options generated from a pydantic model, so that a field is declared once, in the model.

A field `text_field` becomes `--text-field` with the field's type, its description as help and its
`Literal` values as choices; a bool that is off by default becomes a flag `--strict`, one that is on by
default `--no-append-eos`. An option left out is left out of the model too, so the model's defaults and
validation (ranges, `extra="forbid"`) are the only ones, and `model_fields_set` is what the user typed.

Example:
    add_model_options(parser, TokenizeDatasetRequest, positional=("input",), aliases={"--no-eos": "append_eos"})
    request = model_from_args(TokenizeDatasetRequest, parser.parse_args())
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

import pydantic
from pydantic_core import PydanticUndefined

from tradewind.core.config import listed_fields

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)
_SCALARS = (str, int, float)


def add_model_options(
    parser: argparse.ArgumentParser,
    model: type[pydantic.BaseModel],
    *,
    positional: Sequence[str] = (),
    aliases: Mapping[str, str] | None = None,
) -> None:
    """Add an option to `parser` for every field of `model` that its JSON schema lists.

    Args:
        parser: the (sub)command's parser.
        model: the pydantic model whose fields become options.
        positional: fields taken as positional arguments instead, in this order.
        aliases: extra option strings, each mapped to the field it also sets (to keep an older spelling).

    Raises:
        TypeError: a field's type is not a string, number, bool or `Literal` (or one of them or None), so it
            cannot be typed on a command line.
    """
    extra = {}
    for alias, name in (aliases or {}).items():
        extra.setdefault(name, []).append(alias)
    for name in positional:
        parser.add_argument(name, help=_help(model.model_fields[name].description), **_value_kind(model, name))
    for name in listed_fields(model):
        if name in positional:
            continue
        field = model.model_fields[name]
        flag = "--" + name.replace("_", "-")
        help_text = field.description or ""
        if isinstance(field.default, bool):
            flag, action = ("--no-" + flag[2:], "store_false") if field.default else (flag, "store_true")
            options: dict[str, Any] = {"action": action}
            help_text += " (on by default; this option turns it off)" if field.default else ""
        else:
            options = _value_kind(model, name)
            if field.default not in (None, "", PydanticUndefined):
                help_text += f" (default: {field.default})"
        parser.add_argument(
            flag, *extra.get(name, ()), dest=name, default=argparse.SUPPRESS, help=_help(help_text), **options
        )


def model_from_args(model: type[ModelT], args: argparse.Namespace) -> ModelT:
    """Validate the options `add_model_options` added (those given on the command line) as `model`.

    Raises:
        pydantic.ValidationError: a value is out of range or otherwise invalid (the message names the field).
    """
    return model.model_validate({name: getattr(args, name) for name in model.model_fields if hasattr(args, name)})


def _help(text: str | None) -> str:
    """`text` as argparse help, which %-formats it."""
    return (text or "").strip().replace("%", "%%")


def _value_kind(model: type[pydantic.BaseModel], name: str) -> dict[str, Any]:
    """`type=` (and `choices=` for a `Literal`) of a field that takes a value."""
    annotation = _unwrap_optional(model.model_fields[name].annotation)
    if typing.get_origin(annotation) is Literal:
        choices = typing.get_args(annotation)
        return {"type": type(choices[0]), "choices": choices}
    if annotation in _SCALARS:
        return {"type": annotation}
    raise TypeError(f"{model.__name__}.{name}: a {annotation} cannot be a command-line option")


def _unwrap_optional(annotation: Any) -> Any:
    """`X` for `X | None` (or `Optional[X]`); the annotation itself otherwise."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation
