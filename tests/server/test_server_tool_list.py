"""The tool list agents read on connecting: its size, its schemas' titles, its nested sections listed by their
fields (the whole schemas are resources), and each tool's title and hints."""

import json
import subprocess
import sys
import typing

import pytest
from mcp import Client

from tradewind.runs import GPT2Config, LlamaConfig
from tradewind.server import build_server
from tradewind.server.adapter import GUARD_BOUND, without_guard_bounds
from tradewind.server.app import SPEC_DEFAULT_HINTS, WRITING_HINTS, tool_hints
from tradewind.server.reference import reference_pages
from tradewind.tools import TOOLS

pytestmark = pytest.mark.anyio

# Characters of the tools/list answer as sent, every tool: every agent pays them in every conversation, so a new tool
# or field pays for itself with shorter wording elsewhere (issue 40's bound; 20,565 when it was set).
BUDGET = 22_000
READ_ONLY = {
    "inspect_dataset",
    "tail_logs",
    "list_datasets",
    "get_run",
    "wait_for_run",
    "get_sweep",
    "list_runs",
    "read_metrics",
    "cluster_status",
}

DECLARED = {tool.__name__: tool_hints(tool) for tool in TOOLS}  # each tool's @tool declaration, as hints


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


def wire_answer(workspace, method):
    """The line `tradewind serve` (stdio, a real subprocess) answers a `method` request with, as sent."""
    serve = [sys.executable, "-m", "tradewind", "serve", "--workspace", str(workspace)]
    with subprocess.Popen(serve, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as server:
        for message in (
            {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INITIALIZE},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 1, "method": method},
        ):
            server.stdin.write(json.dumps(message) + "\n")
        server.stdin.flush()
        line = next(line for line in server.stdout if json.loads(line).get("id") == 1)
        server.stdin.close()
    return line.rstrip("\n")


INITIALIZE = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}


def test_the_tool_list_as_a_client_receives_it_fits_its_budget(tmp_path):
    """Measured as sent: the serialised JSON-RPC answer to tools/list, every character on the wire. Over budget,
    the message names the largest tools, where cutting pays most."""
    line = wire_answer(tmp_path, "tools/list")
    tools = json.loads(line)["result"]["tools"]
    assert len(tools) == len(TOOLS)
    sizes = sorted(
        ((len(json.dumps(tool, separators=(",", ":"), ensure_ascii=False)), tool["name"]) for tool in tools),
        reverse=True,
    )
    largest = ", ".join(f"{name} {size:,}" for size, name in sizes[:5])
    assert len(line) <= BUDGET, (
        f"tools/list is {len(line):,} characters on the wire (budget {BUDGET:,}); largest: {largest}"
    )


async def test_no_schema_carries_an_automatic_title(listed):
    for tool in listed:
        assert titled_properties(tool.input_schema, f"{tool.name} input") == []
        assert titled_properties(tool.output_schema, f"{tool.name} output") == []


def hint(tool, name):
    """A listed tool's hint `name` as a client reads it: the spec's default where the listing leaves it out, and
    None for a hint MCP gives meaning only on a tool that is not read-only, on one that is."""
    if name in WRITING_HINTS and hint(tool, "read_only_hint"):
        return None
    value = getattr(tool.annotations, name)
    return SPEC_DEFAULT_HINTS[name] if value is None else value


async def test_every_tool_has_a_title_and_its_four_hints_as_the_table_states_them(listed):
    for tool in listed:
        assert tool.title == DECLARED[tool.name].title, tool.name
        assert tool.annotations is not None, tool.name
        for name in SPEC_DEFAULT_HINTS:
            if hint(tool, name) is not None:
                assert hint(tool, name) == getattr(DECLARED[tool.name], name), (tool.name, name)
        assert not (hint(tool, "read_only_hint") and hint(tool, "destructive_hint")), tool.name
    assert {tool.name for tool in listed if hint(tool, "destructive_hint") is None} == READ_ONLY


async def test_a_hint_is_listed_only_where_it_differs_from_the_specs_default_and_means_something(listed):
    for tool in listed:
        stated = tool.annotations.model_dump(exclude_none=True)
        assert all(value != SPEC_DEFAULT_HINTS[name] for name, value in stated.items()), tool.name
        if tool.annotations.read_only_hint:  # MCP: "meaningful only when readOnlyHint == false"
            assert not set(stated) & set(WRITING_HINTS), tool.name
    assert SPEC_DEFAULT_HINTS == {  # MCP's ToolAnnotations: what a client assumes for a hint left out
        "read_only_hint": False,
        "destructive_hint": True,
        "idempotent_hint": False,
        "open_world_hint": True,
    }
    assert WRITING_HINTS == ("destructive_hint", "idempotent_hint")


async def test_exactly_the_tools_that_change_nothing_are_read_only(listed):
    assert {tool.name for tool in listed if hint(tool, "read_only_hint")} == READ_ONLY
    destructive = {tool.name for tool in listed if hint(tool, "destructive_hint")}
    assert "cancel_run" in destructive and "launch_training" not in destructive


