"""What the tests that compile for TPU slices share: they need libtpu (the `tpu` extra), which `.ci/run` installs."""

import contextlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

# Without libtpu there is nothing to compile TPU programs with: skipped, except where CI says it must be there.
needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None and not os.environ.get("TRADEWIND_REQUIRE_TPU_COMPILE"),
    reason="libtpu is not installed (pip install -e '.[tpu]'): nothing to compile TPU programs with",
)


@contextlib.contextmanager
def holding_open(path: str) -> Iterator[subprocess.Popen[str]]:
    """A process that holds `path` open (created if missing) until the block ends, as libtpu holds its lock file."""
    holder = subprocess.Popen(
        [sys.executable, "-c", f"f = open({path!r}, 'a'); print('held', flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.communicate("\n")
