"""The tool list agents read on connecting: its size, its schemas' titles, and each tool's title and hints."""

import json

import pytest
from mcp import Client

from tradewind.server import build_server
from tradewind.server.app import TOOL_HINTS
from tradewind.tools import TOOLS

pytestmark = pytest.mark.anyio

BUDGET = 25_000  # characters of the compact tools/list JSON, all 16 tools
READ_ONLY = {
    "inspect_dataset",
    "tail_logs",
    "list_datasets",
    "get_run",
    "wait_for_run",
    "list_runs",
    "read_metrics",
    "cluster_status",
}


@pytest.fixture
async def listed(ctx):
    async with Client(build_server(ctx)) as client:
        return (await client.list_tools()).tools


def titled_properties(schema, where="schema"):
    """Every `properties` entry, anywhere in `schema`, that carries a title pydantic made up from its name."""
    found = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in ("properties", "$defs") and isinstance(value, dict):
                for name, inner in value.items():
                    automatic = (name, name.replace("_", " ").title())
                    if isinstance(inner, dict) and inner.get("title") in automatic:
                        found.append(f"{where}.{name}")
                    found += titled_properties(inner, f"{where}.{name}")
            else:
                found += titled_properties(value, f"{where}.{key}")
    elif isinstance(schema, list):
        for item in schema:
            found += titled_properties(item, where)
    return found


def test_every_tool_has_one_entry_in_the_hints_table():
    assert set(TOOL_HINTS) == {tool.__name__ for tool in TOOLS}


async def test_the_whole_tool_list_fits_its_budget(listed):
    size = len(
        json.dumps(
            [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in listed], separators=(",", ":")
        )
    )
    assert size <= BUDGET


async def test_no_schema_carries_an_automatic_title(listed):
    for tool in listed:
        assert titled_properties(tool.input_schema, f"{tool.name} input") == []
        assert titled_properties(tool.output_schema, f"{tool.name} output") == []


async def test_every_tool_has_a_title_and_all_four_hints(listed):
    for tool in listed:
        assert tool.title, tool.name
        hints = tool.annotations
        assert hints is not None, tool.name
        values = (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint, hints.open_world_hint)
        assert None not in values, tool.name
        assert not (hints.read_only_hint and hints.destructive_hint), tool.name


async def test_exactly_the_tools_that_change_nothing_are_read_only(listed):
    assert {tool.name for tool in listed if tool.annotations.read_only_hint} == READ_ONLY
    destructive = {tool.name for tool in listed if tool.annotations.destructive_hint}
    assert "cancel_run" in destructive and "launch_training" not in destructive


async def test_each_description_is_one_short_paragraph_saying_when_to_use_the_tool(listed):
    for tool in listed:
        assert "\n\n" not in tool.description and len(tool.description) <= 300, tool.name
        assert not tool.description.startswith((" ", "\n")) and "\n    " not in tool.description, tool.name
        assert "use it" in tool.description.lower(), tool.name


async def test_a_result_shared_by_several_tools_is_listed_once(listed):
    outputs = {tool.name: tool.output_schema for tool in listed}
    run_fields = set(outputs["launch_training"]["required"])
    assert {"run_id", "status", "log_tail"} <= run_fields
    for name in ("get_run", "cancel_run", "wait_for_run"):
        assert not run_fields & set(outputs[name].get("required", [])), name
        assert "launch_training" in outputs[name]["description"], name
    assert outputs["wait_for_run"]["required"] == ["timed_out"]


async def test_a_read_only_server_lists_a_shared_result_under_its_first_listed_tool(ctx):
    async with Client(build_server(ctx, read_only=True)) as client:
        outputs = {tool.name: tool.output_schema for tool in (await client.list_tools()).tools}
    assert {"run_id", "status"} <= set(outputs["get_run"]["required"])
    assert "get_run" in outputs["wait_for_run"]["description"]


async def test_a_read_only_server_lists_exactly_the_read_only_tools(ctx):
    async with Client(build_server(ctx, read_only=True)) as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        result = await client.call_tool("cancel_run", {"run_id": "run-x"})
    assert listed == READ_ONLY
    assert result.is_error and "cancel_run" in result.content[0].text
