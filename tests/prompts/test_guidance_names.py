"""The skills and prompts an agent learns Tradewind from name only what exists.

Every skill has Agent Skills front matter (`name` equal to its folder, a `description` that says when to use
it) and a body under 500 lines. In every skill and prompt: a tool call `tool(arg=...)` names a real tool and
its real arguments; a backticked name with an underscore or a dot is a tool, an argument, a result field, a
config field (dotted from `TrainConfig`), a CLI option, a resource, a file of the repository or a name the
package defines; and every `tradewind ...` line of a bash block parses with the real command-line parser.
"""

import re
import shlex
import typing
from functools import cache
from pathlib import Path

import pytest
from pydantic import BaseModel

from tradewind.cli import build_parser
from tradewind.prompts import PROMPT_NAMES, load_prompt, load_skill, skill_names
from tradewind.runs import TrainConfig
from tradewind.runs.models.configs import GPT2Config, LlamaConfig
from tradewind.tools import TOOLS

ROOT = Path(__file__).parents[2]
TEXTS = [f"skill {name}" for name in skill_names()] + [f"prompt {name}" for name in PROMPT_NAMES]
BACKTICKED = re.compile(r"`([^`\n]+)`")
CALL = re.compile(r"\b([a-z_]+)\(((?:[^()]|\([^()]*\))*)\)")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# Names of the libraries and formats the texts talk about (not Tradewind's to define).
OUTSIDE = {
    "jax.distributed.initialize", "jax.profiler", "jax.numpy", "jax.jit", "jax.lax.scan", "optax.adamw",
    "flax.nnx", "model.safetensors", "config.json", "tokenizer.json", "RAY_ADDRESS", "JAX_PLATFORMS", "XLA_FLAGS",
    "CUDA_VISIBLE_DEVICES", "TRADEWIND_WORKSPACE", "settings.yaml", "metrics.jsonl", "summary.json", "run.json",
    "train.log", "manifest.json", "sweep.json", "controller.log", "experiments.tsv", "experiments.csv",
    "claude_desktop_config.json", "mcp.json", "pyproject.toml", "SKILL.md", "AGENTS.md", "README.md",
    "LlamaForCausalLM", "GPT2LMHeadModel", "pytest.mark.slow", "pytest.mark.ray", "nnx.Module", "nnx.Linear",
    "nnx.Rngs", "__init__.py", "tokenizer_config.json", "chat_template.jinja", "model.safetensors.index.json",
    "save_pretrained",
}  # fmt: skip


def text_of(label: str) -> str:
    kind, name = label.split(" ", 1)
    return load_skill(name) if kind == "skill" else load_prompt(name)


def fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every field of `model` and of the models nested in it, dotted from the top (`optimizer.learning_rate`)."""
    found = set()
    for name, field in model.model_fields.items():
        found.add(prefix + name)
        for inner in _models(field.annotation):
            found |= fields(inner, f"{prefix}{name}.")
    return found


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in typing.get_args(annotation) for model in _models(argument)]


@cache
def config_fields() -> set[str]:
    dotted = fields(TrainConfig) | {f"model.{name}" for name in fields(LlamaConfig) | fields(GPT2Config)}
    return dotted | {name.rsplit(".", 1)[-1] for name in dotted}


@cache
def tool_requests() -> dict[str, type[BaseModel]]:
    return {tool.__name__: typing.get_type_hints(tool)["request"] for tool in TOOLS}


@cache
def result_fields() -> set[str]:
    dotted = {name for tool in TOOLS for name in fields(typing.get_type_hints(tool)["return"])}
    return dotted | {name.rsplit(".", 1)[-1] for name in dotted}


@cache
def cli_names() -> set[str]:
    names = set()

    def walk(parser) -> None:
        for action in parser._actions:  # argparse keeps no public list of a parser's options
            names.update(option.lstrip("-").replace("-", "_") for option in action.option_strings)
            names.add(action.dest)
            choices = action.choices if isinstance(action.choices, dict) else {}  # subcommands
            for name, sub in choices.items():
                if hasattr(sub, "_actions"):
                    names.add(name.replace("-", "_"))
                    walk(sub)

    walk(build_parser())
    return names


@cache
def package_names() -> set[str]:
    """Modules, and names defined or assigned at any level, of the package's source."""
    names = set()
    for path in (ROOT / "tradewind").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        names |= {module, module.removesuffix(".__init__"), path.stem}
        names |= set(re.findall(r"^\s*(?:def|class)\s+(\w+)", path.read_text(encoding="utf-8"), re.M))
        names |= set(re.findall(r"^\s*(\w+)\s*[:=]", path.read_text(encoding="utf-8"), re.M))
    return names


def known(name: str) -> bool:
    return (
        name in OUTSIDE
        or name in tool_requests()
        or any(name in request.model_fields for request in tool_requests().values())
        or name in config_fields()
        or name in result_fields()
        or name in cli_names()
        or name in package_names()
        or (ROOT / name).exists()
    )


def test_there_are_skills_and_prompts_to_check():
    assert len(skill_names()) >= 2 and "instructions" in PROMPT_NAMES


@pytest.mark.parametrize("name", skill_names())
def test_a_skill_has_agent_skills_front_matter_and_a_short_body(name):
    text = load_skill(name)
    match = re.match(r"---\nname: (.+)\ndescription: (.+)\n---\n", text)
    assert match, f"skill {name}: front matter must be `name` then `description`, between --- lines"
    assert match.group(1) == name
    assert "Use when" in match.group(2) and len(match.group(2)) > 80, "the description says when to use it"
    assert len(text[match.end() :].splitlines()) < 500


@pytest.mark.parametrize("label", TEXTS)
def test_every_tool_call_names_a_real_tool_and_its_real_arguments(label):
    for tool, arguments in CALL.findall(text_of(label)):
        if tool not in tool_requests():
            continue
        top_level = re.sub(r"\{(?:[^{}]|\{[^{}]*\})*\}|\[[^\]]*\]|\"[^\"]*\"", "", arguments)
        for argument in re.findall(r"\b([a-z_]+)\s*=", top_level):
            assert argument in tool_requests()[tool].model_fields, f"{label}: {tool}({argument}=...) is no argument"


@pytest.mark.parametrize("label", TEXTS)
def test_every_backticked_name_exists(label):
    unknown = set()
    for quoted in BACKTICKED.findall(text_of(label)):
        quoted = quoted.strip().rstrip("/")
        if CALL.match(quoted) or "{" in quoted or "<" in quoted:
            continue  # calls are checked above; templates and placeholders name nothing yet
        if NAME.match(quoted) and ("_" in quoted or "." in quoted):
            if not known(quoted):
                unknown.add(quoted)
        elif "/" in quoted and re.search(r"\.(py|md|yaml|toml)$", quoted) and not (ROOT / quoted).exists():
            unknown.add(quoted)
    assert not unknown, f"{label} names what does not exist: {sorted(unknown)}"


@pytest.mark.parametrize("label", TEXTS)
def test_every_command_line_in_a_bash_block_parses(label):
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text_of(label), re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line.startswith("tradewind "):
                continue
            try:
                build_parser().parse_args(shlex.split(line)[1:])
            except SystemExit as error:
                pytest.fail(f"{label}: `{line}` does not parse (exit {error.code})")


def test_the_check_tells_real_names_from_invented_ones():
    for real in ("optimizer.learning_rate", "model.n_kv_heads", "time_budget_s", "val_bpb", "run_ids", "dataset_id"):
        assert known(real), real
    for invented in ("optimizer.learning_rat", "model.n_experts", "summary.tokens_per_s", "launch_trainer"):
        assert not known(invented), invented
