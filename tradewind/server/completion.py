"""`completion/complete`: the ids a resource-template or prompt argument may take, as the client types them.

One table maps an argument's name to what lists its values: runs, datasets, sweeps and reports from the
workspace, newest first (`newest_first`); skills and tools in their listed order. The values are those that
start with what the client typed, at most `MAX_VALUES` of them (MCP's cap), with `total` and `hasMore` saying
how many matched. An argument that takes no id (a prompt's goal, an accelerator) completes to nothing.

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
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.types import Completion, CompletionArgument, CompletionContext, PromptReference, ResourceTemplateReference

from tradewind.data import BUILTIN_CORPORA
from tradewind.prompts import skill_names
from tradewind.server.resources import REPORT_SUFFIX
from tradewind.tools import ToolContext

MAX_VALUES = 100  # the most values one completion may carry (MCP)

# Arguments that hold several ids, comma-separated, and the argument whose ids they are: the last one completes.
SEVERAL = {"run_ids": "run_id"}


def id_entries(folder: Path, suffix: str = "") -> list[os.DirEntry[str]]:
    """The entries of `folder` that name ids: its folders or, given `suffix`, its files whose names end in `suffix`;
    none when `folder` is not there (sweeps/ comes with the first sweep). Hidden entries (a dataset still being
    built) name no id."""
    with contextlib.suppress(FileNotFoundError), os.scandir(folder) as entries:
        return [
            entry
            for entry in entries
            if not entry.name.startswith(".")
            and ((entry.is_file() and entry.name.endswith(suffix)) if suffix else entry.is_dir())
        ]
    return []


def newest_first(folder: Path, suffix: str = "") -> list[str]:
    """The ids `id_entries` finds in `folder` (less `suffix`), the most recently changed first.

    One rule for every kind, by modification time: dataset and report ids do not sort by time as run and sweep ids
    do, and a stat per entry keeps a completion cheap (no record is read).
    """
    found = []
    for entry in id_entries(folder, suffix):
        with contextlib.suppress(FileNotFoundError):  # removed since the listing
            found.append((entry.stat().st_mtime_ns, entry.name.removesuffix(suffix)))
    return [name for _, name in sorted(found, reverse=True)]


def id_listers(ctx: ToolContext, tool_names: Sequence[str]) -> dict[str, Callable[[], list[str]]]:
    """What lists the values of each argument that takes an id, by the argument's name (templates' and prompts')."""
    workspace = ctx.workspace
    return {
        "run_id": lambda: newest_first(workspace.runs_dir),
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
    return Completion(values=matches[:MAX_VALUES], total=len(matches), has_more=len(matches) > MAX_VALUES)


def register_completions(server: MCPServer, ctx: ToolContext, tool_names: Sequence[str]) -> None:
    """Answer `completion/complete` on `server` with the ids in `ctx`'s workspace and the names of `tool_names`."""
    listers = id_listers(ctx, tool_names)

    @server.completion()
    async def complete_argument(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion:
        # The table is keyed by argument name alone: no two templates or prompts give one name different meanings.
        return await anyio.to_thread.run_sync(complete, argument.name, argument.value, listers)  # listing reads disk
