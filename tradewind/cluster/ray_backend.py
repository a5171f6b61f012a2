"""The Ray backend: the local backend's API, with jobs run as Ray jobs on a Ray cluster.

Each Tradewind job is one Ray job (id = the Tradewind job id) whose entrypoint is
`python -m tradewind.cluster.ray_entry`, a small driver that gang-schedules the replicas in a
placement group and applies the retry and timeout policy (see `ray_entry.py`). The cluster keeps all
state: the spec travels in the Ray job's metadata, so a restarted server finds every job again
through the Jobs API. Logs are the Ray job's logs (replica output included), read by byte offset and
mirrored into the spec's `log_path` when it has one.

`submit` refuses, before anything is queued, a job with a replica whose bundle fits no alive node
(a resource no node has, or more of it than the largest has); whether the bundles fit *together*
(a gang spread over nodes) is Ray's to decide, bounded by the spec's `pending_timeout_s`.

The address is the `address` argument, else `$RAY_ADDRESS` (a GCS address `host:6379` or a dashboard
URL `http://host:8265`); with neither, a local Ray starts inside this process. A named address that
does not answer is refused within seconds. Ray is imported only when a `RayBackend` is made.

Example:
    backend = RayBackend("127.0.0.1:6379")
    job = backend.submit(JobSpec(name="hi", command=["echo", "hi"], resources=Resources(tpu_type="v5litepod-8")))
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from tradewind.cluster.jobs import (
    LOG_PAGE_BYTES,
    BackendStatus,
    JobRecord,
    JobSpec,
    JobStatus,
    LogChunk,
    decode_log_page,
    wait_for_finish,
)
from tradewind.cluster.ray_entry import (
    RESULT_PREFIX,
    STARTED_LINE,
    describe_bundles,
    format_resources,
    ray_bundles,
    replica_count,
)
from tradewind.core import InvalidInputError, NotFoundError, atomic_write_text, check_id, make_id

SPEC_KEY = "tradewind_spec"
RAY_STATES = {"PENDING": JobStatus.PENDING, "SUCCEEDED": JobStatus.SUCCEEDED, "STOPPED": JobStatus.CANCELLED}
PROBE_TIMEOUT_S = 3.0  # Ray's own client retries an unreachable GCS for about 40 s
DEFAULT_PORTS = {"http": 8265, "https": 443}  # a dashboard URL without a port; a GCS address: 6379
TPU_HEAD = re.compile(r"TPU-(.+)-head")  # the resource Ray's TPU support gives a slice's first host


def check_reachable(address: str, source: str = "argument 'address'") -> None:
    """Refuse within seconds an address where nothing answers, before Ray's client retries for ~40 s.

    Raises:
        InvalidInputError: nothing accepts a connection at the address's host and port; `source` names
            where the address came from.
    """
    if address == "auto":
        return  # Ray finds the head this node belongs to itself
    parsed = urlsplit(address if "://" in address else f"gcs://{address}")
    try:
        port = parsed.port or DEFAULT_PORTS.get(parsed.scheme, 6379)
        socket.create_connection((parsed.hostname or "", port), timeout=PROBE_TIMEOUT_S).close()
    except (OSError, ValueError) as error:
        raise InvalidInputError(
            f"{source}: no Ray cluster answers at {address!r} ({error}); give a running head's address "
            "(host:6379 or http://host:8265), or start one with `ray start --head`"
        ) from error


def _check_not_overridden(address: str) -> None:
    """Ray's job and state clients use `$RAY_ADDRESS` whenever it is set, whatever address they are
    given; refuse another address rather than silently talk to a different cluster."""
    env = os.environ.get("RAY_ADDRESS")
    if env and env != address:
        raise InvalidInputError(
            f"argument 'address': {address!r} differs from RAY_ADDRESS={env!r}, which Ray's clients would use "
            "instead; unset RAY_ADDRESS, or leave the address out"
        )


def node_offers(nodes: list[tuple[str, dict[str, float]]]) -> str:
    """Each node's resources, e.g. `192.0.2.2 (head) {CPU: 4, GPU: 0, TPU: 8, ..., memory: 22.81 GiB}`."""
    shown = []
    for label, resources in nodes:
        always = {key: resources.get(key, 0.0) for key in ("CPU", "GPU", "TPU")}
        shown.append(f"{label} {format_resources({**always, **resources})}")
    return "; ".join(shown) or "(no alive nodes)"


