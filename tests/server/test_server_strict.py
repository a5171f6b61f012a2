"""Strict arguments through the real MCP client: the request model is the only validator, in Tradewind's words."""

import json
import types
import typing

import pydantic
import pytest
from mcp import Client

from tradewind.runs import ARCHITECTURES
from tradewind.server import build_server
from tradewind.server.adapter import GUARD_BOUND
from tradewind.tools import TOOLS, ToolContext

pytestmark = pytest.mark.anyio

PYDANTIC_WORDING = ("pydantic", "errors.pydantic.dev", "validation error for", "Input should be")


def error_text(result) -> str:
    assert result.is_error, result.structured_content
    text = " ".join(block.text for block in result.content)
    assert not any(words in text for words in PYDANTIC_WORDING), text
    assert "Traceback" not in text
    return text


async def still_serving(client, run_id) -> None:
    result = await client.call_tool("get_run", {"run_id": run_id})
    assert not result.is_error and result.structured_content["status"] == "SUCCEEDED"


@pytest.mark.slow
async def test_a_misspelt_launch_training_argument_is_an_error_naming_steps_and_starts_no_run(
    server, ctx, dataset_id, finished_run
):
    runs_before = sorted(ctx.workspace.runs_dir.iterdir())
    async with Client(server) as client:
        message = error_text(await client.call_tool("launch_training", {"dataset": dataset_id, "step": 5}))
        await still_serving(client, finished_run.run_id)
    assert "argument 'step': unknown argument; did you mean 'steps'?" in message
    assert "(launch_training takes: dataset, model, " in message
    assert sorted(ctx.workspace.runs_dir.iterdir()) == runs_before


async def test_launch_training_neither_lists_nor_takes_the_hand_started_gang_section(server, ctx, dataset_id):
    runs_before = sorted(ctx.workspace.runs_dir.iterdir())
    async with Client(server) as client:
        listed = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
        arguments = {"dataset": dataset_id, "distributed": {"enabled": True}}
        message = error_text(await client.call_tool("launch_training", arguments))
    assert "distributed" not in listed["launch_training"]["properties"]
    assert "argument 'distributed': not a launch_training argument" in message
    assert "replicas" in message
    assert sorted(ctx.workspace.runs_dir.iterdir()) == runs_before


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        (
            "read_metrics",
            {"run_id": "RUN", "max_point": 3},
            "argument 'max_point': unknown argument; did you mean 'max_points'?",
        ),
        ("sample_text", {"run_id": "RUN", "temprature": 0.5}, "did you mean 'temperature'?"),
        ("launch_training", {"dataset": "DATASET", "model": {"d_modle": 64}}, "argument 'model.d_modle'"),
    ],
)
@pytest.mark.slow
async def test_a_misspelt_argument_of_any_tool_names_the_nearest_valid_one(
    server, ctx, dataset_id, finished_run, tool, arguments, expected
):
    placeholders = {"RUN": finished_run.run_id, "DATASET": dataset_id}
    arguments = {
        key: placeholders.get(value, value) if isinstance(value, str) else value for key, value in arguments.items()
    }
    runs_before = sorted(ctx.workspace.runs_dir.iterdir())
    async with Client(server) as client:
        message = error_text(await client.call_tool(tool, arguments))
        await still_serving(client, finished_run.run_id)
    assert expected in message
    assert sorted(ctx.workspace.runs_dir.iterdir()) == runs_before


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"steps": "many"}, "argument 'steps': 'many' is not an integer"),
        ({"steps": -1}, "argument 'steps': must be greater than 0 (got -1)"),
        ({"model": {"d_model": "wide"}}, "argument 'model.d_model': 'wide' is not an integer"),
        ({"backend": "slurm"}, "argument 'backend': 'slurm' is not one of 'local' or 'ray'"),
    ],
)
@pytest.mark.slow
async def test_type_and_range_errors_are_in_tradewinds_wording(server, dataset_id, finished_run, arguments, expected):
    async with Client(server) as client:
        message = error_text(await client.call_tool("launch_training", {"dataset": dataset_id, **arguments}))
        await still_serving(client, finished_run.run_id)
    assert expected in message


