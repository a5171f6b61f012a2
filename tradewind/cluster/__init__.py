"""Cluster: jobs and the backends that run them.

Owns the job model (`JobSpec`, `JobRecord`, `JobStatus`), the local backend, where each job is a
process on this machine with its record persisted under the workspace, and the task runners that run
many small tasks (data shards) in parallel. Later: Ray and the step
executor. May import only `tradewind.core`.
"""

from tradewind.cluster.jobs import JobRecord, JobSpec, JobStatus
from tradewind.cluster.local import LocalBackend
from tradewind.cluster.tasks import LocalTaskRunner, TaskRunner, get_task_runner

__all__ = ["JobRecord", "JobSpec", "JobStatus", "LocalBackend", "LocalTaskRunner", "TaskRunner", "get_task_runner"]
