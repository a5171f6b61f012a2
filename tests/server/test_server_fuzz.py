"""Every tool fuzzed through the real MCP client, with arguments generated from the schema the tool lists.

For each tool, hypothesis draws argument objects from its `tools/list` input schema: values the schema allows
(with the suite's real dataset and run ids among the strings, so that valid calls get as far as the tool's
work) mixed with values it does not (wrong types, out-of-range numbers, unknown and missing arguments, huge
strings, NUL bytes, paths leading out of the workspace). Every answer must be a result, or an error result
that says what was wrong in Tradewind's words; every answer fits 32,000 characters; and the server answers a
cheap call after each one.

A valid call of a tool that starts work (a training run, a tokenization, a sampling or profiling process, a
pipeline) would make the fuzz slow and leave processes behind, so the argument that names its input is only
ever drawn from values that name nothing; each test checks that no run or dataset appeared, and cancels any
that did before failing.

Beside the generated calls, `TRAPS` lists the holes of issue 23 as one call each in a workspace laid out for it:
links out of run and dataset folders (a log, a metrics file, a manifest, the reports folder), workspace internals
as inputs (the token file, the job store, settings, a glob that matches dot-files), oversized and control-laden
free text, and operations in the wrong state (resuming a RUNNING run, a blank reason, a pipeline without
--allow-code). A regression of any of them fails here.

And every argument of every tool, nested section fields included (as `tradewind://schema/{tool}` lists them), is
given each of `WRONG_SHAPES` in turn (a list, an object, null, huge numbers, 200 levels of nesting, an empty and a
very long string) while the other arguments name nothing in an empty workspace (issue 38): each answer is a result
or an error in Tradewind's words, argument errors (one line each) naming the argument when its type is wrong, and
the server logs no traceback.
"""

import contextlib
import json
import logging
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

import anyio
import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp_helpers import answer_chars
from pydantic import BaseModel, ConfigDict, field_validator
from runs_helpers import metric_rows, write_run

from tradewind.cluster import JobStatus
from tradewind.cluster.process import process_start_time
from tradewind.runs import RunRecord
from tradewind.server import build_server
from tradewind.server.adapter import as_mcp_tool
from tradewind.tools import TOOLS, TokenizeDatasetRequest, ToolContext, tokenize_dataset
from tradewind.tools.spec import tool as declare_tool

TOOL_NAMES = [tool.__name__ for tool in TOOLS]
EXAMPLES_PER_TOOL = 100  # 16 tools x 100 = 1,600 fuzzed calls a run; the issue asks for at least 500
RESULT_BOUND = 32_000  # characters: what one tool result may cost an agent's context (8k tokens)
ECHO_LIMIT = 200  # characters of a value an error may echo
CALL_DEADLINE_S = 60  # a call that takes longer is a hang, not a slow answer
# What a raw Python or pydantic failure looks like, as opposed to a message written for the agent.
UNREADABLE = ("Traceback (most recent call last)", "errors.pydantic.dev", "validation error for", "Input should be")

# Strings that name nothing anywhere: hostile paths and ids, not one of which can resolve in the workspace.
HUGE = "x" * 100_000
HOSTILE_STRINGS = [
    "",
    " ",
    ".",
    "..",
    "/",
    "../../etc/passwd",
    "/etc/passwd",
    "runs/../../..",
    "~/.ssh/id_rsa",
    "a\x00b",
    "\x00",
    "builtin:",
    "builtin:no-such-corpus",
    "file:///etc/passwd",
    "%2e%2e%2fetc",
    "\u202erun",
    "-1",
    "null",
    HUGE,
]
# The argument of each tool that, given something real, starts work: a run, a tokenization, a JAX process.
CONFINED = {
    ("launch_training", "dataset"),
    ("launch_training", "resume_from"),
    ("tokenize_dataset", "input"),
    ("train_tokenizer", "input"),
    ("sample_text", "run_id"),
    ("profile_run", "run_id"),
    ("rerun_baseline", "run_id"),
    ("run_pipeline", "pipeline"),
}
# Values that are the wrong type for most schemas; each schema's own wrong types are added to them.
WRONG_TYPES = st.sampled_from([None, True, 0, -1, 2.5, "text", [], [1, "a"], {}, {"nested": {"deep": [None]}}])


