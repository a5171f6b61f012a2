"""The `tradewind cluster` commands: look at the backends, read a job's log, cancel a job, run a pipeline,
empty the compile cache, end the warm process.

    tradewind cluster status [--json]                  # backends, capacity and use, queued and running jobs
    tradewind cluster logs JOB_ID [--offset N] [--replica N]
    tradewind cluster cancel JOB_ID
    tradewind cluster clear-cache                      # delete the compiled programs in cache/xla
    tradewind cluster release                          # end the warm process that keeps the TPU open
    tradewind cluster pipeline FILE [--run] [--force] [--storage URL]  # plan by default; --run executes here

The Ray backend is shown when `$RAY_ADDRESS` is set. Handlers import what they need when they run,
so registering these commands costs `tradewind --help` nothing.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

from tradewind.core.subcommands import add_command


def _jobs_dir(args: argparse.Namespace):
    from tradewind.core import Workspace

    return Workspace.from_env(args.workspace).jobs_dir


def _backend(args: argparse.Namespace, job_id: str):
    """The local backend, or the Ray one when the job id is unknown locally and Ray is configured."""
    from tradewind.cluster import get_backend
    from tradewind.core import NotFoundError

    jobs_dir = _jobs_dir(args)
    local = get_backend("local", jobs_dir)
    if not os.environ.get("RAY_ADDRESS"):
        return local
    try:
        local.status(job_id)
        return local
    except NotFoundError:
        return get_backend("ray", jobs_dir)


def _status(args: argparse.Namespace) -> int:
    from tradewind.cluster.backends import BACKENDS, get_backend
    from tradewind.core import Workspace

    jobs_dir = _jobs_dir(args)
    names = BACKENDS if os.environ.get("RAY_ADDRESS") else ["local"]
    statuses = [get_backend(name, jobs_dir).cluster_status() for name in names]
    used, files = Workspace.from_env(args.workspace).compile_cache_use()
    if args.json:
        cache = {"compile_cache": {"bytes": used, "files": files}}
        for status in statuses:
            print(json.dumps({**status.model_dump(mode="json"), **cache}))
        return 0
    for status in statuses:
        print(f"backend {status.name}" + (f" ({status.detail})" if status.detail else ""))
        for key, total in status.capacity.items():
            print(f"  {key:>22}: {status.used.get(key, 0):g} used of {total:g}")
        print(f"  running {len(status.running)}, queued {len(status.queued)}")
        for record in [*status.running, *status.queued]:
            print(f"    {record.status.value:9} {record.id}  {record.spec.name}  (submitted {record.submitted_at})")
    print(f"compile cache: {used / 2**30:,.2f} GiB in {files} files (tradewind cluster clear-cache empties it)")
    return 0


def _clear_cache(args: argparse.Namespace) -> int:
    from tradewind.core import Workspace

    workspace = Workspace.from_env(args.workspace)
    freed = workspace.clear_compile_cache()
    print(f"cleared {workspace.compile_cache_dir}: {freed / 2**30:,.2f} GiB freed")
    return 0


def _release(args: argparse.Namespace) -> int:
    from tradewind.cluster.warm import release

    pid = release(_jobs_dir(args))
    print(f"ended the warm process {pid}" if pid else "no warm process runs for this workspace")
    return 0


def _logs(args: argparse.Namespace) -> int:
    chunk = _backend(args, args.job_id).logs(args.job_id, offset=args.offset, replica=args.replica)
    sys.stdout.write(chunk.text)
    print(f"\n[next offset {chunk.next_offset} of {chunk.size}; finished={chunk.finished}]", file=sys.stderr)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    record = _backend(args, args.job_id).cancel(args.job_id)
    print(f"{record.id}: {record.status.value}" + (f" ({record.reason})" if record.reason else ""))
    return 0


def _pipeline(args: argparse.Namespace) -> int:
    from tradewind.cluster.pipeline import PipelineJob, execute_pipeline
    from tradewind.core import Workspace
    from tradewind.core.buckets import check_access

    workspace = Workspace.from_env(args.workspace, tuple(getattr(args, "allow_path", ())))
    pipeline = workspace.resolve_path(args.file, argument="file")  # relative paths start at the workspace root
    job = PipelineJob(
        pipeline=str(pipeline),
        workspace=str(workspace.root),
        force=args.force,
        dry_run=not args.run,
        storage=args.storage,
    )
    if job.storage is not None:
        check_access(job.storage, argument="storage")  # the URL and how to log in, rather than a library's trace
    execute_pipeline(job)
    return 0


def add_cluster_commands(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `tradewind cluster ...` on the CLI's sub-command parser; `common` holds --workspace."""
    # `common` goes on each action only: on both levels, the action's defaults would overwrite the options
    # given before it.
    cluster = commands.add_parser("cluster", help="job backends: status, logs, cancel, pipelines")
    actions = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    register = functools.partial(add_command, actions, common)

    status = register("status", _status, help="backends, capacity and use, queued and running jobs")
    status.add_argument(
        "--json", action="store_true", help="one JSON object per backend, each with the workspace's compile_cache"
    )

    logs = register("logs", _logs, help="print a job's log from a byte offset")
    logs.add_argument("job_id")
    logs.add_argument("--offset", type=int, default=0, help="byte offset to start at (default 0)")
    logs.add_argument("--replica", type=int, default=0, help="replica of a gang job (default 0)")

    cancel = register("cancel", _cancel, help="stop a queued or running job")
    cancel.add_argument("job_id")

    register("clear-cache", _clear_cache, help="empty the workspace's compile cache (cache/xla)")

    register("release", _release, help="end the workspace's warm process, freeing this host's TPU for other programs")

    pipeline = register("pipeline", _pipeline, help="plan (default) or run a step pipeline file")
    pipeline.add_argument("file", help="a Python file defining `steps` (a relative path starts at the workspace root)")
    pipeline.add_argument("--run", action="store_true", help="run the steps that are not cached (default: plan only)")
    pipeline.add_argument("--force", action="store_true", help="rerun steps that failed before")
    pipeline.add_argument(
        "--storage",
        metavar="URL",
        help="a bucket prefix (gs://, s3://): step outputs are also kept under URL/steps, and a step finished there "
        "is downloaded rather than run",
    )
