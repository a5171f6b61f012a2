import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "ray: needs a Ray head at $RAY_ADDRESS (`.ci/run` starts one)")


@pytest.fixture(scope="session")
def ray_address():
    """The Ray head `.ci/run` starts (with fake TPU resources: `TPU: 8`, `TPU-v5litepod-8-head: 1`)."""
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        if os.environ.get("TRADEWIND_REQUIRE_RAY"):
            pytest.fail("RAY_ADDRESS is unset but TRADEWIND_REQUIRE_RAY is set: .ci/run should have started a Ray head")
        pytest.skip("RAY_ADDRESS is unset: start a head as .ci/run does to run the Ray tests")
    return address