class Session:
    """One in-memory MCP client session on the real server, called from synchronous code.

    Hypothesis drives synchronous tests, so the client lives in an event loop on a portal thread and each call
    crosses over; a call that does not answer within `CALL_DEADLINE_S` fails the test instead of hanging it.
    """

    def __init__(self, portal, client: Client) -> None:
        self.portal = portal
        self.client = client

    def call(self, name: str, arguments: dict[str, Any]):
        return self.portal.call(self._call, name, arguments)

    async def _call(self, name: str, arguments: dict[str, Any]):
        with anyio.fail_after(CALL_DEADLINE_S):
            return await self.client.call_tool(name, arguments)

    def schemas(self) -> dict[str, dict]:
        listed = self.portal.call(self.client.list_tools)
        return {tool.name: tool.input_schema for tool in listed.tools}

    def whole_schema(self, tool: str) -> dict:
        """`tool`'s whole input schema, nested sections' fields too, as the server serves it."""
        read = self.portal.call(self.client.read_resource, f"tradewind://schema/{tool}")
        return json.loads(read.contents[0].text)


@contextlib.contextmanager
def open_session(ctx: ToolContext) -> Iterator[Session]:
    with (
        start_blocking_portal("asyncio") as portal,
        portal.wrap_async_context_manager(Client(build_server(ctx))) as client,
    ):
        yield Session(portal, client)


@pytest.fixture(scope="module")
def session(ctx):
    with open_session(ctx) as opened:
        yield opened


@pytest.fixture(scope="module")
def schemas(session) -> dict[str, dict]:
    return session.schemas()


@pytest.fixture(scope="module")
def real_names(ctx, dataset_id, finished_run) -> list[str]:
    """Strings that name something real, so that generated calls reach the tools' valid paths too."""
    return [dataset_id, finished_run.run_id, "corpus.txt", str(ctx.workspace.root / "corpus.txt")]


# --- schema -> strategy ------------------------------------------------------------------------------------


def resolve(schema: dict, defs: dict) -> dict:
    """`schema` with a `$ref` into `$defs` replaced by the definition (its own keywords, e.g. a description, kept)."""
    if "$ref" not in schema:
        return schema
    name = schema["$ref"].removeprefix("#/$defs/")
    return {**defs[name], **{key: value for key, value in schema.items() if key != "$ref"}}


def types_of(schema: dict) -> list[str]:
    declared = schema.get("type", [])
    return declared if isinstance(declared, list) else [declared]


def bounds(schema: dict) -> tuple[Any, Any, bool, bool]:
    """(low, high, low excluded, high excluded) of a numeric schema; None where unbounded."""
    low, high = schema.get("minimum"), schema.get("maximum")
    exclude_low = exclude_high = False
    if "exclusiveMinimum" in schema:
        low, exclude_low = schema["exclusiveMinimum"], True
    if "exclusiveMaximum" in schema:
        high, exclude_high = schema["exclusiveMaximum"], True
    return low, high, exclude_low, exclude_high


def integers(schema: dict) -> tuple[st.SearchStrategy, st.SearchStrategy]:
    low, high, exclude_low, exclude_high = bounds(schema)
    low = None if low is None else int(low) + exclude_low
    high = None if high is None else int(high) - exclude_high
    outside = [10**30, -(10**30), 2**63, 1.5]
    outside += [] if low is None else [low - 1]
    outside += [] if high is None else [high + 1]
    return st.integers(min_value=low, max_value=high), st.sampled_from(outside)


def numbers(schema: dict) -> tuple[st.SearchStrategy, st.SearchStrategy]:
    # NaN and infinity are left out: JSON has no spelling for them, so no client can send them.
    low, high, exclude_low, exclude_high = bounds(schema)
    valid = st.floats(
        min_value=low,
        max_value=high,
        exclude_min=exclude_low,
        exclude_max=exclude_high,
        allow_nan=False,
        allow_infinity=False,
    )
    outside = [1e308, -1e308]
    outside += [] if low is None else [low, low - 1e-9, low - 1] if exclude_low else [low - 1e-9, low - 1]
    outside += [] if high is None else [high, high + 1e-9, high + 1] if exclude_high else [high + 1e-9, high + 1]
    return valid, st.sampled_from(outside)


