import re
import string
import typing
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


REQUIRED_SKILLS = {
    "train-with-tradewind",
    "fine-tune-a-model",
    "autoresearch-loop",
    "run-first-experiment",
    "tokenize-a-dataset",
    "train-on-tpu-with-ray",
    "debug-a-diverging-run",
    "profile-and-speed-up",
    "compare-runs-and-report",
    "size-a-model-for-a-corpus",
    "size-a-run-for-a-tpu-slice",
    "resume-extend-and-export",
    "add-a-model",
    "add-a-dataset-format",
}


def test_skills_ship_in_the_package_and_agents_skills_link_to_them():
    assert set(skill_names()) == REQUIRED_SKILLS
    for name in skill_names():
        text = load_skill(name)
        assert text.startswith(f"---\nname: {name}\n")
        link = Path(__file__).parents[2] / ".agents" / "skills" / name / "SKILL.md"
        assert link.is_symlink() and link.read_text(encoding="utf-8") == text
    with pytest.raises(NotFoundError, match="unknown skill 'nope'; known skills: add-a-dataset-format, add-a-model, "):
        load_skill("nope")


def test_the_research_loop_skill_calls_only_real_tools_with_real_arguments():
    requests = {tool.__name__: typing.get_type_hints(tool)["request"] for tool in TOOLS}
    calls = re.findall(r"\b([a-z_]+)\(([^()]*(?:\([^()]*\)[^()]*)*)\)", load_skill("autoresearch-loop"))
    named = {name for name, _ in calls if name in requests}
    assert {"launch_training", "wait_for_run", "set_experiment_status", "list_experiments", "estimate_run"} <= named
    for name, arguments in calls:
        if name in requests:
            # Top-level arguments only: nested `{...}` values are config sections.
            flat = re.sub(r"\{[^{}]*(\{[^{}]*\}[^{}]*)*\}", "{}", arguments)
            for argument in re.findall(r"\b([a-z_]+)=", flat):
                assert argument in requests[name].model_fields, f"{name}({argument}=...) in the skill"
