"""The workspace: one root folder that holds every artifact Tradewind makes.

Layout::

    <root>/datasets/<id>/   token caches
    <root>/runs/<id>/       one folder per training run (config, metrics, logs, checkpoints, profiles)
    <root>/reports/         markdown reports and their plots
    <root>/jobs/            job records of the local cluster backend (cluster.sqlite) and job logs
    <root>/steps/           outputs of pipeline steps, addressed by a hash of their inputs

The root comes from `--workspace`, else `$TRADEWIND_WORKSPACE`, else `~/.tradewind`. Every path a tool
accepts is resolved here: it must land inside the root or inside a root the user allowed explicitly
(`--allow-path`), after following symlinks.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path

from tradewind.core.errors import InvalidInputError, NotFoundError, PathEscapeError

ENV_VAR = "TRADEWIND_WORKSPACE"
DEFAULT_ROOT = Path("~/.tradewind")
_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def make_id(prefix: str) -> str:
    """A new sortable, unique id such as `run-20261202-134501-3f9a`."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def check_id(value: str, argument: str) -> str:
    """Return `value` if it is a safe id (letters, digits, `.`, `_`, `-`); raise otherwise."""
    if not _ID_PATTERN.match(value) or value in {".", ".."} or ".." in value:
        raise InvalidInputError(
            f"argument {argument!r}: {value!r} is not a valid id (use letters, digits, '.', '_' and '-')"
        )
    return value


def names_a_path(value: str) -> bool:
    """Whether a value a user gave is a path rather than an id: it holds a '/' or starts with '.' or '~'."""
    return "/" in value or value.startswith((".", "~"))


class Workspace:
    """The workspace root plus the extra input roots the user allowed.

    Args:
        root: the workspace folder; created on first use.
        allowed_paths: further folders whose files tools may read (never write).
    """

    def __init__(self, root: str | os.PathLike[str], allowed_paths: tuple[str | os.PathLike[str], ...] = ()):
        self.root = Path(root).expanduser().resolve()
        self.allowed_roots = tuple(Path(p).expanduser().resolve() for p in allowed_paths)
        for folder in (self.datasets_dir, self.runs_dir, self.reports_dir, self.jobs_dir):
            folder.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_env(
        cls, root: str | os.PathLike[str] | None = None, allowed_paths: tuple[str | os.PathLike[str], ...] = ()
    ) -> Workspace:
        """The workspace named by `root`, else `$TRADEWIND_WORKSPACE`, else `~/.tradewind`."""
        return cls(root or os.environ.get(ENV_VAR) or DEFAULT_ROOT, allowed_paths)

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    @property
    def datasets_dir(self) -> Path:
        return self.root / "datasets"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def reports_dir(self) -> Path:
        return self.root / "reports"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    def dataset_dir(self, dataset_id: str, must_exist: bool = True) -> Path:
        """The folder of dataset `dataset_id`; raises `NotFoundError` if it must exist and does not."""
        return self._child(self.datasets_dir, check_id(dataset_id, "dataset_id"), "dataset", must_exist)

    def run_dir(self, run_id: str, must_exist: bool = True) -> Path:
        """The folder of run `run_id`; raises `NotFoundError` if it must exist and does not."""
        return self._child(self.runs_dir, check_id(run_id, "run_id"), "run", must_exist)

    def run_folder(self, value: str, argument: str = "run") -> Path:
        """A run's folder from its id, or from a path (from the workspace root, or absolute under an allowed root).

        Raises:
            NotFoundError: no such run or folder.
            PathEscapeError, InvalidInputError: as `resolve_path` and `check_id`.
        """
        if names_a_path(value):
            return self.resolve_path(value, argument=argument)
        return self._child(self.runs_dir, check_id(value, argument), "run", must_exist=True)

    def _child(self, parent: Path, name: str, kind: str, must_exist: bool) -> Path:
        path = parent / name
        if must_exist and not path.is_dir():
            known = sorted(p.name for p in parent.iterdir() if p.is_dir())[-5:]
            hint = f"; recent {kind}s: {', '.join(known)}" if known else f"; there are no {kind}s yet"
            raise NotFoundError(f"unknown {kind} id {name!r} in workspace {self.root}{hint}")
        return path

    def resolve_path(self, path: str | os.PathLike[str], argument: str, must_exist: bool = True) -> Path:
        """Resolve a user-given path so that it is inside the workspace or an allowed root.

        Relative paths are taken from the workspace root. Symlinks are followed before the check, so a
        link inside the workspace that points elsewhere is refused.

        Raises:
            PathEscapeError: the path lands outside every allowed root; the message names `argument`.
            NotFoundError: `must_exist` and nothing is there.
        """
        raw = Path(path).expanduser()
        joined = raw if raw.is_absolute() else self.root / raw
        resolved = joined.resolve()
        roots = (self.root, *self.allowed_roots)
        if not any(resolved.is_relative_to(root) for root in roots):
            lexical = Path(os.path.normpath(joined))
            if any(lexical.is_relative_to(root) for root in roots):
                why = "it goes through a symlink that leads outside"
            elif ".." in raw.parts:
                why = "its '..' components climb out of"
            else:
                why = "it is outside"
            allowed = ", ".join(str(root) for root in roots)
            raise PathEscapeError(
                f"argument {argument!r}: path {str(path)!r} is refused because {why} the workspace and the "
                f"allowed roots ({allowed}); use a path inside the workspace or allow its folder with --allow-path"
            )
        if must_exist and not resolved.exists():
            raise NotFoundError(f"argument {argument!r}: no file or folder at {str(path)!r} ({resolved})")
        return resolved