def strings(schema: dict, names: list[str]) -> tuple[st.SearchStrategy, st.SearchStrategy]:
    most = schema.get("maxLength")
    text = st.text(max_size=40 if most is None else min(most, 40))
    # Real names twice: half the strings name a real run, dataset or file, so valid calls reach the tool's work.
    valid = st.one_of(st.sampled_from(names), st.sampled_from(names), text, st.sampled_from(HOSTILE_STRINGS))
    too_long = st.just("y" * (most + 1)) if most is not None else st.nothing()
    return valid, too_long


def value_strategy(schema: dict, defs: dict, names: list[str]) -> st.SearchStrategy:
    """Values for one argument: mostly what `schema` allows, sometimes what it does not."""
    schema = resolve(schema, defs)
    allowed: list[st.SearchStrategy] = []
    refused: list[st.SearchStrategy] = [WRONG_TYPES]
    if "enum" in schema:
        options = schema["enum"]
        allowed.append(st.sampled_from(options))
        refused.append(st.sampled_from(["not-an-option", *(o.upper() for o in options if isinstance(o, str))]))
    else:
        for kind in types_of(schema):
            if kind == "string":
                valid, invalid = strings(schema, names)
            elif kind == "integer":
                valid, invalid = integers(schema)
            elif kind == "number":
                valid, invalid = numbers(schema)
            elif kind == "boolean":
                valid, invalid = st.booleans(), st.sampled_from(["yes", 2])
            elif kind == "null":
                valid, invalid = st.none(), st.nothing()
            elif kind == "object":
                valid, invalid = objects(schema, defs, names), st.sampled_from(["{not json", [{}]])
            elif kind == "array":
                items = value_strategy(schema.get("items", {}), defs, names)
                valid, invalid = st.lists(items, max_size=4), st.just({"not": "a list"})
            else:
                raise AssertionError(f"the fuzz has no strategy for type {kind!r} in {schema}")
            allowed.append(valid)
            refused.append(invalid)
    # Allowed values three times over: hypothesis picks a branch about evenly, so most values are allowed ones
    # and a call with a dozen arguments still often has all of them right.
    return st.one_of(*allowed, *allowed, *allowed, *refused)


def objects(schema: dict, defs: dict, names: list[str], confined: frozenset[str] = frozenset()) -> st.SearchStrategy:
    """Argument objects for `schema`: some of its properties (required ones mostly present), an unknown name now
    and then (a near miss of a real one or a made-up one), and properties in `confined` drawn from names that
    name nothing."""
    properties = schema.get("properties", {})
    required = set(schema.get("required", []))
    fields = {
        name: nowhere() if name in confined else value_strategy(inner, defs, names)
        for name, inner in properties.items()
    }
    present = st.fixed_dictionaries(
        {name: fields[name] for name in properties if name in required},
        optional={name: fields[name] for name in properties if name not in required},
    )
    near_misses = [name + "s" for name in properties] + [name[:-1] for name in properties if len(name) > 1]
    unknown = st.dictionaries(
        st.one_of(st.sampled_from(near_misses or ["x"]), st.text(min_size=1, max_size=12)),
        WRONG_TYPES,
        max_size=2,
    )
    missing_one = st.sampled_from(sorted(required)) if required else st.none()

    @st.composite
    def argument_object(draw) -> dict:
        value = draw(present)
        # One call in six gets an unknown name, one in ten lacks a required one. Not on 0: the first examples
        # hypothesis tries are its simplest draws, and those should be plain calls.
        if draw(st.integers(0, 5)) == 5:
            value = {**draw(unknown), **value}
        if draw(st.integers(0, 9)) == 9:
            value.pop(draw(missing_one), None)
        return value

    return argument_object()


def nowhere() -> st.SearchStrategy:
    """Strings that cannot name a file, dataset, run or pipeline in the workspace, or anything outside it.

    The made-up names have no slash: 'no-such-/../corpus.txt' would name the corpus."""
    made_up = st.text(st.characters(exclude_characters="/\\"), max_size=30).map(lambda text: f"no-such-{text}")
    return st.one_of(st.sampled_from(HOSTILE_STRINGS), made_up)


def arguments_for(tool: str, schema: dict, names: list[str]) -> st.SearchStrategy:
    confined = frozenset(name for owner, name in CONFINED if owner == tool)
    return objects(schema, schema.get("$defs", {}), names, confined)


# --- what every answer must be -----------------------------------------------------------------------------


