"""Markdown for the generated reference pages (tools, command line)."""

from __future__ import annotations


def table_cell(text: str) -> str:
    """`text` for a markdown table cell or paragraph: one line, `|` escaped, and `&`, `<`, `>` escaped outside
    code spans (inside them they show as typed)."""
    parts = " ".join(text.split()).split("`")
    for index in range(0, len(parts), 2):  # even parts are outside backticks
        parts[index] = parts[index].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|")
