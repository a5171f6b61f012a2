"""The `tradewind` command line.

    tradewind serve [--transport stdio|http] [--host 127.0.0.1] [--port 8765] [--no-auth] [--allow-origin URL]
        [--allow-host NAME[:PORT]] [--read-only]
    tradewind demo [--steps 300]
    tradewind tokenize INPUT [--tokenizer byte|PATH|hf:NAME] [--format auto] [--text-field text]
        [--val-fraction 0.1] [--strict] [--prepend-bos] [--no-eos] [--workers N]
    tradewind train-tokenizer INPUT [--vocab-size 32000] [--format auto] [--text-field text]
        [--max-documents N] [--min-frequency 2]
    tradewind inspect DATASET_ID [--split train] [--samples 3] [--sample-chars 400] [--json]
    tradewind sample RUN_ID [--prompt TEXT] [--max-tokens 200] [--temperature 0.8] [--top-k 0] [--top-p 1.0]
        [--seed 0] [--step N] [--timeout-s 300] [--json]
    tradewind train CONFIG.yaml [--set key=value ...] [--detach]
    tradewind runs list [--limit N] [--json] | show RUN [--json] | cancel RUN
    tradewind export RUN --format hf --out DIR
    tradewind cluster status|logs|cancel|pipeline ...

Every command takes `--workspace DIR` (default `$TRADEWIND_WORKSPACE`, else `~/.tradewind`),
`--allow-path DIR` (repeatable) for input folders outside the workspace, and `--allow-code DIR` (repeatable)
for folders of pipeline files `run_pipeline` may run besides `<workspace>/pipelines/`. Paths given to
commands and inside configs (datasets, runs, inputs) are relative to the workspace root; only a command's
own CONFIG file is a plain path. Commands import what they need when they run, so `tradewind --help`
answers at once and nothing loads JAX before it has to.

The options of `tokenize`, `train-tokenizer`, `inspect` and `sample` are generated from their tools'
request models (`tradewind.core.cli_options`), so a field added to a request is an option at once, with
its description as help; they are generated only when that command runs (pydantic loads no sooner).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence

from tradewind.cluster.cli import add_cluster_commands
from tradewind.trainer.cli import add_export_command

# `--no-eos` was `tokenize`'s spelling before its options came from the request (`--no-append-eos`).
_TOKENIZE_ALIASES = {"--no-eos": "append_eos"}


def _context(args: argparse.Namespace):
    from tradewind.tools import ToolContext

    return ToolContext.open(args.workspace, tuple(args.allow_path), tuple(getattr(args, "allow_code", ())))


def _serve(args: argparse.Namespace) -> int:
    from tradewind.server import serve

    if args.transport == "http":
        from tradewind.server.security import check_bind

        check_bind(args.host, auth=not args.no_auth)  # before touching the workspace
    serve(
        _context(args),
        transport=args.transport,
        host=args.host,
        port=args.port,
        auth=not args.no_auth,
        allow_origins=tuple(args.allow_origin),
        allow_hosts=tuple(args.allow_host),
        read_only=args.read_only,
    )
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


def _with_progress(description: str, work):
    """Run `work(progress)` under a rich progress bar on stderr; return its result."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task(description, total=None)

        def progress(done: float, total: float | None = None, message: str | None = None) -> None:
            bar.update(task, completed=done, total=total)

        return work(progress)


def _print_result(result) -> None:
    print(result.model_dump_json(indent=2))


def _tokenize(args: argparse.Namespace) -> int:
    from tradewind.core.cli_options import model_from_args
    from tradewind.tools import TokenizeDatasetRequest, tokenize_dataset

    ctx = _context(args)
    request = model_from_args(TokenizeDatasetRequest, args)
    info = _with_progress("tokenizing", lambda progress: tokenize_dataset(ctx, request, progress))
    _print_result(info)
    if info.bad_records.skipped:
        print(
            f"skipped {info.bad_records.skipped} bad record(s); first: {info.bad_records.examples[0]}", file=sys.stderr
        )
    return 0


