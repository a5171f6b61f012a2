"""What the `tradewind` data and run commands do: each calls a tool function and prints its result for a
person (a progress bar on stderr, tables, or `--json`).

The parser that routes to these handlers is in `tradewind.cli`. Every handler imports what it needs when it
runs, so importing this module loads nothing beyond the standard library.
"""

from __future__ import annotations

import argparse
import sys


def context(args: argparse.Namespace, named: tuple[str | None, ...] = ()):
    """The tools' context for a command: its workspace, with the paths and buckets it allows. A bucket URL among
    `named` (values the person typed on the command line) is theirs to use; an agent's needs --allow-path."""
    from tradewind.core.buckets import is_remote
    from tradewind.tools import ToolContext

    return ToolContext.open(
        args.workspace,
        (*args.allow_path, *(value for value in named if value and is_remote(value))),
        tuple(getattr(args, "allow_code", ())),
        read_only=getattr(args, "read_only", False),
    )


def with_progress(description: str, work):
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


def print_result(result) -> None:
    print(result.model_dump_json(indent=2))


def tokenize(args: argparse.Namespace) -> int:
    from tradewind.core.cli_options import model_from_args
    from tradewind.tools import TokenizeDatasetRequest, tokenize_dataset

    request = model_from_args(TokenizeDatasetRequest, args)
    ctx = context(args, named=(request.input, request.tokenizer, request.output))
    info = with_progress("tokenizing", lambda progress: tokenize_dataset(ctx, request, progress))
    print_result(info)
    if info.bad_records.skipped:
        print(
            f"skipped {info.bad_records.skipped} bad record(s); first: {info.bad_records.examples[0]}", file=sys.stderr
        )
    return 0


def train_tokenizer(args: argparse.Namespace) -> int:
    from tradewind.core.cli_options import model_from_args
    from tradewind.tools import TrainTokenizerRequest, train_tokenizer

    ctx = context(args)
    request = model_from_args(TrainTokenizerRequest, args)
    print_result(with_progress("reading", lambda progress: train_tokenizer(ctx, request, progress)))
    return 0


def inspect(args: argparse.Namespace) -> int:
    from tradewind.core.cli_options import model_from_args
    from tradewind.tools import InspectDatasetRequest, inspect_dataset

    request = model_from_args(InspectDatasetRequest, args)
    report = inspect_dataset(context(args), request)
    if args.json:
        print_result(report)
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


def sample_options():
    """`SampleTextRequest` as `tradewind sample` takes its options: a list of objects is no command-line type, so
    `--messages` is JSON text or a JSON file's path, which `sample` reads into the request's list."""
    from pydantic import Field

    from tradewind.tools import SampleTextRequest

    class SampleCommandOptions(SampleTextRequest):  # for the parser only: `sample` validates a SampleTextRequest
        messages: str | None = Field(  # type: ignore[assignment]
            default=None,
            description="Chat turns to reply to, instead of prompt: JSON "
            '[{"role": "user", "content": "..."}, ...] (or {"messages": [...]}), or the path (from the workspace '
            "root) of a file holding it.",
        )

    return SampleCommandOptions


def read_messages(ctx, value: str):
    """`--messages`: the JSON list of messages in `value`, or in the file it names (relative to the workspace);
    an object with a `messages` list (a chat record) gives that list.

    Raises:
        InvalidInputError: not JSON. PathEscapeError, NotFoundError: as `Workspace.resolve_path`.
    """
    import json

    from tradewind.core import InvalidInputError

    text, where = value, "its text"
    if not value.lstrip().startswith(("[", "{")):
        path = ctx.workspace.resolve_path(value, argument="messages")
        with ctx.workspace.open(path, "r", argument="messages") as file:
            text, where = file.read(), str(path)
    try:
        messages = json.loads(text)
    except ValueError as error:
        raise InvalidInputError(f"argument 'messages': {where} is not valid JSON ({error})") from None
    return messages.get("messages", messages) if isinstance(messages, dict) else messages


def sample(args: argparse.Namespace) -> int:
    from tradewind.core.cli_options import model_from_args
    from tradewind.tools import SampleTextRequest, sample_text

    ctx = context(args)
    if getattr(args, "messages", None) is not None:
        args.messages = read_messages(ctx, args.messages)
    result = sample_text(ctx, model_from_args(SampleTextRequest, args))
    if args.json:
        print_result(result)
        return 0
    print(result.prompt + result.text)
    print(f"{result.tokens} tokens from step {result.step}; saved to {result.output_file}", file=sys.stderr)
    return 0


