"""The docs' list of the tools a read-only server serves is the server's own list."""

from __future__ import annotations

import re
from pathlib import Path

from tradewind.tools import TOOLS
from tradewind.tools.spec import spec_of

TOOLS_PAGE = Path(__file__).parents[1] / "docs" / "tools.md"


def test_the_read_only_tool_list_in_the_docs_names_every_read_only_tool_and_no_other():
    section = TOOLS_PAGE.read_text(encoding="utf-8").split("## Read-only serving", 1)[1].split("\n## ", 1)[0]
    listed = re.search(r"lists only the tools whose `readOnlyHint` is true\s*\(([^)]*)\)", section)
    assert listed, "docs/tools.md's read-only section no longer lists the tools in parentheses"
    named = set(re.findall(r"`(\w+)`", listed.group(1)))
    assert named == {tool.__name__ for tool in TOOLS if spec_of(tool).read_only}
