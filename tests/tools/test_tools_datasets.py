"""The dataset tools through their Python API, on fresh workspaces."""

import json
import shutil
from pathlib import Path

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer

from tradewind.cli import main
from tradewind.core import InvalidInputError, NotFoundError, PathEscapeError
from tradewind.data import TokenizeConfig, cache_id, load_tokenizer, open_token_cache, source_files
from tradewind.server.adapter import as_mcp_tool
from tradewind.tools import (
    InspectDatasetRequest,
    ListDatasetsRequest,
    TokenizeDatasetRequest,
    ToolContext,
    TrainTokenizerRequest,
    inspect_dataset,
    list_datasets,
    tokenize_dataset,
    train_tokenizer,
)
from tradewind.tools.datasets import resolve_dataset


@pytest.fixture
def workspace(tmp_path, small_corpus) -> ToolContext:
    context = ToolContext.open(tmp_path / "ws")
    shutil.copy(small_corpus, context.workspace.root / "corpus.txt")
    folder = context.workspace.root / "jsonl"
    folder.mkdir()
    for part in range(2):
        rows = [json.dumps({"meta": {"body": f"part {part} document {i} " + "la " * i}}) for i in range(200)]
        rows.insert(5, "not json")
        (folder / f"p{part}.jsonl").write_text("\n".join(rows) + "\n")
    return context


def test_tokenize_dataset_reuses_the_cache_for_the_same_inputs_tokenizer_and_options(workspace):
    calls = []
    first = tokenize_dataset(
        workspace, TokenizeDatasetRequest(input="corpus.txt"), lambda d, t, m: calls.append((d, t, m))
    )
    again = tokenize_dataset(workspace, TokenizeDatasetRequest(input="corpus.txt", workers=2))
    other = tokenize_dataset(workspace, TokenizeDatasetRequest(input="corpus.txt", val_fraction=0.2))

    assert (first.reused, again.reused, other.reused) == (False, True, False)
    assert first.dataset_id == again.dataset_id != other.dataset_id
    assert first.documents["train"] + first.documents["val"] == 600 and first.shards == 1
    assert calls[-1] == (calls[-1][1], calls[-1][1], "input bytes tokenized")


def test_tokenize_dataset_reads_a_glob_of_jsonl_and_reports_skipped_records(workspace):
    info = tokenize_dataset(workspace, TokenizeDatasetRequest(input="jsonl/*.jsonl", text_field="meta.body", workers=2))

    root = workspace.workspace.root
    assert info.documents["train"] + info.documents["val"] == 400 and info.shards == 2
    assert info.bad_records.skipped == 2
    assert info.bad_records.per_file == {str(root / "jsonl" / "p0.jsonl"): 1, str(root / "jsonl" / "p1.jsonl"): 1}
    assert info.bad_records.examples[0].startswith(f"{root / 'jsonl' / 'p0.jsonl'}:6: malformed JSON")
    with pytest.raises(InvalidInputError, match=r"p0\.jsonl:6: malformed JSON"):
        tokenize_dataset(workspace, TokenizeDatasetRequest(input="jsonl/*.jsonl", text_field="meta.body", strict=True))


def test_a_glob_may_not_climb_out_of_the_workspace(workspace):
    with pytest.raises(PathEscapeError, match="argument 'input'"):
        tokenize_dataset(workspace, TokenizeDatasetRequest(input="../../*.txt"))
    with pytest.raises(InvalidInputError, match=r"may not contain '\.\.'"):
        tokenize_dataset(workspace, TokenizeDatasetRequest(input="jsonl/*/../../../x"))


