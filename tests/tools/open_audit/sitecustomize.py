"""Test-only: each training process of a gang records every file it opens (Python's `open` audit event).

Put on PYTHONPATH by test_tools_storage.py, with TW_TEST_OPEN_LOG naming a folder: a process that is a gang
replica (TRADEWIND_PROCESS_ID set) appends the paths it opens to `<folder>/replica-<id>-<pid>.txt`. The hook reads
both variables at each event, not at the start: a replica forked by the fork server became one after Python
started (in the server, which ran this file once).
"""

import os
import sys

if os.environ.get("TW_TEST_OPEN_LOG"):
    _logs = {}

    def _record(event, args):
        replica = os.environ.get("TRADEWIND_PROCESS_ID")
        if event != "open" or replica is None or not isinstance(args[0], str | bytes):
            return
        name = os.path.join(os.environ["TW_TEST_OPEN_LOG"], f"replica-{replica}-{os.getpid()}.txt")
        path = os.path.abspath(os.fsdecode(args[0]))
        if path == name:
            return
        if name not in _logs:
            _logs[name] = open(name, "a", buffering=1)  # noqa: SIM115
        _logs[name].write(path + "\n")

    sys.addaudithook(_record)
