"""The `tradewind` command line.

    tradewind serve [--transport stdio|http] [--host 127.0.0.1] [--port 8765]
    tradewind demo [--steps 300]

Every command takes `--workspace DIR` (default `$TRADEWIND_WORKSPACE`, else `~/.tradewind`) and
`--allow-path DIR` (repeatable) for input folders outside the workspace. Commands import what they need
when they run, so `tradewind --help` answers at once and nothing loads JAX before it has to.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _context(args: argparse.Namespace):
    from tradewind.tools import ToolContext

    return ToolContext.open(args.workspace, tuple(args.allow_path))


def _serve(args: argparse.Namespace) -> int:
    from tradewind.server import serve

    serve(_context(args), transport=args.transport, host=args.host, port=args.port)
    return 0


def _demo(args: argparse.Namespace) -> int:
    import time

    import anyio
    from rich.console import Console

    from tradewind.demo import DemoFailed, run_demo

    console = Console(highlight=False)
    workspace = _context(args).workspace.root
    console.print(f"Tradewind demo in workspace {workspace}")
    start = time.monotonic()
    try:
        report = anyio.run(run_demo, workspace, args.steps, console)
    except DemoFailed as error:
        console.print(f"[red]demo failed:[/] {error}")
        return 1
    console.print(f"demo finished in {time.monotonic() - start:.0f} s; report:")
    print(report)
    return 0


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workspace", help="workspace root (default: $TRADEWIND_WORKSPACE, else ~/.tradewind)")
    common.add_argument(
        "--allow-path", action="append", default=[], metavar="DIR", help="also let tools read inputs under DIR"
    )
    common.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    parser = argparse.ArgumentParser(
        prog="tradewind", description="Language-model training work for AI agents, over MCP."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", parents=[common], help="run the MCP server (stdio by default)")
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1", help="HTTP address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="HTTP port; the endpoint is /mcp (default 8765)")
    serve.set_defaults(handler=_serve)

    demo = commands.add_parser(
        "demo", parents=[common], help="run the whole agent loop over MCP on Tiny Shakespeare; prints a report path"
    )
    demo.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from tradewind.core import TradewindError, configure_logging

    configure_logging(args.log_level)
    try:
        return args.handler(args)
    except TradewindError as error:
        print(f"tradewind {args.command}: {error}", file=sys.stderr)
        return 2
