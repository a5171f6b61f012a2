"""A pipeline file planned or run by `pipeline_job`: steps printed as JSON lines, a dry run that writes nowhere."""

import json
import os
from pathlib import Path

import pytest

from tradewind.cluster.pipeline import PipelineJob, execute_pipeline, pipeline_job, steps_dir
from tradewind.core import ConfigError, read_json

PIPELINE = """
from pathlib import Path
from tradewind.cluster import Step

Path("imported-here.txt").write_text("top-level code ran")  # relative: lands in the working folder

def write(out, config, inputs):
    upstream = "".join((p / "out.txt").read_text() for p in inputs.values())
    (out / "out.txt").write_text(upstream + config["word"])

first = Step("first", write, {"word": "a"})
steps = [Step("second", write, {"word": "b"}, deps=(first,))]
"""


@pytest.fixture
def pipeline_file(tmp_path) -> Path:
    path = tmp_path / "pipe.py"
    path.write_text(PIPELINE, encoding="utf-8")
    return path


def printed_steps(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_a_dry_run_plans_every_step_runs_none_and_its_top_level_code_writes_only_into_a_scratch_folder(
    tmp_path, pipeline_file, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    plan_file = tmp_path / "plan.json"
    job = PipelineJob(pipeline=pipeline_file.name, workspace="ws", dry_run=True, output_file="plan.json")
    planned = execute_pipeline(job)
    assert [(step.name, step.action) for step in planned] == [("first", "run"), ("second", "run")]
    assert printed_steps(capsys.readouterr().out) == [step.model_dump() for step in planned]
    assert read_json(plan_file) == [step.model_dump() for step in planned]
    assert not (tmp_path / "imported-here.txt").exists() and os.getcwd() == str(tmp_path)
    assert all(not Path(step.output_path).exists() for step in planned)
    assert all(Path(step.output_path).is_relative_to(steps_dir(tmp_path / "ws")) for step in planned)


def test_a_run_executes_the_steps_in_order_and_a_second_run_finds_them_cached(
    tmp_path, pipeline_file, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # a real run imports the file where it is started
    job = {"pipeline": str(pipeline_file), "workspace": str(tmp_path / "ws")}
    pipeline_job(**job)
    first_run = printed_steps(capsys.readouterr().out)
    assert [(step["name"], step["action"]) for step in first_run] == [("first", "run"), ("second", "run")]
    assert (Path(first_run[1]["output_path"]) / "out.txt").read_text() == "ab"
    pipeline_job(**job)
    assert [step["action"] for step in printed_steps(capsys.readouterr().out)] == ["cached", "cached"]


def test_the_job_refuses_unknown_arguments_naming_them(tmp_path, pipeline_file):
    with pytest.raises(ConfigError, match="dryrun"):
        pipeline_job(pipeline=str(pipeline_file), workspace=str(tmp_path), dryrun=True)


def test_a_file_without_steps_is_a_config_error(tmp_path):
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="steps"):
        execute_pipeline(PipelineJob(pipeline=str(empty), workspace=str(tmp_path), dry_run=True))
