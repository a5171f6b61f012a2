"""The command-line reference page docs/reference/cli.md is exactly what the `tradewind` parsers generate."""

import argparse
from pathlib import Path

import yaml

from tradewind.cli import build_parser
from tradewind.cli_reference import PAGE, REGENERATE, cli_page, main

ROOT = Path(__file__).parents[1]


def test_the_committed_cli_reference_is_exactly_the_generated_one():
    assert PAGE == ROOT / "docs" / "reference" / "cli.md"
    assert PAGE.read_text(encoding="utf-8") == cli_page(), f"docs/reference/cli.md drifted: run `{REGENERATE}`"


def test_the_page_has_every_command_and_sub_command_with_its_usage():
    page = cli_page()
    commands = build_parser()._actions[-1].choices
    for name, parser in commands.items():
        assert f"## `tradewind {name}`\n" in page
        assert f"usage: tradewind {name} " in page
        for action in parser._actions:
            for child in action.choices if isinstance(action, argparse._SubParsersAction) else ():
                assert f"### `tradewind {name} {child}`\n" in page
    assert "### `tradewind cluster pipeline`\n" in page


def test_options_from_request_models_and_common_options_are_in_the_tables():
    page = cli_page()
    assert "| `--port PORT` | `8765` |  | HTTP port; the endpoint is /mcp (default 8765) |" in page
    assert "| `--no-append-eos`, `--no-eos` |" in page  # generated from TokenizeDatasetRequest, with its alias
    assert "| `--log-level LOG_LEVEL` | `INFO` | `DEBUG`, `INFO`, `WARNING`, `ERROR` |" in page
    assert page.count("| `--workspace WORKSPACE` |") == 1  # listed once, not per command
    assert "| `--out OUT` | required |" in page


def test_the_docs_nav_lists_the_cli_reference():
    nav = str(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    assert "reference/cli.md" in nav


def test_the_module_prints_the_page(capsys):
    assert main([]) == 0
    assert capsys.readouterr().out == cli_page()
    assert main(["--bogus"]) == 2
