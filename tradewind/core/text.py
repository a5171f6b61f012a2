"""Free text in requests: every string bounded in length and free of control characters.

A JSON client can send any string where a model says `str`: a megabyte, a NUL byte, a terminal escape, a lone
surrogate. `check_text` walks a validated request (nested config sections, lists, and the keys and values of
free-form dicts) and refuses the first string that is too long or holds such a character, naming its dotted field.

A string's limit is `MAX_TEXT_CHARS`, or the field's own `max_length`, or what a `TextRule` in its annotation
says; only a field whose rule is `MULTILINE` (a prompt) may hold a newline or a tab. NUL, the other C0 and C1
control characters, DEL and lone surrogates are refused everywhere.

    from typing import Annotated
    prompt: Annotated[str, MULTILINE] = Field(default="", max_length=10_000)
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tradewind.core.errors import InvalidInputError

MAX_TEXT_CHARS = 4096  # a string's limit unless its field says otherwise: the longest path Linux takes (PATH_MAX)
NAME_CHARS = 40  # of a dict key, where an error names the field under it

# C0 controls, DEL, C1 controls and lone surrogates; the multi-line set lets newline and tab through.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


@dataclass(frozen=True)
class TextRule:
    """How the strings of a field are checked, given in its annotation (`Annotated[str, TextRule(...)]`).

    Attributes:
        max_chars: the longest string taken; None: the field's own `max_length`, else `MAX_TEXT_CHARS`.
        multiline: whether a newline and a tab are taken (text a person or a model reads as lines).
    """

    max_chars: int | None = None
    multiline: bool = False


MULTILINE = TextRule(multiline=True)


def check_text(request: BaseModel) -> None:
    """Refuse `request` if any string in it is over its field's limit or holds a control character.

    Walks every field of the model, nested models, lists, tuples, sets and dicts (keys and values) without
    recursion, so a deeply nested free-form value cannot exhaust the stack.

    Raises:
        InvalidInputError: names the dotted field (`model.preset`, `run_ids[1]`, `space.x`) and the limit or the
            character, never the value.
    """
    # A field's name is built only for an error: (parent, part) links, as a deep value would make long names.
    pending: list[tuple[Any, Any, int, bool]] = [(request, None, MAX_TEXT_CHARS, False)]
    while pending:
        value, where, limit, multiline = pending.pop()
        if isinstance(value, str):
            _check_string(value, where, limit, multiline)
        elif isinstance(value, BaseModel):
            for name, field in type(value).model_fields.items():
                pending.append((getattr(value, name), (where, f".{name}"), *_rule(field)))
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str):  # a key is a name: one line, whatever the values may hold
                    _check_string(key, (where, " (a key)"), limit, multiline=False)
                pending.append((item, (where, f".{_name(key)}"), limit, multiline))
        elif isinstance(value, (list, tuple, set, frozenset)):
            pending += [(item, (where, f"[{index}]"), limit, multiline) for index, item in enumerate(value)]


def _check_string(text: str, where: Any, limit: int, multiline: bool) -> None:
    if len(text) > limit:
        raise InvalidInputError(
            f"argument {_dotted(where)!r}: {len(text):,} characters; the limit is {limit:,}. Send a shorter value"
        )
    found = (_CONTROL_BUT_LINES if multiline else _CONTROL).search(text)
    if found is not None:
        code = ord(found.group())
        kind = "a lone surrogate" if 0xD800 <= code <= 0xDFFF else "a control character"
        allowed = "only newlines and tabs are taken here" if multiline else "it takes one line of plain text"
        raise InvalidInputError(
            f"argument {_dotted(where)!r}: character {found.start():,} is U+{code:04X}, {kind}; {allowed}"
        )


def _dotted(where: Any) -> str:
    """The field's name from its (parent, part) links: `model.preset`, `run_ids[1]`, `space (a key)`."""
    parts = []
    while where is not None:
        where, part = where
        parts.append(part)
    return "".join(reversed(parts)).removeprefix(".")


def _rule(field: FieldInfo) -> tuple[int, bool]:
    """(limit, multi-line) for the strings of `field`: its `TextRule`, else its own `max_length` if it is a
    string field (on a list, max_length counts items), else the default."""
    rule = next((item for item in field.metadata if isinstance(item, TextRule)), TextRule())
    declared = None
    if _is_text(field.annotation):
        declared = next((item.max_length for item in field.metadata if isinstance(item, annotated_types.MaxLen)), None)
    return rule.max_chars or declared or MAX_TEXT_CHARS, rule.multiline


def _is_text(annotation: Any) -> bool:
    """Whether a field's annotation is `str` or an optional `str`."""
    if annotation is str:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set(typing.get_args(annotation)) == {str, type(None)}
    return False


def _name(key: Any) -> str:
    """A dict key as part of a field's dotted name, cut short."""
    text = str(key)
    return text if len(text) <= NAME_CHARS else text[:NAME_CHARS] + "…"
