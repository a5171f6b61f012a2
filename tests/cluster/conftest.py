"""The local backend the cluster tests submit to, cancelling what a failed test left running."""

import pytest

from tradewind.cluster.local import LocalBackend


@pytest.fixture
def backend(tmp_path):
    backend = LocalBackend(tmp_path / "jobs", cpus=2, memory_gb=4)
    yield backend
    for record in backend.list():  # a failed test must not leave its jobs running after pytest
        if not record.status.finished:
            backend.cancel(record.id)
