"""Confinement: every path stays inside the workspace or an allowed root, workspace internals are never an
input, and running code is a grant of its own (`pipelines/` or `--allow-code`), apart from reading inputs."""

import shutil

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer

from tradewind.core import InvalidInputError, NotFoundError, PathEscapeError
from tradewind.server.adapter import as_mcp_tool
from tradewind.tools import (
    TokenizeDatasetRequest,
    ToolContext,
    TrainTokenizerRequest,
    list_datasets,
    tokenize_dataset,
    train_tokenizer,
)
from tradewind.tools.cluster import RunPipelineRequest, run_pipeline
from tradewind.tools.datasets import ListDatasetsRequest, resolve_dataset
from tradewind.tools.runs import RunRequest, get_run

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
    assert nul.is_error and "NUL byte" in " ".join(block.text for block in nul.content)
    assert long.is_error and "the limit is 4096" in " ".join(block.text for block in long.content)


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
    with pytest.raises(PathEscapeError, match=r"in the workspace but not in .*pipelines.*--allow-code DIR"):
        run_pipeline(ctx, RunPipelineRequest(pipeline="pipe.py"))
    ctx.workspace.pipelines_dir.symlink_to(inputs)
    with pytest.raises(PathEscapeError, match="argument 'pipeline'"):
        run_pipeline(ctx, RunPipelineRequest(pipeline="pipelines/pipe.py"))
    assert not seen.exists()  # no refused file was imported


def test_a_pipeline_under_pipelines_is_planned_with_its_import_in_a_fresh_temporary_folder(ctx, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seen = tmp_path / "seen.txt"
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
