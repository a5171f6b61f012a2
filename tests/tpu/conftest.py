"""The chip tests' process: JAX here stays on the CPU (tests/conftest.py), and on a TPU host the runs it starts
must honour libtpu's lock, which the suite's compile-only setting (`ALLOW_MULTIPLE_LIBTPU_LOAD`) would lift for
them too; compile jobs set it in their own environment (`TPU_COMPILE_ENV`). Elsewhere (CI) nothing changes: the
compile tests of this process rely on it."""

import os
from pathlib import Path

import pytest

from tradewind.cluster.tpu_host import host_tpu, lock_holders
from tradewind.cluster.warm import release

if host_tpu() is not None:
    os.environ.pop("ALLOW_MULTIPLE_LIBTPU_LOAD", None)


@pytest.fixture(autouse=True)
def free_chip():
    """Each test starts with the chip free: the warm processes a test's runs left keep it (tradewind.cluster.warm)."""
    yield
    for _, command in lock_holders():
        if "tradewind.cluster.warm --serve " in command:
            release(Path(command.split(" --serve ", 1)[1]))
