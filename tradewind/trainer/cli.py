"""The `train` and `export` commands of the `tradewind` command line.

    tradewind train CONFIG.yaml [--set key=value ...] [--run-dir DIR]
    tradewind export RUN --format hf --out DIR [--step N]

`train` reads a `TrainConfig` from YAML (the schema `launch_training` takes), applies `--set` overrides
(dotted keys, YAML values: `--set model.preset=micro --set optimizer.type=lion`), and trains in this
process with a progress bar, into `--run-dir` or a new `runs/<id>` in the workspace. Running it again
on the same run folder resumes from the newest checkpoint. `export` writes a Llama run as a Hugging Face
directory; RUN is a run id in the workspace or a run folder.

`tradewind/cli.py` registers these with `add_train_commands(commands, common)`; without it,
`python -m tradewind.trainer.cli train ...` works the same. JAX loads only inside the handlers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def _train(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from tradewind.core import Workspace, load_config, make_id
    from tradewind.trainer.config import TrainConfig
    from tradewind.trainer.loop import train
    from tradewind.trainer.metrics import MetricRow

    config = load_config(TrainConfig, args.config, overrides=args.set)
    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        run_dir = Workspace.from_env(args.workspace).run_dir(make_id("run"), must_exist=False)
    console = Console(stderr=True, highlight=False)
    console.print(f"training into {run_dir}")
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("train", total=config.steps, status="compiling")

        def progress(step: int, total: int, row: MetricRow | None) -> None:
            if row is None:
                bar.update(task, completed=step)
                return
            status = []
            if row.loss is not None:
                status.append(f"loss {row.loss:.3f}")
            if row.eval_loss is not None:
                status.append(f"eval {row.eval_loss:.3f}")
            bar.update(task, completed=step, status=" ".join(status))

        summary = train(config, run_dir, progress=progress)
    console.print(
        f"done: eval loss {summary.final_eval_loss:.4f}, {summary.mean_tokens_per_s:,.0f} tok/s; run folder {run_dir}"
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    from tradewind.core import Workspace
    from tradewind.trainer.hf import export_hf

    run = Path(args.run)
    run_dir = run if run.is_dir() else Workspace.from_env(args.workspace).run_dir(args.run)
    out = export_hf(run_dir, Path(args.out), step=args.step)
    print(f"exported {run_dir} to {out} (config.json, model.safetensors)")
    return 0


def add_train_commands(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `train` and `export` on the `tradewind` command's subparsers."""
    train = commands.add_parser("train", parents=[common], help="train a model from a YAML config, with progress")
    train.add_argument("config", type=Path, help="a TrainConfig as YAML (see docs/trainer.md, experiments/)")
    train.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. model.n_layers=6"
    )
    train.add_argument("--run-dir", help="run folder (default: a new runs/<id> in the workspace)")
    train.set_defaults(handler=_train)

    export = commands.add_parser("export", parents=[common], help="export a Llama run to Hugging Face format")
    export.add_argument("run", help="a run id in the workspace, or a run folder")
    export.add_argument("--format", choices=["hf"], default="hf", help="output format (hf: LlamaForCausalLM)")
    export.add_argument("--out", required=True, help="output folder")
    export.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    export.set_defaults(handler=_export)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `train` or `export` as `python -m tradewind.trainer.cli`; return the exit status."""
    from tradewind.core import TradewindError

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workspace", help="workspace root (default: $TRADEWIND_WORKSPACE, else ~/.tradewind)")
    parser = argparse.ArgumentParser(prog="python -m tradewind.trainer.cli")
    commands = parser.add_subparsers(dest="command", required=True)
    add_train_commands(commands, common)
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except TradewindError as error:
        print(f"tradewind {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
