"""The errors Tradewind raises on purpose.

Every error says what was wrong and where (argument, file, line or field), so that an agent or a person
can fix the input without reading a traceback. Tools let these propagate; the MCP server turns them into
error results and keeps serving.
"""

from __future__ import annotations


class TradewindError(Exception):
    """Base class of the errors Tradewind raises on purpose; the message is written for the user."""


class InvalidInputError(TradewindError, ValueError):
    """An argument, file or config field has a value Tradewind cannot use."""


class PathEscapeError(InvalidInputError):
    """A path argument points outside the workspace and the roots the user allowed."""


class ConfigError(InvalidInputError):
    """A config file or config value does not validate; the message names the file and field."""


class NotFoundError(TradewindError, LookupError):
    """A named thing (run, dataset, file) does not exist."""
