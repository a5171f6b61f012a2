import string
from pathlib import Path

import pytest

from tradewind.core import InvalidInputError, NotFoundError
from tradewind.prompts import PROMPT_NAMES, load_prompt, load_skill, render_prompt, server_instructions, skill_names
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


def test_every_mcp_prompt_file_has_placeholders_only_for_its_arguments():
    fields = {
        name: {field for _, field, _, _ in string.Formatter().parse(load_prompt(name)) if field}
        for name in PROMPT_NAMES
    }
    assert fields["plan-experiment"] == {"goal", "dataset", "budget"}
    assert fields["debug-run"] == {"run_id"}
    assert fields["compare-runs"] == {"run_ids"}
    assert fields["scale-out"] == {"run_id", "accelerator", "backend"}


def test_skills_ship_in_the_package_and_agents_skills_link_to_them():
    assert skill_names() == ("train-with-tradewind",)
    text = load_skill("train-with-tradewind")
    assert text.startswith("---\nname: train-with-tradewind\n")
    link = Path(__file__).parents[2] / ".agents" / "skills" / "train-with-tradewind" / "SKILL.md"
    assert link.is_symlink() and link.read_text(encoding="utf-8") == text
    with pytest.raises(NotFoundError, match="unknown skill 'nope'; known skills: train-with-tradewind"):
        load_skill("nope")
