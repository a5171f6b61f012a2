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

# 1.2 billion parameters, most in a 2**20-token embedding: Adam's state alone (16 bytes a parameter) passes one
# chip's 16 GiB, yet it compiles in half the time of a model as wide in its blocks (19.6 s against 40.6 s sharded
# over a v5litepod-8, docs/reports/benchmarks.md).
WIDE_EMBEDDING = {"d_model": 1088, "n_layers": 1, "n_heads": 17, "vocab_size": 2**20, "max_seq_len": 64}


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