def long_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if len(value) > ECHO_LIMIT else []
    if isinstance(value, dict):
        return [text for item in [*value.keys(), *value.values()] for text in long_strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in long_strings(item)]
    return []


def check_answer(tool: str, arguments: dict, result) -> None:
    """A result or a readable error, within the bound; an error echoes no value past `ECHO_LIMIT` characters."""
    texts = [block.text for block in result.content if block.type == "text"]
    size = answer_chars(result)
    assert size <= RESULT_BOUND, f"{tool} answered {size:,} characters (text and structured content)"
    if not result.is_error:
        return
    message = "\n".join(texts)
    # The SDK prefixes every tool error with this; what follows must say what was wrong.
    cause = message.removeprefix(f"Error executing tool {tool}:").strip()
    assert cause, f"{tool} gave an error with no cause: {message!r}"
    assert not any(words in message for words in UNREADABLE), message[:2000]
    for value in long_strings(arguments):
        assert value[: ECHO_LIMIT + 1] not in message, f"{tool} echoed more than {ECHO_LIMIT} characters of a value"


def run_folders(ctx) -> set[str]:
    return {path.name for path in ctx.workspace.runs_dir.iterdir()}


def dataset_ids(session) -> set[str]:
    listed = session.call("list_datasets", {"limit": 500})
    assert not listed.is_error, listed.content
    return {dataset["dataset_id"] for dataset in listed.structured_content["datasets"]}


# --- the tests ---------------------------------------------------------------------------------------------


def test_the_fuzz_covers_every_listed_tool(schemas):
    assert sorted(schemas) == sorted(TOOL_NAMES)


