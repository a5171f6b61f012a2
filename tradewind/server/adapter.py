"""Turning a Tradewind tool function into an MCP tool, without writing any schema by hand.

A tool is `tool(ctx, request, [progress]) -> Result`. The MCP SDK builds a tool's input schema from the
function signature, so the adapter gives the MCP-facing function one keyword parameter per field of the
request model (with the field's type, default and description): agents see flat arguments, and the
schema comes from the same pydantic model the Python API uses; an argument that is a nested config section
(a model, or a union of models) is listed by its field names only (`compact_sections`), its whole schema being
the resource `tradewind://schema/{tool}` (`request_schema`), which the tool's description names once. The reference
page's result fields come from the result model (`lean_output_schema`). The request model is also the only
validator: the SDK's own argument model lets every value
through (`_Unchecked`), and the wrapper validates exactly what the client sent, so a misspelt argument is an error
naming the nearest valid one rather than silently dropped; then every string of the request, nested ones too, is held to
a length and refused with a control character (`core.text.check_text`). Errors Tradewind raises on purpose become MCP
error results carrying their message, with long echoed values cut to 200 characters. A validator that fails on a shape
it did not expect (a list where it looked a string up) still gives an argument error, naming the arguments, and logs
its traceback: a wrong value never reaches the agent as a crash.

A result is sent as structured content (within `RESULT_CHARS`), beside a one-paragraph text summary of it and links to
the resources that hold more (a run's log, metrics, report; see `resources.result_links`), the two within
`SUMMARY_CHARS`, so that a whole answer fits `ANSWER_CHARS` (`tools.bounds`). A result model that names fields of PNG
paths in its class variable `image_fields` (reports, comparisons) also sends those PNGs as image content, counted apart.
"""

from __future__ import annotations

import base64
import functools
import inspect
import json
import threading
import typing
from collections.abc import Callable
from typing import Annotated, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import pydantic
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent, TextContent
from pydantic_core import core_schema

from tradewind.core import TradewindError, describe_validation_error, get_logger, listed_fields
from tradewind.core.config import cut_echoes
from tradewind.core.text import check_text
from tradewind.server.resources import result_links
from tradewind.tools import ToolContext
from tradewind.tools.bounds import MAX_IMAGE_BYTES, MAX_IMAGES, RESULT_CHARS, SUMMARY_CHARS, cut
from tradewind.tools.context import Cancelled, Progress
from tradewind.tools.spec import spec_of

CANCEL_GRACE_S = 0.8  # a cancelled call is answered within this, whether or not its tool has stopped by then
SUMMARY_STRING_CHARS = 160  # a string field longer than this is summarized by its length (a 128-character id is not)
PNG = "image/png"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_UNSENT = object()  # what the SDK's argument model holds for a required argument the call left out

logger = get_logger(__name__)


class _Unchecked:
    """Annotation metadata that publishes a field's schema but lets any value through.

    The SDK validates a call's arguments against a model it derives from the signature, before the wrapper
    runs, and that model drops unknown keys and words errors its own way. Each of its fields wraps the request
    field's type and constraints, which the JSON schema shows, in a validator that never calls them and passes
    the value on untouched, so the request model, given the raw sent arguments, is the only validator. A required
    field stays required in the schema (its core schema is a chain, not a default) yet a missing value is not
    an SDK error: the chain's one step holds a default the SDK fills in and the wrapper never reads.
    """

    def __init__(self, required: bool) -> None:
        self.required = required

    def __get_pydantic_core_schema__(self, source: Any, handler: pydantic.GetCoreSchemaHandler) -> Any:
        published = handler(source)  # the type with the field's constraints, as the schema shows it
        anything = core_schema.no_info_wrap_validator_function(lambda value, _validate: value, published)
        if not self.required:
            return anything
        return core_schema.chain_schema([core_schema.with_default_schema(anything, default_factory=lambda: _UNSENT)])


def _signature(request_model: type[pydantic.BaseModel], result_model: type) -> inspect.Signature:
    parameters = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            # the FieldInfo carries default, description and constraints; _Unchecked makes them schema only
            annotation=Annotated[field.annotation, field, _Unchecked(field.is_required())],
        )
        for name, field in request_model.model_fields.items()
        if name in listed_fields(request_model)
    ]
    parameters.append(inspect.Parameter("mcp_context", inspect.Parameter.KEYWORD_ONLY, annotation=Context))
    return inspect.Signature(parameters, return_annotation=result_model)


