"""MCP resources (a run's files, the run list, a sweep, a dataset's manifest, the agent skills) and the prompts.

Resources, all read through the workspace's id rules and each bounded to `MAX_RESOURCE_CHARS`:

    tradewind://runs                        application/json   the run list, newest first (what `list_runs` returns)
    tradewind://runs/{run_id}/config        application/json   the run's training configuration
    tradewind://runs/{run_id}/metrics       text/plain         metrics.jsonl, its last part when long
    tradewind://runs/{run_id}/logs          text/plain         the training log, its last part when long
    tradewind://runs/{run_id}/report        text/markdown      the run's report, once `summarize_report` wrote it
    tradewind://runs/{run_id}/plot          image/png          its plots (val_bpb, loss, lr, grad norm, tokens/s)
    tradewind://reports/{report_id}         text/markdown      any report, on one run or several (`report_id`)
    tradewind://reports/{report_id}/plot    image/png          its figure
    tradewind://runs/{run_id}/profile       application/json   what `profile_run` measured, and where the trace is
    tradewind://sweeps/{sweep_id}           application/json   a sweep's state (what `get_sweep` returns)
    tradewind://datasets/{dataset_id}/manifest  application/json  the token cache's manifest
    tradewind://skills/{name}               text/markdown      an agent skill's SKILL.md; each skill is also listed
    tradewind://schema/{tool}               application/json   a tool's whole input schema, nested sections too

Tool results link the resources that hold more than the result itself (`result_links`, from the links each
tool declares in `tradewind.tools.spec`): a report, a log, all the metrics, a plot, a profile; the result stays
small and the client reads a link when it wants it. The templates' ids complete (`completion.py`), and a
client that listens hears when a run's resources change (`updates.py`, which watches the files `run_part_path`
names).

Prompts are the markdown templates of `tradewind.prompts`; a `prompts/get` for an unknown prompt, or
without a required argument, or with one it does not take, is answered with an INVALID_PARAMS error.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from mcp.server.mcpserver.resources import TextResource
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, ResourceLink
from pydantic import Field, ValidationError

from tradewind.core import NotFoundError, TradewindError, Workspace, check_id
from tradewind.core.buckets import is_remote
from tradewind.core.files import Opener
from tradewind.prompts import load_skill, render_prompt, skill_names
from tradewind.runs import RunLayout
from tradewind.tools import ListRunsRequest, SweepRequest, ToolContext, get_sweep, list_runs
from tradewind.tools.spec import Link

MAX_RESOURCE_CHARS = 32_000
JSON = "application/json"
MARKDOWN = "text/markdown"
TEXT = "text/plain"
PNG = "image/png"
MAX_IMAGE_BYTES = 4 * 2**20

# A run's resources: the part of the URI, its title and its MIME type.
RUN_PARTS = {
    "config": ("Run configuration", JSON),
    "metrics": ("Run metrics", TEXT),
    "logs": ("Run log", TEXT),
    "report": ("Run report", MARKDOWN),
    "plot": ("Loss curve", PNG),
    "profile": ("Profile summary", JSON),
}

# A report's files in reports/: `<report_id>.md` and its figure `<report_id>-loss.png` (a run's own report has the
# run's id).
REPORT_SUFFIX = {"text": ".md", "plot": "-loss.png"}
# A report's resources: the part, its name, title and MIME type.
REPORT_PARTS = {"text": ("report", "Report", MARKDOWN), "plot": ("report-plot", "Report plots", PNG)}
RUN_LIST_URI = "tradewind://runs"

T = TypeVar("T")


def run_part_path(workspace: Workspace, run_id: str, part: str) -> Path:
    """The file run resource `part` (one of `RUN_PARTS`) serves: in the run's folder, or its report in reports/.

    `run_id` must be a checked id (`check_id`); the path is not checked for links (the reader refuses those)."""
    layout = RunLayout(workspace.runs_dir / run_id)
    return {
        "config": layout.config,
        "metrics": layout.metrics,
        "logs": layout.log,
        "report": workspace.reports_dir / (run_id + REPORT_SUFFIX["text"]),
        "plot": workspace.reports_dir / (run_id + REPORT_SUFFIX["plot"]),
        "profile": layout.profile / "summary.json",
    }[part]


def run_uri(run_id: str, part: str = "logs") -> str:
    """The URI of a run's resource; `part` is config, metrics, logs or report."""
    return f"tradewind://runs/{run_id}/{part}"


