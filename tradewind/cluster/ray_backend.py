"""The Ray backend: the local backend's API, with jobs run by drivers on a Ray cluster.

Each Tradewind job is one Ray driver, `python -m tradewind.cluster.ray_entry`, that gang-schedules the
replicas in a placement group and applies the retry and timeout policy (see `ray_entry.py`). The
cluster's launcher, a detached actor on the head (`ray_launcher.py`), starts the drivers: it keeps one
warm, so a submission is one actor call and the job runs within a fraction of a second (Ray's Jobs API
starts a supervisor actor and a fresh driver per job: about 3 s). The launcher keeps each job's spec,
driver state and log on the head, so any process that joins the cluster finds, lists and cancels every
job, and jobs outlive the process that submitted them. Logs (replica output included) are read by byte
offset and mirrored into the spec's `log_path` when it has one.

`submit` refuses, before anything is queued, a job with a replica whose bundle fits no alive node
(a resource no node has, or more of it than the largest has); whether the bundles fit *together*
(a gang spread over nodes) is Ray's to decide, bounded by the spec's `pending_timeout_s`.

The address is the `address` argument, else `$RAY_ADDRESS` (the head's GCS address, `host:6379`, or
`auto`); with neither, a local Ray starts inside this process. A named address that does not answer is
refused within seconds. The backend joins the cluster as a driver (without its workers' logs); Ray is
imported only when a `RayBackend` is made.

Example:
    backend = RayBackend("127.0.0.1:6379")
    job = backend.submit(JobSpec(name="hi", command=["echo", "hi"], resources=Resources(accelerator="tpu-v5litepod-8")))
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any
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
    describe_bundles,
    format_resources,
    ray_bundles,
    replica_count,
)
from tradewind.cluster.ray_launcher import LAUNCHER_NAME, NAMESPACE, PROTOCOL, Launcher
from tradewind.core import InvalidInputError, NotFoundError, atomic_write_bytes, check_id, make_id

PROBE_TIMEOUT_S = 3.0  # Ray's own client retries an unreachable GCS for about 40 s
TPU_HEAD = re.compile(r"TPU-(.+)-head")  # the resource Ray's TPU support gives a slice's first host


def check_reachable(address: str, source: str = "argument 'address'") -> None:
    """Refuse within seconds an address where nothing answers, before Ray's client retries for ~40 s.

    Raises:
        InvalidInputError: nothing accepts a connection at the address's host and port; `source` names
            where the address came from.
    """
    if address == "auto":
        return  # Ray finds the head this node belongs to itself
    parsed = urlsplit(f"gcs://{address}")
    try:
        port = parsed.port or 6379
        socket.create_connection((parsed.hostname or "", port), timeout=PROBE_TIMEOUT_S).close()
    except (OSError, ValueError) as error:
        raise InvalidInputError(
            f"{source}: no Ray cluster answers at {address!r} ({error}); give a running head's address "
            "(host:6379), or start one with `ray start --head`"
        ) from error


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
        asked = f"{r.accelerator} x {r.slices} slice(s), " if r.tpu else ""
        raise InvalidInputError(
            f"job {spec.name!r} cannot run on the Ray cluster at {cluster}: it asks for {asked}"
            f"{describe_bundles(bundles, strategy)}, and no alive node can hold bundle {index} "
            f"{format_resources(bundle)}. The nodes offer: {node_offers(nodes)}. To run it: {_fixes(bundle, nodes)}"
        )


class RayBackend:
    """Submit, inspect, wait for, read the logs of and cancel jobs on a Ray cluster.

    Args:
        address: the cluster's GCS address (`host:port`, or `auto`); default `$RAY_ADDRESS`, else a local
            Ray started in this process. This process joins the cluster (once: a Ray already joined here
            is kept).
        python: the interpreter that runs the drivers on the cluster (default: this one, right when the
            cluster shares this machine or image).
        read_only: only read: warm no spare driver, and leave each job's `spec.log_path` as it is (reads
            otherwise mirror the log there); `submit` and `cancel` are refused.

    Raises:
        InvalidInputError: nothing answers at the address, or it is not a GCS address of a usable Ray head.
    """

    name = "ray"
    on_this_machine = False
    default_pending_timeout_s: float | None = 1800.0  # then a gang Ray cannot place (no such slice) fails

    def __init__(self, address: str | None = None, python: str | None = None, read_only: bool = False):
        import ray

        source = "argument 'address'" if address else "RAY_ADDRESS"
        address = address or os.environ.get("RAY_ADDRESS")
        if address and "://" in address:
            raise InvalidInputError(
                f"{source}: {address!r} is a URL; give the Ray head's GCS address (host:6379): Tradewind's "
                "launcher is a Ray actor, which only a process joined to the cluster can reach"
            )
        if address:
            check_reachable(address, source)
        try:
            if not ray.is_initialized():
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            self.launcher: Any = (
                ray.remote(Launcher)
                .options(
                    name=LAUNCHER_NAME,
                    namespace=NAMESPACE,
                    lifetime="detached",
                    get_if_exists=True,
                    num_cpus=0,
                    resources={"node:__internal_head__": 0.001},  # its folder lives on the head
                    max_restarts=-1,
                )
                .remote()
            )
            protocol = ray.get(self.launcher.ping.remote())
        except Exception as error:  # Ray raises ConnectionError, RpcError or ValueError, by address kind
            raise InvalidInputError(f"{source}: cannot use the Ray cluster at {address!r}: {error}") from error
        if protocol != PROTOCOL:  # a detached launcher outlives upgrades of Tradewind
            raise InvalidInputError(
                f"{source}: the Tradewind launcher on the Ray cluster at {address!r} was started by another "
                f"version of Tradewind (protocol {protocol!r}, this one {PROTOCOL}); once its jobs ended, end it "
                f"with `ray.kill(ray.get_actor({LAUNCHER_NAME!r}, namespace={NAMESPACE!r}))` or restart the cluster"
            )
        self.address = address or ray.get_runtime_context().gcs_address
        self.python = python or sys.executable
        self.read_only = read_only
        if not read_only:
            self.launcher.warm.remote(self.python)

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self.launcher, method).remote(*args))

    def submit(self, spec: JobSpec, job_id: str | None = None) -> JobRecord:
        """Hand `spec` to the cluster's launcher; returns its PENDING record at once.

        Raises:
            InvalidInputError: the id is taken or invalid, or a replica fits no alive node (see
                `check_placeable`); nothing is queued then.
        """
        self._check_writable("submit a job")
        job_id = check_id(job_id or make_id("job"), "job_id")
        try:
            replica_count(spec)
        except ValueError as error:
            raise InvalidInputError(f"job {spec.name!r}: {error}") from error
        check_placeable(spec, self._alive_nodes(), self.address)
        if not self._call("submit", job_id, spec.model_dump_json(), self.python):
            raise InvalidInputError(f"argument 'job_id': a Ray job with id {job_id!r} exists already")
        return JobRecord(id=job_id, spec=spec, backend=self.name, log_path=spec.log_path)

    def _check_writable(self, action: str) -> None:
        if self.read_only:
            raise InvalidInputError(
                f"cannot {action}: the Ray backend at {self.address} was opened read-only "
                "(a server started with --read-only only observes)"
            )

    def _view(self, job_id: str, offset: int = 0, limit: int | None = 0) -> dict[str, Any]:
        view = self._call("view", check_id(job_id, "job_id"), offset, limit)
        if view is None:
            raise NotFoundError(f"unknown job id {job_id!r} on the Ray cluster at {self.address}")
        return view

    def _record(self, view: dict[str, Any]) -> JobRecord:
        """The record that the launcher's view of a job (state file and log) says."""
        spec = JobSpec.model_validate_json(view["spec"])
        record = JobRecord(
            id=view["id"], spec=spec, backend=self.name, log_path=spec.log_path, submitted_at=view["submitted_at"]
        )
        ended = "ended_at" in view
        if not ended and not view["started"]:
            record.reason = f"waiting for Ray to place {describe_bundles(*ray_bundles(spec))}"
            return record
        record.status, record.started_at = JobStatus.RUNNING, view["submitted_at"]
        if not ended:
            return record
        record.ended_at = view["ended_at"]
        if view["result"] is not None:
            outcome = json.loads(view["result"])
            record.status, record.reason, record.exit_code = (
                JobStatus(outcome["status"]),
                outcome["reason"],
                outcome["exit_code"],
            )
            record.attempts, record.failures = outcome["attempts"], outcome["failures"]
            record.preemptions = outcome["preemptions"]
        elif view.get("stopped"):
            record.status, record.reason = JobStatus.CANCELLED, "cancelled on request"
        else:
            code = view.get("exit_code")
            record.status, record.exit_code = JobStatus.FAILED, code
            record.reason = f"the job's Ray driver ended (exit code {code}) before reporting a result; see its log"
        return record

    def status(self, job_id: str) -> JobRecord:
        """The job's current record, its log mirrored to `spec.log_path` (unless read-only); raises `NotFoundError`
        for an unknown id."""
        view = self._view(job_id)
        record = self._record(view)
        if record.spec.log_path and not self.read_only:
            self._mirror(job_id, Path(record.spec.log_path), view["size"])
        return record

    def _mirror(self, job_id: str, path: Path, size: int) -> None:
        """Bring the local copy of the job's log at `path` up to `size` bytes, fetching only what it lacks."""
        have = path.read_bytes() if path.exists() else b""
        if len(have) < size:
            new = self._view(job_id, offset=len(have), limit=size - len(have))["log"]
            atomic_write_bytes(path, have + new)

    def wait(self, job_id: str, timeout: float, poll_interval: float = 0.25) -> JobRecord:
        """Wait until the job finishes or `timeout` seconds pass; return its record either way."""
        return wait_for_finish(lambda: self.status(job_id), timeout, poll_interval)

    def logs(self, job_id: str, offset: int = 0, limit: int = LOG_PAGE_BYTES, replica: int = 0) -> LogChunk:
        """Up to `limit` bytes of the job's log (driver and every replica, as Ray collects it) from `offset`."""
        view = self._view(job_id, offset, limit)
        record = self._record(view)
        return decode_log_page(job_id, view["log"], offset=offset, size=view["size"], finished=record.status.finished)

    def cancel(self, job_id: str) -> JobRecord:
        """Stop the job's driver; it cancels the replicas, whose process groups get SIGTERM."""
        self._check_writable("cancel a job")
        self._view(job_id)
        self._call("stop", job_id)
        return self.status(job_id)

    def list(self) -> list[JobRecord]:
        """Every Tradewind job on the cluster, newest first."""
        views = sorted(self._call("views"), key=lambda view: view["submitted_at"], reverse=True)
        return [self._record(view) for view in views]

    def _alive_nodes(self) -> list[tuple[str, dict[str, float]]]:
        """Each alive node's label (its IP, marked when it is the head) and total resources."""
        import ray

        return [
            (
                f"{node['NodeManagerAddress']}{' (head)' if 'node:__internal_head__' in node['Resources'] else ''}",
                dict(node["Resources"]),
            )
            for node in ray.nodes()
            if node["Alive"]
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