async def test_each_description_is_one_short_paragraph_saying_when_to_use_the_tool(listed):
    for tool in listed:
        assert "\n\n" not in tool.description and len(tool.description) <= 300, tool.name
        assert not tool.description.startswith((" ", "\n")) and "\n    " not in tool.description, tool.name
        assert "use it" in tool.description.lower(), tool.name


async def test_a_result_is_listed_as_an_object_without_its_fields(listed):
    # Every agent pays for tools/list in every conversation; the result's fields come back named in the result.
    assert [tool.output_schema for tool in listed] == [{"type": "object"}] * len(TOOLS)


def test_a_results_fields_are_named_on_its_reference_page():
    page = reference_pages()["launch_training.md"]
    assert all(f"`{name}`" in page for name in ("run_id", "status", "log_tail"))


async def test_a_read_only_server_lists_exactly_the_read_only_tools(ctx):
    async with Client(build_server(ctx, read_only=True)) as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        result = await client.call_tool("cancel_run", {"run_id": "run-x"})
    assert listed == READ_ONLY
    assert result.is_error and "cancel_run" in result.content[0].text


async def test_a_nested_config_section_is_listed_as_an_object_naming_each_of_its_fields(listed):
    launch = next(tool for tool in listed if tool.name == "launch_training").input_schema
    request = typing.get_type_hints(next(tool for tool in TOOLS if tool.__name__ == "launch_training"))["request"]
    architectures = {**LlamaConfig.model_fields, **GPT2Config.model_fields}
    sections = {
        "model": architectures,
        "optimizer": request.model_fields["optimizer"].annotation.model_fields,
        "checkpoints": request.model_fields["checkpoints"].annotation.model_fields,
        "mesh": request.model_fields["mesh"].annotation.model_fields,
    }
    for section, fields in sections.items():
        listed_section = launch["properties"][section]
        assert set(listed_section) == {"type", "description"}, section
        assert listed_section["type"] == "object", section
        names = listed_section["description"].partition("Fields: ")[2].partition(";")[0].split(", ")
        assert {name.partition(":")[0] for name in names} == set(fields), section
        assert "tradewind://schema" not in listed_section["description"], section  # named once, in the description
    assert "type: llama|gpt2" in launch["properties"]["model"]["description"]
    assert "schedule: cosine|linear|constant" in launch["properties"]["optimizer"]["description"]
    assert "$defs" not in launch
    description = next(tool for tool in listed if tool.name == "launch_training").description
    assert description.endswith(" Full schema: tradewind://schema/launch_training.")
    assert all("tradewind://schema" not in tool.description for tool in listed if tool.name != "launch_training")
    assert launch["properties"]["steps"]["minimum"] == 1  # a scalar argument keeps its whole schema ...
    assert "maximum" not in launch["properties"]["steps"]  # ... but for a bound that only guards against overflow


async def test_a_compacted_section_says_where_its_whole_schema_is_and_that_resource_has_it(ctx):
    async with Client(build_server(ctx)) as client:
        tools = (await client.list_tools()).tools
        schemas = {
            tool.name: json.loads((await client.read_resource(f"tradewind://schema/{tool.name}")).contents[0].text)
            for tool in tools
        }
    for tool in tools:
        whole = schemas[tool.name]
        assert list(whole["properties"]) == list(tool.input_schema["properties"]), tool.name
        assert whole.get("required", []) == tool.input_schema.get("required", []), tool.name
        for name, field in tool.input_schema["properties"].items():
            if "Fields: " not in field.get("description", ""):
                assert field == without_guard_bounds(whole["properties"][name]), (tool.name, name)
                dropped = {k: v for k, v in whole["properties"][name].items() if k not in field}
                assert all(v >= GUARD_BOUND for v in dropped.values()) and set(dropped) <= {"maximum"}, dropped


async def test_a_tool_is_served_from_its_declaration_alone(ctx, monkeypatch):
    """Adding a tool touches its module and `TOOLS`: the server finds its title, hints, result links and dashboard
    in its `@tool` declaration, with no table of its own to update."""
    from pydantic import BaseModel, ConfigDict

    from tradewind.server import app
    from tradewind.server.dashboard import DASHBOARD_URI
    from tradewind.tools.spec import tool

    class EchoRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        run_id: str

    class EchoResult(BaseModel):
        run_id: str
        dataset_id: str

    @tool("Echo ids", read_only=True, idempotent=True, links=("logs", "manifest"), dashboard=True)
    def echo_ids(ctx, request: EchoRequest) -> EchoResult:
        """Return the ids given. Use it to test."""
        return EchoResult(run_id=request.run_id, dataset_id="ds-1")

    monkeypatch.setattr(app, "TOOLS", (echo_ids,))
    async with Client(build_server(ctx)) as client:
        (listed,) = (await client.list_tools()).tools
        result = await client.call_tool("echo_ids", {"run_id": "run-1"})
    assert listed.title == "Echo ids" and listed.annotations.read_only_hint is True
    assert listed.annotations.open_world_hint is False
    assert listed.annotations.destructive_hint is None and listed.annotations.idempotent_hint is None  # read-only
    assert listed.meta == {"ui": {"resourceUri": DASHBOARD_URI}}
    links = [block.uri for block in result.content if block.type == "resource_link"]
    assert links == ["tradewind://runs/run-1/logs", "tradewind://datasets/ds-1/manifest"]