def sweep_uri(sweep_id: str) -> str:
    """The URI of a sweep's state resource."""
    return f"tradewind://sweeps/{sweep_id}"


def dataset_uri(dataset_id: str) -> str:
    """The URI of a dataset's manifest resource."""
    return f"tradewind://datasets/{dataset_id}/manifest"


def skill_uri(name: str) -> str:
    """The URI of an agent skill's resource."""
    return f"tradewind://skills/{name}"


def report_uri(report_id: str, part: str | None = None) -> str:
    """The URI of a report (one run's or several runs'), or of its `part` ("plot")."""
    return f"tradewind://reports/{report_id}" + (f"/{part}" if part else "")


def schema_uri(tool: str) -> str:
    """The URI of a tool's whole input schema, which the tool list compacts (`adapter.compact_sections`)."""
    return f"tradewind://schema/{tool}"


# Each kind of link a tool declares (`tradewind.tools.spec.Link`): the result field holding the id it needs, the
# URI with `{id}` standing for that id, and the linked resource's title and MIME type. A run's report is linked
# as a report (`report_id`), as several runs' reports are.
LINKS: dict[str, tuple[str, str, str, str]] = {
    **{part: ("run_id", run_uri("{id}", part), *RUN_PARTS[part]) for part in ("config", "metrics", "logs", "profile")},
    "manifest": ("dataset_id", dataset_uri("{id}"), "Dataset manifest", JSON),
    "report": ("report_id", report_uri("{id}"), *REPORT_PARTS["text"][1:]),
    "report_plot": ("report_id", report_uri("{id}", "plot"), *REPORT_PARTS["plot"][1:]),
}


def result_links(links: tuple[Link, ...], result: dict[str, Any]) -> list[ResourceLink]:
    """The `links` a tool declares, for its `result`: each resource that holds more than the result shows. A
    result whose `path` is a bucket URL (a token cache written there) has its files there, not in the workspace
    the resources read, so it links none."""
    if is_remote(result.get("path") or ""):
        return []
    found = []
    for kind in links:
        field, uri, title, mime_type = LINKS[kind]
        if isinstance(value := result.get(field), str):
            name = f"{value} {kind.replace('_', ' ')}"
            found.append(ResourceLink(name=name, title=title, uri=uri.replace("{id}", value), mime_type=mime_type))
    return found


def _run_resource(server: MCPServer, part: str, description: str) -> Callable[[Callable[..., Any]], Any]:
    """The decorator that serves a run resource, with its title and MIME type from `RUN_PARTS`."""
    title, mime_type = RUN_PARTS[part]
    return server.resource(
        run_uri("{run_id}", part), name=f"run-{part}", title=title, description=description, mime_type=mime_type
    )


def _report_resource(server: MCPServer, part: str, description: str) -> Callable[[Callable[..., Any]], Any]:
    """The decorator that serves a report's text or plot (`part`), with its name, title and MIME type from
    `REPORT_PARTS`."""
    name, title, mime_type = REPORT_PARTS[part]
    uri = report_uri("{report_id}", None if part == "text" else part)
    return server.resource(uri, name=name, title=title, description=description, mime_type=mime_type)


