"""Read the markdown prompts shipped beside this module."""

from __future__ import annotations

import string
from functools import cache
from importlib import resources

from tradewind.core import InvalidInputError, NotFoundError

PROMPT_NAMES = ("instructions", "train_on_text")


@cache
def load_prompt(name: str) -> str:
    """The text of prompt `name` (one of `PROMPT_NAMES`)."""
    if name not in PROMPT_NAMES:
        raise NotFoundError(f"unknown prompt {name!r}; known prompts: {', '.join(PROMPT_NAMES)}")
    return resources.files(__package__).joinpath(f"{name}.md").read_text(encoding="utf-8")


def render_prompt(name: str, **values: object) -> str:
    """Prompt `name` with its `{placeholders}` filled from `values`; every placeholder must be given."""
    template = load_prompt(name)
    needed = {field for _, field, _, _ in string.Formatter().parse(template) if field}
    missing = sorted(needed - values.keys())
    if missing:
        raise InvalidInputError(f"prompt {name!r} needs values for: {', '.join(missing)}")
    return template.format(**values)


def server_instructions() -> str:
    """What the MCP server tells every connecting agent about itself."""
    return load_prompt("instructions")
