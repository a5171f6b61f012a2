"""Buckets (`gs://`, `s3://`): where a run keeps its files when its hosts share no disk.

A bucket holds objects, not files. One object appears whole or not at all, but a folder of them can be
seen half-copied. So a folder copied into a bucket counts only once its marker (`MARKER`) is there, and the
marker is written last, listing every file and its size (`upload_folder`). `download_folder` refuses a
prefix without a marker and checks every file it fetches against it. A copy cut off part-way has no marker:
the next try copies it again, and nothing reads it meanwhile.

Credentials come from the environment and never enter Tradewind's records: application-default credentials
for `gs://` (through gcsfs), the AWS credential chain for `s3://` (through s3fs). Their documented endpoint
settings point them at a server of your choosing: `STORAGE_EMULATOR_HOST` for gcsfs (and
`TENSORSTORE_GCS_HTTP_URL` for orbax's tensorstore), `AWS_ENDPOINT_URL` for s3fs. `check_access` runs
before anything queues and names the URL and how to authenticate when the bucket cannot be used.

Example:
    check_access("gs://my-bucket/runs", argument="storage")
    upload_folder("datasets/ds-1234", "gs://my-bucket/runs/datasets/ds-1234")
    download_folder("gs://my-bucket/runs/datasets/ds-1234", "/tmp/ds-1234")
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tradewind.core.errors import ConfigError, NotFoundError

MARKER = ".tradewind-complete.json"
# Where the clients send their requests (an emulator, a private endpoint): a run's processes on other hosts get
# these from the launcher. Credentials never travel so: each host finds its own.
ENDPOINT_SETTINGS = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL", "AWS_ENDPOINT_URL")
# Called with (bytes copied so far, bytes in all) as a copy goes.
CopyProgress = Callable[[int, int], None]


@dataclass(frozen=True)
class Scheme:
    """What one kind of bucket needs: the fsspec package, the extra that installs it, how to log in."""

    package: str
    extra: str
    authenticate: str


SCHEMES = {
    "gs": Scheme(
        "gcsfs",
        "gcs",
        "Tradewind uses Google application-default credentials: run `gcloud auth application-default login`, "
        "or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file",
    ),
    "s3": Scheme(
        "s3fs",
        "s3",
        "Tradewind uses the AWS credential chain: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
        "AWS_PROFILE, or run on a machine with an instance role",
    ),
}


def scheme_of(location: str | os.PathLike[str]) -> str | None:
    """`gs` or `s3` for a bucket URL, None for anything else (a local path)."""
    head, sep, _ = str(location).partition("://")
    return head if sep and head in SCHEMES else None


def is_remote(location: str | os.PathLike[str]) -> bool:
    """Whether `location` is a bucket URL (`gs://...`, `s3://...`)."""
    return scheme_of(location) is not None


def bucket_url(value: str) -> str:
    """`value` checked as a bucket URL (`gs://bucket/prefix`, `s3://...`), without a trailing slash.

    Raises:
        ValueError: another scheme, or no valid bucket name (3 to 63 lowercase letters, digits, `.`, `-`, `_`).
    """
    if not is_remote(value):
        raise ValueError(f"{value!r} is not a bucket URL: give gs://BUCKET/PREFIX or s3://BUCKET/PREFIX")
    bucket = value.split("://", 1)[1].split("/", 1)[0]
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]", bucket):
        raise ValueError(f"{value!r}: {bucket!r} is not a bucket name (3-63 lowercase letters, digits, '.', '-', '_')")
    return value.rstrip("/")


def under(url: str, prefix: str) -> bool:
    """Whether bucket URL `url` is `prefix` or lies beneath it (`gs://b/x/y` is under `gs://b/x`, `gs://b/xy` not)."""
    url, prefix = url.rstrip("/"), prefix.rstrip("/")
    return url == prefix or url.startswith(prefix + "/")


def join_url(url: str, *parts: str) -> str:
    """`url` with `parts` appended, one `/` between each."""
    return "/".join([url.rstrip("/"), *(part.strip("/") for part in parts)])


def url_name(url: str) -> str:
    """The last part of `url`, as a folder's name: `gs://b/runs/run-1` -> `run-1`."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def remote_fs(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of bucket URL `url`, and the path inside it (`bucket/key`).

    Raises:
        ConfigError: the scheme's package is not installed (the message names the extra to install).
    """
    import fsspec

    scheme = SCHEMES[scheme_of(url) or ""]
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError:
        raise ConfigError(
            f"{url}: reading and writing {scheme_of(url)}:// needs {scheme.package}: "
            f"pip install 'tradewind[{scheme.extra}]'"
        ) from None


def object_version(info: dict[str, Any]) -> str | None:
    """The version a bucket gives an object (GCS's generation, S3's ETag): it changes whenever the object does.
    None for a local file, whose size and modification time serve instead."""
    version = info.get("generation") or info.get("ETag") or info.get("etag")
    return str(version).strip('"') if version else None


def check_access(url: str, argument: str) -> None:
    """Check that this process can write, read and delete objects under `url`, before any work starts.

    Raises:
        ConfigError: it cannot; the message names `argument`, the URL, what the bucket answered and how to
            authenticate.
    """
    fs, path = remote_fs(url)
    probe = f"{path.rstrip('/')}/.tradewind-access-{secrets.token_hex(4)}"
    try:
        fs.pipe_file(probe, b"ok")
        if fs.cat_file(probe) != b"ok":
            raise OSError("an object written could not be read back")
        fs.rm_file(probe)
    except Exception as error:  # every library has its own errors for refused credentials and missing buckets
        detail = str(error).splitlines()[0].rstrip(".") if str(error) else type(error).__name__
        raise ConfigError(
            f"argument {argument!r}: cannot use {url}: {detail}. {SCHEMES[scheme_of(url) or ''].authenticate}; "
            "and check that the bucket exists and that this account may write to it"
        ) from None


def is_complete(url: str) -> bool:
    """Whether the folder copied to `url` is complete (its marker is there)."""
    fs, path = remote_fs(url)
    fs.invalidate_cache(path)
    return fs.exists(f"{path.rstrip('/')}/{MARKER}")


def upload_folder(
    local: str | os.PathLike[str], url: str, progress: CopyProgress | None = None, skip: Collection[str] = ()
) -> None:
    """Copy every file under folder `local` (but those named in `skip`, at its top) to the prefix `url`, then
    the marker that lists them.

    Files already there with the size the marker will name are not sent again, so a copy cut off part-way
    resumes; but nothing reads the prefix until the marker lands.
    """
    fs, path = remote_fs(url)
    root = Path(local)
    files = {
        file.relative_to(root).as_posix(): file.stat().st_size
        for file in sorted(root.rglob("*"))
        if file.is_file() and file.name != MARKER and file.relative_to(root).as_posix() not in skip
    }
    present = _sizes(fs, path)
    total, done = sum(files.values()), 0
    for name, size in files.items():
        if present.get(name) != size:
            fs.put_file(str(root / name), f"{path}/{name}")
        done += size
        if progress:
            progress(done, total)
    fs.pipe_file(f"{path}/{MARKER}", json.dumps({"files": files}, sort_keys=True).encode())


def download_folder(url: str, local: str | os.PathLike[str], progress: CopyProgress | None = None) -> Path:
    """Copy the complete folder at `url` to `local` (replaced whole), checking each file's size; `local`.

    The copy is made beside `local` and renamed into place, so `local` is either the old folder or the new.

    Raises:
        NotFoundError: `url` has no marker: nothing was copied there, or the copy did not finish.
        ConfigError: a file differs from the size its marker names (the prefix was written to since).
    """
    fs, path = remote_fs(url)
    fs.invalidate_cache(path)
    try:
        files: dict[str, int] = json.loads(fs.cat_file(f"{path}/{MARKER}"))["files"]
    except FileNotFoundError:
        raise NotFoundError(f"{url} holds no complete copy ({MARKER} missing: never copied, or cut off)") from None
    target = Path(local)
    partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
    total, done = sum(files.values()), 0
    try:
        partial.mkdir(parents=True)  # also for a copy of no files
        for name, size in files.items():
            (partial / name).parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(f"{path}/{name}", str(partial / name))
            got = (partial / name).stat().st_size
            if got != size:
                raise ConfigError(f"{url}/{name}: {got} bytes, its copy's marker says {size}; copy it again")
            done += size
            if progress:
                progress(done, total)
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(partial)
    return target


def read_objects(url: str, names: tuple[str, ...]) -> dict[str, bytes]:
    """The objects `names` under prefix `url` that exist, by name (each whole, as it was last written)."""
    fs, path = remote_fs(url)
    found = {}
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            found[name] = fs.cat_file(f"{path}/{name}")
    return found


def upload_files(local: str | os.PathLike[str], url: str, names: tuple[str, ...]) -> None:
    """Copy the files `names` of folder `local` that exist to prefix `url`, each replacing its object whole."""
    fs, path = remote_fs(url)
    for name in names:
        if (Path(local) / name).is_file():
            fs.put_file(str(Path(local) / name), f"{path}/{name}")


def download_files(url: str, local: str | os.PathLike[str], names: tuple[str, ...]) -> None:
    """Copy the objects `names` under prefix `url` into folder `local`, in that order, each under a temporary
    name first: a file of `local` is whole or absent, so the last one named may mark the others complete.

    Raises:
        FileNotFoundError: an object named is not there.
    """
    fs, path = remote_fs(url)
    for name in names:
        target = Path(local) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        fs.get_file(f"{path}/{name}", str(partial))
        os.replace(partial, target)


def list_objects(url: str) -> dict[str, int]:
    """The size of every object under prefix `url`, by its name relative to the prefix (none: `{}`)."""
    fs, path = remote_fs(url)
    return _sizes(fs, path)


def remove_objects(url: str) -> None:
    """Delete the object `url`, or every object under the prefix `url`; nothing there is no error."""
    fs, path = remote_fs(url)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path, recursive=True)
    fs.invalidate_cache(path)


def _sizes(fs: Any, path: str) -> dict[str, int]:
    """The size of every object under prefix `path`, by its name relative to the prefix."""
    fs.invalidate_cache(path)
    try:
        found = fs.find(path, detail=True)
    except FileNotFoundError:
        return {}
    prefix = path.rstrip("/") + "/"
    return {name[len(prefix) :]: int(info.get("size") or 0) for name, info in found.items() if name.startswith(prefix)}
