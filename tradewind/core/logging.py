"""Logging to stderr only: stdout belongs to the MCP stdio transport and to command output."""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str | int = "INFO") -> None:
    """Send Tradewind's log records to stderr at `level`; safe to call more than once."""
    root = logging.getLogger("tradewind")
    root.setLevel(level)
    if not any(getattr(h, "_tradewind", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler._tradewind = True  # type: ignore[attr-defined]
        root.addHandler(handler)


def get_logger(name: str) -> logging.Logger:
    """A logger under the `tradewind` namespace, e.g. `get_logger(__name__)`."""
    return logging.getLogger(name if name.startswith("tradewind") else f"tradewind.{name}")
