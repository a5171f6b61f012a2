"""The dataset tools through their Python API, on fresh workspaces."""

import shutil
from pathlib import Path

import pytest

from tradewind.core import InvalidInputError, NotFoundError, PathEscapeError
from tradewind.data import open_token_cache
from tradewind.tools import (
    InspectDatasetRequest,
    ListDatasetsRequest,
    TokenizeDatasetRequest,
    ToolContext,
    inspect_dataset,
    list_datasets,
    tokenize_dataset,
)
from tradewind.tools.datasets import resolve_dataset


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
