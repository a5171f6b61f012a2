"""The server fixture the MCP tests share: the real server on the suite's workspace."""

import pytest

from tradewind.server import build_server


@pytest.fixture
def server(ctx):
    return build_server(ctx)