def train(args: argparse.Namespace) -> int:
    from tradewind.core import load_config
    from tradewind.tools import LaunchTrainingRequest, launch_training

    request = load_config(LaunchTrainingRequest, args.config, overrides=args.set)
    ctx = context(args, named=(request.storage, request.dataset, request.init_from))
    run = with_progress("preparing the dataset", lambda progress: launch_training(ctx, request, progress))
    print(f"run {run.run_id} ({run.status.value} on {run.backend}, {run.accelerator}); folder {run.run_dir}")
    if args.detach:
        return 0
    return follow(ctx, run.run_id)


def estimate(args: argparse.Namespace) -> int:
    """Size a run before launching it (`estimate_run`): parameters, memory, step time, what the budget trains."""
    from tradewind.core import load_config
    from tradewind.tools import LaunchTrainingRequest
    from tradewind.tools.estimating import EstimateRunRequest, describe_estimate, estimate_run

    # Loaded as `train` loads it, so both name a bad file, line or field the same way.
    config = load_config(LaunchTrainingRequest, args.config, overrides=args.set)
    request = EstimateRunRequest(config=config, time_budget_s=args.budget_s, probe=not args.no_probe)
    ctx = context(args)
    result = with_progress("estimating", lambda progress: estimate_run(ctx, request, progress))
    if args.json:
        print_result(result)
        return 0
    print(describe_estimate(result))
    return 0


def compile_for_slice(args: argparse.Namespace) -> int:
    """Compile a run for a TPU slice on this machine (`estimate_run` with a TPU accelerator): HBM per chip
    against the chip's, and the estimated step time, MFU and what the budget trains."""
    from tradewind.cluster.placement import tpu_accelerator
    from tradewind.core import load_config
    from tradewind.tools import LaunchTrainingRequest
    from tradewind.tools.estimating import EstimateRunRequest, describe_estimate, estimate_run
    from tradewind.tools.tpu_fit import require_libtpu

    require_libtpu()  # estimate_run would fall back to the analytic estimate
    accelerator = tpu_accelerator(args.accelerator)  # a TPU type, with or without `tpu-`; none: this host's chips
    placement = [f"accelerator={accelerator}", f"slices={args.slices}"]
    config = load_config(LaunchTrainingRequest, args.config, overrides=[*args.set, *placement])
    request = EstimateRunRequest(config=config, timeout_s=args.timeout_s)
    ctx = context(args)
    activity = f"compiling for {args.slices} x {accelerator}"
    result = with_progress(activity, lambda progress: estimate_run(ctx, request, progress))
    if args.json:
        print_result(result)
    else:
        print(describe_estimate(result))
    return 0 if result.fits is not False else 1


def follow(ctx, run_id: str) -> int:
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


def runs(args: argparse.Namespace) -> int:
    from tradewind.tools import ListRunsRequest, RunRequest, cancel_run, get_run, list_runs

    ctx = context(args)
    if args.action == "show":
        print_result(get_run(ctx, RunRequest(run_id=args.run)))
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
        print_result(listed)
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


def profile(args: argparse.Namespace) -> int:
    """Profile a run's steps (`profile_run`): the step split, the top ops, the verdict and one suggestion."""
    from tradewind.core.cli_options import model_from_args
    from tradewind.tools import ProfileRunRequest, profile_run
    from tradewind.tools.profiling import describe_profile

    request = model_from_args(ProfileRunRequest, args)
    result = with_progress("profiling", lambda progress: profile_run(context(args), request, progress))
    if args.json:
        print_result(result)
        return 0
    print(describe_profile(result))
    print(f"trace: {result.trace_dir}", file=sys.stderr)
    return 0


def report(args: argparse.Namespace) -> int:
    """One run: its report (`summarize_report`); several: their comparison (`compare_runs`). Prints the paths."""
    from tradewind.tools import CompareRunsRequest, SummarizeReportRequest, compare_runs, summarize_report

    ctx = context(args)
    if len(args.runs) == 1:
        result = summarize_report(ctx, SummarizeReportRequest(run_id=args.runs[0], sample=not args.no_sample))
        anomalies = result.anomalies
    else:
        result = compare_runs(ctx, CompareRunsRequest(run_ids=args.runs, metric=args.metric))
        anomalies = [anomaly for run in result.runs for anomaly in run.anomalies]
    if args.json:
        print_result(result)
        return 0
    if len(args.runs) > 1:
        print(f"better on {result.compared_on} at {result.at_tokens:,} tokens: {result.best_run or 'none'}")
    print(f"{len(anomalies)} anomal{'y' if len(anomalies) == 1 else 'ies'}", file=sys.stderr)
    print(result.report_path)
    print(result.html_path)
    return 0