@pytest.mark.parametrize("tool", TOOL_NAMES)
@pytest.mark.slow
def test_every_generated_call_gets_a_result_or_a_readable_error_and_the_server_keeps_answering(
    tool, session, schemas, real_names, ctx, finished_run
):
    runs_before, datasets_before = run_folders(ctx), dataset_ids(session)
    calls = 0

    # derandomize: the same calls every run, so a CI failure reproduces; database=None writes no .hypothesis/.
    @settings(
        max_examples=EXAMPLES_PER_TOOL,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(arguments=arguments_for(tool, schemas[tool], real_names))
    def one_call(arguments):
        nonlocal calls
        calls += 1
        check_answer(tool, arguments, session.call(tool, arguments))
        alive = session.call("get_run", {"run_id": finished_run.run_id})
        assert not alive.is_error and alive.structured_content["status"] == "SUCCEEDED", alive.content

    try:
        one_call()
    finally:
        started = sorted(run_folders(ctx) - runs_before)
        for run_id in started:  # leave nothing running for the rest of the suite
            session.call("cancel_run", {"run_id": run_id})
    assert not started, f"the fuzz of {tool} started runs {started}"
    assert dataset_ids(session) == datasets_before, f"the fuzz of {tool} built a dataset"
    assert calls >= EXAMPLES_PER_TOOL


# --- every argument given each wrong shape (issue 38) -----------------------------------------------------------
#
# The generated calls above draw wrong types now and then; here every argument, nested section fields included, gets
# each shape of `WRONG_SHAPES` in turn, so that a validator that assumes a type (a list used as a dict key) cannot hide.
# The other arguments are `nowhere_arguments`: a call the request model accepts fails with "not found" in an empty
# workspace, so no call starts work.


def nested(depth: int, wrap: Callable[[Any], Any]) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = wrap(value)
    return value


# 200 levels: the client's own serializer refuses a little past 250, so nothing deeper can reach a server through it.
DEPTH = 200
WRONG_SHAPES = {
    "list": ["x", 1],
    "empty-list": [],
    "object": {"x": 1},
    "empty-object": {},
    "null": None,
    "huge-integer": 10**30,
    "huge-float": 1e308,
    "deep-list": nested(DEPTH, lambda inner: [inner]),
    "deep-object": nested(DEPTH, lambda inner: {"x": inner}),
    "empty-string": "",
    "long-string": HUGE,
}
# What a Python exception looks like in an answer, as opposed to a message written for the agent.
EXCEPTION_NAME = re.compile(r"\b\w*(Error|Exception)\b|Traceback|unhashable")
# Required arguments that are not a bare string of nothing, per tool; `nowhere_arguments` fills in the rest. A section
# with a required field of its own is given it, so that a wrong value beside it is the call's one problem.
NOWHERE = {
    "launch_training": {"dataset": "no-such-dataset", "model": {"rope_scaling": {"factor": 8.0}}},
    "estimate_run": {"run_id": "no-such-run"},
    "summarize_report": {"run_id": "no-such-run"},
    "compare_runs": {"run_ids": ["no-such-run", "no-such-other-run"]},
    "set_experiment_status": {"run_id": "no-such-run", "status": "kept", "reason": "the fuzz"},
    "launch_sweep": {"base": {"dataset": "no-such-dataset"}, "space": {"seed": [1, 2]}},
}


def nowhere_arguments(tool: str, schema: dict) -> dict[str, Any]:
    """Arguments `tool`'s request model accepts that name nothing: `NOWHERE`'s, else `no-such-<name>` for each
    required argument."""
    return NOWHERE.get(tool) or {name: f"no-such-{name}" for name in schema.get("required", [])}


def section_schemas(schema: dict, defs: dict) -> list[dict]:
    """The object schemas with named fields that an argument of `schema` may be (a section, or a nullable one)."""
    schema = resolve(schema, defs)
    options = [resolve(option, defs) for option in schema.get("anyOf") or schema.get("oneOf") or [schema]]
    return [option for option in options if option.get("properties")]


def field_paths(schema: dict, defs: dict, parents: tuple[str, ...] = ()) -> dict[tuple[str, ...], dict]:
    """Every field of `schema`, nested sections' fields after their section's, by path: the field's schema."""
    paths = {}
    for name, inner in schema.get("properties", {}).items():
        paths[(*parents, name)] = inner
        for section in section_schemas(inner, defs):
            paths |= field_paths(section, defs, (*parents, name))
    return paths


def json_type(value: Any) -> str:
    kinds = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string"}
    return kinds.get(type(value)) or ("array" if isinstance(value, list) else "object")


def allowed_types(schema: dict, defs: dict) -> set[str] | None:
    """The JSON types `schema` allows; None where it allows any value."""
    schema = resolve(schema, defs)
    if "enum" in schema:
        return {json_type(option) for option in schema["enum"]}
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        each = [allowed_types(option, defs) for option in options]
        return None if None in each else set().union(*each)
    declared = set(types_of(schema))
    return (declared | {"integer"} if "number" in declared else declared) or None


def with_value(arguments: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """`arguments` with the field at `path` set to `value`, the sections on the way kept or made."""
    head, *rest = path
    if not rest:
        return {**arguments, head: value}
    section = arguments.get(head)
    return {**arguments, head: with_value(section if isinstance(section, dict) else {}, tuple(rest), value)}


def names_field(line: str, path: tuple[str, ...]) -> bool:
    """Whether an error line is about the field at `path`: it names it (or a part of it, `lora.targets.0`), or it
    names the section holding it and says the field's name (a model's `type` is checked by its section)."""
    field, section = ".".join(path), ".".join(path[:-1])
    return line.startswith((f"argument '{field}'", f"argument '{field}.")) or (
        bool(section) and line.startswith(f"argument '{section}':") and path[-1] in line
    )


def shape_problem(tool: str, path: tuple[str, ...], wrong_type: bool, result) -> str | None:
    """What is wrong with the answer to a call giving the field at `path` a wrong shape: None for a result or an
    error in Tradewind's words; a value of the wrong type must get argument errors, one line per problem
    (`argument 'name': ...`, or `tool: ...` for the whole call), one of them naming the field."""
    if not result.is_error:
        return "accepted a value of the wrong type" if wrong_type else None
    message = "\n".join(block.text for block in result.content if block.type == "text")
    cause = message.removeprefix(f"Error executing tool {tool}:").strip()
    if not cause or cause == message:
        return f"crashed: {message!r}"
    if EXCEPTION_NAME.search(cause) or any(words in cause for words in UNREADABLE):
        return f"not in Tradewind's words: {cause[:300]!r}"
    if not wrong_type:  # a value the request takes: the tool's own error ("not found") says what is wrong
        return None
    lines = cause.split("\n")
    if not all(line.startswith(("argument '", f"{tool}: ")) for line in lines):
        return f"not argument errors: {cause[:300]!r}"
    if not any(names_field(line, path) for line in lines):
        return f"does not name {'.'.join(path)!r}: {cause[:300]!r}"
    return None


@pytest.fixture(scope="module")
def empty_ctx(tmp_path_factory) -> ToolContext:
    """A workspace with nothing in it: no dataset, run, sweep or file for a call to start work on."""
    context = ToolContext.open(tmp_path_factory.mktemp("empty-workspace"))
    (context.workspace.root / "settings.yaml").write_text("backend: local\n", encoding="utf-8")
    return context


@pytest.fixture(scope="module")
def empty_session(empty_ctx):
    with open_session(empty_ctx) as opened:
        yield opened


def test_the_nowhere_arguments_pass_every_request_model():
    for tool in TOOLS:
        request = get_type_hints(tool)["request"]
        request.model_validate(nowhere_arguments(tool.__name__, request.model_json_schema()), strict=True)


@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_every_argument_given_a_wrong_shape_gets_an_argument_error_naming_it_and_the_server_logs_no_traceback(
    tool, empty_session, empty_ctx, caplog
):
    whole = empty_session.whole_schema(tool)
    defs = whole.get("$defs", {})
    paths = field_paths(whole, defs)
    assert set(empty_session.schemas()[tool].get("properties", {})) <= {path[0] for path in paths}
    base = nowhere_arguments(tool, whole)
    problems = []
    for path, schema in paths.items():
        field, allowed = ".".join(path), allowed_types(schema, defs)
        for shape, value in WRONG_SHAPES.items():
            result = empty_session.call(tool, with_value(base, path, value))
            problem = shape_problem(tool, path, allowed is not None and json_type(value) not in allowed, result)
            if problem:
                problems.append(f"{field}={shape}: {problem}")
    assert not problems, f"{tool}, {len(problems)} answers:\n" + "\n".join(problems)
    logged = [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]
    assert not logged, f"{tool} logged {logged[0].getMessage()!r}, {len(logged)} records with a traceback or error"
    assert not any(empty_ctx.workspace.runs_dir.iterdir()), f"the fuzz of {tool} started a run"
    assert not any(empty_ctx.workspace.datasets_dir.iterdir()), f"the fuzz of {tool} built a dataset"


class ColourRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    colour: str

    @field_validator("colour", mode="before")
    @classmethod
    def _alias(cls, colour: Any) -> Any:
        return {"crimson": "red"}.get(colour, colour)  # the defect the fuzz hunts: a list is no dict key


@declare_tool("Colour", read_only=True)
def colour(ctx: ToolContext, request: ColourRequest) -> ColourRequest:
    """Echo a colour; 'boom' is a defect of the tool itself."""
    if request.colour == "boom":
        raise KeyError(request.colour)
    return request


def test_a_validator_that_fails_on_a_shape_gives_an_argument_error_and_logs_it_while_a_tool_crash_stays_one(
    tmp_path, caplog
):
    server = MCPServer(name="colour")
    server.add_tool(as_mcp_tool(colour, ToolContext.open(tmp_path / "ws")), name="colour", structured_output=True)

    async def calls():
        async with Client(server) as client:
            return [await client.call_tool("colour", {"colour": value}) for value in (["x"], "boom", "crimson")]

    refused, crashed, taken = anyio.run(calls)
    assert refused.is_error and refused.content[0].text == (
        "Error executing tool colour: colour: arguments colour could not be validated; "
        "give each the type its schema shows"
    )
    assert crashed.is_error and crashed.content[0].text == "Error executing tool colour"  # not disguised
    assert taken.structured_content == {"colour": "red"}
    failures = [record.exc_info[0] for record in caplog.records if record.exc_info]
    assert TypeError in failures, "the validator's defect must stay in the server's log"


# --- the traps of issue 23: workspaces laid out by an attacker, and calls a careless agent makes ------------------
#
# Each trap gets a fresh workspace (a small dataset, a finished run, a run that is RUNNING, a token file, settings, a
# pipeline) beside a folder outside it, lays its trap (a link out of a run or dataset folder, or none), makes one call,
# and checks what no answer may do: show what lies outside, change anything outside, start a run or build a dataset it
# was not meant to, or break the server. Traps that must be refused name a fragment of the error.

SECRET = "SECRET-7f3a9c"  # in every file outside the workspace a trap links to, and in the token file
SECRET_LOSS = 987654.0  # the loss of the metrics row outside


@dataclass
class Planted:
    root: Path  # the workspace
    outside: Path
    dataset_id: str
    run_id: str  # a finished run
    live_run_id: str  # a run whose record says RUNNING, its trainer a live process


def link_log(planted: Planted) -> None:
    (planted.outside / "secret.log").write_text(f"{SECRET} the log of another system\n")
    log = planted.root / "runs" / planted.run_id / "train.log"
    log.unlink(missing_ok=True)
    log.symlink_to(planted.outside / "secret.log")


def link_metrics(planted: Planted) -> None:
    (planted.outside / "metrics.jsonl").write_text(json.dumps({"step": 1, "elapsed": 1.0, "loss": SECRET_LOSS}) + "\n")
    metrics = planted.root / "runs" / planted.run_id / "metrics.jsonl"
    metrics.unlink()
    metrics.symlink_to(planted.outside / "metrics.jsonl")


def link_manifest(planted: Planted) -> None:
    manifest_path = planted.root / "datasets" / planted.dataset_id / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["sources"][0]["path"] = str(planted.outside / f"{SECRET}.txt")
    (planted.outside / "manifest.json").write_text(json.dumps(manifest))
    manifest_path.unlink()
    manifest_path.symlink_to(planted.outside / "manifest.json")


def link_reports(planted: Planted) -> None:
    (planted.outside / "reports").mkdir()
    shutil.rmtree(planted.root / "reports")
    (planted.root / "reports").symlink_to(planted.outside / "reports", target_is_directory=True)


def nothing(planted: Planted) -> None:
    pass


TINY = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64}, "batch_size": 2, "seq_len": 16}

