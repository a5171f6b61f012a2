"""`completion/complete`: the ids a resource-template or prompt argument may take, as the client types them.

One table maps an argument's name to what lists its values: runs, datasets, sweeps and reports from the
workspace, newest first (runs by when they were made, the rest by when they changed); skills and tools in their
listed order. The values are those that start with what the client typed, at most `MAX_VALUES` of them (MCP's
cap) and `COMPLETION_CHARS` characters in all, with `total` and `hasMore` saying how many matched. An argument
that takes no id (a prompt's goal, an accelerator) completes to nothing.

Only the prompts and resource templates the server lists complete, and only their own arguments: any other
reference or argument, or a value longer than `VALUE_CHARS`, is refused with INVALID_PARAMS (MCP's answer to an
invalid prompt name), its name echoed cut. A folder is read no further than `MAX_ENTRIES` entries.

    tradewind://runs/{run_id}/..., debug-run's and scale-out's run_id   run ids
    compare-runs' run_ids                                               the id after the last comma
    tradewind://datasets/{dataset_id}/manifest                          dataset ids
    plan-experiment's dataset                                           dataset ids, then builtin:NAME
    tradewind://sweeps/{sweep_id}                                       sweep ids
    tradewind://reports/{report_id}, .../plot                           report ids
    tradewind://skills/{name}                                           skill names
    tradewind://schema/{tool}                                           tool names
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.shared.uri_template import UriTemplate
from mcp.types import (
    INVALID_PARAMS,
    Completion,
    CompletionArgument,
    CompletionContext,
    PromptReference,
    ResourceTemplateReference,
)

from tradewind.core import TradewindError, Workspace
from tradewind.core.config import shown_value
from tradewind.data import BUILTIN_CORPORA
from tradewind.prompts import skill_names
from tradewind.runs import RunLayout, read_record
from tradewind.server.resources import REPORT_SUFFIX
from tradewind.tools import ToolContext
from tradewind.tools.bounds import fitting

MAX_VALUES = 100  # the most values one completion may carry (MCP)
# The longest value completed: compare_runs takes eight run ids of at most 128 characters (check_id), and ", "
# between them. Every value completed repeats what was typed, so a longer one would be echoed up to 100 times.
VALUE_CHARS = 1_040
COMPLETION_CHARS = 8_000  # the values of one completion, as JSON: a menu to pick from, not a document
MAX_ENTRIES = 10_000  # the entries of one folder a completion reads (a stat each), in the file system's order

# Arguments that hold several ids, comma-separated, and the argument whose ids they are: the last one completes.
SEVERAL = {"run_ids": "run_id"}


def id_entries(folder: Path, suffix: str = "") -> list[os.DirEntry[str]]:
    """The entries of `folder` that name ids: its folders or, given `suffix`, its files whose names end in `suffix`;
    none when `folder` is not there (sweeps/ comes with the first sweep). Hidden entries (a dataset still being
    built) name no id. Only the first `MAX_ENTRIES` entries the file system lists are read."""
    with contextlib.suppress(FileNotFoundError), os.scandir(folder) as entries:
        return [
            entry
            for entry in itertools.islice(entries, MAX_ENTRIES)
            if not entry.name.startswith(".")
            and ((entry.is_file() and entry.name.endswith(suffix)) if suffix else entry.is_dir())
        ]
    return []


def newest_first(folder: Path, suffix: str = "") -> list[str]:
    """The ids `id_entries` finds in `folder` (less `suffix`), the most recently changed first.

    For datasets, sweeps and reports: dataset and report ids do not sort by time as sweep ids do, and a stat per
    entry keeps a completion cheap (no record is read).
    """
    found = []
    for entry in id_entries(folder, suffix):
        with contextlib.suppress(FileNotFoundError):  # removed since the listing
            found.append((entry.stat().st_mtime_ns, entry.name.removesuffix(suffix)))
    return [name for _, name in sorted(found, reverse=True)]


def runs_newest_first(workspace: Workspace) -> list[str]:
    """The run ids in the workspace, the most recently made first, by their records' `created_at`: a run's folder
    changes whenever the run writes or is reported on, and ids made within one second sort by their random tail.
    The runs whose record cannot be read (not yet written, damaged) follow, the most recently changed first."""
    read = workspace.reader("run_id")
    found: list[tuple[bool, str | int, str]] = []
    for entry in id_entries(workspace.runs_dir):
        try:
            found.append((True, read_record(RunLayout(Path(entry.path)).record, read).created_at, entry.name))
        except (TradewindError, OSError):  # one bad folder must not hide the others
            with contextlib.suppress(FileNotFoundError):  # removed since the listing
                found.append((False, entry.stat().st_mtime_ns, entry.name))
    return [name for *_, name in sorted(found, reverse=True)]


def id_listers(ctx: ToolContext, tool_names: Sequence[str]) -> dict[str, Callable[[], list[str]]]:
    """What lists the values of each argument that takes an id, by the argument's name (templates' and prompts')."""
    workspace = ctx.workspace
    return {
        "run_id": lambda: runs_newest_first(workspace),
        "dataset_id": lambda: newest_first(workspace.datasets_dir),
        "dataset": lambda: newest_first(workspace.datasets_dir) + [f"builtin:{name}" for name in BUILTIN_CORPORA],
        "sweep_id": lambda: newest_first(workspace.sweeps_dir),
        "report_id": lambda: newest_first(workspace.reports_dir, REPORT_SUFFIX["text"]),
        "name": lambda: list(skill_names()),
        "tool": lambda: list(tool_names),
    }


