"""Strict arguments through the real MCP client: the request model is the only validator, in Tradewind's words."""

import json

import pytest
from mcp import Client

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
async def test_a_megabyte_id_is_refused_showing_at_most_200_characters_of_it(server, finished_run, tool):
    huge = "r" * 1_000_000
    async with Client(server) as client:
        message = error_text(await client.call_tool(tool, {"run_id": huge}))
        await still_serving(client, finished_run.run_id)
    assert len(message) < 1000
    assert "r" * 200 in message and "r" * 201 not in message
    assert "(1,000,000 characters)" in message


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
    assert model["properties"]["type"]["enum"] == ["llama", "gpt2"] and "n_kv_heads" in model["properties"]
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
    async with Client(server) as client:
        tools = (await client.list_tools()).tools
    unbounded = [entry for tool in tools for entry in numeric_fields_without_a_range(tool.input_schema, tool.name)]
    assert unbounded == []


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