# (id, trap, tool, arguments, what the error must say; None: a result or an error, as long as nothing leaks).
# DATASET, RUN and LIVE stand for the planted dataset, finished run and RUNNING run.
TRAPS = [
    # Links out of run and dataset folders (issue 23 item 3).
    ("log-link-tail", link_log, "tail_logs", {"run_id": "RUN"}, None),
    ("log-link-get", link_log, "get_run", {"run_id": "RUN"}, None),
    ("metrics-link-read", link_metrics, "read_metrics", {"run_id": "RUN"}, None),
    ("metrics-link-report", link_metrics, "summarize_report", {"run_id": "RUN", "sample": False}, None),
    ("manifest-link-inspect", link_manifest, "inspect_dataset", {"dataset_id": "DATASET"}, None),
    ("manifest-link-list", link_manifest, "list_datasets", {}, None),
    ("manifest-link-launch", link_manifest, "launch_training", {"dataset": "DATASET", "steps": 5, **TINY}, "dataset"),
    ("reports-link-report", link_reports, "summarize_report", {"run_id": "RUN", "sample": False}, None),
    ("reports-link-export", link_reports, "list_experiments", {"export": "tsv"}, None),
    # Workspace internals as inputs (item 5).
    ("token-file", nothing, "tokenize_dataset", {"input": ".tradewind-token"}, "input"),
    ("token-glob", nothing, "tokenize_dataset", {"input": "[.a]*"}, "input"),
    ("job-store", nothing, "tokenize_dataset", {"input": "jobs"}, "input"),
    ("settings", nothing, "tokenize_dataset", {"input": "settings.yaml"}, "input"),
    ("token-tokenizer", nothing, "train_tokenizer", {"input": ".tradewind-token"}, "input"),
    # Oversized free text and control characters (item 11).
    ("wandb-megabyte", nothing, "launch_training", {"dataset": "DATASET", "wandb_project": "p" * 1_000_000}, "wandb"),
    ("wandb-nul", nothing, "launch_training", {"dataset": "DATASET", "wandb_project": "p\x00"}, "wandb_project"),
    ("note-escape", nothing, "launch_training", {"dataset": "DATASET", "note": "\x1b[2J"}, "note"),
    ("sweep-id-nul", nothing, "list_experiments", {"sweep_id": "a\x00"}, "sweep_id"),
    ("sweep-id-path", nothing, "list_experiments", {"sweep_id": "../../x"}, "sweep_id"),
    ("changed-megabyte", nothing, "list_experiments", {"changed": "x" * 1_000_000}, "changed"),
    ("reason-nul", nothing, "set_experiment_status", {"run_id": "RUN", "status": "kept", "reason": "a\x00b"}, "reason"),
    # Operations in the wrong state (items 4, 9, 11).
    ("resume-running", nothing, "launch_training", {"resume_from": "LIVE", "steps": 100}, "RUNNING"),
    ("blank-reason", nothing, "set_experiment_status", {"run_id": "RUN", "status": "kept", "reason": "  "}, "reason"),
    ("pipeline-no-grant", nothing, "run_pipeline", {"pipeline": "pipelines/marker.py"}, "--allow-code"),
    ("pipeline-run-no-grant", nothing, "run_pipeline", {"pipeline": "pipelines/marker.py", "dry_run": False}, "code"),
]


