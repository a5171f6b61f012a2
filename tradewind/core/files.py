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
3. Only regular files with one link are opened (`refusal`): a FIFO or a device planted as a log or an input
   would hang the reader or feed it without end, and a hard link to a file outside is a regular file whose path
   lies inside. The file is looked at before it is opened (a device is never opened), opened with `O_NONBLOCK`,
   and looked at again through its descriptor: a file swapped in between is refused.

A folder handed whole to another process (a checkpoint folder orbax reads, a tokenizer folder) cannot be
opened on its behalf; `check_tree` refuses one that holds a symlink leading outside the roots, a special file
or a hard link.

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


def file_state(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """A file's modification time and size, which an append or a rewrite changes; None when it is not there.
    A link is stated, never followed: what it leads to is for the confined reader to refuse."""
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


def open_plain(path: Path) -> IO[bytes]:
    """The opener of files no workspace confines (a trainer's own run folder, a path given on the command line):
    regular files with one link only (`open_regular`)."""
    return open_regular(path)


def read_bounded(path: str | os.PathLike[str], max_bytes: int, opener: Opener = open_plain) -> bytes:
    """The bytes of file `path`, opened with `opener`; at most `max_bytes` are read.

    Raises:
        InvalidInputError: it holds more than `max_bytes`; and what `opener` raises.
    """
    with opener(Path(path)) as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InvalidInputError(
            f"{path} is refused: it holds more than {max_bytes:,} bytes, the most a file of its kind may"
        )
    return data


def refusal(info: os.stat_result) -> str | None:
    """Why a file of `info` (its `lstat`) is not read on a caller's behalf, or None: only a regular file with one
    link is."""
    if not stat.S_ISREG(info.st_mode):
        return f"it is {_kind(info.st_mode)}, not a regular file: only regular files are read"
    if info.st_nlink != 1:
        return (
            f"it has {info.st_nlink} hard links, and a hard link can bring in a file from outside: only files with "
            "one link are read (copy it instead)"
        )
    return None


def _kind(mode: int) -> str:
    kinds = {
        stat.S_ISDIR: "a folder",
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
        stat.S_ISLNK: "a symlink",
    }
    return next((name for is_kind, name in kinds.items() if is_kind(mode)), "a special file")


def open_regular(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open `path` (symlinks followed) to read, in binary mode, if it is a regular file with one link (`refusal`).

    Raises:
        FileNotFoundError: nothing is there (as `open` raises it).
        InvalidInputError: anything else, or a file swapped for another while being opened; the message names
            the path.
    """
    return os.fdopen(_open_checked(os.path.realpath(path), os.O_RDONLY, str(path)), "rb")


def open_append(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open `path` (made if missing) to append to, in binary mode: for a log another process could swap, a file
    that is not a regular file with one link (a FIFO, a device, a hard link to a file elsewhere) is refused, not
    written into.

    Raises:
        InvalidInputError: as `refusal` says, naming the path.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    return os.fdopen(_open_checked(os.path.realpath(path), flags, str(path), create=True), "ab")


def _open_checked(name: str, flags: int, where: str, *, dir_fd: int | None = None, create: bool = False) -> int:
    """A descriptor of file `name` opened with `flags`, checked by `refusal` before it is opened and again through
    the descriptor (the same file, still regular with one link); a file `create` makes is new, so not looked at
    before. Writers open without `O_TRUNC` and truncate once the file is checked, so a link swapped in is never
    truncated.

    Raises:
        FileNotFoundError: nothing is there, and `create` is false.
        InvalidInputError: `refusal`'s reasons, with `where` first, or the file changed while being opened.
    """
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        if not create:
            raise
        before = None
    if before is not None and (reason := refusal(before)) is not None:
        if stat.S_ISLNK(before.st_mode):  # a link swapped in after the path was resolved
            raise PathEscapeError(f"{where} is refused because it became a symlink while being opened")
        raise InvalidInputError(f"{where} is refused: {reason}")
    truncate = bool(flags & os.O_TRUNC)
    fd = os.open(name, (flags & ~os.O_TRUNC) | _NOFOLLOW | _CLOEXEC | _NONBLOCK, 0o644, dir_fd=dir_fd)
    try:
        after = os.fstat(fd)
        swapped = before is not None and (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino)
        reason = "it was replaced while being opened" if swapped else refusal(after)
        if reason is not None:
            raise InvalidInputError(f"{where} is refused: {reason}")
        os.set_blocking(fd, True)
        if truncate:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
        InvalidInputError: the path is not a regular file with one link (`refusal`): a folder, a FIFO, a device,
            a hard link.
    """
    flags = _MODE_FLAGS[mode.replace("b", "").replace("+", "")[:1]]
    if "+" in mode:
        flags = (flags & ~os.O_WRONLY) | os.O_RDWR
    resolved, root = confined_path(path, roots, argument)
    if resolved == root:
        raise InvalidInputError(f"argument {argument!r}: {path} is a folder, not a file")
    folder = _open_folder(resolved.parent, root, argument, create=make_parents)
    where = f"argument {argument!r}: {resolved}"
    try:
        fd = _open_checked(resolved.name, flags, where, dir_fd=folder, create=bool(flags & os.O_CREAT))
    except FileNotFoundError:
        raise NotFoundError(f"argument {argument!r}: no file at {resolved}") from None
    except OSError as error:
        if error.errno in _LINK_ERRNOS:
            raise _escape_during_open(resolved, argument) from None
        raise
    finally:
        os.close(folder)
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
    """`path` resolved, after checking that neither it nor anything inside it links outside `roots`, and that it
    holds only folders and regular files with one link (`refusal`).

    For folders another process reads whole (checkpoints, tokenizer folders). A symlink that stays inside
    the roots is allowed; one that leads out, or dangles, is refused with its name.

    Raises:
        PathEscapeError: a symlink inside leads outside `roots`.
        InvalidInputError: a special file or a hard link inside, named.
    """
    resolved, _ = confined_path(path, roots, argument)
    if resolved.exists() and not resolved.is_dir():
        _check_entry(resolved, resolved.stat(), argument)
    if not resolved.is_dir():
        return resolved
    for folder, subfolders, files in os.walk(resolved, followlinks=False):
        for name in (*subfolders, *files):
            entry = Path(folder) / name
            info = entry.lstat()
            if stat.S_ISLNK(info.st_mode):
                confined_path(entry, roots, argument)
                info = entry.stat()
            _check_entry(entry, info, argument)
    return resolved


def _check_entry(path: Path, info: os.stat_result, argument: str) -> None:
    """Refuse `path` (of `info`) inside a folder another process reads whole, unless a folder or a file `refusal`
    lets through."""
    if not stat.S_ISDIR(info.st_mode) and (reason := refusal(info)) is not None:
        raise InvalidInputError(f"argument {argument!r}: {path} is refused: {reason}")
