"""Every code block a tutorial marks runnable (```python runnable, ```bash runnable) runs and exits 0.

Each block runs on its own, in a fresh workspace: `TRADEWIND_WORKSPACE` set to an empty temporary folder,
which is also the current folder; Python blocks with this environment's interpreter, bash blocks with
`bash -euo pipefail` and this environment's `bin/` first on `PATH` (so `tradewind` is the installed command).
The test id is the block's file and line, e.g. `training-from-python.md:14`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = Path(__file__).parents[1] / "docs" / "tutorials"
TIMEOUT_S = 240  # one block; each takes seconds to ~40 s on a 2-core CPU
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$")


def runnable_blocks(folder: Path = TUTORIALS) -> list[tuple[str, str, str]]:
    """(file:line, language, code) of each fenced block whose info string is `<language> runnable`."""
    blocks = []
    for path in sorted(folder.glob("*.md")):
        lines = path.read_text(encoding="utf-8").splitlines()
        index = 0
        while index < len(lines):
            start = _FENCE.match(lines[index])
            index += 1
            if not start:
                continue
            indent, fence, words = start["indent"], start["fence"], start["info"].split()
            body = []
            while index < len(lines) and not re.match(rf"^[ \t]*{re.escape(fence)}[ \t]*$", lines[index]):
                body.append(lines[index].removeprefix(indent))
                index += 1
            index += 1  # the closing fence
            if len(words) >= 2 and words[1] == "runnable":
                opened_at = index - len(body) - 1  # 1-based line of the opening fence
                blocks.append((f"{path.name}:{opened_at}", words[0], "\n".join(body) + "\n"))
    return blocks


BLOCKS = runnable_blocks()


def test_the_tutorials_have_runnable_blocks_in_python_and_bash():
    assert {language for _, language, _ in BLOCKS} == {"python", "bash"}, BLOCKS


@pytest.mark.slow
@pytest.mark.parametrize(("where", "language", "code"), BLOCKS, ids=[where for where, _, _ in BLOCKS])
def test_a_runnable_tutorial_block_exits_zero(where, language, code, tmp_path):
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "TRADEWIND_WORKSPACE": str(tmp_path),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-"] if language == "python" else ["bash", "-euo", "pipefail", "-s"]
    result = subprocess.run(
        command, input=code, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert result.returncode == 0, (
        f"{where} ({language}) exited {result.returncode}\n--- block ---\n{code}"
        f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-4000:]}"
    )