def register_resources(server: MCPServer, ctx: ToolContext, tool_schemas: dict[str, dict[str, Any]]) -> None:
    """Serve the run list, each skill, and the run, report, sweep, dataset, skill and tool-schema resource templates
    on `server`, reading `ctx`'s workspace; `tool_schemas` holds each listed tool's whole input schema."""
    workspace = ctx.workspace
    # Every file a resource serves is opened through the workspace's confined open: a symlink in a run folder,
    # a dataset or reports/ that leads outside is refused, never followed.
    read_run, read_dataset = workspace.reader("run_id"), workspace.reader("dataset_id")
    read_report = workspace.reader("report_id")

    def known_run(run_id: str) -> str:
        """`run_id`, once its run folder is found (a resource error otherwise)."""
        _found(lambda: workspace.run_dir(run_id))
        return run_id

    def run_file(run_id: str, part: str, what: str) -> Path:
        path = run_part_path(workspace, known_run(run_id), part)
        return _existing(path, f"run {run_id!r} has no {what} yet ({path.name} is missing)")

    @server.resource(
        RUN_LIST_URI,
        name="runs",
        title="Runs",
        description="The workspace's runs, newest first, with their status, step and latest losses (what the "
        "`list_runs` tool returns: its first page). Listen to it to hear when a run starts, ends or appears.",
        mime_type=JSON,
    )
    def run_list() -> str:
        return list_runs(ctx, ListRunsRequest()).model_dump_json()

    @_run_resource(server, "config", "The training configuration a run was launched with (config.json).")
    def run_config(run_id: str) -> str:
        return _whole_json(read_run, run_file(run_id, "config", "configuration"), "get_run")

    @_run_resource(
        server,
        "metrics",
        "A run's logged metrics, one JSON object a line (step, loss, eval_loss, lr, grad_norm, tokens_per_s); "
        f"the last {MAX_RESOURCE_CHARS:,} characters when longer.",
    )
    def run_metrics(run_id: str) -> str:
        how_to_page = (
            f"every row of a step range with the `read_metrics` tool (run_id {run_id!r}, start_step, end_step)"
        )
        return _tail(read_run, run_file(run_id, "metrics", "metrics"), how_to_page)

    @_run_resource(server, "logs", f"A run's training log; the last {MAX_RESOURCE_CHARS:,} characters when longer.")
    def run_logs(run_id: str) -> str:
        how_to_page = f"`get_run` (run_id {run_id!r}) names the whole file as `log_file`"
        return _tail(read_run, run_file(run_id, "logs", "log"), how_to_page)

    @_run_resource(server, "report", "A run's markdown report, once the `summarize_report` tool has written it.")
    def run_report(run_id: str) -> str:
        return report_text(known_run(run_id))

    @_run_resource(
        server,
        "plot",
        "A run's loss, learning-rate, grad-norm and throughput plots (PNG), once `summarize_report` has drawn them.",
    )
    def run_plot(run_id: str) -> bytes:
        return report_plot(known_run(run_id))

    @_run_resource(
        server, "profile", "What the `profile_run` tool measured (profile/summary.json), with its trace folder."
    )
    def run_profile(run_id: str) -> str:
        return _whole_json(read_run, run_file(run_id, "profile", "profile"), "profile_run")

    @_report_resource(
        server, "text", "A report `summarize_report` wrote, on one run or several (its result's report_id)."
    )
    def report_text(report_id: str) -> str:
        path = report_file(report_id, "text")
        return _head(read_report, path, f"the whole report is {path}")

    @_report_resource(server, "plot", "A report's figure (PNG): one run's curves, or several runs' overlaid.")
    def report_plot(report_id: str) -> bytes:
        return _image(read_report, report_file(report_id, "plot"))

    def report_file(report_id: str, part: str) -> Path:
        path = workspace.reports_dir / (_found(lambda: check_id(report_id, "report_id")) + REPORT_SUFFIX[part])
        return _existing(
            path, f"no report {report_id!r} yet: call the `summarize_report` tool (run_id, or run_ids for several runs)"
        )

    @server.resource(
        sweep_uri("{sweep_id}"),
        name="sweep",
        title="Sweep",
        description="A sweep's status, best trial and trials (what the `get_sweep` tool returns).",
        mime_type=JSON,
    )
    def sweep(sweep_id: str) -> str:
        return _found(lambda: get_sweep(ctx, SweepRequest(sweep_id=sweep_id))).model_dump_json()

    @server.resource(
        dataset_uri("{dataset_id}"),
        name="dataset-manifest",
        title="Dataset manifest",
        description="A tokenized dataset's manifest: its inputs, tokenizer, shards and token counts.",
        mime_type=JSON,
    )
    def dataset_manifest(dataset_id: str) -> str:
        path = _found(lambda: workspace.dataset_dir(dataset_id)) / "manifest.json"
        missing = f"dataset {dataset_id!r} has no manifest.json: it is not a complete token cache"
        return _whole_json(read_dataset, _existing(path, missing), "inspect_dataset")

    @server.resource(
        skill_uri("{name}"),
        name="skill",
        title="Agent skill",
        description=f"An agent skill shipped with Tradewind (SKILL.md); skills: {', '.join(skill_names())}.",
        mime_type=MARKDOWN,
    )
    def skill(name: str) -> str:
        return _found(lambda: load_skill(name))

    for name in skill_names():  # listed too, so that a client finds them in resources/list
        text = load_skill(name)
        title, description = skill_summary(text)
        server.add_resource(
            TextResource(
                uri=skill_uri(name),
                name=f"skill-{name}",
                title=title,
                description=description,
                mime_type=MARKDOWN,
                text=text,
            )
        )

    @server.resource(
        schema_uri("{tool}"),
        name="tool-schema",
        title="Tool input schema",
        description="A tool's whole input schema: every nested section's fields with their types, defaults and "
        "ranges (the tool list names a section's fields only).",
        mime_type=JSON,
    )
    def tool_schema(tool: str) -> str:
        if tool not in tool_schemas:
            raise ResourceNotFoundError(f"no tool {tool!r}; tools: {', '.join(tool_schemas)}")
        return json.dumps(tool_schemas[tool], separators=(",", ":"))