def _train_tokenizer(args: argparse.Namespace) -> int:
    from tradewind.core.cli_options import model_from_args
    from tradewind.tools import TrainTokenizerRequest, train_tokenizer

    ctx = _context(args)
    request = model_from_args(TrainTokenizerRequest, args)
    _print_result(_with_progress("reading", lambda progress: train_tokenizer(ctx, request, progress)))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from tradewind.core.cli_options import model_from_args
    from tradewind.tools import InspectDatasetRequest, inspect_dataset

    request = model_from_args(InspectDatasetRequest, args)
    report = inspect_dataset(_context(args), request)
    if args.json:
        _print_result(report)
        return 0
    print(f"dataset {report.dataset_id}  ({report.path})")
    print(f"tokenizer {report.tokenizer}  vocab {report.vocab_size:,}  dtype {report.dtype}  shards {report.shards}")
    for split in report.documents:
        print(
            f"  {split:5}  {report.documents[split]:>12,} documents  {report.tokens[split]:>14,} tokens  "
            f"{report.bytes[split]:>14,} bytes"
        )
    hist = report.histogram
    print(
        f"document length in tokens ({request.split}): min {hist.min:,}  median {hist.median:,.0f}  "
        f"mean {hist.mean:,.1f}  max {hist.max:,}"
    )
    widest = max(hist.counts) or 1
    for low, high, count in zip(hist.edges, hist.edges[1:], hist.counts, strict=False):
        if count:
            print(f"  [{low:>8,}, {high:>8,})  {count:>10,}  {'#' * max(1, round(40 * count / widest))}")
    for sample in report.samples:
        print(f"--- document {sample.index} ({sample.tokens:,} tokens)")
        print(sample.text)
    if report.note:
        print(report.note)
    bad = report.bad_records
    print(f"bad records skipped: {bad.skipped}")
    for example in bad.examples:
        print(f"  {example}")
    return 0


def _sample(args: argparse.Namespace) -> int:
    from tradewind.core.cli_options import model_from_args
    from tradewind.tools import SampleTextRequest, sample_text

    result = sample_text(_context(args), model_from_args(SampleTextRequest, args))
    if args.json:
        _print_result(result)
        return 0
    print(result.prompt + result.text)
    print(f"{result.tokens} tokens from step {result.step}; saved to {result.output_file}", file=sys.stderr)
    return 0


def _train(args: argparse.Namespace) -> int:
    from tradewind.core import load_config
    from tradewind.tools import LaunchTrainingRequest, launch_training

    ctx = _context(args)
    request = load_config(LaunchTrainingRequest, args.config, overrides=args.set)
    run = _with_progress("preparing the dataset", lambda progress: launch_training(ctx, request, progress))
    print(f"run {run.run_id} ({run.status.value} on {run.backend}, {run.accelerator}); folder {run.run_dir}")
    if args.detach:
        return 0
    return _follow(ctx, run.run_id)


