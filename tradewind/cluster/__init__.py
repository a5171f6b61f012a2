"""Cluster: jobs, the backends that run them, and the step executor.

Owns the job model (`JobSpec`, `Resources`, `JobRecord`, `JobStatus`), where a run's processes go
(`Placement`, with its parsed `Accelerator`), the local backend (processes
on this machine admitted by a resource ledger, state in SQLite under the workspace), the Ray backend
(`RayBackend`, the `ray` extra), the task runners that run many small tasks (data shards) in
parallel, and the step executor that caches pipeline steps under content-addressed paths. May import
only `tradewind.core`. Names load on first use (PEP 562, through `tradewind.core.lazy_getattr`), so
`tradewind --help` can register the cluster commands without loading pydantic, and Ray loads only when
a Ray backend or runner is used. Code outside this layer gets a backend from `get_backend` and uses it
through the `Backend` protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tradewind.core import lazy_getattr

if TYPE_CHECKING:
    from tradewind.cluster.backends import Backend, get_backend
    from tradewind.cluster.executor import (
        Executor,
        PlannedStep,
        Step,
        StepBusyError,
        StepFailedError,
        load_pipeline,
    )
    from tradewind.cluster.jobs import (
        BackendStatus,
        Callback,
        DistributedEnv,
        JobRecord,
        JobSpec,
        JobStatus,
        LogChunk,
        distributed_env,
    )
    from tradewind.cluster.ledger import Capacity
    from tradewind.cluster.local import LocalBackend
    from tradewind.cluster.pipeline import PIPELINE_CALLABLE, PipelineJob, execute_pipeline
    from tradewind.cluster.placement import (
        Accelerator,
        AcceleratorName,
        BackendName,
        Placement,
        Resources,
        parse_accelerator,
    )
    from tradewind.cluster.ray_backend import RayBackend
    from tradewind.cluster.tasks import LocalTaskRunner, RayTaskRunner, TaskRunner, get_task_runner
    from tradewind.cluster.tpus import TPU_COMPILE_ENV, TPU_TYPES, TpuChip, TpuSlice, tpu_slice, tpu_topology

__getattr__ = lazy_getattr(
    __name__,
    {
        "PIPELINE_CALLABLE": "tradewind.cluster.pipeline",
        "PipelineJob": "tradewind.cluster.pipeline",
        "execute_pipeline": "tradewind.cluster.pipeline",
        "Accelerator": "tradewind.cluster.placement",
        "AcceleratorName": "tradewind.cluster.placement",
        "BackendName": "tradewind.cluster.placement",
        "Placement": "tradewind.cluster.placement",
        "TPU_TYPES": "tradewind.cluster.tpus",
        "TPU_COMPILE_ENV": "tradewind.cluster.tpus",
        "TpuChip": "tradewind.cluster.tpus",
        "TpuSlice": "tradewind.cluster.tpus",
        "tpu_slice": "tradewind.cluster.tpus",
        "parse_accelerator": "tradewind.cluster.placement",
        "Backend": "tradewind.cluster.backends",
        "get_backend": "tradewind.cluster.backends",
        "BackendStatus": "tradewind.cluster.jobs",
        "Callback": "tradewind.cluster.jobs",
        "Capacity": "tradewind.cluster.ledger",
        "DistributedEnv": "tradewind.cluster.jobs",
        "Executor": "tradewind.cluster.executor",
        "JobRecord": "tradewind.cluster.jobs",
        "JobSpec": "tradewind.cluster.jobs",
        "JobStatus": "tradewind.cluster.jobs",
        "LocalBackend": "tradewind.cluster.local",
        "LocalTaskRunner": "tradewind.cluster.tasks",
        "LogChunk": "tradewind.cluster.jobs",
        "PlannedStep": "tradewind.cluster.executor",
        "RayBackend": "tradewind.cluster.ray_backend",
        "RayTaskRunner": "tradewind.cluster.tasks",
        "Resources": "tradewind.cluster.placement",
        "Step": "tradewind.cluster.executor",
        "StepBusyError": "tradewind.cluster.executor",
        "StepFailedError": "tradewind.cluster.executor",
        "TaskRunner": "tradewind.cluster.tasks",
        "distributed_env": "tradewind.cluster.jobs",
        "get_task_runner": "tradewind.cluster.tasks",
        "load_pipeline": "tradewind.cluster.executor",
        "tpu_topology": "tradewind.cluster.tpus",
    },
)

__all__ = [
    "PIPELINE_CALLABLE",
    "PipelineJob",
    "execute_pipeline",
    "TPU_COMPILE_ENV",
    "TPU_TYPES",
    "TpuChip",
    "TpuSlice",
    "Accelerator",
    "AcceleratorName",
    "BackendName",
    "Placement",
    "Backend",
    "BackendStatus",
    "Callback",
    "Capacity",
    "DistributedEnv",
    "Executor",
    "JobRecord",
    "JobSpec",
    "JobStatus",
    "LocalBackend",
    "LocalTaskRunner",
    "LogChunk",
    "PlannedStep",
    "RayBackend",
    "RayTaskRunner",
    "Resources",
    "Step",
    "StepBusyError",
    "StepFailedError",
    "TaskRunner",
    "distributed_env",
    "get_backend",
    "get_task_runner",
    "load_pipeline",
    "parse_accelerator",
    "tpu_slice",
    "tpu_topology",
]
