"""Confinement: every path stays inside the workspace or an allowed root, workspace internals are never an
input, and running code is a grant of its own (`pipelines/` or `--allow-code`), apart from reading inputs."""

import inspect
import json
import os
import re
import shutil
import stat

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

from tradewind.core import InvalidInputError, NotFoundError, PathEscapeError, TradewindError
from tradewind.server import build_server
from tradewind.server.adapter import as_mcp_tool
from tradewind.server.dashboard import dashboard_data
from tradewind.tools import (
    CompareRunsRequest,
    InspectDatasetRequest,
    LaunchTrainingRequest,
    ListExperimentsRequest,
    ProfileRunRequest,
    ReadMetricsRequest,
    SampleTextRequest,
    SummarizeReportRequest,
    TailLogsRequest,
    TokenizeDatasetRequest,
    ToolContext,
    TrainTokenizerRequest,
    compare_runs,
    inspect_dataset,
    launch_training,
    list_datasets,
    list_experiments,
    list_runs,
    profile_run,
    read_metrics,
    sample_text,
    summarize_report,
    tail_logs,
    tokenize_dataset,
    train_tokenizer,
)
from tradewind.tools.cluster import RunPipelineRequest, run_pipeline
from tradewind.tools.datasets import ListDatasetsRequest, resolve_dataset
from tradewind.tools.runs import ListRunsRequest, RunRequest, get_run

PIPELINE = """
import os
from pathlib import Path
from tradewind.cluster import Step

Path("made-at-import.txt").write_text("top-level code ran here")
Path({seen!r}).write_text(os.getcwd())

def write(out, config, inputs):
    (out / "out.txt").write_text(config["word"])

steps = [Step("only", write, {{"word": "a"}})]
"""


@pytest.fixture
def ctx(tmp_path, small_corpus) -> ToolContext:
    context = ToolContext.open(tmp_path / "ws", allowed_paths=(tmp_path / "inputs",), allowed_code=(tmp_path / "code",))
    shutil.copy(small_corpus, context.workspace.root / "corpus.txt")
    return context


@pytest.fixture
def outside(tmp_path):
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "secret.txt").write_text("not yours\n" * 50)
    return folder


def test_a_dataset_folder_that_is_a_symlink_out_of_the_workspace_is_refused(ctx, outside):
    (ctx.workspace.datasets_dir / "ds-linked").symlink_to(outside)
    with pytest.raises(PathEscapeError, match=r"argument 'dataset_id': dataset 'ds-linked' is refused .* symlink"):
        ctx.workspace.dataset_dir("ds-linked")
    with pytest.raises(PathEscapeError, match="argument 'dataset'"):
        resolve_dataset(ctx, "ds-linked")
    (outside / "manifest.json").write_text("{}")
    assert list_datasets(ctx, ListDatasetsRequest()).total == 0


def test_a_run_folder_that_is_a_symlink_out_of_the_workspace_is_refused(ctx, outside):
    (ctx.workspace.runs_dir / "run-linked").symlink_to(outside)
    with pytest.raises(PathEscapeError, match=r"argument 'run_id': run 'run-linked' is refused .* leads to"):
        get_run(ctx, RunRequest(run_id="run-linked"))
    with pytest.raises(PathEscapeError, match="argument 'resume_from'"):
        ctx.workspace.run_folder("run-linked", argument="resume_from")


def test_a_tokenizer_folder_that_is_a_symlink_out_of_the_workspace_is_refused(ctx, outside):
    (ctx.workspace.root / "tokenizers").symlink_to(outside)
    with pytest.raises(PathEscapeError, match=r"tokenizer folder .* is refused because it is a symlink"):
        train_tokenizer(ctx, TrainTokenizerRequest(input="corpus.txt", vocab_size=300))
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    with pytest.raises(PathEscapeError, match="argument 'tokenizer'"):
        tokenize_dataset(ctx, TokenizeDatasetRequest(input="corpus.txt", tokenizer="tokenizers/secret.txt"))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "argument 'input': the path is empty"),
        ("  ", "argument 'input': the path is empty"),
        ("corpus\x00.txt", "argument 'input': the path 'corpus\\\\x00.txt' contains a NUL byte"),
        ("data/*\x00", "contains a NUL byte"),
        ("a/" * 2100, "argument 'input': the path is 4200 characters long; the limit is 4096"),
        ("x" * 300 + ".txt", "argument 'input': the path component 'x+'... is over 255 bytes long"),
    ],
)
def test_an_empty_nul_or_over_long_input_is_refused_naming_the_argument(ctx, value, expected):
    with pytest.raises(InvalidInputError, match=expected):
        tokenize_dataset(ctx, TokenizeDatasetRequest(input=value))
    with pytest.raises(InvalidInputError, match="argument 'where'"):
        ctx.workspace.resolve_path(value, argument="where")


