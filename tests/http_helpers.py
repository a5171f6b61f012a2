"""Starting `tradewind serve --transport http` as a subprocess on a free loopback port, for the HTTP tests."""

import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TOKEN_FILE = ".tradewind-token"


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    workspace: Path
    stderr_lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    def token(self) -> str:
        return (self.workspace / TOKEN_FILE).read_text().strip()


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_command(workspace: Path, port: int, *extra: str) -> list[str]:
    serve = [sys.executable, "-m", "tradewind", "serve", "--workspace", str(workspace)]
    return [*serve, "--transport", "http", "--port", str(port), *extra]


def server_env(token: str | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "TRADEWIND_TOKEN"}
    if token is not None:
        env["TRADEWIND_TOKEN"] = token
    return env


@contextmanager
def running_server(workspace: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    """Start the server and wait (30 s deadline) until uvicorn says it is listening; stop it afterwards."""
    port = free_loopback_port()
    process = subprocess.Popen(
        serve_command(workspace, port, *extra),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env if env is not None else server_env(),
    )
    server = Server(process, port, workspace)
    lines: queue.Queue[str | None] = queue.Queue()

    def drain() -> None:  # keeps the pipe empty for as long as the server lives
        for line in process.stderr:
            server.stderr_lines.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"server did not start listening within 30 s:\n{server.stderr}")
            if line is None:
                pytest.fail(f"server exited with {process.wait()} before listening:\n{server.stderr}")
            if "Uvicorn running on" in line:
                break
        yield server
    finally:
        process.terminate()
        process.wait(timeout=30)