def _follow(ctx, run_id: str) -> int:
    """Show a run's progress until it ends; Ctrl-C cancels it. Exit status 0 only if it succeeded."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from tradewind.tools import RunRequest, WaitForRunRequest, cancel_run, wait_for_run

    console = Console(stderr=True, highlight=False)
    columns = (
        TextColumn("train"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"),
    )
    try:
        with Progress(*columns, console=console) as bar:
            task = bar.add_task("train", total=None, note="starting")

            def progress(done: float, total: float | None = None, message: str | None = None) -> None:
                bar.update(task, completed=done, total=total, note=message or "")

            info = wait_for_run(ctx, WaitForRunRequest(run_id=run_id, timeout_s=3600), progress)
            while info.timed_out:
                info = wait_for_run(ctx, WaitForRunRequest(run_id=run_id, timeout_s=3600), progress)
    except KeyboardInterrupt:
        info = cancel_run(ctx, RunRequest(run_id=run_id))
        console.print(f"cancelled run {run_id} ({info.status.value}); resume it with --set resume_from={run_id}")
        return 130
    if info.summary is not None:
        summary = info.summary
        losses = " -> ".join(
            "n/a" if x is None else f"{x:.4f}" for x in (summary.first_eval_loss, summary.final_eval_loss)
        )
        console.print(
            f"{info.status.value}: eval loss {losses}, {summary.mean_tokens_per_s or 0:,.0f} tok/s; "
            f"run {run_id} in {info.run_dir}"
        )
        return 0
    console.print(f"run {run_id} {info.status.value}: {info.reason}")
    for line in info.log_tail:
        console.print(f"  {line}", markup=False)
    return 1


def _runs(args: argparse.Namespace) -> int:
    from tradewind.tools import ListRunsRequest, RunRequest, cancel_run, get_run, list_runs

    ctx = _context(args)
    if args.action == "show":
        _print_result(get_run(ctx, RunRequest(run_id=args.run)))
        return 0
    if args.action == "cancel":
        info = cancel_run(ctx, RunRequest(run_id=args.run))
        print(f"run {info.run_id}: {info.status.value}" + (f" ({info.reason})" if info.reason else ""))
        return 0
    listed = list_runs(ctx, ListRunsRequest(limit=args.limit))
    # A page ends at an agent's result budget; a terminal has none, so follow the cursor up to --limit runs.
    while listed.next_cursor and (shown := len(listed.runs) + len(listed.unreadable)) < args.limit:
        more = list_runs(ctx, ListRunsRequest(limit=args.limit - shown, cursor=listed.next_cursor))
        listed = more.model_copy(
            update={"runs": listed.runs + more.runs, "unreadable": listed.unreadable + more.unreadable}
        )
    if args.json:
        _print_result(listed)
        return 0
    for run in listed.runs:
        loss = "n/a" if run.eval_loss is None else f"{run.eval_loss:.4f}"
        print(
            f"{run.run_id}  {run.status.value:9}  step {run.step:>6}/{run.total_steps:<6}  eval {loss:>7}  "
            f"{run.backend}/{run.accelerator}" + (f"  ({run.reason})" if run.reason else "")
        )
    for bad in listed.unreadable:
        print(f"{bad.run_id}  UNREADABLE  {bad.reason}")
    print(f"{listed.total} run folder(s) in {ctx.workspace.runs_dir}")
    return 0


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
        help="also let run_pipeline run Python files under DIR (besides <workspace>/pipelines/)",
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
        "--read-only",
        action="store_true",
        help="serve only the tools that change nothing (datasets, runs, metrics and logs to look at)",
    )
    serve.set_defaults(handler=_serve)

    demo = commands.add_parser(
        "demo", parents=[common], help="run the whole agent loop over MCP on Tiny Shakespeare; prints a report path"
    )
    demo.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    demo.set_defaults(handler=_demo)

    tokenize = commands.add_parser(
        "tokenize", parents=[common], help="tokenize files into a token cache; prints the dataset id and counts"
    )
    from_model(tokenize, "TokenizeDatasetRequest", positional=("input",), aliases=_TOKENIZE_ALIASES)
    tokenize.set_defaults(handler=_tokenize)

    train = commands.add_parser(
        "train-tokenizer", parents=[common], help="train a byte-level BPE tokenizer; prints its tokenizer.json path"
    )
    from_model(train, "TrainTokenizerRequest", positional=("input",))
    train.set_defaults(handler=_train_tokenizer)

    inspect = commands.add_parser(
        "inspect", parents=[common], help="describe a token cache: counts, length histogram, samples, bad records"
    )
    from_model(inspect, "InspectDatasetRequest", positional=("dataset_id",))
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.set_defaults(handler=_inspect)

    sample = commands.add_parser(
        "sample", parents=[common], help="generate text from a run's checkpoint; prints the prompt and the text"
    )
    from_model(sample, "SampleTextRequest", positional=("run_id",))
    sample.add_argument("--json", action="store_true", help="print the result as JSON")
    sample.set_defaults(handler=_sample)

    train = commands.add_parser(
        "train", parents=[common], help="launch a training run from a YAML config and follow it with a progress bar"
    )
    train.add_argument("config", help="a TrainConfig as YAML, the schema launch_training takes (see experiments/)")
    train.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. model.n_layers=6"
    )
    train.add_argument("--detach", action="store_true", help="print the run id and return; the run goes on")
    train.set_defaults(handler=_train)

    runs = commands.add_parser("runs", parents=[common], help="list, show or cancel training runs (any backend)")
    actions = runs.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", parents=[common], help="the newest runs with status and losses")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    for action, text in (
        ("show", "one run as JSON: status, where it runs, losses, summary"),
        ("cancel", "stop a run; it keeps its checkpoints"),
    ):
        actions.add_parser(action, parents=[common], help=text).add_argument("run", help="a run id")
    runs.set_defaults(handler=_runs)

    add_export_command(commands, common)
    add_cluster_commands(commands, common)
    return parser


def _add_model_options(command: str | None, parser: argparse.ArgumentParser, model_name: str, **how) -> None:
    """Add the options of the `tradewind.tools` request `model_name` to `parser` if it is the parser of `command`
    (or `command` is None); `how` as `add_model_options` takes it."""
    if command not in (None, parser.prog.split()[-1]):
        return
    import tradewind.tools
    from tradewind.core.cli_options import add_model_options

    add_model_options(parser, getattr(tradewind.tools, model_name), **how)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv[0] if argv else "").parse_args(argv)
    from tradewind.core import TradewindError, configure_logging

    configure_logging(args.log_level)
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
