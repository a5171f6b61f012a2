"""Choosing a backend by name: what tools and the CLI call so they need not know each class."""

from __future__ import annotations

import os
from typing import Protocol

from tradewind.cluster.jobs import LOG_PAGE_BYTES, BackendStatus, JobRecord, JobSpec, LogChunk
from tradewind.cluster.local import LocalBackend
from tradewind.cluster.placement import BackendName
from tradewind.cluster.ray_backend import RayBackend
from tradewind.core import InvalidInputError

# Each backend's class owns its settings (`on_this_machine`, `default_pending_timeout_s`), read before connecting.
BACKEND_TYPES: dict[BackendName, type[LocalBackend] | type[RayBackend]] = {"local": LocalBackend, "ray": RayBackend}
BACKENDS = tuple(BACKEND_TYPES)


class Backend(Protocol):
    """What every backend offers (`LocalBackend`, `RayBackend`); code above `cluster` sees only this."""

    name: str
    on_this_machine: bool  # its jobs run on the machine that submits them
    default_pending_timeout_s: float | None  # for a spec that names none: how long a job may wait to start

    def submit(self, spec: JobSpec, job_id: str | None = None) -> JobRecord: ...
    def status(self, job_id: str) -> JobRecord: ...
    def wait(self, job_id: str, timeout: float) -> JobRecord: ...
    def logs(self, job_id: str, offset: int = 0, limit: int = LOG_PAGE_BYTES, replica: int = 0) -> LogChunk: ...
    def cancel(self, job_id: str) -> JobRecord: ...
    def list(self) -> list[JobRecord]: ...
    def cluster_status(self) -> BackendStatus: ...


def get_backend(
    name: str, jobs_dir: str | os.PathLike[str], address: str | None = None, read_only: bool = False
) -> Backend:
    """The backend called `name`: "local" (state under `jobs_dir`) or "ray" (`address`, else `$RAY_ADDRESS`).

    Unlike `RayBackend()`, this never starts a Ray inside the calling process (a server's): without an
    address there is no cluster to use. With `read_only`, the backend only reads and writes nothing to the
    workspace (see `LocalBackend` and `RayBackend`).

    Raises:
        InvalidInputError: an unknown name; "ray" without the `ray` extra installed, without an address,
            or with one where no Ray head answers.
    """
    if name == "local":
        return LocalBackend(jobs_dir, read_only=read_only)
    if name == "ray":
        if not (address or os.environ.get("RAY_ADDRESS")):
            raise InvalidInputError(
                "argument 'backend': 'ray' needs a Ray cluster: set RAY_ADDRESS to its head's address "
                "(its GCS address, host:6379), or start one with `ray start --head`"
            )
        try:
            return RayBackend(address, read_only=read_only)
        except ImportError as error:  # RayBackend imports Ray when it is made, not when its module is
            raise InvalidInputError(
                "argument 'backend': Ray is not installed (pip install 'tradewind[ray]')"
            ) from error
    raise InvalidInputError(f"argument 'backend': unknown backend {name!r}; known: {', '.join(BACKENDS)}")
