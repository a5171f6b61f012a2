"""Prompts: the server's instructions and the prompt templates an agent can ask for.

Each prompt is a markdown file beside this module; `load_prompt` reads one and `render_prompt` fills its
`{placeholders}`. This layer rests on `tradewind.core` alone, and only `tools` and `server` import it.
"""

from tradewind.prompts.loader import PROMPT_NAMES, load_prompt, render_prompt, server_instructions

__all__ = ["PROMPT_NAMES", "load_prompt", "render_prompt", "server_instructions"]