def _progress_reporter(mcp_context: Context, cancelled: threading.Event) -> Progress:
    """A progress callback that notifies the MCP client, callable from any thread.

    Made in the tool's worker thread, it keeps that request's event-loop token, so that threads the tool
    code starts itself (a Rust tokenizer's, a build's poller) can report progress too. It sends a value only
    when it exceeds the last one sent (the spec asks progress to increase), and raises `Cancelled` once the
    client has cancelled the call (`cancelled` is set), so a long tool stops at its next report.
    """
    loop = anyio.from_thread.run_sync(anyio.lowlevel.current_token)
    lock = threading.Lock()
    last: list[float] = []

    def report(done: float, total: float | None = None, message: str | None = None) -> None:
        if cancelled.is_set():
            raise Cancelled("the call was cancelled")
        with lock:  # several threads may report; the check and the update go together
            if last and done <= last[0]:
                return
            last[:] = [done]
        anyio.from_thread.run(mcp_context.report_progress, done, total, message, token=loop)

    return report


def _sent(mcp_context: Context, arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments the client sent, unknown names included, without the defaults the SDK filled in.

    The request model then knows which fields were given (`model_fields_set`): a run that continues another
    inherits every field the call leaves out, and `init_from` refuses only model fields that were set. A
    known argument's value is the SDK's (it parses a JSON object or list sent as a string), else the raw one.
    """
    params = mcp_context.request_context.params or {}
    sent = params.get("arguments") or {}
    return {name: arguments.get(name, value) for name, value in sent.items()}


def as_mcp_tool(tool: Callable[..., Any], ctx: ToolContext) -> Callable[..., Any]:
    """Wrap `tool` so that `MCPServer.add_tool` publishes its request and result models as schemas.

    The tool runs in a worker thread, so a long tool never blocks the server's event loop and other calls are
    answered meanwhile. A thread cannot be interrupted, so when the client cancels the call (the SDK cancels the
    request's cancel scope) the tool's progress callback raises `Cancelled` at its next report, and the request
    ends once the tool has stopped, or `CANCEL_GRACE_S` after the cancel if it has not (`_run_cancellable`).
    """
    hints = typing.get_type_hints(tool)
    request_model, result_model = hints["request"], hints["return"]
    reports_progress = "progress" in inspect.signature(tool).parameters

    def run(mcp_context: Context, cancelled: threading.Event, arguments: dict[str, Any]) -> Any:
        sent = _sent(mcp_context, arguments)
        try:
            # The only validation the arguments get. Strict, as JSON has types: "5" is not 5 and true is not 1.
            request = request_model.model_validate(sent, strict=True)
        except pydantic.ValidationError as error:
            raise _error(describe_validation_error(error, tool.__name__, arguments_of=request_model)) from None
        except Exception:  # a validator's defect, which only the arguments' shape reached: the log keeps its traceback
            logger.exception("%s: validating the arguments failed", tool.__name__)
            raise _error(_unvalidated(tool.__name__, request_model, sent)) from None
        try:
            check_text(request)  # every string: bounded, and no control characters (the models' types allow both)
            if reports_progress:
                return tool(ctx, request, progress=_progress_reporter(mcp_context, cancelled))
            return tool(ctx, request)
        except pydantic.ValidationError as error:  # a model the tool builds from valid arguments
            raise _error(cut_echoes(describe_validation_error(error, tool.__name__), sent)) from None
        except TradewindError as error:  # Cancelled too: the SDK never sends a cancelled call's answer
            raise _error(cut_echoes(str(error), sent)) from None

    @functools.wraps(tool)
    async def call(mcp_context: Context, **arguments: Any) -> Any:
        result = await _run_cancellable(run, mcp_context, threading.Event(), arguments)
        structured = result.model_dump(mode="json")
        links = result_links(spec_of(tool).links, structured)
        text_budget = SUMMARY_CHARS - sum(_json_chars(link) for link in links)
        text = TextContent(type="text", text=summarize(tool.__name__, structured, text_budget))
        images = result_images(result, ctx)
        return CallToolResult(content=[text, *links, *images], structured_content=structured)

    call.__signature__ = _signature(request_model, result_model)  # type: ignore[attr-defined]
    call.__annotations__ = {"mcp_context": Context, "return": result_model}
    del call.__wrapped__  # make inspect use __signature__, not the tool's own parameters
    return call


def _unvalidated(tool_name: str, request_model: type[pydantic.BaseModel], sent: dict[str, Any]) -> str:
    """The argument error for arguments whose validation failed with no `ValidationError` to say which was wrong.

    It names the arguments sent that the tool takes (names made up by the client are not echoed), so the agent
    checks them against the schema; what failed is in the server's log.
    """
    taken = [name for name in listed_fields(request_model) if name in sent]
    return (
        f"{tool_name}: arguments {', '.join(taken) or '(none)'} could not be validated; "
        "give each the type its schema shows"
    )


def _error(message: str) -> ToolError:
    """An error result's message, cut to fit an answer (a failed job's message carries the end of its log)."""
    return ToolError(cut(message, RESULT_CHARS))


def _json_chars(block: pydantic.BaseModel) -> int:
    """Characters a content block takes in the answer, as the SDK sends it."""
    return len(block.model_dump_json(by_alias=True, exclude_none=True))


def summarize(tool_name: str, structured: dict[str, Any], budget: int) -> str:
    """The answer's text: a one-paragraph summary of the result, within `budget` characters.

    The result itself is the structured content; a client that shows only text still sees the tool, each
    top-level number, flag and short string (ids, statuses, most paths), the length of a long one, and how many
    items each list or object holds. Written from the result alone, the same for every tool.
    """
    facts = []
    for name, value in structured.items():
        if isinstance(value, list):
            facts.append(f"{name}: {len(value)} item{'' if len(value) == 1 else 's'}")
        elif isinstance(value, dict):
            facts.append(f"{name}: {len(value)} entr{'y' if len(value) == 1 else 'ies'}")
        elif isinstance(value, str) and len(value) > SUMMARY_STRING_CHARS:
            facts.append(f"{name}: {len(value):,} characters")
        else:
            facts.append(f"{name}={json.dumps(value, ensure_ascii=False)}")
    return cut(f"{tool_name} result (whole in structured content): {', '.join(facts)}", budget)


def result_images(result: pydantic.BaseModel, ctx: ToolContext) -> list[ImageContent]:
    """The PNG files named by the fields in `result`'s `image_fields`, as image content (the first few small ones).

    Each is opened through the workspace (a link leading out of it is not followed) and sent only if it is a PNG
    of at most `MAX_IMAGE_BYTES`; the others stay paths in the result.
    """
    images = []
    for name in getattr(result, "image_fields", ()):
        for path in getattr(result, name, ()):
            if len(images) == MAX_IMAGES:
                return images
            data = _small_png(ctx, path, name)
            if data is not None:
                images.append(ImageContent(type="image", data=base64.b64encode(data).decode("ascii"), mime_type=PNG))
    return images


def _small_png(ctx: ToolContext, path: str, argument: str) -> bytes | None:
    if not path.endswith(".png"):
        return None
    try:
        with ctx.workspace.open(path, "rb", argument=argument) as file:
            data = file.read(MAX_IMAGE_BYTES + 1)
    except (TradewindError, OSError):  # gone, or not the workspace's own file: the result still names it
        return None
    return data if len(data) <= MAX_IMAGE_BYTES and data.startswith(PNG_SIGNATURE) else None


async def _run_cancellable(
    run: Callable[..., Any], mcp_context: Context, cancelled: threading.Event, arguments: dict[str, Any]
) -> Any:
    """`run` in a worker thread; once the request is cancelled, `cancelled` is set and the request ends when `run`
    has stopped or `CANCEL_GRACE_S` later, whichever comes first.

    A tool that reports progress stops at its next report (the callback raises `Cancelled`), which the long ones do
    at least twice a second. One that cannot stop sooner (it reports nothing, or is inside a single long step) runs
    on in its thread and its result is dropped: the client gets its answer within the grace, not when the tool
    ends.
    """
    stopped = threading.Event()

    def target() -> Any:
        try:
            return run(mcp_context, cancelled, arguments)
        finally:
            stopped.set()

    try:
        return await anyio.to_thread.run_sync(target, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        cancelled.set()
        with anyio.CancelScope(shield=True):  # the request is cancelled: wait a moment for the tool to stop
            await anyio.to_thread.run_sync(stopped.wait, CANCEL_GRACE_S, abandon_on_cancel=True)
        raise


def _automatic_title(key: str) -> str:
    return key.replace("_", " ").title()  # pydantic's title for a field with none of its own


def lean_input_schema(schema: Any, _name: str | None = None) -> Any:
    """`schema` accepting the same values in fewer characters, for agents to read.

    Pydantic's automatic titles go (a title a person set stays), `anyOf [T, null]` becomes `type: [T, "null"]`,
    an integer's `exclusiveMinimum: n` becomes `minimum: n + 1` (and `exclusiveMaximum: n` `maximum: n - 1`),
    `default: null` goes (a field left out of `required` is optional, and null is what it then holds), and so do
    `additionalProperties: true` and `items: {}` (what JSON Schema assumes without them), and an enum's `type` (its
    values say it). A model used more than once stays one entry of the schema's `$defs`.
    """
    if isinstance(schema, list):
        return [lean_input_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    lean: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and _name is not None and value in (_name, _automatic_title(_name)):
            continue
        if key in ("properties", "$defs"):
            lean[key] = {name: lean_input_schema(inner, _name=name) for name, inner in value.items()}
        else:
            lean[key] = lean_input_schema(value)
    lean = _or_null(lean)
    if lean.get("type") in ("integer", ["integer", "null"]):  # the same integers: > 0 is >= 1, < 10 is <= 9
        if lean.get("exclusiveMinimum") is not None:
            lean["minimum"] = lean.pop("exclusiveMinimum") + 1
        if lean.get("exclusiveMaximum") is not None:
            lean["maximum"] = lean.pop("exclusiveMaximum") - 1
    if lean.get("additionalProperties") is True:
        del lean["additionalProperties"]
    if lean.get("items") == {}:
        del lean["items"]
    if lean.get("default", 0) is None:
        del lean["default"]
    if "enum" in lean:
        lean.pop("type", None)
    if _name is None and lean.get("title", "").endswith("Arguments"):
        del lean["title"]  # the SDK's name for its argument model, `<tool>Arguments`, which says nothing
    return lean


def lean_output_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """What a tool returns, in brief: each top-level field's name and type.

    A nested model is `{"type": "object"}` (its fields are in the result itself, named), written in place
    rather than referenced; an enum keeps its values; descriptions, defaults and the `required` list go. Only
    ever looser than the result model's own schema, so a result the model produced still validates against
    it (the client checks).
    """
    lean = lean_input_schema(schema)
    defs = {
        f"#/$defs/{name}": {"type": "object"} if definition.get("type") == "object" else _bare(definition)
        for name, definition in lean.get("$defs", {}).items()
    }
    return {"type": "object", "properties": _inline(_bare(lean["properties"], names=True), defs)}


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    """`schema` with each `{"$ref": ...}` replaced by the definition it names."""
    if isinstance(schema, list):
        return [_inline(item, defs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if set(schema) == {"$ref"}:
        return defs[schema["$ref"]]
    return {key: _inline(value, defs) for key, value in schema.items()}


def _bare(schema: Any, names: bool = False) -> Any:
    """`schema` without descriptions and defaults, and with objects' fields left unlisted."""
    if isinstance(schema, list):
        return [_bare(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if names:  # a `properties` mapping: the keys are field names, not keywords
        return {name: _bare(inner) for name, inner in schema.items()}
    if schema.get("type") == "object":
        return {"type": "object"}
    dropped = ("description", "default", "title")
    return {key: _bare(value, names=key == "properties") for key, value in schema.items() if key not in dropped}


def request_schema(tool: Callable[..., Any]) -> dict[str, Any]:
    """The whole JSON schema of `tool`'s request model, lean: every nested field with its type, default and range.

    What `tradewind://schema/{tool}` serves; the listed input schema is this with its nested sections compacted
    (`compact_sections`). Fields marked `SkipJsonSchema` are not in it, as they are not arguments.
    """
    return lean_input_schema(typing.get_type_hints(tool)["request"].model_json_schema())


GUARD_BOUND = 10**4
"""A `maximum` this high (10**4 eval batches, a week of seconds, a million-entry vocabulary, 10**9 steps, a 2**32
seed) says nothing an agent plans with: it only keeps a number within what the code can hold or a job should take.
The listing leaves it out; validation keeps it, and its error names the bound."""


def without_guard_bounds(schema: Any) -> Any:
    """`schema` without any `maximum` of `GUARD_BOUND` or more, however deep."""
    if isinstance(schema, list):
        return [without_guard_bounds(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: without_guard_bounds(value)
        for key, value in schema.items()
        if not (key == "maximum" and isinstance(value, int | float) and value >= GUARD_BOUND)
    }


def compact_sections(schema: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`schema` with each argument that is a nested config section (a model, or a union of models) written as a
    bare object whose description names the section's fields, and the names of those arguments.

    The field names are what an agent needs to write a section (`optimizer: {"learning_rate": 1e-3}`); an enum
    or a union's tag shows its values (`type: llama|gpt2`), and a field every model of the section requires
    says so. Types, defaults and ranges are in the whole schema, which the caller names once for all sections
    (the tool's description), not in each. Validation does not change: the request model checks the whole
    section, and its errors name the nested field (`model.d_model`). Other arguments, lists of models among
    them, keep their whole schema but for the bounds too high to plan with (`without_guard_bounds`),
    and `$defs` keeps the entries they still refer to.
    """
    defs = schema.get("$defs", {})
    properties = {}
    sections = []
    for name, field in schema.get("properties", {}).items():
        models, nullable = _section_models(field, defs)
        if not models:
            properties[name] = without_guard_bounds(field)
            continue
        # the argument's own description, else a lone model's docstring (a union's are each its own)
        about = field.get("description") or (models[0].get("description", "") if len(models) == 1 else "")
        description = f"{about} Fields: {_field_listing(models)}".strip()
        properties[name] = {"type": ["object", "null"] if nullable else "object", "description": description}
        sections.append(name)
    compact = {key: value for key, value in schema.items() if key != "$defs"} | {"properties": properties}
    used = _used_defs(properties, defs)
    if used:
        compact["$defs"] = {name: definition for name, definition in defs.items() if name in used}
    return compact, sections


def _ref_name(ref: str) -> str:
    return ref.removeprefix("#/$defs/")


def _section_models(field: dict[str, Any], defs: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """The object schemas (with named fields) that argument `field` may be, and whether it may be null; no
    schemas when it may be anything else too (a number, a list), as it is then no section."""
    models = []
    nullable = False
    for option in field.get("anyOf") or field.get("oneOf") or [field]:
        option = defs.get(_ref_name(option["$ref"]), {}) if "$ref" in option else option
        if option == {"type": "null"}:
            nullable = True
        elif isinstance(option.get("properties"), dict) and option["properties"]:
            models.append(option)
        else:
            return [], False
    return models, nullable


def _field_listing(models: list[dict[str, Any]]) -> str:
    """The fields of a section that is one of `models`, in order: `name`, `name: a|b` for an enum or a union's
    tag, with `(required)` after a field each model requires."""
    fields: dict[str, list[dict[str, Any]]] = {}
    for model in models:
        for name, inner in model["properties"].items():
            fields.setdefault(name, []).append({**inner, "required": name in model.get("required", [])})
    entries = []
    for name, options in fields.items():
        values = [
            value
            for option in options
            for value in (option.get("enum") or ([option["const"]] if "const" in option else []))
            if value is not None
        ]
        entry = f"{name}: {'|'.join(dict.fromkeys(map(str, values)))}" if values else name
        if len(options) == len(models) and all(option["required"] for option in options):
            entry += " (required)"
        entries.append(entry)
    return ", ".join(entries)


def _used_defs(schema: Any, defs: dict[str, Any]) -> set[str]:
    """The names of the `$defs` entries `schema` refers to, directly or through other entries."""
    used: set[str] = set()
    pending = [schema]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending += item
        elif isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and _ref_name(ref) in defs and _ref_name(ref) not in used:
                used.add(_ref_name(ref))
                pending.append(defs[_ref_name(ref)])
            pending += [value for key, value in item.items() if key != "$ref"]
    return used


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """`anyOf: [{type: T, ...}, {type: null}]` as `type: [T, null]`, where that accepts the same values."""
    options = schema.get("anyOf")
    if not isinstance(options, list) or len(options) != 2 or {"type": "null"} not in options:
        return schema
    (other,) = [option for option in options if option != {"type": "null"}]
    if "const" in other or set(other) & (set(schema) - {"anyOf"}):
        return schema
    merged = {key: value for key, value in schema.items() if key != "anyOf"} | other
    if "enum" in other:  # its values say its type
        merged["enum"] = [*other["enum"], None]
        merged.pop("type", None)
    elif isinstance(other.get("type"), str):
        merged["type"] = [other["type"], "null"]
    else:
        return schema
    return merged
