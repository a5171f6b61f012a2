"""Read the markdown prompts and skills shipped beside this module."""

from __future__ import annotations

import string
from functools import cache
from importlib import resources

from tradewind.core import InvalidInputError, NotFoundError

# A prompt's file is `<name>.md`; `instructions` is the server's, the rest are MCP prompts.
PROMPT_NAMES = ("instructions", "train_on_text", "plan-experiment", "debug-run", "compare-runs", "scale-out")
SKILLS_FOLDER = "skills"  # skills/<name>/SKILL.md; `.agents/skills/<name>/SKILL.md` links here


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


@cache
def skill_names() -> tuple[str, ...]:
    """The agent skills shipped with Tradewind, sorted (each a folder `skills/<name>/` holding `SKILL.md`)."""
    folder = resources.files(__package__).joinpath(SKILLS_FOLDER)
    return tuple(sorted(entry.name for entry in folder.iterdir() if entry.joinpath("SKILL.md").is_file()))


@cache
def load_skill(name: str) -> str:
    """The `SKILL.md` text of skill `name` (one of `skill_names()`), front matter included."""
    if name not in skill_names():
        raise NotFoundError(f"unknown skill {name!r}; known skills: {', '.join(skill_names())}")
    return resources.files(__package__).joinpath(SKILLS_FOLDER, name, "SKILL.md").read_text(encoding="utf-8")
