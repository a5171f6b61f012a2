"""What a tool is, declared once beside its function: `@tool(...)` records its title, what it does to the world,
the resources its result links to and whether the run dashboard attaches to it. The server reads it (`spec_of`)
and dispatches on no tool name.

    @tool("Get a run's status", read_only=True, idempotent=True, open_world=True, links=("logs", "metrics"),
          dashboard=True)
    def get_run(ctx: ToolContext, request: RunRequest) -> RunInfo: ...

What each effect means:
    read_only    changes nothing in the workspace or on a backend (a tool that writes a file, even a log, is not).
    destructive  may delete or stop something that was there (cancel_run stops a run; run_pipeline runs the
                 user's own step code, which may do anything). Writing new files, or rewriting a file the tool
                 owns, is not.
    idempotent   calling again with the same arguments changes nothing more (caches reused, a report rewritten).
    open_world   may reach outside the workspace and this machine's processes: a Ray cluster (runs go to one when
                 the backend is 'ray', and run tools ask the run's backend about its job) or user code
                 (run_pipeline). Dataset tools read only files under the workspace's allowed roots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

# What a result can link to, named by the id field of the result it needs: a run's files (`run_id`), a dataset's
# manifest (`dataset_id`), a report and its plots (`report_id`). The server maps each to its resource URI.
Link = Literal["config", "metrics", "logs", "plot", "profile", "manifest", "report", "report_plot"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ToolSpec:
    """A tool's title, its four effects (see the module docstring), its result's links, and the dashboard."""

    title: str
    read_only: bool
    destructive: bool
    idempotent: bool
    open_world: bool
    links: tuple[Link, ...] = ()
    dashboard: bool = False  # MCP Apps hosts draw its result in the run dashboard


def tool(
    title: str,
    *,
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    open_world: bool = False,
    links: tuple[Link, ...] = (),
    dashboard: bool = False,
) -> Callable[[F], F]:
    """Declare the function it decorates a tool, with its `ToolSpec`; the function itself is unchanged.

    Every effect defaults to False, so a declaration names the effects a tool has. (MCP's own defaults differ:
    a client takes a hint left out of the listing as destructive and open-world, so the server states each one
    that differs from MCP's.)
    """
    if read_only and destructive:
        raise ValueError(f"tool {title!r}: a read-only tool cannot be destructive")
    spec = ToolSpec(title, read_only, destructive, idempotent, open_world, links, dashboard)

    def declare(function: F) -> F:
        function.spec = spec  # type: ignore[attr-defined]
        return function

    return declare


def spec_of(function: Callable[..., Any]) -> ToolSpec:
    """The `ToolSpec` that `@tool` declared for `function`."""
    spec = getattr(function, "spec", None)
    if not isinstance(spec, ToolSpec):
        raise TypeError(f"{function.__name__} is not declared a tool: decorate it with @tool(...)")
    return spec
