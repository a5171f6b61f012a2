"""Prompts: the server's instructions, the prompt templates an agent can ask for, and the agent skills.

Each prompt is a markdown file beside this module; `load_prompt` reads one and `render_prompt` fills its
`{placeholders}`. Each skill is `skills/<name>/SKILL.md` (`.agents/skills/<name>/SKILL.md` is a link to it),
read by `load_skill`. This layer rests on `tradewind.core` alone, and only `tools` and `server` import it.
"""

from tradewind.prompts.loader import (
    PROMPT_NAMES,
    load_prompt,
    load_skill,
    render_prompt,
    server_instructions,
    skill_names,
)

__all__ = ["PROMPT_NAMES", "load_prompt", "load_skill", "render_prompt", "server_instructions", "skill_names"]
