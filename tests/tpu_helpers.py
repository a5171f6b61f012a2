"""What the tests that compile for TPU slices share: they need libtpu (the `tpu` extra), which `.ci/run` installs."""

import importlib.util
import os

import pytest

# Without libtpu there is nothing to compile TPU programs with: skipped, except where CI says it must be there.
needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None and not os.environ.get("TRADEWIND_REQUIRE_TPU_COMPILE"),
    reason="libtpu is not installed (pip install -e '.[tpu]'): nothing to compile TPU programs with",
)