def test_train_tokenizer_then_tokenize_with_it_records_its_fingerprint_and_bos(workspace):
    trained = train_tokenizer(workspace, TrainTokenizerRequest(input="corpus.txt", vocab_size=400))
    again = train_tokenizer(workspace, TrainTokenizerRequest(input="corpus.txt", vocab_size=400))
    info = tokenize_dataset(
        workspace, TokenizeDatasetRequest(input="corpus.txt", tokenizer=trained.tokenizer, prepend_bos=True)
    )

    assert (trained.reused, again.reused) == (False, True) and trained.tokenizer == again.tokenizer
    assert trained.vocab_size == 400 and (trained.eos_id, trained.bos_id) == (0, 1)
    manifest = open_token_cache(info.path).manifest
    assert manifest.tokenizer.fingerprint == trained.fingerprint and manifest.prepend_bos is True
    assert info.vocab_size == 400 and info.dtype == "uint16"
    byte_tokens = tokenize_dataset(workspace, TokenizeDatasetRequest(input="corpus.txt")).tokens["train"]
    assert info.tokens["train"] < byte_tokens * 0.7  # merges shorten the stream even at 400 tokens


def test_inspect_dataset_shows_counts_histogram_samples_and_bad_records(workspace):
    info = tokenize_dataset(workspace, TokenizeDatasetRequest(input="jsonl", text_field="meta.body"))

    report = inspect_dataset(workspace, InspectDatasetRequest(dataset_id=info.dataset_id, samples=2, sample_chars=30))

    assert report.documents == info.documents and report.tokens == info.tokens
    assert sum(report.histogram.counts) == info.documents["train"]
    assert report.histogram.edges[:4] == [0, 1, 2, 4]
    assert report.histogram.min >= len("part 0 document 0 ") + 1
    assert report.samples[0].text.startswith("part 0 document ")
    assert all(len(s.text) <= 30 for s in report.samples) and len(report.samples) == 2
    assert report.bad_records.skipped == 2 and report.note is None


def test_inspect_dataset_of_an_unknown_id_lists_what_there_is(workspace):
    with pytest.raises(NotFoundError, match="unknown dataset id 'ds-nope'"):
        inspect_dataset(workspace, InspectDatasetRequest(dataset_id="ds-nope"))


def test_list_datasets_lists_finished_caches_newest_first_and_skips_unfinished_ones(workspace):
    one = tokenize_dataset(workspace, TokenizeDatasetRequest(input="corpus.txt"))
    two = tokenize_dataset(workspace, TokenizeDatasetRequest(input="jsonl", text_field="meta.body"))
    (workspace.workspace.datasets_dir / ".ds-x.partial").mkdir()
    (workspace.workspace.datasets_dir / "ds-unfinished").mkdir()

    listed = list_datasets(workspace, ListDatasetsRequest())

    assert listed.total == 2 and {d.dataset_id for d in listed.datasets} == {one.dataset_id, two.dataset_id}
    by_id = {d.dataset_id: d for d in listed.datasets}
    assert by_id[one.dataset_id].documents == 600 and by_id[one.dataset_id].tokenizer == "byte"
    assert [d.created for d in listed.datasets] == sorted((d.created for d in listed.datasets), reverse=True)
    assert len(list_datasets(workspace, ListDatasetsRequest(limit=1)).datasets) == 1


def test_the_dataset_id_is_the_cache_id_of_the_files_the_tokenizer_and_the_tokenize_config(workspace):
    request = TokenizeDatasetRequest(input="corpus.txt", val_fraction=0.2, prepend_bos=True, workers=1)
    info = tokenize_dataset(workspace, request)

    sources = source_files([workspace.workspace.root / "corpus.txt"])
    config = TokenizeConfig(val_fraction=0.2, prepend_bos=True)
    assert info.dataset_id == cache_id(sources, load_tokenizer("byte"), config)


@pytest.mark.anyio
async def test_every_tokenize_config_field_is_a_tool_argument_and_a_cli_option(workspace, capsys):
    server = MCPServer(name="dataset-tools")
    server.add_tool(as_mcp_tool(tokenize_dataset, workspace), name="tokenize_dataset", structured_output=True)
    async with Client(server) as client:
        (tool,) = (await client.list_tools()).tools
    with pytest.raises(SystemExit):
        main(["tokenize", "--help"])
    shown = capsys.readouterr().out

    assert set(TokenizeConfig.model_fields) <= set(tool.input_schema["properties"])
    for name in TokenizeConfig.model_fields:
        option = "--" + name.replace("_", "-")
        assert option in shown or "--no-" + option[2:] in shown, name


