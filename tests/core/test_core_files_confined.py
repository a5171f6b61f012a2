"""`core.files` through `Workspace`: no symlink inside the workspace leads a read or a write outside it."""

from __future__ import annotations

import os

import pytest

from tradewind.core import NotFoundError, PathEscapeError, Workspace
from tradewind.core.errors import InvalidInputError


@pytest.fixture
def workspace(tmp_path):
    return Workspace(tmp_path / "ws")


@pytest.fixture
def outside(tmp_path):
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("the secret\n")
    return folder


def test_reading_a_file_that_links_out_is_refused_naming_the_argument(workspace, outside):
    log = workspace.runs_dir / "r1" / "train.log"
    log.parent.mkdir()
    log.symlink_to(outside / "secret.txt")
    with pytest.raises(PathEscapeError, match=r"argument 'run_id'.*train\.log.*symlink"):
        workspace.open(log, "r", argument="run_id")


def test_a_folder_that_links_out_refuses_reads_and_writes_below_it(workspace, outside):
    run = workspace.runs_dir / "r1"
    run.mkdir()
    (run / "samples").symlink_to(outside)
    with pytest.raises(PathEscapeError):
        workspace.open(run / "samples" / "secret.txt", "r", argument="run_id")
    with pytest.raises(PathEscapeError):
        workspace.open(run / "samples" / "new.txt", "w", argument="run_id")
    with pytest.raises(PathEscapeError):
        workspace.write_atomic(run / "samples" / "new.json", "{}", argument="run_id")
    with pytest.raises(PathEscapeError):
        workspace.make_dir(run / "samples" / "sub", argument="run_id")
    assert sorted(os.listdir(outside)) == ["secret.txt"]


def test_writes_make_their_folders_and_land_whole(workspace):
    path = workspace.write_atomic("reports/a/b/report.md", "# hello\n", argument="run_ids")
    assert path == workspace.root / "reports" / "a" / "b" / "report.md"
    with workspace.open("reports/a/b/report.md", "r", argument="run_ids") as handle:
        assert handle.read() == "# hello\n"
    for line in ("one\n", "two\n"):
        with workspace.open("runs/r1/train.log", "a", argument="run_id") as handle:
            handle.write(line)
    assert (workspace.runs_dir / "r1" / "train.log").read_text() == "one\ntwo\n"
    assert not [name for name in os.listdir(workspace.root / "reports" / "a" / "b") if name.endswith(".tmp")]


def test_a_fifo_planted_as_a_log_is_refused_rather_than_waited_on(workspace):
    fifo = workspace.runs_dir / "r1" / "train.log"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(InvalidInputError, match="not a regular file"):
        workspace.open(fifo, "rb", argument="run_id")


def test_a_missing_file_is_not_found_and_names_the_argument(workspace):
    with pytest.raises(NotFoundError, match="argument 'run_id'"):
        workspace.open("runs/r1/train.log", "rb", argument="run_id")


def test_writing_under_an_allowed_input_root_is_refused(tmp_path, outside):
    workspace = Workspace(tmp_path / "ws", allowed_paths=(outside,))
    with workspace.open(outside / "secret.txt", "r", argument="input") as handle:
        assert handle.read() == "the secret\n"
    with pytest.raises(PathEscapeError):
        workspace.open(outside / "new.txt", "w", argument="input")


def test_check_tree_refuses_a_link_out_anywhere_inside_and_allows_one_that_stays_in(workspace, outside):
    checkpoints = workspace.runs_dir / "r1" / "checkpoints" / "100"
    checkpoints.mkdir(parents=True)
    (checkpoints / "state").write_text("weights")
    (checkpoints / "inside").symlink_to(checkpoints / "state")
    assert workspace.check_tree(checkpoints.parent, argument="resume_from") == checkpoints.parent
    (checkpoints / "leak").symlink_to(outside)
    with pytest.raises(PathEscapeError, match=r"argument 'resume_from'.*leak"):
        workspace.check_tree(checkpoints.parent, argument="resume_from")
