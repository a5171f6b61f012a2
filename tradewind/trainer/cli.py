"""The `export` command of the `tradewind` command line.

    tradewind export RUN --format hf|peft --out DIR [--step N]

writes a run as a Hugging Face directory (config, weights and tokenizer files; a LoRA run's adapters merged in),
or a LoRA run's adapters as a PEFT folder (`peft`); RUN is a run id in the workspace, or a run folder relative
to the workspace root. `tradewind/cli.py` registers it with
`add_export_command(commands, common)`; without it, `python -m tradewind.trainer.cli export ...` works the
same. JAX loads only inside the handler. (`tradewind train` lives in `tradewind/cli.py`: it launches a run
through the tools, as every interface does.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tradewind.core.subcommands import add_command


def _export(args: argparse.Namespace) -> int:
    from tradewind.core import Workspace
    from tradewind.core.buckets import is_remote
    from tradewind.trainer.export import export_hf

    workspace = Workspace.from_env(args.workspace, tuple(getattr(args, "allow_path", ())))
    run_dir = workspace.run_folder(args.run)
    peft = args.format == "peft"
    if is_remote(args.out):  # a bucket the person names on the command line
        print(f"exported {run_dir} to {export_hf(run_dir, args.out, step=args.step, peft=peft)}")
        return 0
    out = Path(args.out).expanduser()
    out = export_hf(run_dir, out if out.is_absolute() else workspace.root / out, step=args.step, peft=peft)
    print(f"exported {run_dir} to {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


def add_export_command(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `export` on the `tradewind` command's subparsers."""
    export = add_command(commands, common, "export", _export, help="export a run to Hugging Face format")
    export.add_argument("run", help="a run id in the workspace, or a run folder")
    export.add_argument(
        "--format",
        choices=["hf", "peft"],
        default="hf",
        help="hf: the whole model (LoRA merged in); peft: a LoRA run's adapters for its base model",
    )
    export.add_argument(
        "--out", required=True, help="output folder (a relative one is taken from the workspace root), or gs:// s3://"
    )
    export.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run `export` as `python -m tradewind.trainer.cli`; return the exit status."""
    from tradewind.core import TradewindError

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workspace", help="workspace root (default: $TRADEWIND_WORKSPACE, else ~/.tradewind)")
    parser = argparse.ArgumentParser(prog="python -m tradewind.trainer.cli")
    commands = parser.add_subparsers(dest="command", required=True)
    add_export_command(commands, common)
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except TradewindError as error:
        print(f"tradewind {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
