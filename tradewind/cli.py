"""The `tradewind` command line.

    tradewind serve [--transport stdio|http] [--host 127.0.0.1] [--port 8765] [--no-auth] [--allow-origin URL]
        [--allow-host NAME[:PORT]] [--read-timeout-s 10] [--max-connections 128] [--read-only]
    tradewind demo [--steps 300]
    tradewind tokenize INPUT [--tokenizer byte|PATH|hf:NAME] [--format auto] [--text-field text]
        [--val-fraction 0.1] [--strict] [--prepend-bos] [--no-eos] [--workers N] [--output gs://BUCKET/PREFIX]
    tradewind train-tokenizer INPUT [--vocab-size 32000] [--format auto] [--text-field text]
        [--max-documents N] [--min-frequency 2]
    tradewind inspect DATASET_ID [--split train] [--samples 3] [--sample-chars 400] [--json]
    tradewind sample RUN_ID [--prompt TEXT | --messages JSON|FILE] [--max-tokens 200] [--temperature 0.8]
        [--top-k 0] [--top-p 1.0] [--seed 0] [--step N] [--timeout-s 300] [--json]
    tradewind profile RUN_ID [--steps 5] [--start-step 2] [--timeout-s 600] [--json]
    tradewind report RUN [RUN ...] [--metric val_bpb|eval_loss|loss] [--no-sample] [--json]
    tradewind train CONFIG.yaml [--set key=value ...] [--detach]
    tradewind estimate CONFIG.yaml [--set key=value ...] [--budget-s S] [--no-probe] [--json]
    tradewind compile CONFIG.yaml [--accelerator v5litepod-16] [--slices N] [--set key=value ...] [--json]
    tradewind runs list [--limit N] [--json] | show RUN [--json] | cancel RUN
    tradewind export RUN --format hf --out DIR
    tradewind cluster status|logs|cancel|pipeline ...

Every command takes `--workspace DIR` (default `$TRADEWIND_WORKSPACE`, else `~/.tradewind`),
`--allow-path DIR` (repeatable) for input folders outside the workspace, and `--allow-code DIR` (repeatable)
for the only folders whose pipeline files `run_pipeline` may run (none by default). Paths given to
commands and inside configs (datasets, runs, inputs) are relative to the workspace root; only a command's
own CONFIG file is a plain path. Commands import what they need when they run, so `tradewind --help`
answers at once and nothing loads JAX before it has to.

The options of `tokenize`, `train-tokenizer`, `inspect`, `sample` and `profile` are generated from their tools'
request models (`tradewind.core.cli_options`), so a field added to a request is an option at once, with
its description as help; they are generated only when that command runs (pydantic loads no sooner).
What those commands do is in `tradewind.commands`.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Sequence

from tradewind import commands
from tradewind.cluster.cli import add_cluster_commands
from tradewind.core.subcommands import add_command
from tradewind.trainer.cli import add_export_command

# `--no-eos` was `tokenize`'s spelling before its options came from the request (`--no-append-eos`).
_TOKENIZE_ALIASES = {"--no-eos": "append_eos"}


def _serve(args: argparse.Namespace) -> int:
    from tradewind.server import serve

    if args.transport == "http":
        from tradewind.server.security import check_bind

        check_bind(args.host, auth=not args.no_auth)  # before touching the workspace
    serve(
        commands.context(args),
        transport=args.transport,
        host=args.host,
        port=args.port,
        auth=not args.no_auth,
        allow_origins=tuple(args.allow_origin),
        allow_hosts=tuple(args.allow_host),
        read_only=args.read_only,
        read_timeout_s=args.read_timeout_s,
        max_connections=args.max_connections,
    )
    return 0


def _demo(args: argparse.Namespace) -> int:
    import time

    import anyio
    from rich.console import Console

    from tradewind.demo import DemoFailed, run_demo

    console = Console(highlight=False)
    workspace = commands.context(args).workspace.root
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


def _positive(kind: type[int] | type[float]):
    """An argparse type: a finite number of `kind` above zero."""
    name = "whole number" if kind is int else "number of seconds"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"expected a {name} above 0, got {text!r}")
        return value

    return parse


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """CONFIG and --set, as `train` and `estimate` read a run's config."""
    parser.add_argument("config", help="a TrainConfig as YAML, the schema launch_training takes (see experiments/)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. model.n_layers=6"
    )


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `tradewind` parser; with `command`, only that command's options generated from a request model.

    Those options need the request models (and so pydantic) imported; `main` passes the command it runs, so
    `tradewind --help` and the other commands do without. `None` generates them all.
    """
    from_model = functools.partial(_add_model_options, command)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workspace", help="workspace root (default: $TRADEWIND_WORKSPACE, else ~/.tradewind)")
    common.add_argument(
        "--allow-path", action="append", default=[], metavar="DIR", help="also let tools read inputs under DIR"
    )
    common.add_argument(
        "--allow-code",
        action="append",
        default=[],
        metavar="DIR",
        help="let run_pipeline run Python files under DIR (no folder is granted by default)",
    )
    common.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    parser = argparse.ArgumentParser(
        prog="tradewind", description="Language-model training work for AI agents, over MCP."
    )
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register = functools.partial(add_command, subcommands, common)

    serve = register("serve", _serve, help="run the MCP server (stdio by default)")
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1", help="HTTP address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="HTTP port; the endpoint is /mcp (default 8765)")
    serve.add_argument(
        "--no-auth",
        action="store_true",
        help="HTTP without the bearer token; refused unless --host is loopback (default: token from "
        "$TRADEWIND_TOKEN, else <workspace>/.tradewind-token)",
    )
    serve.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="URL",
        help="also accept requests whose Origin is URL, e.g. http://localhost:3000 (repeatable)",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="also accept this Host header, e.g. the machine's name when binding 0.0.0.0 (repeatable)",
    )
    serve.add_argument(
        "--read-timeout-s",
        type=_positive(float),
        default=10.0,
        metavar="S",
        help="HTTP: close a connection whose request headers, or whose body after them, take longer than S "
        "seconds to arrive",
    )
    serve.add_argument(
        "--max-connections",
        type=_positive(int),
        default=128,
        metavar="N",
        help="HTTP: connections open at once; those without the token hold at most half (a quarter from one "
        "address) and give way to newer ones; past N with the token, one more is answered 503 and closed",
    )
    serve.add_argument(
        "--read-only",
        action="store_true",
        help="serve only the tools that change nothing (datasets, runs, metrics and logs to look at)",
    )

    demo = register("demo", _demo, help="run the whole agent loop over MCP on Tiny Shakespeare; prints a report path")
    demo.add_argument("--steps", type=int, default=300, help="training steps (default 300)")

    tokenize = register(
        "tokenize", commands.tokenize, help="tokenize files into a token cache; prints the dataset id and counts"
    )
    from_model(tokenize, "TokenizeDatasetRequest", positional=("input",), aliases=_TOKENIZE_ALIASES)

    train = register(
        "train-tokenizer",
        commands.train_tokenizer,
        help="train a byte-level BPE tokenizer; prints its tokenizer.json path",
    )
    from_model(train, "TrainTokenizerRequest", positional=("input",))

    inspect = register(
        "inspect", commands.inspect, help="describe a token cache: counts, length histogram, samples, bad records"
    )
    from_model(inspect, "InspectDatasetRequest", positional=("dataset_id",))
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")

    sample = register(
        "sample", commands.sample, help="generate text from a run's checkpoint; prints the prompt and the text"
    )
    _add_sample_options(command, sample)
    sample.add_argument("--json", action="store_true", help="print the result as JSON")

    train = register(
        "train", commands.train, help="launch a training run from a YAML config and follow it with a progress bar"
    )
    _add_config_arguments(train)
    train.add_argument("--detach", action="store_true", help="print the run id and return; the run goes on")

    estimate = register(
        "estimate",
        commands.estimate,
        help="size a run before launching it: parameters, memory fit, step time, what its budget trains",
    )
    _add_config_arguments(estimate)
    estimate.add_argument(
        "--budget-s", type=float, metavar="S", help="seconds of training to plan for (default: the config's budget)"
    )
    estimate.add_argument(
        "--no-probe", action="store_true", help="do not compile and time its steps when no earlier run has this shape"
    )
    estimate.add_argument("--json", action="store_true", help="print the estimate as JSON")

    compile_ = register(
        "compile",
        commands.compile_for_slice,
        help="compile a run for a TPU slice on this machine (no TPU needed): HBM per chip, estimated step time",
    )
    _add_config_arguments(compile_)
    compile_.add_argument(
        "--accelerator",
        metavar="TYPE",
        help="a TPU slice type, e.g. v5litepod-16 or tpu-v5p-8 (default: this host's TPU, where it has one)",
    )
    compile_.add_argument("--slices", type=_positive(int), default=1, help="slices training together (default 1)")
    compile_.add_argument(
        "--timeout-s", type=_positive(float), default=600.0, metavar="S", help="give up compiling after S seconds"
    )
    compile_.add_argument("--json", action="store_true", help="print the estimate as JSON")

    profile = register(
        "profile", commands.profile, help="profile a run's steps: where the time goes, a verdict, one suggestion"
    )
    from_model(profile, "ProfileRunRequest", positional=("run_id",))
    profile.add_argument("--json", action="store_true", help="print the result as JSON")

    report = register(
        "report", commands.report, help="write a run's report, or compare several runs; prints the report paths"
    )
    report.add_argument("runs", nargs="+", metavar="RUN", help="a run id; two or more: a comparison")
    report.add_argument(
        "--metric", choices=["val_bpb", "eval_loss", "loss"], default="val_bpb", help="compare runs on it"
    )
    report.add_argument("--no-sample", action="store_true", help="no text sampled from the run's checkpoint")
    report.add_argument("--json", action="store_true", help="print the result as JSON")

    runs = register("runs", commands.runs, help="list, show or cancel training runs (any backend)")
    actions = runs.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", parents=[common], help="the newest runs with status and losses")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    for action, text in (
        ("show", "one run as JSON: status, where it runs, losses, summary"),
        ("cancel", "stop a run; it keeps its checkpoints"),
    ):
        actions.add_parser(action, parents=[common], help=text).add_argument("run", help="a run id")

    add_export_command(subcommands, common)
    add_cluster_commands(subcommands, common)
    return parser


def _add_model_options(command: str | None, parser: argparse.ArgumentParser, model_name: str, **how) -> None:
    """Add the options of the `tradewind.tools` request `model_name` to `parser` if it is the parser of `command`
    (or `command` is None); `how` as `add_model_options` takes it."""
    if command not in (None, parser.prog.split()[-1]):
        return
    import tradewind.tools
    from tradewind.core.cli_options import add_model_options

    add_model_options(parser, getattr(tradewind.tools, model_name), **how)


def _add_sample_options(command: str | None, parser: argparse.ArgumentParser) -> None:
    """`sample`'s options, from `SampleTextRequest` as `commands.sample_options` has it (`--messages` as JSON)."""
    if command not in (None, "sample"):
        return
    from tradewind.core.cli_options import add_model_options

    add_model_options(parser, commands.sample_options(), positional=("run_id",))


def keep_off_the_tpu() -> None:
    """On a TPU host, keep this process's JAX (should anything here load it) on the CPU: one process at a time
    can use the chips, and they are for the training jobs, which choose for themselves."""
    from tradewind.cluster.tpu_host import host_tpu

    if host_tpu() is not None:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv[0] if argv else "").parse_args(argv)
    from tradewind.core import TradewindError, configure_logging

    configure_logging(args.log_level)
    keep_off_the_tpu()
    try:
        return args.handler(args)
    except TradewindError as error:
        print(f"tradewind {args.command}: {error}", file=sys.stderr)
        return 2
    except ValueError as error:  # pydantic's ValidationError is a ValueError; pydantic loads only by then
        from pydantic import ValidationError

        from tradewind.core import describe_validation_error

        if not isinstance(error, ValidationError):
            raise
        print(describe_validation_error(error, f"tradewind {args.command}"), file=sys.stderr)
        return 2
