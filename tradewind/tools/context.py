"""What every tool works with: the workspace, the job backend, and a way to report progress."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from tradewind.cluster import LocalBackend
from tradewind.core import Workspace

Progress = Callable[[float, float | None, str | None], None]
"""`progress(done, total, message)`: called by long tools; the MCP server forwards it as notifications."""


def no_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    """The progress callback for callers that do not show progress."""


@dataclass(frozen=True)
class ToolContext:
    """The workspace the tools read and write, and the backend that runs their jobs."""

    workspace: Workspace
    backend: LocalBackend

    @classmethod
    def open(
        cls, root: str | os.PathLike[str] | None = None, allowed_paths: tuple[str | os.PathLike[str], ...] = ()
    ) -> ToolContext:
        """The context for the workspace at `root` (else `$TRADEWIND_WORKSPACE`, else the default)."""
        workspace = Workspace.from_env(root, allowed_paths)
        return cls(workspace=workspace, backend=LocalBackend(workspace.jobs_dir))