@pytest.mark.slow
async def test_a_missing_required_argument_is_named(server, finished_run):
    async with Client(server) as client:
        message = error_text(await client.call_tool("tokenize_dataset", {}))
        await still_serving(client, finished_run.run_id)
    assert "argument 'input': missing" in message


@pytest.mark.parametrize("tool", ["get_run", "read_metrics", "summarize_report"])
@pytest.mark.slow
async def test_a_megabyte_id_is_refused_naming_its_argument_and_length_without_echoing_it(server, finished_run, tool):
    huge = "r" * 1_000_000
    async with Client(server) as client:
        message = error_text(await client.call_tool(tool, {"run_id": huge}))
        await still_serving(client, finished_run.run_id)
    assert len(message) < 1000
    assert "argument 'run_id': 1,000,000 characters; the limit is 4,096" in message
    assert "r" * 20 not in message


@pytest.mark.slow
async def test_a_megabyte_value_of_the_wrong_type_is_cut_too(server, finished_run):
    async with Client(server) as client:
        message = error_text(await client.call_tool("list_runs", {"limit": "9" * 1_000_000}))
        await still_serving(client, finished_run.run_id)
    assert len(message) < 1000 and "9" * 201 not in message and "argument 'limit'" in message


async def test_the_published_schema_is_still_the_request_models(server):
    async with Client(server) as client:
        listed = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
        whole = json.loads((await client.read_resource("tradewind://schema/launch_training")).contents[0].text)
    launch = listed["launch_training"]
    assert launch["properties"]["steps"]["minimum"] == 1
    assert "n_kv_heads" in launch["properties"]["model"]["description"]  # listed by name; the resource has all
    model = whole["properties"]["model"]  # one object with every architecture's fields, tagged by type
    assert model["properties"]["type"]["enum"] == list(ARCHITECTURES) and "n_kv_heads" in model["properties"]
    assert model["properties"]["d_model"]["maximum"] == 65536
    assert whole["$defs"]["OptimizerConfig"]["properties"]["learning_rate"]["exclusiveMinimum"] == 0
    assert listed["tokenize_dataset"]["required"] == ["input"]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"optimizer": {"learning_rat": 0.1}}, "argument 'optimizer.learning_rat': unknown argument"),
        ({"checkpoints": {"keep_last": 0}}, "argument 'checkpoints.keep_last': must be greater than 0 (got 0)"),
        ({"model": {"type": "gpt3"}}, "type 'gpt3' is not a model type"),
    ],
)
async def test_a_bad_field_of_a_compacted_section_is_still_named(server, ctx, arguments, expected):
    runs_before = sorted(ctx.workspace.runs_dir.iterdir())
    async with Client(server) as client:
        message = error_text(await client.call_tool("launch_training", {"dataset": "no-such-dataset", **arguments}))
    assert expected in message
    assert sorted(ctx.workspace.runs_dir.iterdir()) == runs_before


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"steps": 10**12}, "argument 'steps': must be at most 1000000000 (got 1000000000000)"),
        ({"model": {"d_model": 2**30}}, "argument 'model.d_model': must be at most 65536"),
        ({"mesh": {"data": -5}}, "argument 'mesh.data': must be at least -1 (got -5)"),
        ({"mesh": {"data": 0}}, "argument 'mesh.data': must be -1"),
    ],
)
async def test_numbers_past_their_documented_range_are_refused(server, ctx, dataset_id, arguments, expected):
    runs_before = sorted(ctx.workspace.runs_dir.iterdir())
    async with Client(server) as client:
        message = error_text(await client.call_tool("launch_training", {"dataset": dataset_id, **arguments}))
    assert expected in message
    assert sorted(ctx.workspace.runs_dir.iterdir()) == runs_before


