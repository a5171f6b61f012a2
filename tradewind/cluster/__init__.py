"""Cluster: jobs and the backends that run them.

Owns the job model (`JobSpec`, `JobRecord`, `JobStatus`) and the local backend, where each job is a
process on this machine with its record persisted under the workspace. Later: Ray and the step
executor. May import only `tradewind.core`.
"""

from tradewind.cluster.jobs import JobRecord, JobSpec, JobStatus
from tradewind.cluster.local import LocalBackend

__all__ = ["JobRecord", "JobSpec", "JobStatus", "LocalBackend"]