def _fixes(bundle: dict[str, float], nodes: list[tuple[str, dict[str, float]]]) -> str:
    """What to change so that `bundle` fits a node: one suggestion per resource no node has enough of."""
    fixes = []
    for key, amount in bundle.items():
        largest = max((resources.get(key, 0.0) for _, resources in nodes), default=0.0)
        if largest >= amount:
            continue
        if slice_head := TPU_HEAD.fullmatch(key):
            types = sorted({m[1] for _, resources in nodes for name in resources if (m := TPU_HEAD.fullmatch(name))})
            offer = f"use a TPU type the cluster has: {', '.join(types)}, or" if types else "the cluster has no TPUs:"
            fixes.append(f"{offer} add the hosts of a {slice_head[1]} slice (whose first host Ray gives {key})")
        elif key == "GPU" and largest == 0:
            fixes.append("no node has a GPU: use accelerator 'cpu', or add nodes with GPUs")
        elif largest == 0:
            fixes.append(f"no node has {key}: add nodes that do")
        else:
            most = format_resources({key: largest})[1:-1]
            fixes.append(f"ask for at most {most} per replica (the largest node's), or add larger nodes")
    return "; ".join(fixes) or "no single node has all of it at once: ask for less per replica, or add larger nodes"


def check_placeable(spec: JobSpec, nodes: list[tuple[str, dict[str, float]]], cluster: str) -> None:
    """Refuse a job with a replica whose bundle fits no alive node: Ray would keep it pending forever.

    Only each bundle on its own is checked; whether they fit together is Ray's to decide.

    Raises:
        InvalidInputError: says what the job asks for, what each node offers, and what to change.
    """
    bundles, strategy = ray_bundles(spec)
    for index, bundle in enumerate(bundles):
        if any(all(resources.get(k, 0.0) >= v for k, v in bundle.items()) for _, resources in nodes):
            continue
        r = spec.resources
        asked = f"TPU {r.tpu_type} x {r.tpu_slices} slice(s), " if r.tpu_type else ""
        raise InvalidInputError(
            f"job {spec.name!r} cannot run on the Ray cluster at {cluster}: it asks for {asked}"
            f"{describe_bundles(bundles, strategy)}, and no alive node can hold bundle {index} "
            f"{format_resources(bundle)}. The nodes offer: {node_offers(nodes)}. To run it: {_fixes(bundle, nodes)}"
        )


def _iso(ms: int | None) -> str | None:
    if not ms:
        return None
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


