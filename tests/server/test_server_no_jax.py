"""The MCP server never loads JAX: a real client lists the tools and calls every read-only one against the real
server, in a process that started clean, and that process has imported none of JAX, flax, optax or orbax."""

import json
import subprocess
import sys

# Each read-only tool's arguments; a run or sweep that does not exist answers an error, which is enough: the
# call goes through the tool and its imports all the same.
READ_ONLY_CALLS = {
    "cluster_status": {},
    "get_run": {"run_id": "missing"},
    "get_sweep": {"sweep_id": "missing"},
    "inspect_dataset": {"dataset_id": "builtin:tinyshakespeare"},
    "list_datasets": {},
    "list_runs": {},
    "read_metrics": {"run_id": "missing"},
    "tail_logs": {"run_id": "missing"},
    "wait_for_run": {"run_id": "missing"},
}

# Runs in its own interpreter, so that nothing the test session imported counts.
SERVER_SESSION = """
import json, sys
import anyio
from mcp import Client
from tradewind.server import build_server
from tradewind.tools import ToolContext

async def main():
    calls = json.loads(sys.argv[2])
    async with Client(build_server(ToolContext.open(sys.argv[1]))) as client:
        listed = (await client.list_tools()).tools
        read_only = sorted(tool.name for tool in listed if tool.annotations.read_only_hint)
        answered = {}
        for name in read_only:
            result = await client.call_tool(name, calls.get(name, {}))
            answered[name] = result.content[0].text if result.is_error else "ok"
    loaded = [name for name in ("jax", "flax", "optax", "orbax") if name in sys.modules]
    print(json.dumps({"listed": len(listed), "answered": answered, "loaded": loaded}))

anyio.run(main)
"""


def test_listing_the_tools_and_calling_every_read_only_one_loads_no_jax(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", SERVER_SESSION, str(tmp_path / "ws"), json.dumps(READ_ONLY_CALLS)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    session = json.loads(result.stdout.strip().splitlines()[-1])
    assert session["listed"] > len(READ_ONLY_CALLS)
    assert sorted(session["answered"]) == sorted(READ_ONLY_CALLS), "a new read-only tool needs its arguments here"
    for name, answer in session["answered"].items():  # each call reached its tool: no argument was refused
        assert answer == "ok" or "unknown run id 'missing'" in answer or "unknown sweep id 'missing'" in answer, name
    assert session["answered"]["inspect_dataset"] == session["answered"]["list_runs"] == "ok"
    assert session["loaded"] == []
