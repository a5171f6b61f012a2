"""A command of the `tradewind` command line, registered the one way every command is: a sub-parser that takes
the common options (`--workspace` and the rest) and names the function that runs it.

Imports only the standard library, so that registering the commands costs `tradewind --help` nothing.

Example:
    report = add_command(subcommands, common, "report", commands.report, help="write a run's report")
    report.add_argument("runs", nargs="+")
    ...
    args = parser.parse_args(argv)
    args.handler(args)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def add_command(
    subcommands: argparse._SubParsersAction,
    common: argparse.ArgumentParser,
    name: str,
    handler: Callable[[argparse.Namespace], int],
    *,
    help: str,
) -> argparse.ArgumentParser:
    """Add the command `name` to `subcommands`: it takes `common`'s options, `help` is its line in the command
    list, and `handler(args)` runs it (its `args.handler`, an exit status).

    Returns:
        The command's parser, for its own arguments.
    """
    parser = subcommands.add_parser(name, parents=[common], help=help)
    parser.set_defaults(handler=handler)
    return parser
