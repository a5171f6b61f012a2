import pytest

from tradewind.core import InvalidInputError, NotFoundError
from tradewind.prompts import PROMPT_NAMES, load_prompt, render_prompt, server_instructions
from tradewind.tools import TOOLS


def test_instructions_mention_every_tool():
    text = server_instructions()
    assert [tool.__name__ for tool in TOOLS if f"`{tool.__name__}`" not in text] == []


def test_every_prompt_file_loads():
    assert all(load_prompt(name).strip() for name in PROMPT_NAMES)


def test_render_fills_placeholders_and_requires_all_of_them():
    text = render_prompt("train_on_text", input="builtin:tinyshakespeare", steps=300)
    assert "`builtin:tinyshakespeare`" in text and "300 steps" in text
    with pytest.raises(InvalidInputError, match="needs values for: steps"):
        render_prompt("train_on_text", input="x")


def test_unknown_prompt_is_not_found():
    with pytest.raises(NotFoundError, match="unknown prompt 'nope'"):
        load_prompt("nope")
