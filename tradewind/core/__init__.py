"""Core: the workspace, safe file storage, config loading, errors, logging and lazy package names.

The lowest layer: it imports nothing else from Tradewind, and every other layer may import it. Names load
on first use (`lazy_getattr`), so that packages resting on core (the CLI's commands among them) can import
it without loading pydantic, YAML or fsspec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tradewind.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from tradewind.core.config import (
        apply_overrides,
        describe_validation_error,
        listed_fields,
        load_config,
        parse_config,
        read_json_config,
    )
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

__getattr__ = lazy_getattr(
    __name__,
    {
        "apply_overrides": "tradewind.core.config",
        "describe_validation_error": "tradewind.core.config",
        "listed_fields": "tradewind.core.config",
        "load_config": "tradewind.core.config",
        "parse_config": "tradewind.core.config",
        "read_json_config": "tradewind.core.config",
        "ConfigError": "tradewind.core.errors",
        "InvalidInputError": "tradewind.core.errors",
        "NotFoundError": "tradewind.core.errors",
        "PathEscapeError": "tradewind.core.errors",
        "TradewindError": "tradewind.core.errors",
        "configure_logging": "tradewind.core.logging",
        "get_logger": "tradewind.core.logging",
        "append_jsonl": "tradewind.core.storage",
        "atomic_write_bytes": "tradewind.core.storage",
        "atomic_write_json": "tradewind.core.storage",
        "atomic_write_text": "tradewind.core.storage",
        "open_url": "tradewind.core.storage",
        "read_json": "tradewind.core.storage",
        "read_jsonl": "tradewind.core.storage",
        "tail_lines": "tradewind.core.storage",
        "Workspace": "tradewind.core.workspace",
        "check_id": "tradewind.core.workspace",
        "make_id": "tradewind.core.workspace",
        "names_a_path": "tradewind.core.workspace",
    },
)

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
    "lazy_getattr",
    "load_config",
    "make_id",
    "names_a_path",
    "open_url",
    "parse_config",
    "read_json",
    "read_json_config",
    "read_jsonl",
    "tail_lines",
]
