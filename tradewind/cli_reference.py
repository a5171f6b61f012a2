"""The command-line reference page `docs/reference/cli.md`, generated from the `tradewind` parsers.

    python -m tradewind.cli_reference            # prints the page
    python -m tradewind.cli_reference --write    # rewrites docs/reference/cli.md

The page walks `tradewind.cli.build_parser()` with every option generated (so the options that come from
the tools' request models are there too) and, for each command and sub-command, gives its usage line and a
table of its arguments: flags, default, allowed values and help, as `--help` states them. The options every
command takes are listed once. A test (`tests/test_cli_reference.py`) checks the committed page is exactly
this one. `tradewind.cli` does not import this module, so `tradewind --help` pays nothing for it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from tradewind.cli import build_parser
from tradewind.core.markdown import table_cell

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md"
"""Where the page lives in a source checkout."""

REGENERATE = "python -m tradewind.cli_reference --write"
_USAGE_WIDTH = 100  # fixed, so the page does not depend on the terminal it was generated in


def _commands(
    parser: argparse.ArgumentParser, help_text: str = ""
) -> Iterator[tuple[argparse.ArgumentParser, str, bool]]:
    """(parser, its one-line help, whether it has sub-commands) for `parser` and every parser below it."""
    subparsers = _subparsers(parser)
    yield parser, help_text, subparsers is not None
    if subparsers is None:
        return
    helps = {choice.dest: choice.help or "" for choice in subparsers._choices_actions}
    for name, child in subparsers.choices.items():
        yield from _commands(child, helps.get(name, ""))


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a user types: neither `--help` nor the sub-command slot."""
    return [
        action
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    ]


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=_USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _code(value: object) -> str:
    return "`" + str(value).replace("|", "\\|") + "`"


def _name(action: argparse.Action) -> str:
    if not action.option_strings:
        return _code(action.metavar or action.dest)
    value = "" if action.nargs == 0 else " " + (action.metavar or action.dest.upper())
    return ", ".join(_code(flag + value) for flag in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.required or (not action.option_strings and action.nargs not in ("?", "*")):
        return "required"
    if action.default is None or action.default is argparse.SUPPRESS or action.default is False:
        return ""
    if action.default in ([], ""):  # an appending option's empty start, an empty string
        return ""
    return _code(action.default)


def _help(action: argparse.Action, prog: str) -> str:
    """The help as `--help` prints it (argparse %-formats it), with "(repeatable)" for an appending option."""
    shown = action.help and action.help != argparse.SUPPRESS
    text = action.help % {**vars(action), "prog": prog} if shown else ""
    if isinstance(action, argparse._AppendAction) and "repeatable" not in text:
        text = (text + " (repeatable)").strip()
    return table_cell(text)


def _table(actions: list[argparse.Action], prog: str) -> list[str]:
    lines = ["| argument | default | allowed | help |", "|---|---|---|---|"]
    for action in actions:
        allowed = ", ".join(_code(choice) for choice in action.choices) if action.choices else ""
        lines.append(f"| {_name(action)} | {_default(action)} | {allowed} | {_help(action, prog)} |")
    return lines


def _common_dests(parsers: list[argparse.ArgumentParser]) -> set[str]:
    """The options every command (a parser without sub-commands) takes."""
    leaves = [set(action.dest for action in _arguments(parser) if action.option_strings) for parser in parsers]
    return set.intersection(*leaves) if leaves else set()


def cli_page() -> str:
    """The markdown page: the common options, then each command with its usage line and arguments."""
    root = build_parser()
    commands = list(_commands(root))
    common = _common_dests([parser for parser, _, nested in commands if not nested])
    lines = [
        "# Command line",
        "",
        f"<!-- Generated from the `tradewind` parsers by `{REGENERATE}`; do not edit by hand. -->",
        "",
        f"`{root.prog}`: {table_cell(root.description or '')} Every command below answers `--help` with the same",
        "text. Relative paths in arguments and configs are taken from the workspace root; only the config file",
        "of `tradewind train` and `tradewind estimate` is a plain path from the current folder (see",
        "[Workspace](../workspace.md)).",
        "",
        "## Options every command takes",
        "",
    ]
    sample = next(parser for parser, _, nested in commands if not nested)
    lines += _table([action for action in _arguments(sample) if action.dest in common], sample.prog)
    lines.append("")
    for parser, help_text, _ in commands[1:]:
        level = "#" * min(parser.prog.count(" ") + 1, 4)
        lines += [f"{level} `{parser.prog}`", ""]
        if help_text:
            lines += [table_cell(help_text[0].upper() + help_text[1:]) + ".", ""]
        lines += ["```text", _usage(parser), "```", ""]
        own = [action for action in _arguments(parser) if action.dest not in common]
        if own:
            lines += [*_table(own, parser.prog), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        PAGE.parent.mkdir(parents=True, exist_ok=True)
        PAGE.write_text(cli_page(), encoding="utf-8")
        print(PAGE, file=sys.stderr)
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    print(cli_page(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
