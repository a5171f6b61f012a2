"""The tool reference pages in docs/reference/tools/ are exactly what the server's schemas generate."""

from pathlib import Path

import pytest
import yaml
from mcp import Client

from tradewind.server import build_server
from tradewind.server.reference import REGENERATE, listed_tools, main, reference_pages
from tradewind.tools import TOOLS

ROOT = Path(__file__).parents[2]
PAGES = ROOT / "docs" / "reference" / "tools"


@pytest.fixture(scope="module")
def pages():
    return reference_pages()


def test_the_committed_tool_reference_pages_are_exactly_the_generated_ones(pages):
    committed = {path.name: path.read_text(encoding="utf-8") for path in sorted(PAGES.glob("*.md"))}
    assert sorted(committed) == sorted(pages), f"pages added or removed: run `{REGENERATE}`"
    stale = [name for name, text in pages.items() if committed[name] != text]
    assert not stale, f"{', '.join(stale)} drifted from the tool schemas: run `{REGENERATE}`"


def test_there_is_a_page_per_tool_and_the_docs_nav_lists_each_one(pages):
    assert set(pages) == {"index.md"} | {f"{tool.__name__}.md" for tool in TOOLS}
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    listed = str(nav)
    missing = [name for name in pages if f"reference/tools/{name}" not in listed]
    assert not missing, f"mkdocs.yml's nav lacks reference/tools/{missing[0]}"


def test_a_tool_page_shows_its_arguments_defaults_ranges_hints_and_result_fields(pages):
    page = pages["launch_training.md"]
    assert page.startswith("# `launch_training`\n")
    assert "**Launch a training run.** Train a model on a token cache" in page
    assert "| `steps` | integer | `200` | ≥ 1, ≤ 1000000000 |" in page
    assert '| `backend` | string \\| null | `null` | `"local"`, `"ray"`, `null` |' in page
    assert "### `model`" in page and "| `model.d_model` | integer | `128` | ≥ 1, ≤ 65536 |" in page
    assert "| `openWorldHint` | yes |" in page and "| `readOnlyHint` | no |" in page
    assert "| `run_id` | string |" in page and "## Result" in page
    assert "| `run_id` | string | required |" in pages["get_run.md"]


@pytest.fixture(scope="module")
def generated_from():
    return listed_tools()  # outside the test's event loop: it runs one of its own


@pytest.mark.anyio
async def test_the_pages_come_from_the_tools_a_client_lists(ctx, generated_from):
    async with Client(build_server(ctx)) as client:
        from_client = (await client.list_tools()).tools
    dump = [tool.model_dump(mode="json", exclude={"meta"}) for tool in generated_from]
    assert dump == [tool.model_dump(mode="json", exclude={"meta"}) for tool in from_client]


def test_the_module_prints_one_page_or_all_of_them(pages, capsys):
    assert main(["get_run"]) == 0
    assert capsys.readouterr().out == pages["get_run.md"]
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(f"<!-- file: {name} -->\n" in out for name in pages)
    assert main(["no_such_tool"]) == 2
