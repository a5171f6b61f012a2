"""The tool reference pages `docs/reference/tools/`, generated from the tools the server lists.

    python -m tradewind.server.reference            # prints every page, each after a `<!-- file: NAME -->` line
    python -m tradewind.server.reference NAME       # prints the page of one tool (or `index`)
    python -m tradewind.server.reference --write    # rewrites docs/reference/tools/ (stale pages removed)

Each page is built from what `build_server` publishes to agents (title, description, annotations, and the
whole input schema it serves as `tradewind://schema/{tool}`, whose nested sections the tool list only names)
plus the rest of the tool's docstring and its result model's fields (types and descriptions; the listed
output schema names the fields only), so it says what a client sees and a little more. A test
(`tests/server/test_server_reference.py`) checks the committed pages are exactly these.
Imports no JAX.
"""

from __future__ import annotations

import inspect
import json
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any

import anyio
from mcp.types import Tool

from tradewind.core.markdown import table_cell
from tradewind.server.adapter import lean_output_schema
from tradewind.server.app import build_server, tool_hints
from tradewind.server.resources import schema_uri
from tradewind.tools import TOOLS, ToolContext

PAGES_DIR = Path(__file__).resolve().parents[2] / "docs" / "reference" / "tools"
"""Where the pages live in a source checkout."""

REGENERATE = "python -m tradewind.server.reference --write"
_HEADER = f"<!-- Generated from the server's tool schemas by `{REGENERATE}`; do not edit by hand. -->"
_CONFIG_REFERENCE = "../../trainer.md#config-reference"
_HINTS = (  # the annotation, its name on the wire, and what `yes` means (as `tradewind.tools.spec` states it)
    ("read_only_hint", "readOnlyHint", "changes nothing in the workspace or on a backend"),
    ("destructive_hint", "destructiveHint", "may delete or stop something that was there"),
    ("idempotent_hint", "idempotentHint", "calling again with the same arguments changes nothing more"),
    ("open_world_hint", "openWorldHint", "may reach outside the workspace and this machine's processes"),
)


def listed_tools() -> list[Tool]:
    """The tools as `build_server` lists them to a client, for a throwaway workspace."""
    return _published()[0]


def _published() -> tuple[list[Tool], dict[str, dict[str, Any]]]:
    """The tools `build_server` lists, and each one's whole input schema as its `tradewind://schema/` resource
    serves it, for a throwaway workspace."""
    with tempfile.TemporaryDirectory(prefix="tradewind-reference-") as root:
        server = build_server(ToolContext.open(root))

        async def read() -> tuple[list[Tool], dict[str, dict[str, Any]]]:
            tools = list(await server.list_tools())
            schemas = {}
            for tool in tools:
                (content,) = await server.read_resource(schema_uri(tool.name))
                schemas[tool.name] = json.loads(content.content)
            return tools, schemas

        return anyio.run(read)


def _prose(text: str) -> str:
    """Docstring paragraphs, each joined to one line and escaped like a cell."""
    paragraphs = [" ".join(block.split()) for block in text.split("\n\n") if block.strip()]
    return "\n\n".join(table_cell(paragraph) for paragraph in paragraphs)


def _literal(value: Any) -> str:
    return "`" + json.dumps(value, ensure_ascii=False).replace("|", "\\|") + "`"


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(schema: dict[str, Any], links: dict[str, str] | None = None) -> str:
    """A short type: `integer`, `string \\| null`, `array of X`, or a nested model's name (linked if in `links`)."""
    if "$ref" in schema or "properties" in schema:
        name = _ref_name(schema["$ref"]) if "$ref" in schema else schema.get("title", "object")
        return f"[{name}](#{links[name]})" if links and name in links else name
    if "anyOf" in schema:
        return " \\| ".join(_type(option, links) for option in schema["anyOf"])
    if "const" in schema:
        return _literal(schema["const"])
    kinds = schema.get("type") or _enum_types(schema.get("enum")) or "any"
    kinds = kinds if isinstance(kinds, list) else [kinds]
    shown = []
    for kind in kinds:
        if kind == "array" and isinstance(schema.get("items"), dict):
            shown.append(f"array of {_type(schema['items'], links)}")
        elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
            shown.append(f"object of {_type(schema['additionalProperties'], links)}")
        else:
            shown.append(kind)
    return " \\| ".join(shown)


def _enum_types(values: list[Any] | None) -> list[str]:
    """The JSON types of an enum's values, in order (the lean schema lists an enum without its type)."""
    names = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}
    return list(dict.fromkeys(names[type(value)] for value in values or ()))


def _allowed(schema: dict[str, Any]) -> str:
    """The range or the allowed values a schema states, e.g. `> 0, ≤ 256` or `"auto"`, `"text"`."""
    if "enum" in schema:
        return ", ".join(_literal(value) for value in schema["enum"])
    bounds = [
        ("exclusiveMinimum", "> {}"),
        ("minimum", "≥ {}"),
        ("exclusiveMaximum", "< {}"),
        ("maximum", "≤ {}"),
        ("minLength", "at least {} characters"),
        ("maxLength", "at most {} characters"),
        ("minItems", "at least {} items"),
        ("maxItems", "at most {} items"),
    ]
    shown = [template.format(schema[key]) for key, template in bounds if key in schema]
    if "pattern" in schema:
        shown.append(f"matches `{schema['pattern']}`")
    for option in schema.get("anyOf", ()):
        if isinstance(option, dict) and _allowed(option):
            shown.append(_allowed(option))
    items = schema.get("items")
    if isinstance(items, dict) and _allowed(items):
        shown.append("each " + _allowed(items))
    return ", ".join(shown)