def complete(argument: str, typed: str, listers: dict[str, Callable[[], list[str]]]) -> Completion:
    """The values of `argument` that start with `typed`, listed by `listers`; for an argument of `SEVERAL` ids,
    `typed` with its last id completed (an id already named is not offered again)."""
    partial = typed
    if argument in SEVERAL:
        argument = SEVERAL[argument]
        partial = typed.rpartition(",")[2].lstrip()
    head = typed[: len(typed) - len(partial)]  # the ids before the last, commas and spaces as typed
    named = {part.strip() for part in head.split(",")}
    ids = listers[argument]() if argument in listers else []
    matches = [head + value for value in ids if value.startswith(partial) and value not in named]
    values = fitting(matches[:MAX_VALUES], COMPLETION_CHARS)
    return Completion(values=values, total=len(matches), has_more=len(matches) > len(values))


def invalid_params(message: str) -> MCPError:
    """MCP's answer to a completion request for what the server does not list (as to an invalid prompt name)."""
    return MCPError(code=INVALID_PARAMS, message=message)


async def check_request(
    server: MCPServer, ref: PromptReference | ResourceTemplateReference, argument: CompletionArgument
) -> None:
    """Refuse a completion of `argument` unless `ref` names a prompt or resource template `server` lists, one that
    takes `argument`, and its value is at most `VALUE_CHARS` long.

    Raises:
        MCPError: INVALID_PARAMS, saying what was wrong and what there is; the names sent are echoed cut.
    """
    if isinstance(ref, PromptReference):
        prompts = {prompt.name: prompt for prompt in await server.list_prompts()}
        if ref.name not in prompts:
            raise invalid_params(f"unknown prompt {shown_value(ref.name)}; known prompts: {', '.join(sorted(prompts))}")
        what = f"prompt {ref.name!r}"
        takes = [taken.name for taken in prompts[ref.name].arguments or []]
    else:
        if ref.uri not in {template.uri_template for template in await server.list_resource_templates()}:
            raise invalid_params(
                f"unknown resource template {shown_value(ref.uri)}; resources/templates/list lists them"
            )
        what = f"resource template {ref.uri!r}"
        takes = UriTemplate.parse(ref.uri).variable_names
    if argument.name not in takes:
        raise invalid_params(
            f"{what} takes no argument {shown_value(argument.name)}; it takes: {', '.join(takes) or 'none'}"
        )
    if len(argument.value) > VALUE_CHARS:
        raise invalid_params(
            f"argument {argument.name!r}: the value is {len(argument.value):,} characters; "
            f"completion takes at most {VALUE_CHARS:,}"
        )


def register_completions(server: MCPServer, ctx: ToolContext, tool_names: Sequence[str]) -> None:
    """Answer `completion/complete` on `server` with the ids in `ctx`'s workspace and the names of `tool_names`."""
    listers = id_listers(ctx, tool_names)

    @server.completion()
    async def complete_argument(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion:
        await check_request(server, ref, argument)
        # The table is keyed by argument name alone: no two templates or prompts give one name different meanings.
        return await anyio.to_thread.run_sync(complete, argument.name, argument.value, listers)  # listing reads disk
