"""Opening files inside the workspace so that no symlink in it leads outside.

Runs, datasets, reports and samples are folders that processes and people write into. A symlink planted
in one of them (`runs/X/train.log -> /etc/passwd`, `runs/X/samples -> /home/me/.ssh`) would let a tool read or
write outside the workspace while the path it was given looks inside. So every tool, resource and dashboard
route opens workspace files here (through `Workspace.open` and friends):

1. The path is resolved, symlinks followed, and must land under one of the allowed roots (the workspace root
   for writing; the workspace and the `--allow-path` roots for reading).
2. The resolved path is then opened one component at a time from the root's own descriptor, each with
   `O_NOFOLLOW`: a component swapped for a symlink between the check and the open is refused, not followed.
   There is no gap between checking a path and using it.
3. Only regular files are opened (with `O_NONBLOCK`, so a FIFO planted as a log cannot hang the reader).

A folder handed whole to another process (a checkpoint folder orbax reads, a tokenizer folder) cannot be
opened on its behalf; `check_tree` refuses one that holds a symlink leading outside the roots.

Example:
    with open_confined(run_dir / "train.log", "rb", roots=(workspace_root,), argument="run_id") as f:
        f.seek(offset)
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from tradewind.core.errors import InvalidInputError, NotFoundError, PathEscapeError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
# What a component that is (or became) a symlink gives under O_NOFOLLOW: ELOOP for the last, ENOTDIR for
# a folder opened with O_DIRECTORY.
_LINK_ERRNOS = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)

_MODE_FLAGS = {
    "r": os.O_RDONLY,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
}

Roots = Sequence[Path]
# How a reader of a lower layer opens the file it reads, in binary mode: `open_plain` outside any workspace,
# `Workspace.reader(argument)` for a workspace file (confined).
Opener = Callable[[Path], IO[bytes]]


def open_plain(path: Path) -> IO[bytes]:
    """The opener of files no workspace confines (a trainer's own run folder, a path given on the command line)."""
    return open(path, "rb")


def confined_path(path: str | os.PathLike[str], roots: Roots, argument: str) -> tuple[Path, Path]:
    """`path` resolved (symlinks followed) and the allowed root it lies under.

    Raises:
        PathEscapeError: the resolved path is under none of `roots`; the message names `argument`, the path,
            and where its symlink led.
    """
    given = Path(path)
    resolved = given.resolve()
    root = next((root for root in roots if resolved.is_relative_to(root)), None)
    if root is None:
        shown = ", ".join(str(root) for root in roots)
        raise PathEscapeError(
            f"argument {argument!r}: {given} is refused because it leads through a symlink to {resolved}, outside "
            f"the workspace and the allowed roots ({shown}); files and folders inside workspace objects may not "
            "link out"
        )
    return resolved, root


def _escape_during_open(path: Path, argument: str) -> PathEscapeError:
    return PathEscapeError(
        f"argument {argument!r}: {path} is refused because a part of it is a symlink (it changed while being "
        "opened); files and folders inside workspace objects may not link out"
    )


def _open_folder(resolved: Path, root: Path, argument: str, *, create: bool) -> int:
    """A descriptor of folder `resolved`, reached from `root` one component at a time without following a
    symlink; missing folders are made when `create`."""
    fd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        for name in resolved.relative_to(root).parts:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise NotFoundError(f"argument {argument!r}: no folder at {resolved}") from None
                # made meanwhile by another writer: opened below all the same, without following
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError as error:
        os.close(fd)
        if error.errno in _LINK_ERRNOS:
            raise _escape_during_open(resolved, argument) from None
        raise
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_confined(
    path: str | os.PathLike[str],
    mode: str = "rb",
    *,
    roots: Roots,
    argument: str,
    encoding: str | None = "utf-8",
    errors: str | None = None,
    make_parents: bool = False,
) -> IO[Any]:
    """Open the regular file `path` under one of `roots` (see the module docstring) with `open`'s `mode`.

    `encoding` and `errors` apply in text modes. `make_parents` makes missing folders (for writing).

    Raises:
        PathEscapeError: the path, or a folder on the way, leads outside `roots`.
        NotFoundError: reading a file that does not exist.
        InvalidInputError: the path is a folder, a FIFO or another non-regular file.
    """
    flags = _MODE_FLAGS[mode.replace("b", "").replace("+", "")[:1]]
    if "+" in mode:
        flags = (flags & ~os.O_WRONLY) | os.O_RDWR
    resolved, root = confined_path(path, roots, argument)
    if resolved == root:
        raise InvalidInputError(f"argument {argument!r}: {path} is a folder, not a file")
    folder = _open_folder(resolved.parent, root, argument, create=make_parents)
    try:
        fd = os.open(resolved.name, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, 0o644, dir_fd=folder)
    except FileNotFoundError:
        raise NotFoundError(f"argument {argument!r}: no file at {resolved}") from None
    except OSError as error:
        if error.errno in _LINK_ERRNOS:
            raise _escape_during_open(resolved, argument) from None
        if error.errno == errno.EISDIR:
            raise InvalidInputError(f"argument {argument!r}: {resolved} is a folder, not a file") from None
        raise
    finally:
        os.close(folder)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInputError(f"argument {argument!r}: {resolved} is not a regular file (a FIFO or device?)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    text = "b" not in mode
    return os.fdopen(fd, mode, encoding=encoding if text else None, errors=errors if text else None)


def make_confined_dir(path: str | os.PathLike[str], *, roots: Roots, argument: str) -> Path:
    """Make folder `path` (and its parents) under one of `roots`, refusing any symlink on the way; its path."""
    resolved, root = confined_path(path, roots, argument)
    os.close(_open_folder(resolved, root, argument, create=True))
    return resolved


def write_confined(path: str | os.PathLike[str], data: bytes, *, roots: Roots, argument: str) -> Path:
    """Write `data` to `path` atomically (a temporary file beside it, fsync, rename), confined like
    `open_confined`: the folder is held open by descriptor, so the rename lands where the check looked."""
    resolved, root = confined_path(path, roots, argument)
    folder = _open_folder(resolved.parent, root, argument, create=True)
    temporary = f".{resolved.name}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, resolved.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=folder)
            raise
    finally:
        os.close(folder)
    return resolved


def check_tree(path: str | os.PathLike[str], *, roots: Roots, argument: str) -> Path:
    """`path` resolved, after checking that neither it nor anything inside it links outside `roots`.

    For folders another process reads whole (checkpoints, tokenizer folders). A symlink that stays inside
    the roots is allowed; one that leads out, or dangles, is refused with its name.
    """
    resolved, _ = confined_path(path, roots, argument)
    if not resolved.is_dir():
        return resolved
    for folder, subfolders, files in os.walk(resolved, followlinks=False):
        for name in (*subfolders, *files):
            entry = Path(folder) / name
            if entry.is_symlink():
                confined_path(entry, roots, argument)
    return resolved
