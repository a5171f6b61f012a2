"""Logging goes to stderr only (stdout is the MCP stdio transport), once per record however often it is set up."""

import subprocess
import sys

SCRIPT = """
from tradewind.core.logging import configure_logging, get_logger
configure_logging("INFO")
configure_logging("DEBUG")  # a second call changes the level and adds no second handler
get_logger("demo").debug("debug line")
get_logger("tradewind.tools").info("info line")
configure_logging("WARNING")
get_logger("demo").info("hidden line")
print("stdout line")
"""


def test_records_go_to_stderr_once_each_at_the_latest_level_and_stdout_keeps_only_program_output():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "stdout line\n"
    lines = done.stderr.splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "DEBUG tradewind.demo: debug line",
        "INFO tradewind.tools: info line",
    ]