def test_cli_tokenize_options_make_the_dataset_the_tool_makes_and_keep_the_old_no_eos(workspace, capsys):
    common = ["--workspace", str(workspace.workspace.root), "--log-level", "WARNING"]
    assert main(["tokenize", "corpus.txt", "--no-eos", "--val-fraction", "0.2", "--workers", "1", *common]) == 0
    by_cli = json.loads(capsys.readouterr().out)

    again = TokenizeDatasetRequest(input="corpus.txt", append_eos=False, val_fraction=0.2)
    assert tokenize_dataset(workspace, again).model_dump() == {**by_cli, "reused": True}
    assert open_token_cache(by_cli["path"]).manifest.append_eos is False


def test_cli_train_tokenizer_tokenize_and_inspect_run_end_to_end(workspace, capsys):
    common = ["--workspace", str(workspace.workspace.root), "--log-level", "WARNING"]
    assert main(["train-tokenizer", "corpus.txt", "--vocab-size", "300", *common]) == 0
    tokenizer = json.loads(capsys.readouterr().out)["tokenizer"]
    assert main(["tokenize", "corpus.txt", "--tokenizer", tokenizer, "--workers", "1", *common]) == 0
    info = json.loads(capsys.readouterr().out)
    assert main(["inspect", info["dataset_id"], "--samples", "1", *common]) == 0
    shown = capsys.readouterr().out

    assert info["vocab_size"] == 300 and info["documents"]["train"] + info["documents"]["val"] == 600
    assert f"dataset {info['dataset_id']}" in shown and "--- document 0" in shown
    assert main(["tokenize", "corpus.txt", "--workers", "0", *common]) == 2
    assert "workers: Input should be greater than or equal to 1" in capsys.readouterr().err


@pytest.mark.parametrize("argument", ["linked", "linked/*.txt"])
def test_a_folder_or_glob_that_reaches_outside_through_a_symlink_is_refused(workspace, tmp_path, argument):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret paragraph\n")
    folder = workspace.workspace.root / "linked"
    folder.mkdir()
    (folder / "fine.txt").write_text("a paragraph\n")
    (folder / "leak.txt").symlink_to(outside)

    with pytest.raises(PathEscapeError, match="symlink that leads outside"):
        tokenize_dataset(workspace, TokenizeDatasetRequest(input=argument))


@pytest.fixture
def cache(workspace) -> Path:
    """The token cache of corpus.txt in `workspace`."""
    return Path(tokenize_dataset(workspace, TokenizeDatasetRequest(input="corpus.txt")).path)


def test_resolve_dataset_takes_an_id_a_workspace_path_or_an_absolute_path_to_the_same_cache(workspace, cache):
    anywhere = workspace.workspace.root / "steps" / "tokenize-abc" / "cache"
    shutil.copytree(cache, anywhere)

    forms = [cache.name, f"datasets/{cache.name}", f"./datasets/{cache.name}/", str(cache)]
    assert [resolve_dataset(workspace, form) for form in forms] == [cache] * len(forms)
    assert resolve_dataset(workspace, "steps/tokenize-abc/cache") == anywhere


def test_a_relative_dataset_path_is_taken_from_the_workspace_not_the_current_folder(
    workspace, cache, tmp_path, monkeypatch
):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(cache, elsewhere / "datasets" / cache.name)
    shutil.copytree(cache, elsewhere / "mine")
    monkeypatch.chdir(elsewhere)

    assert resolve_dataset(workspace, f"datasets/{cache.name}") == cache
    with pytest.raises(NotFoundError, match=r"nothing is at './mine' .*relative paths start at the workspace root"):
        resolve_dataset(workspace, "./mine")