def numeric_fields_without_a_range(schema, where):
    """Every integer or number property, anywhere in `schema`, that lacks a lower or an upper bound."""
    found = []
    if isinstance(schema, dict):
        types = schema.get("type")
        types = types if isinstance(types, list) else [types]
        if {"integer", "number"} & set(types):
            low = "minimum" in schema or "exclusiveMinimum" in schema
            high = "maximum" in schema or "exclusiveMaximum" in schema
            if not (low and high):
                found.append(where)
        for key, value in schema.items():
            if key in ("properties", "$defs") and isinstance(value, dict):
                found += [
                    entry
                    for name, inner in value.items()
                    for entry in numeric_fields_without_a_range(inner, f"{where}.{name}")
                ]
            elif isinstance(value, (dict, list)):
                found += numeric_fields_without_a_range(value, where)
    elif isinstance(schema, list):
        for item in schema:
            found += numeric_fields_without_a_range(item, where)
    return found


async def test_every_numeric_argument_of_every_tool_has_a_documented_range(server):
    """Listed with both bounds, but for a maximum too high to plan with (`GUARD_BOUND`): the listing leaves that out
    (`adapter.without_guard_bounds`), and the tool's whole schema states it."""
    async with Client(server) as client:
        tools = (await client.list_tools()).tools
        schemas = {
            tool.name: json.loads((await client.read_resource(f"tradewind://schema/{tool.name}")).contents[0].text)
            for tool in tools
        }
    unbounded = [entry for tool in tools for entry in numeric_fields_without_a_range(tool.input_schema, tool.name)]
    guarded = []
    for entry in unbounded:
        tool, name = entry.split(".", 1)
        whole = schemas[tool]["properties"].get(name, {})
        if max(whole.get("maximum", 0), whole.get("items", {}).get("maximum", 0)) >= GUARD_BOUND:
            guarded.append(entry)
    assert unbounded == guarded and "launch_training.steps" in guarded  # not vacuous


async def test_every_numeric_field_of_every_tools_whole_schema_has_a_documented_range(server):
    async with Client(server) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        schemas = {
            name: json.loads((await client.read_resource(f"tradewind://schema/{name}")).contents[0].text)
            for name in names
        }
    unbounded = [entry for name, schema in schemas.items() for entry in numeric_fields_without_a_range(schema, name)]
    assert unbounded == []
    # not vacuous: the nested sections' numbers are there to check
    assert schemas["launch_training"]["$defs"]["MeshConfig"]["properties"]["data"]["minimum"] == -1


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("list_runs", {"limit": "5"}, "argument 'limit': '5' is not an integer"),
        ("list_runs", {"limit": True}, "argument 'limit': True is not an integer"),
        ("wait_for_run", {"run_id": "RUN", "timeout_s": "1"}, "argument 'timeout_s': '1' is not a number"),
        (
            "sample_text",
            {"run_id": "RUN", "prompt": "y" * 10_001},
            "argument 'prompt': must have at most 10000 characters (got 10,001)",
        ),
    ],
)
@pytest.mark.slow
async def test_values_are_not_coerced_from_another_json_type(server, finished_run, tool, arguments, expected):
    arguments = {key: finished_run.run_id if value == "RUN" else value for key, value in arguments.items()}
    async with Client(server) as client:
        message = error_text(await client.call_tool(tool, arguments))
    assert expected in message


# Every string of every request: bounded and free of control characters.

TOO_LONG = "y" * 100_000  # past every string field's limit (a prompt's, 10,000, is the longest)
CONTROL = "ok\x00"  # NUL is refused everywhere, multi-line text included


def placeholder(annotation):
    """A valid-looking value of `annotation` for a dict whose key is being probed."""
    origin = typing.get_origin(annotation)
    return [1] if origin in (list, tuple, set, frozenset) else 1