def plant_workspace(tmp_path: Path, small_corpus: Path, live_pid: int) -> Planted:
    """A fresh workspace with a small dataset, a finished run, a RUNNING run (`live_pid` its trainer), a token file,
    settings and a pipeline whose import writes a marker outside; and the folder outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    ctx = ToolContext.open(tmp_path / "workspace")
    root = ctx.workspace.root
    shutil.copy(small_corpus, root / "corpus.txt")
    (root / "settings.yaml").write_text("backend: local\n")
    (root / ".tradewind-token").write_text(SECRET + "\n")
    (root / "pipelines").mkdir()
    (root / "pipelines" / "marker.py").write_text(f"open({str(outside / 'pipeline-ran')!r}, 'w').close()\nsteps = []\n")
    dataset_id = tokenize_dataset(ctx, TokenizeDatasetRequest(input="corpus.txt")).dataset_id
    finished = RunRecord(run_id="run-done", backend="process", status=JobStatus.SUCCEEDED)
    write_run(ctx, "run-done", metric_rows(steps=20), finished)
    live = RunRecord(
        run_id="run-live",
        backend="process",
        status=JobStatus.RUNNING,
        host=socket.gethostname(),
        pid=live_pid,
        pid_start=process_start_time(live_pid),
    )
    write_run(ctx, "run-live", metric_rows(steps=5), live)
    return Planted(root, outside, dataset_id, "run-done", "run-live")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def answer_text(result) -> str:
    texts = [block.text for block in result.content if block.type == "text"]
    return "\n".join(texts) + json.dumps(result.structured_content)


@pytest.fixture
def live_trainer():
    """A process standing in for a RUNNING run's trainer."""
    process = subprocess.Popen(["sleep", "300"])
    yield process.pid
    process.kill()
    process.wait()