def skill_summary(text: str) -> tuple[str | None, str]:
    """A SKILL.md's title (its first heading; None without one) and description (its front matter's, which
    `tests/prompts` require of every shipped skill)."""
    _, front_matter, body = text.split("---\n", 2)
    title = next((line.removeprefix("# ") for line in body.splitlines() if line.startswith("# ")), None)
    return title, yaml.safe_load(front_matter)["description"]


def _found(read: Callable[[], T]) -> T:
    """`read()`, with Tradewind's errors turned into resource errors that keep their message."""
    try:
        return read()
    except NotFoundError as err:
        raise ResourceNotFoundError(str(err)) from err
    except TradewindError as err:
        raise ResourceError(str(err)) from err


def _existing(path: Path, missing: str) -> Path:
    """`path` where it is there (a link too: the confined open refuses it), else ResourceNotFoundError(`missing`)."""
    if not (path.exists() or path.is_symlink()):
        raise ResourceNotFoundError(missing)
    return path


def _image(opener: Opener, path: Path) -> bytes:
    """An image file's bytes; one over `MAX_IMAGE_BYTES` is refused."""
    with _found(lambda: opener(path)) as f:
        if os.fstat(f.fileno()).st_size > MAX_IMAGE_BYTES:
            raise ResourceError(f"{path} is over the {MAX_IMAGE_BYTES:,} bytes an image resource serves")
        return f.read()


def _read_text(opener: Opener, path: Path) -> str:
    with _found(lambda: opener(path)) as f:
        return f.read().decode("utf-8", errors="replace")


def _whole_json(opener: Opener, path: Path, tool: str) -> str:
    """A JSON file's text; a file over the bound is refused (cut JSON would not parse)."""
    text = _read_text(opener, path)
    if len(text) > MAX_RESOURCE_CHARS:
        raise ResourceError(
            f"{path.name} is {len(text):,} characters, over the {MAX_RESOURCE_CHARS:,} a resource serves; "
            f"use the `{tool}` tool instead"
        )
    return text


def _tail(opener: Opener, path: Path, how_to_page: str) -> str:
    """The last `MAX_RESOURCE_CHARS` characters of a text file, from a line start, after a note when cut."""
    with _found(lambda: opener(path)) as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - 4 * MAX_RESOURCE_CHARS))  # a UTF-8 character is at most 4 bytes
        text = f.read().decode("utf-8", errors="replace")
    if size <= MAX_RESOURCE_CHARS or (size <= 4 * MAX_RESOURCE_CHARS and len(text) <= MAX_RESOURCE_CHARS):
        return text
    note = f"# cut: the last part of {path.name} ({size:,} bytes in all); {how_to_page}\n"
    kept = text[-(MAX_RESOURCE_CHARS - len(note)) :]
    kept = kept.partition("\n")[2] or kept  # start at a whole line
    return note + kept


def _head(opener: Opener, path: Path, where: str) -> str:
    """The first `MAX_RESOURCE_CHARS` characters of a text file, then a note when cut."""
    text = _read_text(opener, path)
    if len(text) <= MAX_RESOURCE_CHARS:
        return text
    note = f"\n\n(cut at {MAX_RESOURCE_CHARS:,} of {len(text):,} characters; {where})\n"
    return text[: MAX_RESOURCE_CHARS - len(note)] + note


# Prompts: each argument described; prompt arguments arrive as strings and are checked here.