@pytest.mark.anyio
async def test_a_nul_byte_or_over_long_path_through_mcp_is_an_error_that_says_why(ctx):
    server = MCPServer(name="confinement")
    server.add_tool(as_mcp_tool(tokenize_dataset, ctx), name="tokenize_dataset", structured_output=True)
    async with Client(server) as client:
        nul = await client.call_tool("tokenize_dataset", {"input": "corpus\x00.txt"})
        long = await client.call_tool("tokenize_dataset", {"input": "a/" * 2100})
    nul_text = " ".join(block.text for block in nul.content)
    assert nul.is_error and "argument 'input': character 6 is U+0000" in nul_text
    long_text = " ".join(block.text for block in long.content)
    assert long.is_error and "argument 'input': 4,200 characters; the limit is 4,096" in long_text


@pytest.mark.parametrize("value", ["jobs/cluster.sqlite", "jobs", "jobs/*", ".", "*/*"])
def test_the_job_database_and_logs_are_never_an_input(ctx, value):
    assert (ctx.workspace.jobs_dir / "cluster.sqlite").is_file()
    with pytest.raises(InvalidInputError, match=r"argument 'input': .* workspace internals: .*jobs/ folder"):
        tokenize_dataset(ctx, TokenizeDatasetRequest(input=value))
    with pytest.raises(InvalidInputError, match="workspace internals"):
        train_tokenizer(ctx, TrainTokenizerRequest(input=value, vocab_size=300))


def test_the_files_of_a_token_cache_are_never_an_input(ctx):
    info = tokenize_dataset(ctx, TokenizeDatasetRequest(input="corpus.txt"))
    shard = next(p for p in sorted((ctx.workspace.datasets_dir / info.dataset_id).rglob("*")) if p.is_file())
    for value in (str(shard), f"datasets/{info.dataset_id}", f"datasets/{info.dataset_id}/*/*", "datasets"):
        with pytest.raises(InvalidInputError, match=r"workspace internals: .* inside the workspace's token caches"):
            tokenize_dataset(ctx, TokenizeDatasetRequest(input=value))
        with pytest.raises(InvalidInputError, match="token caches"):
            train_tokenizer(ctx, TrainTokenizerRequest(input=value, vocab_size=300))


