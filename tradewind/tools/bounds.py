"""How much one tool result may hold, and how tools cut what they return to fit.

An agent pays for every character a tool call answers, in its context window, so a whole answer fits
`ANSWER_CHARS`: the result, sent as structured content, fits `RESULT_CHARS` characters of compact JSON by
construction (long strings are cut, long lists are capped or paged, and a result says when it left
something out and how to get it), and the server's text beside it, a summary of the result, with the
resource links fits the rest, `SUMMARY_CHARS`. Images (report plots) are counted apart: at most
`MAX_IMAGES` of at most `MAX_IMAGE_BYTES` each.

Sizes are counted as JSON counts them: a quote, a backslash or a control character in a string takes two
to six characters once escaped, and a log full of terminal colour codes would otherwise swell to six times
its length.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

ANSWER_CHARS = 32_000  # about 8k tokens: the most one tool call's answer costs (text + structured content)
SUMMARY_CHARS = 1_000  # the answer's text, a summary of the result, and its resource links
RESULT_CHARS = ANSWER_CHARS - SUMMARY_CHARS  # the result itself: the answer's structured content
MAX_IMAGES = 3  # PNGs sent with one result: a report on eight runs has nine plots; the first says the most
MAX_IMAGE_BYTES = 512 * 1024  # a PNG larger than this is left to its path (and resource)
LINE_CHARS = 300  # one line of a log, an error or a reason, as shown inside a result
PATH_CHARS = 300  # one path, shown by its end (the file's name) when longer
PAGE_CHARS = RESULT_CHARS - 1_000  # the entries of a listing's page; the rest is room for counts and a cursor
ELLIPSIS = "…"

M = TypeVar("M", bound=BaseModel | str)


def json_chars(text: str) -> int:
    """Characters `text` takes inside a JSON string, escapes included (as pydantic writes it)."""
    return len(json.dumps(text, ensure_ascii=False)) - 2


def _escaped_chars(char: str) -> int:
    if char in '"\\\b\f\n\r\t':
        return 2
    return 6 if char < " " else 1  # other control characters become \u00XX


def fitting_prefix(text: str, limit: int) -> int:
    """How many characters from the start of `text` fit in `limit` characters of JSON string."""
    if json_chars(text) <= limit:
        return len(text)
    used = 0
    for index, char in enumerate(text):
        used += _escaped_chars(char)
        if used > limit:
            return index
    return len(text)


def cut(text: str, limit: int = LINE_CHARS, *, keep_end: bool = False) -> str:
    """`text` if it fits `limit` characters of JSON; else its start (or, with `keep_end`, its end) that
    fits with an ellipsis marking the cut."""
    if json_chars(text) <= limit:
        return text
    if keep_end:
        kept = fitting_prefix(text[::-1], limit - 1)
        return ELLIPSIS + text[len(text) - kept :]
    return text[: fitting_prefix(text, limit - 1)] + ELLIPSIS


def cut_path(path: str) -> str:
    """A path cut to `PATH_CHARS`, keeping its end: the file's name says more than the folders above it."""
    return cut(path, PATH_CHARS, keep_end=True)


def fitting(items: Iterable[M], budget: int) -> list[M]:
    """The first of `items` (models or strings) whose JSON list fits `budget` characters.

    Takes items from the iterable only until one does not fit, so a generator that reads a file per item
    reads no more than it returns (plus one).
    """
    kept: list[M] = []
    used = 2  # the brackets
    for item in items:
        size = json_chars(item) + 2 if isinstance(item, str) else len(item.model_dump_json())  # a string's quotes
        used += size + (1 if kept else 0)  # and a comma between items
        if used > budget:
            break
        kept.append(item)
    return kept


class PageRequest(BaseModel):
    """A listing's page: how many entries, starting after the previous page."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=500)
    cursor: str | None = Field(default=None, description="The last page's next_cursor.")
