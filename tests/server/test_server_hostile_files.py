"""Hostile files through a real MCP client (issue 38, item 2): a FIFO, a device or a hard link where the server
reads a file on a caller's behalf is refused at once, and 100 such calls leave no thread and no open file behind.
The refusals themselves, call by call, are in tests/tools/test_tools_confinement.py."""

import contextlib
import os
import shutil
import stat
import threading
import time

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tradewind.server import build_server
from tradewind.tools import ToolContext

pytestmark = pytest.mark.anyio
BOUND_S = 5.0  # each refusal answers well within this: no read of a special file is ever started


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def hostile(tmp_path, small_corpus) -> ToolContext:
    """A workspace holding, beside a real corpus, a FIFO, a /dev/zero-like device (where root may make one), a
    folder of them, and a hard link to a file outside."""
    ctx = ToolContext.open(tmp_path / "ws")
    root = ctx.workspace.root
    shutil.copy(small_corpus, root / "corpus.txt")
    os.mkfifo(root / "pipe.txt")
    (root / "specials").mkdir()
    os.mkfifo(root / "specials" / "pipe.txt")
    secret = tmp_path / "outside.txt"
    secret.write_text("not yours\n" * 10)
    (root / "linked.txt").hardlink_to(secret)
    with contextlib.suppress(PermissionError):  # not root: the FIFOs and the hard link still make calls hostile
        os.mknod(root / "zero.txt", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    return ctx


def hostile_calls(root) -> list[tuple[str, dict]]:
    inputs = ["pipe.txt", "specials", "specials/*.txt", "linked.txt"]
    inputs += ["zero.txt"] if (root / "zero.txt").exists() else []
    calls = [("tokenize_dataset", {"input": value}) for value in inputs]
    calls += [("train_tokenizer", {"input": value, "vocab_size": 300}) for value in inputs]
    tokenizers = [value for value in inputs if "*" not in value]  # a tokenizer is a file or a folder, not a glob
    calls += [("tokenize_dataset", {"input": "corpus.txt", "tokenizer": value}) for value in tokenizers]
    return calls


async def test_a_hundred_hostile_calls_end_within_their_bound_and_leave_no_thread_or_open_file(hostile):
    calls = hostile_calls(hostile.workspace.root)
    async with Client(build_server(hostile)) as client:
        for name, arguments in calls:  # once each first: the worker threads the server keeps are started
            await answer(client, name, arguments)
        threads, files = threading.active_count(), open_files()
        for index in range(100):
            name, arguments = calls[index % len(calls)]
            started = time.monotonic()
            text = await answer(client, name, arguments)
            assert time.monotonic() - started < BOUND_S, (name, arguments)
            assert "is refused" in text or "not read:" in text, (name, arguments, text[:500])
            assert "not yours" not in text
        assert threading.active_count() <= threads
        assert open_files() <= files


async def answer(client, name, arguments) -> str:
    """The text of a call's answer, an error's or a result's."""
    try:
        result = await client.call_tool(name, arguments)
    except MCPError as error:
        return str(error)
    return " ".join(getattr(block, "text", "") for block in result.content)
