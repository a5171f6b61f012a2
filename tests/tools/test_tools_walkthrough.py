"""The worked example page, docs/observability-example.md: written by the tools, and still what they write."""

import re

import pytest

from tradewind.tools.walkthrough import PAGE, build


def skeleton(page: str) -> list[str]:
    """The page's headings, table headers and code fences, with run ids and numbers masked: what stays the
    same from one machine and one run to the next."""
    lines = page.splitlines()
    kept = [
        line
        for i, line in enumerate(lines)
        if line.startswith(("#", "```"))
        or (line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"))
    ]
    masked = [re.sub(r"run-\d{8}-\d{6}-[0-9a-f]+", "RUN", line) for line in kept]
    return [re.sub(r"\d[\d,.]*", "N", line) for line in masked]


def test_every_plot_the_committed_page_shows_is_committed_beside_it():
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", PAGE.read_text(encoding="utf-8"))
    assert len(links) == 2  # the run's four panels and the comparison's overlay
    assert all((PAGE.parent / link).is_file() for link in links), links


@pytest.mark.slow
def test_the_committed_page_has_the_structure_the_tools_write_now(tmp_path):
    page = build(tmp_path / "workspace", tmp_path / "assets")
    assert skeleton(page) == skeleton(PAGE.read_text(encoding="utf-8")), "run `make walkthrough` and commit the page"
    assert sorted(path.suffix for path in (tmp_path / "assets").iterdir()) == [".png", ".png"]
