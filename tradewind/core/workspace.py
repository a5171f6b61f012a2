"""The workspace: one root folder that holds every artifact Tradewind makes.

Layout::

    <root>/datasets/<id>/   token caches
    <root>/runs/<id>/       one folder per training run (config, metrics, logs, checkpoints, profiles)
    <root>/sweeps/<id>/     a sweep's state and its controller's log
    <root>/reports/         markdown reports and their plots, experiment-ledger exports
    <root>/exports/         export_model's Hugging Face (or PEFT) folders of runs
    <root>/cache/xla/       compiled programs local training jobs reuse
    <root>/jobs/            job records of the local cluster backend (cluster.sqlite) and job logs
    <root>/steps/           outputs of pipeline steps, addressed by a hash of their inputs
    <root>/pipelines/       a place for pipeline files (run only once granted with --allow-code)

The root comes from `--workspace`, else `$TRADEWIND_WORKSPACE`, else `~/.tradewind`. Every path a tool
accepts is resolved here: it must land inside the root or inside a root the user allowed explicitly
(`--allow-path`), after following symlinks. Running code is a separate grant, never a default: a pipeline
file must lie under a root given with `--allow-code` (`resolve_code`), `pipelines/` included.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path
from typing import IO, Any

from tradewind.core.buckets import bucket_url, is_remote, under
from tradewind.core.errors import InvalidInputError, NotFoundError, PathEscapeError
from tradewind.core.files import Opener, check_tree, make_confined_dir, open_confined, write_confined

ENV_VAR = "TRADEWIND_WORKSPACE"
COMPILE_CACHE_ENV = "TRADEWIND_COMPILE_CACHE_DIR"  # one compile cache for every workspace on the machine
DEFAULT_ROOT = Path("~/.tradewind")
_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # the whole id: `$` would let a final newline by
MAX_PATH_CHARS = 4096  # Linux's PATH_MAX
MAX_NAME_BYTES = 255  # Linux's NAME_MAX: one component of a path
PIPELINES_DIR = "pipelines"
SETTINGS_FILE = "settings.yaml"  # the workspace's settings, read by `tradewind.tools.context`


def make_id(prefix: str) -> str:
    """A new sortable, unique id such as `run-20261202-134501-3f9a0c1d`.

    Eight random hex digits: with four, 50 ids made in one second collided about once in fifty tries (a
    sweep launches that many at once); with eight, about once in three million.
    """
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"


def check_id(value: str, argument: str) -> str:
    """Return `value` if it is a safe id (letters, digits, `.`, `_`, `-`); raise otherwise."""
    if not _ID_PATTERN.fullmatch(value) or value in {".", ".."} or ".." in value:
        raise InvalidInputError(
            f"argument {argument!r}: {value!r} is not a valid id (use letters, digits, '.', '_' and '-')"
        )
    return value


def check_path_text(value: str | os.PathLike[str], argument: str) -> str:
    """Return `value` as text if it can name a path: not empty, no NUL byte, not over-long; raise otherwise.

    Raises:
        InvalidInputError: the message names `argument` and the limit that was broken.
    """
    text = os.fspath(value)
    if not isinstance(text, str):
        raise InvalidInputError(f"argument {argument!r}: a path must be text, not {type(text).__name__}")
    if not text.strip():
        raise InvalidInputError(f"argument {argument!r}: the path is empty; name a file or folder")
    if "\x00" in text:
        raise InvalidInputError(f"argument {argument!r}: the path {text[:80]!r} contains a NUL byte")
    if len(text) > MAX_PATH_CHARS:
        raise InvalidInputError(
            f"argument {argument!r}: the path is {len(text)} characters long; the limit is {MAX_PATH_CHARS}"
        )
    for part in Path(text).parts:
        if len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
            raise InvalidInputError(
                f"argument {argument!r}: the path component {part[:40]!r}... is over {MAX_NAME_BYTES} bytes long, "
                "the limit of one file or folder name"
            )
    return text


def names_a_path(value: str) -> bool:
    """Whether a value a user gave is a path rather than an id: it holds a '/' or starts with '.' or '~'."""
    return "/" in value or value.startswith((".", "~"))


class Workspace:
    """The workspace root plus the extra input roots and code roots the user allowed.

    Args:
        root: the workspace folder; created on first use.
        allowed_paths: further folders whose files tools may read (never write, never run); a bucket prefix
            (`gs://bucket/x`, `s3://...`) lets runs read and write under it (`check_bucket`).
        code_paths: the folders whose Python files `run_pipeline` may import and run (`--allow-code`).
        create: make the workspace's folders now; False for one that is only read (a read-only server),
            which must then exist already.

    Raises:
        NotFoundError: with `create=False`, a folder of the workspace is not there.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        allowed_paths: tuple[str | os.PathLike[str], ...] = (),
        code_paths: tuple[str | os.PathLike[str], ...] = (),
        create: bool = True,
    ):
        self.root = Path(root).expanduser().resolve()
        self.allowed_roots = tuple(Path(p).expanduser().resolve() for p in allowed_paths if not is_remote(p))
        self.allowed_buckets = tuple(bucket_url(str(p)) for p in allowed_paths if is_remote(p))
        self.code_roots = tuple(Path(p).expanduser().resolve() for p in code_paths)
        for folder in (self.datasets_dir, self.runs_dir, self.reports_dir, self.jobs_dir):
            if create:
                folder.mkdir(parents=True, exist_ok=True)
            elif not folder.is_dir():
                raise NotFoundError(
                    f"{folder} is not there, so {self.root} is not a workspace to read: a read-only server "
                    "makes nothing. Run any command that writes to it first, or serve without --read-only"
                )

    @classmethod
    def from_env(
        cls,
        root: str | os.PathLike[str] | None = None,
        allowed_paths: tuple[str | os.PathLike[str], ...] = (),
        code_paths: tuple[str | os.PathLike[str], ...] = (),
        create: bool = True,
    ) -> Workspace:
        """The workspace named by `root`, else `$TRADEWIND_WORKSPACE`, else `~/.tradewind`."""
        return cls(root or os.environ.get(ENV_VAR) or DEFAULT_ROOT, allowed_paths, code_paths, create)

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    @property
    def datasets_dir(self) -> Path:
        return self.root / "datasets"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def sweeps_dir(self) -> Path:
        """`sweeps/`: one folder per sweep (`sweep.json`, the controller's log); made by the first sweep."""
        return self.root / "sweeps"

    @property
    def reports_dir(self) -> Path:
        return self.root / "reports"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    @property
    def compile_cache_dir(self) -> Path:
        """`cache/xla/`: compiled XLA programs that local training jobs reuse (JAX's persistent cache), or the
        folder `TRADEWIND_COMPILE_CACHE_DIR` names: workspaces on one machine may share one, since JAX keys each
        program on its HLO, the compiler, its flags and the devices."""
        shared = os.environ.get(COMPILE_CACHE_ENV)
        return Path(shared).expanduser() if shared else self.root / "cache" / "xla"

    def compile_cache_use(self) -> tuple[int, int]:
        """Bytes and files in `cache/xla/` now (JAX evicts the least recently used past its bound)."""
        sizes = [entry.stat().st_size for entry in self._cache_files()]
        return sum(sizes), len(sizes)

    def clear_compile_cache(self) -> int:
        """Delete every compiled program in `cache/xla/`; returns the bytes freed. A job compiling meanwhile
        only misses the cache."""
        freed = 0
        for entry in self._cache_files():
            freed += entry.stat().st_size
            entry.unlink(missing_ok=True)
        return freed

    def _cache_files(self) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(self.compile_cache_dir) as entries:
                return [entry for entry in entries if entry.is_file(follow_symlinks=False)]
        except FileNotFoundError:
            return []

    @property
    def pipelines_dir(self) -> Path:
        return self.root / PIPELINES_DIR

    @property
    def read_roots(self) -> tuple[Path, ...]:
        """Where tools may read: the workspace and the `--allow-path` roots."""
        return (self.root, *self.allowed_roots)

    @property
    def write_roots(self) -> tuple[Path, ...]:
        """Where tools may write: the workspace alone."""
        return (self.root,)

    def open(
        self,
        path: str | os.PathLike[str],
        mode: str = "rb",
        *,
        argument: str,
        encoding: str | None = "utf-8",
        errors: str | None = None,
    ) -> IO[Any]:
        """Open a file inside the workspace (or, to read, an allowed root) with no symlink leading out.

        The one way tools, resources and the dashboard open workspace files (`core.files.open_confined`):
        writing (`w`, `a`, `x`) is confined to the workspace and makes missing folders; reading to the
        workspace and the `--allow-path` roots. `argument` is the request argument that led here, for errors.

        Raises:
            PathEscapeError: the file or a folder on the way leads outside.
            NotFoundError: reading a file that is not there.
            InvalidInputError: not a regular file.
        """
        writing = any(flag in mode for flag in "wax+")
        return open_confined(
            self.root / path,
            mode,
            roots=self.write_roots if writing else self.read_roots,
            argument=argument,
            encoding=encoding,
            errors=errors,
            make_parents=writing,
        )

    def reader(self, argument: str) -> Opener:
        """An opener for the readers of lower layers (`read_json`, `read_metrics`, `open_token_cache`, ...): each file
        they read is opened with `open(path, "rb", argument=argument)`, so it is confined like any other."""
        return lambda path: self.open(path, "rb", argument=argument)

    def write_atomic(self, path: str | os.PathLike[str], data: bytes | str, *, argument: str) -> Path:
        """Write a workspace file atomically, confined like `open`; `str` data is written as UTF-8."""
        payload = data.encode("utf-8") if isinstance(data, str) else data
        return write_confined(self.root / path, payload, roots=self.write_roots, argument=argument)

    def make_dir(self, path: str | os.PathLike[str], *, argument: str) -> Path:
        """Make a folder inside the workspace (for a process to write into), refusing symlinks that lead out."""
        return make_confined_dir(self.root / path, roots=self.write_roots, argument=argument)

    def check_tree(self, path: str | os.PathLike[str], *, argument: str) -> Path:
        """A folder another process will read whole (checkpoints, a tokenizer), checked for links leading out."""
        return check_tree(self.root / path, roots=self.read_roots, argument=argument)

    def internal_input(self, path: Path) -> str | None:
        """What makes the resolved `path` a workspace internal that is never an input, else None.

        Internals: `jobs/` (the job database `cluster.sqlite` and job logs), everything under `datasets/`
        (token caches: manifests and shard files), `settings.yaml`, `cache/` (compiled programs), and every
        file or folder of the workspace whose name starts with '.' (the HTTP token `.tradewind-token` among
        them), at any depth. Files under an `--allow-path` root are the user's, not internals.
        """
        if not path.is_relative_to(self.root):
            return None
        parts = path.relative_to(self.root).parts
        hidden = next((part for part in parts if part.startswith(".")), None)
        if hidden is not None:
            return f"{path} is hidden ({hidden!r}: names starting with '.' hold the server's token and state)"
        if path.is_relative_to(self.jobs_dir):
            return f"{path} is in the workspace's jobs/ folder (the job database and job logs)"
        if path.is_relative_to(self.datasets_dir):
            return f"{path} is inside the workspace's token caches (datasets/)"
        if path.is_relative_to(self.root / "cache"):
            return f"{path} is in the workspace's cache/ folder (compiled programs)"
        if parts == (SETTINGS_FILE,):
            return f"{path} is the workspace's {SETTINGS_FILE} (its settings and limits)"
        return None

    def dataset_dir(self, dataset_id: str, must_exist: bool = True) -> Path:
        """The folder of dataset `dataset_id`; raises `NotFoundError` if it must exist and does not."""
        return self._child(self.datasets_dir, check_id(dataset_id, "dataset_id"), "dataset", must_exist, "dataset_id")

    def run_dir(self, run_id: str, must_exist: bool = True) -> Path:
        """The folder of run `run_id`; raises `NotFoundError` if it must exist and does not."""
        return self._child(self.runs_dir, check_id(run_id, "run_id"), "run", must_exist, "run_id")

    def sweep_dir(self, sweep_id: str, must_exist: bool = True) -> Path:
        """The folder of sweep `sweep_id`; raises `NotFoundError` if it must exist and does not."""
        name = check_id(sweep_id, "sweep_id")
        if must_exist and not self.sweeps_dir.is_dir():
            raise NotFoundError(f"unknown sweep id {name!r} in workspace {self.root}; there are no sweeps yet")
        return self._child(self.sweeps_dir, name, "sweep", must_exist, "sweep_id")

    def run_folder(self, value: str, argument: str = "run") -> Path:
        """A run's folder from its id, or from a path (from the workspace root, or absolute under an allowed root).

        Raises:
            NotFoundError: no such run or folder.
            PathEscapeError, InvalidInputError: as `resolve_path` and `check_id`.
        """
        if names_a_path(value):
            return self.resolve_path(value, argument=argument)
        return self._child(self.runs_dir, check_id(value, argument), "run", True, argument)

    def _child(self, parent: Path, name: str, kind: str, must_exist: bool, argument: str) -> Path:
        """`parent/name`, after checking that it does not lead (through a symlink) out of the allowed roots."""
        path = parent / name
        target = path.resolve()
        if not any(target.is_relative_to(root) for root in (self.root, *self.allowed_roots)):
            raise PathEscapeError(
                f"argument {argument!r}: {kind} {name!r} is refused because {path} is a symlink that leads to "
                f"{target}, outside the workspace and the allowed roots"
            )
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
            InvalidInputError: an empty path, a NUL byte, or one over `MAX_PATH_CHARS` characters (or a
                component over `MAX_NAME_BYTES` bytes); the message names `argument`.
            PathEscapeError: the path lands outside every allowed root; the message names `argument`.
            NotFoundError: `must_exist` and nothing is there.
        """
        check_path_text(path, argument)
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

    def check_bucket(self, url: str, argument: str, also: tuple[str, ...] = ()) -> str:
        """`url` checked to lie under a bucket prefix given with `--allow-path` (or one of `also`); every other
        bucket is refused.

        Raises:
            InvalidInputError: not a bucket URL.
            PathEscapeError: under none of the allowed prefixes; the message names `argument`.
        """
        try:
            url = bucket_url(url)
        except ValueError as error:
            raise InvalidInputError(f"argument {argument!r}: {error}") from None
        allowed = (*self.allowed_buckets, *also)
        if not any(under(url, prefix) for prefix in allowed):
            shown = ", ".join(allowed) or "none"
            raise PathEscapeError(
                f"argument {argument!r}: {url} is refused because it is under none of the allowed bucket prefixes "
                f"({shown}); allow it with --allow-path {url}, or name it as storage in settings.yaml"
            )
        return url

    def resolve_input(self, path: str | os.PathLike[str], argument: str) -> Path:
        """`resolve_path` for a file or folder a tool reads as its input, refusing workspace internals
        (`internal_input`): a user's data is never the server's token, job store, settings or caches.

        Raises:
            InvalidInputError: as `resolve_path`, or the path is an internal; the message names `argument`.
            PathEscapeError, NotFoundError: as `resolve_path`.
        """
        resolved = self.resolve_path(path, argument=argument)
        internal = self.internal_input(resolved)
        if internal is not None:
            raise InvalidInputError(
                f"argument {argument!r}: {str(path)!r} is refused because it would read workspace internals: "
                f"{internal}; workspace internals are never an input"
            )
        return resolved

    def resolve_code(self, path: str | os.PathLike[str], argument: str) -> Path:
        """Resolve a Python file the user wants run (or imported, even for a dry run): it must lie under a root
        given with `--allow-code`.

        Running code is a grant of its own, never a default: a file in the workspace (`pipelines/` included) or
        under a root given with `--allow-path` (inputs only) is refused until its folder is allowed with
        `--allow-code DIR`. Symlinks are followed before the check.

        Raises:
            InvalidInputError: as `resolve_path`.
            PathEscapeError: the file is under no code root; the message says where it is and how to grant it.
            NotFoundError: nothing is there.
        """
        check_path_text(path, argument)
        raw = Path(path).expanduser()
        resolved = (raw if raw.is_absolute() else self.root / raw).resolve()
        if not any(resolved.is_relative_to(root) for root in self.code_roots):
            read_root = next((root for root in self.allowed_roots if resolved.is_relative_to(root)), None)
            if read_root is not None:
                where = f"it is under {read_root}, a root allowed with --allow-path, which grants reading inputs"
                where += ", not running code"
            elif resolved.is_relative_to(self.root):
                where = "it is in the workspace, and files there are not code the server may run"
            else:
                where = "it is outside every code root"
            granted = ", ".join(str(root) for root in self.code_roots) or "none"
            raise PathEscapeError(
                f"argument {argument!r}: {str(path)!r} ({resolved}) is refused because {where}; this server runs or "
                f"imports code only from folders granted with --allow-code DIR (granted: {granted}): restart it "
                f"with --allow-code {resolved.parent}"
            )
        if not resolved.exists():
            raise NotFoundError(f"argument {argument!r}: no file at {str(path)!r} ({resolved})")
        return resolved