def register_prompts(server: MCPServer) -> None:
    """Serve Tradewind's prompts on `server` (replacing any of the same name) and answer bad
    `prompts/get` requests with INVALID_PARAMS errors that say what was wrong."""

    def train_on_text(
        input: Annotated[
            str, Field(description="Text to train on: a file or folder in the workspace, or builtin:NAME.")
        ] = "builtin:tinyshakespeare",
        steps: Annotated[int, Field(description="Training steps for the run.", gt=0)] = 300,
    ) -> str:
        return render_prompt("train_on_text", input=input, steps=steps)

    def plan_experiment(
        goal: Annotated[str, Field(description="The question the experiment should answer, in a sentence.")],
        dataset: Annotated[
            str, Field(description="Dataset: an id, a path in the workspace, or builtin:NAME.")
        ] = "builtin:tinyshakespeare",
        budget: Annotated[
            str, Field(description="Time and compute to spend, e.g. '10 minutes on this CPU' or '1 hour on gpu:8'.")
        ] = "a few minutes on this machine",
    ) -> str:
        return render_prompt("plan-experiment", goal=goal, dataset=dataset, budget=budget)

    def debug_run(run_id: Annotated[str, Field(description="The run to debug: a run id from list_runs.")]) -> str:
        return render_prompt("debug-run", run_id=run_id)

    def compare_runs(
        run_ids: Annotated[str, Field(description="Two or more run ids to compare, separated by commas.")],
    ) -> str:
        ids = [part.strip() for part in run_ids.split(",") if part.strip()]
        if len(ids) < 2:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"prompt 'compare-runs': run_ids needs two or more run ids, comma-separated; got {run_ids!r}",
            )
        return render_prompt("compare-runs", run_ids=", ".join(f"`{run_id}`" for run_id in ids))

    def scale_out(
        run_id: Annotated[str, Field(description="The run to scale out: a run id from list_runs.")],
        accelerator: Annotated[
            str, Field(description="Target accelerator: cpu, gpu, gpu:N, or a TPU slice such as tpu-v5litepod-8.")
        ] = "gpu:8",
        backend: Annotated[str, Field(description="Job backend to run it on: local or ray.")] = "ray",
    ) -> str:
        return render_prompt("scale-out", run_id=run_id, accelerator=accelerator, backend=backend)

    prompts = {
        "train_on_text": (train_on_text, "Step-by-step plan to tokenize a text, train on it and report the result."),
        "plan-experiment": (plan_experiment, "Plan, size and run a training experiment that answers a question."),
        "debug-run": (debug_run, "Find out why a training run failed or trains badly, and how to fix it."),
        "compare-runs": (compare_runs, "Compare training runs: their differing settings, losses and throughput."),
        "scale-out": (scale_out, "Move a run to more or larger accelerators (GPUs, a TPU slice) on a backend."),
    }
    for name, (function, description) in prompts.items():
        with contextlib.suppress(ValueError):  # replaces one build_server registered, if any
            server.remove_prompt(name)
        server.prompt(name=name, description=description)(function)
    server.middleware.append(_PromptRequestCheck(server))


class _PromptRequestCheck:
    """Middleware: a `prompts/get` that names no known prompt, lacks a required argument or passes one the
    prompt does not take, or whose arguments fail validation, fails with INVALID_PARAMS and a readable message
    (the SDK answers these with code 0 and "Unknown prompt" or "Error rendering prompt")."""

    def __init__(self, server: MCPServer):
        self._server = server

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "prompts/get" or not isinstance(ctx.params, dict):
            return await call_next(ctx)
        name = ctx.params.get("name")
        arguments = ctx.params.get("arguments") or {}
        prompts = {prompt.name: prompt for prompt in await self._server.list_prompts()}
        prompt = prompts.get(name) if isinstance(name, str) else None
        if prompt is None:
            raise MCPError(
                code=INVALID_PARAMS, message=f"unknown prompt {name!r}; known prompts: {', '.join(sorted(prompts))}"
            )
        declared = {argument.name: argument for argument in prompt.arguments or []}
        missing = [argument for argument in declared.values() if argument.required and argument.name not in arguments]
        if missing:
            needs = "; ".join(f"{argument.name} ({argument.description})" for argument in missing)
            raise MCPError(code=INVALID_PARAMS, message=f"prompt {name!r} needs argument(s): {needs}")
        unknown = sorted(set(arguments) - declared.keys()) if isinstance(arguments, dict) else []
        if unknown:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"prompt {name!r} takes no argument(s) {', '.join(unknown)}; "
                f"it takes: {', '.join(declared) or 'none'}",
            )
        try:
            return await call_next(ctx)
        except ValueError as err:  # the SDK wraps what rendering raised; its cause says what was wrong
            cause = _root_cause(err)
            if isinstance(cause, ValidationError):
                problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in cause.errors())
                raise MCPError(code=INVALID_PARAMS, message=f"prompt {name!r}: {problems}") from err
            if isinstance(cause, TradewindError):
                raise MCPError(code=INVALID_PARAMS, message=f"prompt {name!r}: {cause}") from err
            raise


def _root_cause(err: BaseException) -> BaseException:
    while err.__cause__ is not None:
        err = err.__cause__
    return err
