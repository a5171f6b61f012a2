"""Choosing a backend by name: what tools and the CLI call so they need not know each class."""

from __future__ import annotations

import os
from typing import Protocol

from tradewind.cluster.jobs import JobRecord, JobSpec
from tradewind.cluster.local import BackendStatus, LocalBackend, LogChunk
from tradewind.core import InvalidInputError

BACKENDS = ("local", "ray")


class Backend(Protocol):
    """What every backend offers (`LocalBackend`, `RayBackend`)."""

    name: str

    def submit(self, spec: JobSpec, job_id: str | None = None) -> JobRecord: ...
    def status(self, job_id: str) -> JobRecord: ...
    def wait(self, job_id: str, timeout: float) -> JobRecord: ...
    def logs(self, job_id: str, offset: int = 0, limit: int = ..., replica: int = 0) -> LogChunk: ...
    def cancel(self, job_id: str) -> JobRecord: ...
    def list(self) -> list[JobRecord]: ...
    def cluster_status(self) -> BackendStatus: ...


def get_backend(name: str, jobs_dir: str | os.PathLike[str], address: str | None = None) -> Backend:
    """The backend called `name`: "local" (state under `jobs_dir`) or "ray" (`address`, else `$RAY_ADDRESS`).

    Raises:
        InvalidInputError: an unknown name, or "ray" without the `ray` extra installed.
    """
    if name == "local":
        return LocalBackend(jobs_dir)
    if name == "ray":
        try:
            from tradewind.cluster.ray_backend import RayBackend
        except ImportError as error:
            raise InvalidInputError(
                "argument 'backend': Ray is not installed (pip install 'tradewind[ray]')"
            ) from error
        return RayBackend(address)
    raise InvalidInputError(f"argument 'backend': unknown backend {name!r}; known: {', '.join(BACKENDS)}")
