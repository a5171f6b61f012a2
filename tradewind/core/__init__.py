"""Core: the workspace, safe file storage, config loading, errors and logging.

The lowest layer: it imports nothing else from Tradewind, and every other layer may import it.
"""

from tradewind.core.config import apply_overrides, describe_validation_error, listed_fields, load_config, parse_config
from tradewind.core.errors import ConfigError, InvalidInputError, NotFoundError, PathEscapeError, TradewindError
from tradewind.core.logging import configure_logging, get_logger
from tradewind.core.storage import (
    append_jsonl,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    open_url,
    read_json,
    read_jsonl,
    tail_lines,
)
from tradewind.core.workspace import Workspace, check_id, make_id, names_a_path

__all__ = [
    "ConfigError",
    "InvalidInputError",
    "NotFoundError",
    "PathEscapeError",
    "TradewindError",
    "Workspace",
    "append_jsonl",
    "apply_overrides",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_id",
    "configure_logging",
    "describe_validation_error",
    "listed_fields",
    "get_logger",
    "load_config",
    "make_id",
    "names_a_path",
    "open_url",
    "parse_config",
    "read_json",
    "read_jsonl",
    "tail_lines",
]