def test_resolve_dataset_tokenizes_a_builtin_corpus_on_first_use_and_reuses_it(workspace):
    calls = []
    folder = resolve_dataset(workspace, "builtin:tinyshakespeare", lambda d, t, m: calls.append(m))
    built = (folder / "manifest.json").stat().st_mtime_ns
    again = resolve_dataset(workspace, "builtin:tinyshakespeare")

    assert folder.parent == workspace.workspace.datasets_dir and again == folder
    assert (folder / "manifest.json").stat().st_mtime_ns == built
    assert calls and set(calls) == {"input bytes tokenized"}
    assert open_token_cache(folder).manifest.sources[0].path.endswith("tinyshakespeare.txt.zst")
    assert resolve_dataset(workspace, folder.name) == folder


def test_a_dataset_outside_the_workspace_is_refused_unless_its_root_is_allowed(workspace, cache, tmp_path):
    shared = tmp_path / "shared"
    shutil.copytree(cache, shared / "cache")

    with pytest.raises(PathEscapeError, match=r"argument 'dataset': path '\.\./shared/cache' is refused"):
        resolve_dataset(workspace, "../shared/cache")
    with pytest.raises(PathEscapeError, match="argument 'train_data'"):
        resolve_dataset(workspace, str(shared / "cache"), argument="train_data")
    allowed = ToolContext.open(workspace.workspace.root, allowed_paths=(shared,))
    assert resolve_dataset(allowed, str(shared / "cache")) == shared / "cache"


def test_an_unknown_dataset_id_or_path_says_which_datasets_there_are(workspace, cache):
    known = rf"recent dataset ids, newest first: {cache.name}; built-in corpora, tokenized on first use: "
    known += "builtin:tinyshakespeare"

    with pytest.raises(NotFoundError, match=rf"argument 'dataset': unknown dataset id 'ds-nope' .*; {known}$"):
        resolve_dataset(workspace, "ds-nope")
    with pytest.raises(NotFoundError, match=rf"argument 'dataset': nothing is at 'datasets/tinyshakespeare' .*{known}"):
        resolve_dataset(workspace, "datasets/tinyshakespeare")


def test_a_folder_or_file_that_is_not_a_token_cache_is_refused_saying_what_it_is(workspace, cache):
    (workspace.workspace.datasets_dir / "ds-unfinished").mkdir()

    with pytest.raises(InvalidInputError, match=r"'\./jsonl' \(.*\) is not a token cache: it has no manifest\.json"):
        resolve_dataset(workspace, "./jsonl")
    with pytest.raises(InvalidInputError, match=rf"'ds-unfinished' .* has no manifest\.json; recent .*{cache.name}"):
        resolve_dataset(workspace, "ds-unfinished")
    with pytest.raises(InvalidInputError, match=r"'\./corpus\.txt' .* is a file, not a token cache; tokenize it"):
        resolve_dataset(workspace, "./corpus.txt")


def test_an_unknown_builtin_corpus_lists_the_builtin_corpora(workspace):
    with pytest.raises(
        NotFoundError,
        match=r"argument 'dataset': 'builtin:nope' is not a built-in corpus; .*: builtin:tinyshakespeare$",
    ):
        resolve_dataset(workspace, "builtin:nope")
    with pytest.raises(NotFoundError, match=r"argument 'input': .* built-in corpora: builtin:tinyshakespeare$"):
        tokenize_dataset(workspace, TokenizeDatasetRequest(input="builtin:nope"))


def test_inspect_dataset_accepts_a_workspace_path_as_well_as_an_id(workspace, cache):
    report = inspect_dataset(workspace, InspectDatasetRequest(dataset_id=f"datasets/{cache.name}", samples=0))

    assert report.path == str(cache)
    assert report.documents["train"] == open_token_cache(cache).manifest.splits["train"].documents
    with pytest.raises(PathEscapeError, match="argument 'dataset_id'"):
        inspect_dataset(workspace, InspectDatasetRequest(dataset_id="/etc"))