class RayBackend:
    """Submit, inspect, wait for, read the logs of and cancel jobs on a Ray cluster.

    Args:
        address: the cluster (GCS `host:port` or dashboard `http://host:port`); default `$RAY_ADDRESS`,
            else a local Ray started in this process.
        python: the interpreter that runs the driver on the cluster (default: this one, right when the
            cluster shares this machine or image).

    Raises:
        InvalidInputError: nothing answers at the address, or what answers is not a usable Ray head.
    """

    name = "ray"

    def __init__(self, address: str | None = None, python: str | None = None):
        from ray.job_submission import JobSubmissionClient

        source = "argument 'address'" if address else "RAY_ADDRESS"
        address = address or os.environ.get("RAY_ADDRESS")
        if address:
            check_reachable(address, source)
            _check_not_overridden(address)
        else:
            import ray

            context = ray.init(include_dashboard=True, dashboard_host="127.0.0.1", ignore_reinit_error=True)
            address = f"http://{context.dashboard_url}"
        try:
            self.client = JobSubmissionClient(address)
        except Exception as error:  # Ray raises ConnectionError, RpcError or ValueError, by address kind
            raise InvalidInputError(f"{source}: cannot use the Ray cluster at {address!r}: {error}") from error
        self.address = address
        self.python = python or sys.executable

    def submit(self, spec: JobSpec, job_id: str | None = None) -> JobRecord:
        """Submit `spec` as a Ray job; returns its PENDING record at once.

        Raises:
            InvalidInputError: the id is taken or invalid, or a replica fits no alive node (see
                `check_placeable`); nothing is queued then.
        """
        job_id = check_id(job_id or make_id("job"), "job_id")
        try:
            replica_count(spec)
        except ValueError as error:
            raise InvalidInputError(f"job {spec.name!r}: {error}") from error
        check_placeable(spec, self._alive_nodes(), self.address)
        entrypoint = shlex.join([self.python, "-m", "tradewind.cluster.ray_entry", job_id, spec.model_dump_json()])
        try:
            self.client.submit_job(
                entrypoint=entrypoint,
                submission_id=job_id,
                entrypoint_num_cpus=0,  # the driver only waits; the replicas hold the resources
                metadata={"name": spec.name, SPEC_KEY: spec.model_dump_json()},
                runtime_env={"env_vars": dict(spec.env)} if spec.env else None,
            )
        except RuntimeError as error:
            if "already exists" in str(error):
                raise InvalidInputError(f"argument 'job_id': a Ray job with id {job_id!r} exists already") from error
            raise
        return JobRecord(id=job_id, spec=spec, backend=self.name, log_path=spec.log_path)

    def _info(self, job_id: str):
        try:
            return self.client.get_job_info(check_id(job_id, "job_id"))
        except RuntimeError as error:
            raise NotFoundError(f"unknown job id {job_id!r} on the Ray cluster at {self.address}") from error

    def _text(self, job_id: str) -> str:
        return self.client.get_job_logs(job_id)

    def _record(self, info) -> JobRecord:
        metadata = info.metadata or {}
        if SPEC_KEY not in metadata:
            raise NotFoundError(f"Ray job {info.submission_id!r} was not submitted by Tradewind")
        spec = JobSpec.model_validate_json(metadata[SPEC_KEY])
        record = JobRecord(
            id=info.submission_id,
            spec=spec,
            backend=self.name,
            log_path=spec.log_path,
            submitted_at=_iso(info.start_time),
        )
        state = str(info.status.value if hasattr(info.status, "value") else info.status)
        text = self._text(info.submission_id) if state != "PENDING" else ""
        if spec.log_path and text:
            atomic_write_text(Path(spec.log_path), text)
        if state in ("PENDING", "RUNNING") and STARTED_LINE not in text:
            # Ray calls the job RUNNING while its driver waits for the placement group; we call it queued.
            record.status = JobStatus.PENDING
            record.reason = f"waiting for Ray to place {describe_bundles(*ray_bundles(spec))}"
            return record
        if state == "RUNNING":
            record.status, record.started_at = JobStatus.RUNNING, _iso(info.start_time)
            return record
        record.status = RAY_STATES.get(state, JobStatus.FAILED)
        record.started_at, record.ended_at = _iso(info.start_time), _iso(info.end_time)
        result = next((line for line in reversed(text.splitlines()) if line.startswith(RESULT_PREFIX)), None)
        if result is not None:
            outcome = json.loads(result[len(RESULT_PREFIX) :])
            record.status, record.reason, record.exit_code = (
                JobStatus(outcome["status"]),
                outcome["reason"],
                outcome["exit_code"],
            )
            record.attempts, record.failures = outcome["attempts"], outcome["failures"]
            record.preemptions = outcome["preemptions"]
        elif record.status is JobStatus.CANCELLED:
            record.reason = "cancelled on request"
        elif record.status is JobStatus.FAILED:
            record.reason = info.message or "the Ray job failed"
            record.exit_code = getattr(info, "driver_exit_code", None)
        return record

    def status(self, job_id: str) -> JobRecord:
        """The job's current record; raises `NotFoundError` for an unknown id."""
        return self._record(self._info(job_id))

    def wait(self, job_id: str, timeout: float, poll_interval: float = 0.25) -> JobRecord:
        """Wait until the job finishes or `timeout` seconds pass; return its record either way."""
        return wait_for_finish(lambda: self.status(job_id), timeout, poll_interval)

    def logs(self, job_id: str, offset: int = 0, limit: int = LOG_PAGE_BYTES, replica: int = 0) -> LogChunk:
        """Up to `limit` bytes of the job's log (driver and every replica, as Ray collects it) from `offset`."""
        record = self.status(job_id)
        data = self._text(job_id).encode()
        page = data[offset : offset + limit]
        return decode_log_page(job_id, page, offset=offset, size=len(data), finished=record.status.finished)

    def cancel(self, job_id: str) -> JobRecord:
        """Stop the Ray job; its driver cancels the replicas, whose process groups get SIGTERM."""
        record = self.status(job_id)
        if not record.status.finished:
            self.client.stop_job(job_id)
        return self.status(job_id)

    def list(self) -> list[JobRecord]:
        """Every Tradewind job on the cluster, newest first."""
        jobs = [info for info in self.client.list_jobs() if SPEC_KEY in (info.metadata or {})]
        jobs.sort(key=lambda info: info.start_time or 0, reverse=True)
        return [self._record(info) for info in jobs]

    def _alive_nodes(self) -> list[tuple[str, dict[str, float]]]:
        """Each alive node's label (its IP, marked when it is the head) and total resources."""
        from ray.util.state import list_nodes

        return [
            (f"{node.node_ip}{' (head)' if node.is_head_node else ''}", dict(node.resources_total or {}))
            for node in list_nodes(address=self.client.get_address(), detail=True)
            if str(node.state) == "ALIVE"
        ]

    def cluster_status(self) -> BackendStatus:
        """The cluster's resources (from its nodes), what Tradewind's active jobs hold, and those jobs."""
        capacity: dict[str, float] = {}
        for _, resources in self._alive_nodes():
            for key, value in resources.items():
                if not key.startswith("node:"):
                    capacity[key] = capacity.get(key, 0) + value
        active = [r for r in self.list() if not r.status.finished]
        used: dict[str, float] = {}
        for record in active:
            if record.status is JobStatus.RUNNING:
                for bundle in ray_bundles(record.spec)[0]:
                    for key, value in bundle.items():
                        used[key] = used.get(key, 0) + value
        return BackendStatus(
            name=self.name,
            detail=self.address,
            capacity=capacity,
            used=used,
            queued=[r for r in active if r.status is JobStatus.PENDING],
            running=[r for r in active if r.status is JobStatus.RUNNING],
        )