@pytest.mark.parametrize(
    ("trap", "tool", "arguments", "expected"), [trap[1:] for trap in TRAPS], ids=[trap[0] for trap in TRAPS]
)
def test_a_trap_is_refused_or_answered_without_reaching_outside_the_workspace(
    tmp_path, small_corpus, live_trainer, trap, tool, arguments, expected
):
    planted = plant_workspace(tmp_path, small_corpus, live_trainer)
    trap(planted)
    names = {"DATASET": planted.dataset_id, "RUN": planted.run_id, "LIVE": planted.live_run_id}
    arguments = {key: names.get(value, value) if isinstance(value, str) else value for key, value in arguments.items()}
    ctx = ToolContext.open(planted.root)
    outside_before, runs_before = snapshot(planted.outside), set(ctx.workspace.runs_dir.iterdir())
    datasets_before = sorted(ctx.workspace.datasets_dir.iterdir())

    async def session():
        async with Client(build_server(ctx)) as client:
            result = await client.call_tool(tool, arguments)
            alive = await client.call_tool("get_run", {"run_id": planted.live_run_id})  # untouched by every trap
            started = sorted(set(ctx.workspace.runs_dir.iterdir()) - runs_before)
            for run in started:  # leave nothing training
                await client.call_tool("cancel_run", {"run_id": run.name})
        return result, alive, started

    result, alive, started = anyio.run(session)
    shown = answer_text(result)
    assert SECRET not in shown and f"{SECRET_LOSS:g}" not in shown, shown[:2000]
    assert snapshot(planted.outside) == outside_before, "the call wrote outside the workspace"
    assert not started, f"{tool} started {started}"
    assert sorted(ctx.workspace.datasets_dir.iterdir()) == datasets_before, f"{tool} built a dataset"
    assert not alive.is_error, alive.content
    if result.is_error:
        check_answer(tool, arguments, result)
    if expected is not None:
        assert result.is_error and expected in shown, shown[:2000]
