"""Test-only: each training process of a gang records every file it opens (Python's `open` audit event).

Put on PYTHONPATH by test_tools_storage.py, with TW_TEST_OPEN_LOG naming a folder: a process that is a gang
replica (TRADEWIND_PROCESS_ID set) appends the paths it opens to `<folder>/replica-<id>-<pid>.txt`.
"""

import os
import sys

_folder, _replica = os.environ.get("TW_TEST_OPEN_LOG"), os.environ.get("TRADEWIND_PROCESS_ID")
if _folder and _replica is not None:
    _log = open(os.path.join(_folder, f"replica-{_replica}-{os.getpid()}.txt"), "a", buffering=1)  # noqa: SIM115

    def _record(event, args):
        if event == "open" and isinstance(args[0], str | bytes):
            path = os.fsdecode(args[0])
            if path != _log.name:
                _log.write(os.path.abspath(path) + "\n")

    sys.addaudithook(_record)
