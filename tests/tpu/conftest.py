"""The chip tests' process: JAX here stays on the CPU (tests/conftest.py), and on a TPU host the runs it starts
must honour libtpu's lock, which the suite's compile-only setting (`ALLOW_MULTIPLE_LIBTPU_LOAD`) would lift for
them too; compile jobs set it in their own environment (`TPU_COMPILE_ENV`). Elsewhere (CI) nothing changes: the
compile tests of this process rely on it."""

import os

from tradewind.cluster.tpu_host import host_tpu

if host_tpu() is not None:
    os.environ.pop("ALLOW_MULTIPLE_LIBTPU_LOAD", None)
