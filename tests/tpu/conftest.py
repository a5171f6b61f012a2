"""The chip tests' process: JAX here stays on the CPU (tests/conftest.py), and the runs it starts must honour
libtpu's lock, which the suite's compile-only setting (`ALLOW_MULTIPLE_LIBTPU_LOAD`) would lift for them too;
compile jobs set it in their own environment (`TPU_COMPILE_ENV`)."""

import os

os.environ.pop("ALLOW_MULTIPLE_LIBTPU_LOAD", None)
