import os

import pytest

from tradewind.core import NotFoundError, PathEscapeError, Workspace, check_id, make_id


@pytest.fixture
def workspace(tmp_path):
    return Workspace(tmp_path / "ws")


def test_workspace_creates_its_layout(workspace):
    assert {p.name for p in workspace.root.iterdir()} == {"datasets", "runs", "reports", "jobs"}


def test_relative_path_resolves_inside_the_workspace(workspace):
    (workspace.root / "data.txt").write_text("hello")
    assert workspace.resolve_path("data.txt", argument="input") == workspace.root / "data.txt"


def test_dotdot_that_climbs_out_is_refused_and_names_the_argument(workspace):
    with pytest.raises(PathEscapeError, match=r"argument 'input'.*'\.\.' components climb out"):
        workspace.resolve_path("../outside.txt", argument="input")


def test_dotdot_that_stays_inside_is_allowed(workspace):
    (workspace.root / "datasets" / "a.txt").write_text("x")
    assert workspace.resolve_path("runs/../datasets/a.txt", argument="input").name == "a.txt"


def test_absolute_path_elsewhere_is_refused(workspace, tmp_path):
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("x")
    with pytest.raises(PathEscapeError, match="is outside the workspace"):
        workspace.resolve_path(str(outside), argument="tokenizer")


def test_symlink_that_escapes_is_refused(workspace, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    os.symlink(secret, workspace.root / "link.txt")
    with pytest.raises(PathEscapeError, match="symlink that leads outside"):
        workspace.resolve_path("link.txt", argument="input")


def test_allowed_root_admits_paths_outside_the_workspace(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("x")
    workspace = Workspace(tmp_path / "ws", allowed_paths=(corpus,))
    assert workspace.resolve_path(str(corpus / "a.txt"), argument="input") == corpus / "a.txt"


def test_missing_path_is_reported_with_the_argument(workspace):
    with pytest.raises(NotFoundError, match=r"argument 'input': no file or folder at 'nope\.txt'"):
        workspace.resolve_path("nope.txt", argument="input")


def test_unknown_run_id_lists_known_runs(workspace):
    (workspace.runs_dir / "run-a").mkdir()
    with pytest.raises(NotFoundError, match=r"unknown run id 'run-b'.*run-a"):
        workspace.run_dir("run-b")


@pytest.mark.parametrize("bad", ["", "..", "a/b", "../x", "a..b", "-x", "x" * 200, "lr\n", "lr\r\n", "\nlr"])
def test_unsafe_ids_are_refused(bad):
    with pytest.raises(ValueError, match="not a valid id"):
        check_id(bad, "run_id")


def test_made_ids_are_valid_and_distinct():
    ids = {make_id("run") for _ in range(50)}
    assert len(ids) == 50
    assert all(check_id(i, "run_id") == i for i in ids)


def test_workspace_root_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TRADEWIND_WORKSPACE", str(tmp_path / "from-env"))
    assert Workspace.from_env().root == (tmp_path / "from-env").resolve()
    assert Workspace.from_env(tmp_path / "explicit").root == (tmp_path / "explicit").resolve()


def test_sweep_dir_is_under_sweeps_and_an_unknown_sweep_is_named(workspace):
    with pytest.raises(NotFoundError, match=r"unknown sweep id 'sweep-1'.*no sweeps yet"):
        workspace.sweep_dir("sweep-1")
    folder = workspace.sweep_dir("sweep-1", must_exist=False)
    assert folder == workspace.sweeps_dir / "sweep-1" == workspace.root / "sweeps" / "sweep-1"
    folder.mkdir(parents=True)
    assert workspace.sweep_dir("sweep-1") == folder
    with pytest.raises(NotFoundError, match=r"unknown sweep id 'sweep-2'.*recent sweeps: sweep-1"):
        workspace.sweep_dir("sweep-2")