def test_a_pipeline_under_an_allow_path_root_is_refused_and_one_elsewhere_in_the_workspace_too(ctx, tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    seen = tmp_path / "seen.txt"
    (inputs / "pipe.py").write_text(PIPELINE.format(seen=str(seen)))
    with pytest.raises(PathEscapeError, match=r"argument 'pipeline': .* --allow-path, which grants reading inputs"):
        run_pipeline(ctx, RunPipelineRequest(pipeline=str(inputs / "pipe.py")))
    (ctx.workspace.root / "pipe.py").write_text(PIPELINE.format(seen=str(seen)))
    with pytest.raises(PathEscapeError, match=r"in the workspace, and files there are not code .*--allow-code DIR"):
        run_pipeline(ctx, RunPipelineRequest(pipeline="pipe.py"))
    ctx.workspace.pipelines_dir.symlink_to(inputs)
    with pytest.raises(PathEscapeError, match="argument 'pipeline'"):
        run_pipeline(ctx, RunPipelineRequest(pipeline="pipelines/pipe.py"))
    assert not seen.exists()  # no refused file was imported


def test_a_pipeline_under_a_granted_pipelines_folder_is_planned_with_its_import_in_a_fresh_temporary_folder(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    seen = tmp_path / "seen.txt"
    ctx = ToolContext.open(tmp_path / "ws", allowed_code=(tmp_path / "ws" / "pipelines",))
    ctx.workspace.pipelines_dir.mkdir()
    (ctx.workspace.pipelines_dir / "pipe.py").write_text(PIPELINE.format(seen=str(seen)))
    plan = run_pipeline(ctx, RunPipelineRequest(pipeline="pipelines/pipe.py"))
    assert [(s.name, s.action) for s in plan.steps] == [("only", "run")]
    assert "tradewind-plan-" in seen.read_text() and not seen.read_text().startswith(str(ctx.workspace.root))
    assert not list(ctx.workspace.root.rglob("made-at-import.txt")) and not (tmp_path / "made-at-import.txt").exists()
    assert not (ctx.workspace.root / "steps").exists() or not any((ctx.workspace.root / "steps").iterdir())


def test_a_pipeline_under_an_allow_code_root_is_accepted(ctx, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "pipe.py").write_text(PIPELINE.format(seen=str(tmp_path / "seen.txt")))
    plan = run_pipeline(ctx, RunPipelineRequest(pipeline=str(code / "pipe.py")))
    assert [(s.name, s.action) for s in plan.steps] == [("only", "run")]
    with pytest.raises(NotFoundError, match="argument 'pipeline': no file"):
        run_pipeline(ctx, RunPipelineRequest(pipeline=str(code / "missing.py")))


# --- No file or folder inside a workspace object leads outside (issue 23, item 3) ---------------------------------
#
# A hand-made workspace holds a failed run `run-a` (record, config, metrics, log, summary, profile, a checkpoint
# folder, samples), a finished `run-b`, a token cache `ds-trap`, a tokenizer folder `tkdir` and run-a's report.
# Each case replaces one entry with a symlink to a copy outside the workspace holding a marker secret, then calls
# every tool, resource and dashboard function that reads or writes that entry: each must refuse naming the
# symlink, the secret must appear nowhere, and nothing outside may change.

SECRET = "tw-marker-secret-7c1e"
RUN = "run-a"
DATASET = "ds-trap"
# Tools of another helper's files (sampling, profiling, launching, experiments): their cases fail until they
# confine these reads and writes too.
LATER = {"sample_text", "profile_run", "resume_from", "export"}


@pytest.fixture(scope="module")
def template(tmp_path_factory, small_corpus):
    """The workspace every case copies (tokenizing and training a tokenizer once per module)."""
    from runs_helpers import metric_rows, write_run

    from tradewind.cluster import JobStatus
    from tradewind.runs import ProfileSummary, RunRecord, TrainConfig, TrainSummary

    root = tmp_path_factory.mktemp("template") / "ws"
    ctx = ToolContext.open(root)
    shutil.copy(small_corpus, root / "corpus.txt")
    (root / "settings.yaml").write_text("backend: local\n")
    info = tokenize_dataset(ctx, TokenizeDatasetRequest(input="corpus.txt"))
    (ctx.workspace.datasets_dir / info.dataset_id).rename(ctx.workspace.datasets_dir / DATASET)
    trained = train_tokenizer(ctx, TrainTokenizerRequest(input="corpus.txt", vocab_size=300))
    (root / "tkdir").mkdir()
    shutil.copy(trained.tokenizer, root / "tkdir" / "tokenizer.json")
    config = TrainConfig(
        dataset=str(ctx.workspace.datasets_dir / DATASET),  # as launch_training records it: resolved
        steps=20,
        batch_size=8,
        seq_len=32,
        model={"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
    )
    summary = TrainSummary(
        parameters=1, steps=20, tokens_seen=5120, final_loss=2.0, first_eval_loss=5.0, final_eval_loss=2.1,
        best_eval_loss=2.1, mean_tokens_per_s=100.0, compile_s=1.0, wall_s=2.0,
    )  # fmt: skip
    profile = ProfileSummary(
        steps=2, compile_s=1.0, mean_step_s=0.1, tokens_per_s=100.0, parameters=1, trace_dir="profile", backend="cpu"
    )
    for run_id, status in ((RUN, JobStatus.FAILED), ("run-b", JobStatus.SUCCEEDED)):
        record = RunRecord(run_id=run_id, backend="process", status=status, reason="exited with code 1")
        layout = write_run(ctx, run_id, metric_rows(steps=20, eval_every=10), record)
        layout.config.write_text(config.model_dump_json())
        layout.summary.write_text(summary.model_dump_json())
        layout.log.write_text("step 5 loss 3.0\nTraceback: RuntimeError: boom\n")
        (layout.profile).mkdir()
        (layout.profile / "summary.json").write_text(profile.model_dump_json())
        (layout.checkpoints / "5").mkdir(parents=True)
        (layout.checkpoints / "5" / "state").write_bytes(b"\0" * 16)
        layout.samples.mkdir()
    (ctx.workspace.reports_dir / f"{RUN}.md").write_text("# Training report\n")
    (ctx.workspace.reports_dir / f"{RUN}-loss.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return root


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def _link_out(root, relative, outside):
    """Move `root/relative` outside (a secret planted in it) and leave a symlink to it in its place."""
    inside = root / relative
    target = outside / relative.replace("/", "__")
    shutil.move(inside, target)
    if target.is_dir():
        (target / "secret.txt").write_text(SECRET)
    else:
        target.write_text(json.dumps({"secret": SECRET}) + "\n")
    inside.symlink_to(target, target_is_directory=target.is_dir())


async def _refusal(call):
    """The error a call ends with (its text), or the result it returned, marked as not refused."""
    try:
        result = call()
        if inspect.isawaitable(result):
            result = await result
    except (TradewindError, MCPError) as error:
        return f"{type(error).__name__}: {error}"
    return f"NOT REFUSED: {result}"


def _resource(ctx, uri):
    async def read():
        async with Client(build_server(ctx)) as client:
            try:
                return await client.read_resource(uri)
            except MCPError as error:  # raised outside the client's task group, not as a group of one
                failure = error
        raise failure

    return read


def _unreadable_reason(ctx, run_id):
    listing = list_runs(ctx, ListRunsRequest())
    reasons = {entry.run_id: entry.reason for entry in listing.unreadable}
    if run_id in reasons:
        raise PathEscapeError(reasons[run_id])  # list_runs tells of the refusal instead of raising it
    return listing


CALLS = {
    "get_run": lambda ctx: get_run(ctx, RunRequest(run_id=RUN)),
    "list_runs": lambda ctx: _unreadable_reason(ctx, RUN),
    "tail_logs": lambda ctx: tail_logs(ctx, TailLogsRequest(run_id=RUN)),
    "read_metrics": lambda ctx: read_metrics(ctx, ReadMetricsRequest(run_id=RUN)),
    "summarize_report": lambda ctx: summarize_report(ctx, SummarizeReportRequest(run_id=RUN, sample=False)),
    "compare_runs": lambda ctx: compare_runs(ctx, CompareRunsRequest(run_ids=[RUN, "run-b"])),
    "dashboard_data": lambda ctx: dashboard_data(ctx, [RUN]),
    "config resource": lambda ctx: _resource(ctx, f"tradewind://runs/{RUN}/config")(),
    "metrics resource": lambda ctx: _resource(ctx, f"tradewind://runs/{RUN}/metrics")(),
    "logs resource": lambda ctx: _resource(ctx, f"tradewind://runs/{RUN}/logs")(),
    "profile resource": lambda ctx: _resource(ctx, f"tradewind://runs/{RUN}/profile")(),
    "report resource": lambda ctx: _resource(ctx, f"tradewind://runs/{RUN}/report")(),
    "plot resource": lambda ctx: _resource(ctx, f"tradewind://runs/{RUN}/plot")(),
    "manifest resource": lambda ctx: _resource(ctx, f"tradewind://datasets/{DATASET}/manifest")(),
    "inspect_dataset": lambda ctx: inspect_dataset(ctx, InspectDatasetRequest(dataset_id=DATASET)),
    "launch_training": lambda ctx: launch_training(ctx, LaunchTrainingRequest(dataset=DATASET, steps=2)),
    "tokenize with tkdir": lambda ctx: tokenize_dataset(
        ctx, TokenizeDatasetRequest(input="corpus.txt", tokenizer="tkdir")
    ),
    "tokenize with tkdir/tokenizer.json": lambda ctx: tokenize_dataset(
        ctx, TokenizeDatasetRequest(input="corpus.txt", tokenizer="tkdir/tokenizer.json")
    ),
    "sample_text": lambda ctx: sample_text(
        ctx, SampleTextRequest(run_id=RUN, prompt="The", max_tokens=2, timeout_s=60)
    ),
    "profile_run": lambda ctx: profile_run(ctx, ProfileRunRequest(run_id=RUN, timeout_s=120)),
    "resume_from": lambda ctx: launch_training(ctx, LaunchTrainingRequest(steps=30, resume_from=RUN)),
    "export": lambda ctx: list_experiments(ctx, ListExperimentsRequest(export="tsv")),
}
RUN_READERS = ("get_run", "list_runs", "dashboard_data", "summarize_report")
# (the entry turned into a symlink that leads out, the calls that read or write through it)
TRAPS = {
    f"runs/{RUN}/train.log": (*RUN_READERS, "tail_logs", "logs resource"),
    f"runs/{RUN}/metrics.jsonl": (*RUN_READERS, "read_metrics", "compare_runs", "metrics resource"),
    f"runs/{RUN}/run.json": (*RUN_READERS, "read_metrics", "tail_logs"),
    f"runs/{RUN}/summary.json": RUN_READERS,
    f"runs/{RUN}/config.json": (*RUN_READERS, "compare_runs", "config resource"),
    f"runs/{RUN}/profile/summary.json": ("summarize_report", "profile resource"),
    f"runs/{RUN}/profile": ("summarize_report", "profile resource", "profile_run"),
    f"runs/{RUN}/checkpoints/5": ("summarize_report", "sample_text", "resume_from"),
    f"runs/{RUN}/checkpoints": ("summarize_report", "sample_text", "resume_from"),
    f"runs/{RUN}/samples": ("sample_text",),
    f"datasets/{DATASET}/manifest.json": ("inspect_dataset", "manifest resource", "launch_training"),
    f"datasets/{DATASET}/train": ("inspect_dataset", "launch_training"),
    "tkdir/tokenizer.json": ("tokenize with tkdir", "tokenize with tkdir/tokenizer.json"),
    "tkdir": ("tokenize with tkdir", "tokenize with tkdir/tokenizer.json"),
    f"reports/{RUN}.md": ("report resource", "summarize_report"),
    f"reports/{RUN}-loss.png": ("plot resource", "summarize_report"),
    "reports": ("report resource", "plot resource", "summarize_report", "compare_runs", "export"),
}
CASES = [
    pytest.param(trap, call, id=f"{trap} {call}" + (" (H4)" if call in LATER else ""))
    for trap, calls in TRAPS.items()
    for call in calls
]


@pytest.mark.anyio
@pytest.mark.parametrize(("trap", "call"), CASES)
async def test_a_symlink_inside_a_workspace_object_that_leads_out_is_refused_and_nothing_outside_is_touched(
    template, tmp_path, trap, call
):
    root = tmp_path / "ws"
    shutil.copytree(template, root, symlinks=True)
    for config in root.glob("runs/*/config.json"):  # the copy's runs train on the copy's dataset
        config.write_text(config.read_text().replace(str(template), str(root)))
    outside = tmp_path / "outside"
    outside.mkdir()
    _link_out(root, trap, outside)
    before = _snapshot(outside)
    ctx = ToolContext.open(root)
    text = await _refusal(lambda: CALLS[call](ctx))
    assert re.search(r"refused .*symlink", text), text[:2000]
    assert SECRET not in text
    assert _snapshot(outside) == before


# --- Hard links and special files in place of a workspace file (issue 38, items 1-3 and 6) ---------------------

FILE_TRAPS = {trap: calls for trap, calls in TRAPS.items() if "." in trap.rsplit("/", 1)[-1] or trap.endswith("/5")}
FILE_TRAPS.pop(f"runs/{RUN}/checkpoints/5")  # a folder; its file is trapped below
FILE_TRAPS[f"runs/{RUN}/checkpoints/5/state"] = ("sample_text", "resume_from")
FILE_TRAPS[f"datasets/{DATASET}/train/shard-00000.bin"] = ("inspect_dataset", "launch_training")
FILE_CASES = [pytest.param(trap, call, id=f"{trap} {call}") for trap, calls in FILE_TRAPS.items() for call in calls]
# summarize_report writes these afresh: a new file is renamed over whatever was there, which is never written into.
REWRITTEN = {(f"reports/{RUN}.md", "summarize_report"), (f"reports/{RUN}-loss.png", "summarize_report")}


def _replace(root, relative, make):
    """Put `make(path)` where the file `root/relative` was (the file itself gone)."""
    inside = root / relative
    assert inside.is_file(), f"{relative} is not a file of the template"
    inside.unlink()
    make(inside)


def _workspace_copy(template, tmp_path):
    root = tmp_path / "ws"
    shutil.copytree(template, root, symlinks=True)
    for config in root.glob("runs/*/config.json"):  # the copy's runs train on the copy's dataset
        config.write_text(config.read_text().replace(str(template), str(root)))
    return root


@pytest.mark.anyio
@pytest.mark.parametrize(("trap", "call"), FILE_CASES)
async def test_a_hard_link_in_place_of_a_workspace_file_is_refused_and_its_outside_file_never_read(
    template, tmp_path, trap, call
):
    """A hard link to a file outside is a regular file whose path lies inside: only its link count tells."""
    root = _workspace_copy(template, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text(json.dumps({"secret": SECRET}) + "\n")
    _replace(root, trap, lambda path: path.hardlink_to(secret))
    text = await _refusal(lambda: CALLS[call](ToolContext.open(root)))
    if (trap, call) in REWRITTEN:
        assert text.startswith("NOT REFUSED") and (root / trap).stat().st_nlink == 1
    else:
        assert re.search(r"refused.*2 hard links", text), text[:2000]
    assert SECRET not in text
    assert secret.read_text() == json.dumps({"secret": SECRET}) + "\n"


@pytest.mark.anyio
@pytest.mark.parametrize(("trap", "call"), FILE_CASES)
async def test_a_fifo_in_place_of_a_workspace_file_is_refused_at_once_naming_it(template, tmp_path, trap, call):
    root = _workspace_copy(template, tmp_path)
    _replace(root, trap, os.mkfifo)
    text = await _refusal(lambda: CALLS[call](ToolContext.open(root)))
    if (trap, call) in REWRITTEN:
        assert text.startswith("NOT REFUSED") and (root / trap).is_file()
    else:
        assert re.search(r"refused.*a FIFO, not a regular file", text), text[:2000]


def _zero_device(path):
    """A character device like /dev/zero at `path` (root may make one; others, with a bind mount)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making a device node needs root here")


@pytest.mark.parametrize("trap", [f"runs/{RUN}/config.json", f"runs/{RUN}/train.log", "corpus.txt"])
def test_a_device_in_place_of_a_workspace_file_is_refused_without_reading_it(template, tmp_path, trap):
    root = _workspace_copy(template, tmp_path)
    _replace(root, trap, _zero_device)
    ctx = ToolContext.open(root)
    calls = {
        "corpus.txt": lambda: tokenize_dataset(ctx, TokenizeDatasetRequest(input="corpus.txt")),
        f"runs/{RUN}/config.json": lambda: get_run(ctx, RunRequest(run_id=RUN)),
        f"runs/{RUN}/train.log": lambda: tail_logs(ctx, TailLogsRequest(run_id=RUN)),
    }
    with pytest.raises(InvalidInputError, match=r"refused: it is a character device, not a regular file"):
        calls[trap]()


@pytest.mark.parametrize("make", [os.mkfifo, _zero_device], ids=["fifo", "device"])
@pytest.mark.parametrize("tool", ["tokenize_dataset", "train_tokenizer"])
def test_special_files_as_input_are_refused_and_in_a_folder_skipped_and_reported(ctx, make, tool):
    data = ctx.workspace.root / "data"
    data.mkdir()
    shutil.copy(ctx.workspace.root / "corpus.txt", data / "a.txt")
    make(data / "b.txt")
    call = {
        "tokenize_dataset": lambda value: tokenize_dataset(ctx, TokenizeDatasetRequest(input=value)),
        "train_tokenizer": lambda value: train_tokenizer(ctx, TrainTokenizerRequest(input=value, vocab_size=300)),
    }[tool]
    kind = "a FIFO" if make is os.mkfifo else "a character device"
    with pytest.raises(InvalidInputError, match=rf"argument 'input': .*b\.txt is refused: it is {kind}, not a regular"):
        call("data/b.txt")
    result = call("data")  # the folder: its regular file read, the special one left out and said so
    assert (
        result.bad_records.examples[0]
        == f"{data / 'b.txt'}: not read: it is {kind}, not a regular file: only regular files are read"
    )
    result = call("data/*.txt")  # a glob, the same
    assert result.bad_records.examples[0].startswith(f"{data / 'b.txt'}: not read: it is {kind}")


def test_a_hard_linked_input_file_is_refused_and_in_a_folder_skipped_and_reported(ctx, outside):
    data = ctx.workspace.root / "data"
    data.mkdir()
    shutil.copy(ctx.workspace.root / "corpus.txt", data / "a.txt")
    (data / "b.txt").hardlink_to(outside / "secret.txt")
    with pytest.raises(InvalidInputError, match=r"b\.txt is refused: it has 2 hard links"):
        tokenize_dataset(ctx, TokenizeDatasetRequest(input="data/b.txt"))
    info = tokenize_dataset(ctx, TokenizeDatasetRequest(input="data"))
    assert info.bad_records.examples[0].startswith(f"{data / 'b.txt'}: not read: it has 2 hard links")
    assert "not yours" not in json.dumps(
        inspect_dataset(ctx, InspectDatasetRequest(dataset_id=info.dataset_id)).model_dump()
    )


@pytest.mark.parametrize("make", [os.mkfifo, _zero_device], ids=["fifo", "device"])
def test_settings_that_are_a_special_file_are_refused_naming_it_not_ignored(ctx, make):
    make(ctx.workspace.root / "settings.yaml")
    with pytest.raises(TradewindError, match=r"settings\.yaml.* is refused: it is a (FIFO|character device)"):
        launch_training(ctx, LaunchTrainingRequest(dataset="builtin:tinyshakespeare", steps=2))


# --- Workspace internals are never inputs, by name or by glob (issue 23, item 5) --------------------------------


@pytest.mark.parametrize(
    ("value", "internal"),
    [
        (".tradewind-token", "'.tradewind-token'"),
        ("[.a]*", "'.tradewind-token'"),
        (".*", "'.tradewind-token'"),
        ("notes/.hidden/secret.txt", "'.hidden'"),
        ("notes/.*/*", "'.hidden'"),
        ("settings.yaml", "settings.yaml"),
        ("settings.*", "settings.yaml"),
        ("cache/xla/program.bin", "cache/ folder"),
        ("cache", "cache/ folder"),
        ("c*/*/*", "cache/ folder"),
    ],
)
def test_the_token_file_settings_cache_and_every_dot_file_are_never_an_input_by_name_or_glob(ctx, value, internal):
    root = ctx.workspace.root
    (root / ".tradewind-token").write_text(SECRET)
    (root / "settings.yaml").write_text(f"# {SECRET}\nbackend: local\n")
    (root / "notes" / ".hidden").mkdir(parents=True)
    (root / "notes" / ".hidden" / "secret.txt").write_text(SECRET)
    (root / "notes" / "visible.txt").write_text("a note\n")
    (root / "cache" / "xla").mkdir(parents=True)
    (root / "cache" / "xla" / "program.bin").write_text(SECRET)
    for call in (
        lambda: tokenize_dataset(ctx, TokenizeDatasetRequest(input=value)),
        lambda: train_tokenizer(ctx, TrainTokenizerRequest(input=value, vocab_size=300)),
    ):
        with pytest.raises(InvalidInputError, match=r"argument 'input': .* workspace internals: .*") as caught:
            call()
        assert internal in str(caught.value)
    assert not any(ctx.workspace.datasets_dir.iterdir())


@pytest.mark.parametrize(
    ("value", "internal"),
    [(".tradewind-token", "'.tradewind-token'"), ("settings.yaml", "settings.yaml"), ("jobs", "jobs/ folder")],
)
def test_a_tokenizer_or_init_from_that_names_a_workspace_internal_is_refused(ctx, value, internal):
    (ctx.workspace.root / ".tradewind-token").write_text(SECRET)
    (ctx.workspace.root / "settings.yaml").write_text("backend: local\n")
    with pytest.raises(InvalidInputError, match=rf"argument 'tokenizer': .* workspace internals: .*{internal}"):
        tokenize_dataset(ctx, TokenizeDatasetRequest(input="corpus.txt", tokenizer=value))
    with pytest.raises(InvalidInputError, match=rf"argument 'init_from': .* workspace internals: .*{internal}"):
        launch_training(ctx, LaunchTrainingRequest(dataset="builtin:tinyshakespeare", init_from=value))
    assert not any(ctx.workspace.datasets_dir.iterdir()) and not any(ctx.workspace.runs_dir.iterdir())
