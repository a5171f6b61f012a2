"""The driver of one Tradewind job on Ray: reserves a placement group, runs the replicas, retries.

The Ray backend's launcher (`ray_launcher.py`) runs this module as a Ray driver, one per job. It
reserves one bundle per replica in a placement group (all or nothing: gang scheduling), finds the
coordinator address on replica 0's node, starts every replica as a Ray task that runs the job's
process, and waits. It applies the same policy as the local supervisor: a replica killed by a signal
or lost with its worker or node is a preemption, any other non-zero exit a failure; each is retried
up to its limit; the timeout fails the job. A group not placed within the spec's `pending_timeout_s`
(counted from when the driver starts waiting) is removed and the job fails with Ray's own account of
why: the GCS placement group scheduler's state for it and what the autoscaler said about it meanwhile.
Its outcome (`{"status": ..., "reason": ..., "exit_code": ..., "attempts": ...}`) ends its output, after
`[tradewind] result `, and a spare also writes it to `<folder>/<job id>.result`, which the backend reads
for the status: Ray copies the output of job-less workers into every driver's log, so the result line
need not be the log's last.

Commands (started by the launcher, `ray_launcher.py`, not typed by hand):
    python -m tradewind.cluster.ray_entry --spare <folder>              # joins the cluster, then runs the
                                                                        # `<job id> <JobSpec JSON>` line on stdin
    python -m tradewind.cluster.ray_entry <job id> '<JobSpec as JSON>'  # the same, cold, result printed only
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tradewind.cluster.jobs import (
    ATTEMPT_ENV,
    COORDINATOR_ENV,
    JOB_ID_ENV,
    PROCESS_COUNT_ENV,
    PROCESS_ID_ENV,
    JobSpec,
    JobStatus,
)
from tradewind.cluster.tpus import megascale_env
from tradewind.core import atomic_write_json

RESULT_PREFIX = "[tradewind] result "
STARTED_LINE = "[tradewind] replicas started"
LOG_FLUSH_S = 1.0
REPLICA_POLL_S = 0.1
PREEMPTION_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
# What the GCS placement group scheduler's states mean for a group still waiting (gcs.proto).
SCHEDULING_STATES = {
    "INFEASIBLE": "the alive nodes cannot hold them with this strategy even when idle; more or other nodes could",
    "NO_RESOURCES": "the nodes could hold them, but their resources are in use",
    "QUEUED": "the scheduler has not tried it yet",
}


def replica_count(spec: JobSpec) -> int:
    """Replicas of the job: one per TPU host for a TPU job, else `spec.replicas`."""
    tpu = spec.resources.tpu
    if tpu is None:
        return spec.replicas
    needed = tpu.hosts * spec.resources.slices
    if spec.replicas not in (1, needed):
        raise ValueError(
            f"a {spec.resources.accelerator} x{spec.resources.slices} job runs {needed} replicas, not {spec.replicas}"
        )
    return needed


def replica_env(spec: JobSpec, index: int, count: int, coordinator: str | None) -> dict[str, str]:
    """The gang variables of replica `index` of `count`: its process id and, in a gang, the coordinator's
    `host:port` and the process count; over several TPU slices also libtpu's multi-slice variables (replicas
    run slice by slice, as `ray_bundles` places them)."""
    env = {PROCESS_ID_ENV: str(index)}
    if coordinator is not None:
        env |= {COORDINATOR_ENV: coordinator, PROCESS_COUNT_ENV: str(count)}
    slices = spec.resources.slices
    if spec.resources.tpu is not None and slices > 1 and coordinator is not None:
        env |= megascale_env(coordinator.rsplit(":", 1)[0], slices, index // (count // slices))
    return env


def ray_bundles(spec: JobSpec) -> tuple[list[dict[str, float]], str]:
    """One Ray resource bundle per replica, and the placement strategy.

    CPUs, GPUs and memory map to Ray's `CPU`, `GPU` and `memory`. A TPU type maps to `TPU: <chips per
    host>` on every bundle and `TPU-<type>-head: 1` on the first bundle of each slice, the names Ray's
    TPU support gives the hosts of a slice; multi-host slices spread one bundle per node.
    """
    r = spec.resources
    base: dict[str, float] = {"CPU": max(r.cpus, 0.001)}
    if r.gpus:
        base["GPU"] = r.gpus
    if r.memory_gb:
        base["memory"] = r.memory_gb * 2**30
    tpu = r.tpu
    if tpu is None:
        return [dict(base) for _ in range(spec.replicas)], "PACK"
    bundles = []
    for _slice in range(r.slices):
        for host in range(tpu.hosts):
            bundle = {**base, "TPU": tpu.chips_per_host}
            if host == 0:
                bundle[f"TPU-{tpu.tpu_type}-head"] = 1
            bundles.append(bundle)
    return bundles, "STRICT_SPREAD" if len(bundles) > 1 else "PACK"


def format_resources(resources: Mapping[str, float]) -> str:
    """`{CPU: 1, TPU: 8, memory: 4 GiB}`: a bundle or a node's resources as messages show them.

    Ray's per-node `node:<ip>` markers and the object store say nothing about what a job may ask for.
    """
    shown = [
        f"{key}: {value / 2**30:.4g} GiB" if key == "memory" else f"{key}: {value:g}"
        for key, value in resources.items()
        if not key.startswith("node:") and key != "object_store_memory"
    ]
    return "{" + ", ".join(shown) + "}"


def describe_bundles(bundles: list[dict[str, float]], strategy: str) -> str:
    """E.g. `2 bundles {CPU: 1, TPU: 8, TPU-v5litepod-8-head: 1} x 2 (STRICT_SPREAD)`."""
    runs = [(bundle, len(list(same))) for bundle, same in itertools.groupby(bundles)]
    shapes = ", ".join(format_resources(bundle) + (f" x {count}" if count > 1 else "") for bundle, count in runs)
    return f"{len(bundles)} bundle{'s' if len(bundles) > 1 else ''} {shapes} ({strategy})"


class AutoscalerEvents:
    """What Ray's autoscaler says about one placement group while the driver waits for it.

    The autoscaler sends its events ("No available node types can fulfill resource request {...}",
    or for a gang on autoscaler v2 "... placement group requests (detail=<group id>...)") to every
    driver's log stream; `add` keeps the lines that name the group or one of its bundles.
    """

    def __init__(self, group_id: str, bundles: list[dict[str, float]]):
        self.group_id = group_id
        self.shapes = [{key: float(value) for key, value in bundle.items()} for bundle in bundles]
        self.lines: list[str] = []

    def add(self, lines: Iterable[str]) -> None:
        for line in lines:
            if self._about_us(line) and line not in self.lines:
                self.lines.append(line)

    def _about_us(self, line: str) -> bool:
        if self.group_id in line:
            return True
        for text in re.findall(r"\{[^{}]*\}", line):
            with contextlib.suppress(ValueError, SyntaxError):
                if ast.literal_eval(text) in self.shapes:
                    return True
        return False


@contextlib.contextmanager
def _listening(events: AutoscalerEvents) -> Iterator[None]:
    """Hand the autoscaler's events from this driver's log stream to `events` meanwhile.

    Ray offers that stream only through private names; without them we lose the autoscaler's words,
    not the wait (the scheduler's state still explains it).
    """
    try:
        from ray._private.worker import filter_autoscaler_events, global_worker_stdstream_dispatcher
    except ImportError:
        yield
        return

    def handle(data: dict[str, Any]) -> None:
        if data.get("pid") == "autoscaler":
            events.add(filter_autoscaler_events(data.get("lines", [])))

    global_worker_stdstream_dispatcher.add_handler("tradewind_autoscaler_events", handle)
    try:
        yield
    finally:
        global_worker_stdstream_dispatcher.remove_handler("tradewind_autoscaler_events")


def _await_placement(group: Any, spec: JobSpec, bundles: list[dict[str, float]], strategy: str) -> str | None:
    """Wait until Ray has reserved every bundle (the gang: nothing starts before), at most the spec's
    `pending_timeout_s`; then remove the group and return why it was not placed, in Ray's words."""
    import ray
    from ray.util import placement_group_table
    from ray.util.placement_group import remove_placement_group

    events = AutoscalerEvents(group.id.hex(), bundles)
    with _listening(events):
        ready, _ = ray.wait([group.ready()], timeout=spec.pending_timeout_s)
    if ready:
        return None
    state = placement_group_table(group).get("stats", {}).get("scheduling_state", "UNKNOWN")
    remove_placement_group(group)
    why = f"it waits for {describe_bundles(bundles, strategy)}, which Ray's placement group scheduler reports {state}"
    if state in SCHEDULING_STATES:
        why += f": {SCHEDULING_STATES[state]}"
    if events.lines:
        why += ". Ray's autoscaler: " + " ".join(events.lines)
    return f"not scheduled within pending_timeout_s={spec.pending_timeout_s:g} s: {why}"


def _run_replica(argv: list[str], env: dict[str, str], cwd: str | None) -> int:
    """Runs on a Ray worker: the job's process, whose output goes to the worker's (and so the job's) log."""
    # ray.cancel interrupts the task as a SIGINT would, which does nothing where SIGINT is ignored: in
    # the workers of a head started in the background, as `.ci/run` does. The worker is this job's own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    process = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd, start_new_session=True)
    try:
        # The interrupt is raised between bytecodes, never inside a blocking wait(): poll.
        while (code := process.poll()) is None:
            time.sleep(REPLICA_POLL_S)
        return code
    except BaseException:  # ray.cancel raises KeyboardInterrupt here: take the process group down with us
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        raise


def _node_address() -> str:
    """Runs on replica 0's node: an address there with a free port for the gang's coordinator.

    `TRADEWIND_COORDINATOR_HOST` overrides the node's IP, e.g. 127.0.0.1 for a one-machine Ray in tests.
    """
    import ray

    host = os.environ.get("TRADEWIND_COORDINATOR_HOST") or ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind((host if host == "127.0.0.1" else "", 0))
        port = s.getsockname()[1]
    return f"{host}:{port}"


def _result(status: JobStatus, reason: str | None, exit_code: int | None, **counts: Any) -> dict[str, Any]:
    return {"status": status.value, "reason": reason, "exit_code": exit_code, **counts}


def connect() -> None:
    """Join the cluster at `$RAY_ADDRESS` as a driver whose log shows its replicas' output."""
    import ray

    os.environ["RAY_COLOR_PREFIX"] = "0"  # plain "(_run_replica pid=N)" prefixes in the job's log
    ray.init(log_to_driver=True)


def drive(job_id: str, spec: JobSpec, result_path: Path | None = None) -> int:
    """Run the job to a terminal state on the Ray cluster this process joined (`connect`); print its outcome
    and write it to `result_path`; returns the exit code."""
    outcome = _run(job_id, spec)
    time.sleep(LOG_FLUSH_S)  # replica output reaches the driver through Ray's log monitor a moment late
    print(RESULT_PREFIX + json.dumps(outcome), flush=True)
    if result_path is not None:
        atomic_write_json(result_path, outcome)
    return 0 if outcome["status"] == JobStatus.SUCCEEDED.value else 1


def _run(job_id: str, spec: JobSpec) -> dict[str, Any]:
    """The job's outcome: its replicas placed as a gang, run, and retried by its policy."""
    import ray
    from ray.exceptions import NodeDiedError, OwnerDiedError, TaskCancelledError, WorkerCrashedError
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundles, strategy = ray_bundles(spec)
    count = replica_count(spec)
    group = placement_group(bundles, strategy=strategy, name=f"tradewind-{job_id}")
    unplaced = _await_placement(group, spec, bundles, strategy)
    if unplaced is not None:
        return _result(JobStatus.FAILED, unplaced, None, attempts=0, failures=0, preemptions=0)
    run_replica = ray.remote(max_retries=0)(_run_replica)
    stopping = {"cancelled": False}
    refs: list[Any] = []

    def on_term(signum: int, frame: Any) -> None:  # `cancel` (the launcher's stop): end the replicas first
        stopping["cancelled"] = True
        for ref in refs:
            ray.cancel(ref)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    failures = preemptions = attempts = 0
    while True:
        attempts += 1
        counts = {"attempts": attempts, "failures": failures, "preemptions": preemptions}
        at = {i: PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i) for i in range(count)}
        env = {**spec.env, JOB_ID_ENV: job_id, ATTEMPT_ENV: str(attempts)}
        address = None
        if count > 1:
            address = ray.get(ray.remote(num_cpus=0)(_node_address).options(scheduling_strategy=at[0]).remote())
        refs[:] = []
        for i in range(count):
            options = {k: v for k, v in bundles[i].items() if k not in ("CPU", "GPU", "memory")}
            refs.append(
                run_replica.options(
                    num_cpus=bundles[i]["CPU"],
                    num_gpus=bundles[i].get("GPU", 0),
                    memory=bundles[i].get("memory"),
                    resources=options or None,
                    scheduling_strategy=at[i],
                ).remote(spec.argv(python=sys.executable), env | replica_env(spec, i, count, address), spec.cwd)
            )
        print(f"{STARTED_LINE} (attempt {attempts}, {count} replicas)", flush=True)
        deadline = time.monotonic() + spec.timeout_s if spec.timeout_s else None
        outcome, code, reason = "succeeded", 0, None
        pending = list(refs)
        try:
            while pending:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, pending = ray.wait(pending, num_returns=1, timeout=timeout)
                if not done:
                    outcome, reason = "timed_out", f"timed out after {spec.timeout_s:g} s (timeout_s) and was killed"
                    break
                try:
                    code = ray.get(done[0])
                except (WorkerCrashedError, NodeDiedError, OwnerDiedError) as error:
                    outcome, code, reason = "preempted", None, f"lost its Ray worker or node: {type(error).__name__}"
                    break
                if code != 0:
                    preempted = code < 0 and signal.Signals(-code) in PREEMPTION_SIGNALS
                    outcome = "preempted" if preempted else "failed"
                    reason = (
                        f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                    )
                    break
        except (KeyboardInterrupt, TaskCancelledError):
            outcome, reason = "cancelled", "cancelled on request"
        for ref in pending:  # one replica ended the attempt: the rest of the gang cannot go on
            ray.cancel(ref)
        with contextlib.suppress(Exception):
            ray.wait(pending, num_returns=len(pending), timeout=20)
        counts = {"attempts": attempts, "failures": failures, "preemptions": preemptions}
        if stopping["cancelled"] or outcome == "cancelled":
            return _result(JobStatus.CANCELLED, "cancelled on request", None, **counts)
        if outcome == "succeeded":
            return _result(JobStatus.SUCCEEDED, None, 0, **counts)
        if outcome == "timed_out":
            return _result(JobStatus.FAILED, reason, None, **counts)
        if outcome == "preempted":
            preemptions += 1
            if preemptions > spec.max_retries_preemption:
                return _result(JobStatus.PREEMPTED, reason, code, **{**counts, "preemptions": preemptions})
        else:
            failures += 1
            if failures > spec.max_retries_failure:
                return _result(JobStatus.FAILED, reason, code, **{**counts, "failures": failures})
        print(f"[tradewind] attempt {attempts + 1} of job {job_id} after: {reason}", flush=True)


def main(argv: list[str]) -> int:
    """`--spare <folder>`: join the cluster first, then run the job named on stdin (none at end of input)."""
    connect()
    if argv[0] != "--spare":
        return drive(argv[0], JobSpec.model_validate_json(argv[1]))
    line = sys.stdin.readline()
    if not line:
        return 0
    job_id, spec_json = line.split(" ", 1)
    return drive(job_id, JobSpec.model_validate_json(spec_json), Path(argv[1]) / f"{job_id}.result")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