def string_slots(annotation, path):
    """Every place a string can go in a value of `annotation`: (its dotted name, a function that builds a value
    holding a given string there). Lists get two copies, as some need two items."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is str or annotation is typing.Any:
        yield path, lambda text: text
    elif origin is typing.Annotated:
        yield from string_slots(args[0], path)
    elif origin in (typing.Union, types.UnionType):
        for option in args:
            yield from string_slots(option, path)
    elif origin in (list, tuple, set, frozenset):
        for inner, build in string_slots(args[0], path):
            yield inner, lambda text, build=build: [build(text), build(text)]
    elif origin is dict:
        value = placeholder(args[1])
        yield path, lambda text: {text: value}
        for inner, build in string_slots(args[1], f"{path}.k"):
            yield inner, lambda text, build=build: {"k": build(text)}
    elif isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        for name, field in annotation.model_fields.items():
            for inner, build in string_slots(field.annotation, f"{path}.{name}" if path else name):
                yield inner, lambda text, name=name, build=build: {name: build(text)}


def required_arguments(request_model) -> dict:
    """Arguments that pass the model's validation (the tool may refuse them later): the fields it requires, and a
    dataset, which a launch needs unless it resumes a run."""
    plain = {
        "run_ids": ["run-a", "run-b"],
        "status": "kept",
        "base": {"dataset": "d"},
        "space": {"optimizer.learning_rate": [1e-3]},
    }
    required = {name for name, field in request_model.model_fields.items() if field.is_required()}
    if "dataset" in request_model.model_fields and "resume_from" in request_model.model_fields:
        required.add("dataset")
    return {name: plain.get(name, "x") for name in required}


def probes(tool):
    """The string slots of `tool`'s request (one per dotted field) and the arguments it requires."""
    request_model = typing.get_type_hints(tool)["request"]
    found = {}
    for path, build in string_slots(request_model, ""):
        found.setdefault(path, build)
    return list(found.items()), required_arguments(request_model)


def tree(root):
    return sorted((str(path), path.stat().st_size) for path in root.rglob("*") if path.is_file())


TEXT_TOOLS = [tool for tool in TOOLS if probes(tool)[0]]  # all but cluster_status, whose arguments are choices


def test_the_walk_finds_the_strings_of_nested_sections_lists_and_dicts():
    fields = {tool.__name__: [path for path, _ in probes(tool)[0]] for tool in TEXT_TOOLS}
    nested = {"wandb_project", "model.preset", "distributed.coordinator_address", "note"}
    assert nested <= set(fields["launch_training"])
    assert fields["compare_runs"] == ["run_ids"] and set(fields["launch_sweep"]) >= {"base", "base.k", "space.k"}
    assert len(TEXT_TOOLS) == len(TOOLS) - 1


@pytest.mark.parametrize("tool", TEXT_TOOLS, ids=lambda tool: tool.__name__)
async def test_every_string_field_refuses_an_overlong_value_and_a_control_character_naming_the_field(tool, tmp_path):
    context = ToolContext.open(tmp_path / "ws")
    slots, required = probes(tool)
    before = tree(context.workspace.root)
    async with Client(build_server(context)) as client:
        for path, build in slots:
            # The error names the dotted field (check_text), or the argument holding it where the model's own
            # validation refused the value first (an unknown preset).
            argument = path.split(".")[0]
            for bad in (TOO_LONG, CONTROL):
                result = await client.call_tool(tool.__name__, {**required, **build(bad)})
                assert result.is_error, (path, repr(bad[:10]), result.structured_content)
                message = error_text(result)
                assert f"argument '{argument}" in message and len(message) < 1_000, (path, message[:300])
    assert tree(context.workspace.root) == before


async def test_a_prompt_may_hold_newlines_and_tabs(tmp_path):
    async with Client(build_server(ToolContext.open(tmp_path / "ws"))) as client:
        result = await client.call_tool("sample_text", {"run_id": "run-nope", "prompt": "ROMEO:\n\tBut soft"})
    assert "unknown run id 'run-nope'" in error_text(result)  # past the text check, to the run