def _default(name: str, schema: dict[str, Any], required: list[str]) -> str:
    if name in required:
        return "required"
    if "default" in schema:
        return _literal(schema["default"])
    if "$ref" in schema or "properties" in schema:
        return "(section)"
    return "`null`"


def _arguments_table(schema: dict[str, Any], prefix: str, links: dict[str, str]) -> list[str]:
    required = schema.get("required", [])
    lines = ["| argument | type | default | allowed | description |", "|---|---|---|---|---|"]
    for name, field in schema.get("properties", {}).items():
        lines.append(
            f"| `{prefix}{name}` | {_type(field, links)} | {_default(name, field, required)} | "
            f"{_allowed(field)} | {table_cell(field.get('description', ''))} |"
        )
    return lines


def _nested_sections(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(argument name, model name, its schema) of each top-level argument that is a nested model: a `$defs`
    entry, or a titled object schema written in place (as `ModelConfig`'s)."""
    nested = []
    for name, field in schema.get("properties", {}).items():
        for option in [field, *(option for option in field.get("anyOf", ()) if isinstance(option, dict))]:
            definition = schema.get("$defs", {}).get(_ref_name(option["$ref"]), {}) if "$ref" in option else option
            if "properties" in definition:
                nested.append((name, definition.get("title") or _ref_name(option["$ref"]), definition))
                break
    return nested


def _tool_function(name: str) -> Any:
    return next(tool for tool in TOOLS if tool.__name__ == name)


def _result_fields(name: str) -> list[tuple[str, dict[str, Any], str]]:
    """(name, lean schema, description) of each field of tool `name`'s result; the list names fields only."""
    result_model = typing.get_type_hints(_tool_function(name))["return"]
    schema = lean_output_schema(result_model.model_json_schema(mode="serialization"))
    return [
        (field, schema["properties"][field], info.description or "")
        for field, info in result_model.model_fields.items()
    ]


def tool_page(tool: Tool, schema: dict[str, Any]) -> str:
    """The markdown page of one listed tool, whose whole input schema is `schema`."""
    hints = tool_hints(_tool_function(tool.name))
    _, _, rest = inspect.cleandoc(_tool_function(tool.name).__doc__ or "").partition("\n\n")
    lines = [
        f"# `{tool.name}`",
        "",
        _HEADER,
        "",
        f"**{table_cell(hints.title or tool.name)}.** {table_cell(tool.description or '')}",
        "",
    ]
    if rest.strip():
        lines += [_prose(rest), ""]
    lines += ["| hint | value | meaning of yes |", "|---|---|---|"]
    for attribute, label, meaning in _HINTS:
        lines.append(f"| `{label}` | {'yes' if getattr(hints, attribute) else 'no'} | {meaning} |")
    lines.append("")

    nested = _nested_sections(schema)
    links = {model: argument for argument, model, _ in nested}
    lines += ["## Arguments", ""]
    if schema.get("properties"):
        lines += _arguments_table(schema, "", links)
    else:
        lines.append("None.")
    lines.append("")
    for argument, model, definition in nested:
        lines += [f"### `{argument}`", ""]
        intro = table_cell(definition.get("description", ""))
        lines += [f"{intro} An object ({model}); the same fields as [`{argument}.`]({_CONFIG_REFERENCE}).", ""]
        lines += _arguments_table(definition, f"{argument}.", links)
        lines.append("")

    lines += ["## Result", "", "| field | type | description |", "|---|---|---|"]
    for name, field, description in _result_fields(tool.name):
        lines.append(f"| `{name}` | {_type(field)} | {table_cell(description)} |")
    lines.append("")
    return "\n".join(lines)


def index_page(tools: list[Tool]) -> str:
    """The index of the tool pages: each tool's title and first description line."""
    lines = [
        "# Tool reference",
        "",
        _HEADER,
        "",
        "One page per tool that `tradewind serve` lists, in the order agents see them, generated from the",
        "published schemas: arguments (type, default, allowed values), hints and result fields. The overview",
        "is [MCP tools](../../tools.md); setting up a client is [Clients](../../clients.md).",
        "",
        "| tool | title | what it does |",
        "|---|---|---|",
    ]
    for tool in tools:
        title, description = table_cell(tool.title or ""), table_cell(tool.description or "")
        lines.append(f"| [`{tool.name}`]({tool.name}.md) | {title} | {description} |")
    lines.append("")
    return "\n".join(lines)


def reference_pages() -> dict[str, str]:
    """Every page, by file name under `docs/reference/tools/`: `index.md`, then one per tool."""
    tools, schemas = _published()
    pages = {"index.md": index_page(tools)}
    pages.update({f"{tool.name}.md": tool_page(tool, schemas[tool.name]) for tool in tools})
    return pages


def write_pages(folder: Path = PAGES_DIR) -> list[Path]:
    """Write the pages into `folder`, removing `.md` files there that no tool has any more."""
    pages = reference_pages()
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.md"):
        if stale.name not in pages:
            stale.unlink()
    written = []
    for name, text in pages.items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        for path in write_pages():
            print(path, file=sys.stderr)
        return 0
    pages = reference_pages()
    if len(argv) == 1 and not argv[0].startswith("-"):
        name = argv[0].removesuffix(".md") + ".md"
        if name not in pages:
            print(f"no page {name!r}; pages: {', '.join(pages)}", file=sys.stderr)
            return 2
        print(pages[name], end="")
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name, text in pages.items():
        print(f"<!-- file: {name} -->\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
