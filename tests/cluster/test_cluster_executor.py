import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from polling import wait_until

from tradewind.cluster import (
    Executor,
    JobSpec,
    JobStatus,
    LocalBackend,
    Step,
    StepBusyError,
    StepFailedError,
    load_pipeline,
)
from tradewind.cluster.executor import LEASE_FILE, STATUS_FILE
from tradewind.cluster.pipeline import PIPELINE_CALLABLE, PipelineJob, pipeline_job
from tradewind.core import ConfigError

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "pipeline_tiny.py")


def record_call(out, config, inputs):
    with open(config["calls"], "a") as f:
        f.write(f"{out.name}\n")
    text = "".join((path / "out.txt").read_text() for path in inputs.values())
    (out / "out.txt").write_text(text + config["word"])


def fail_unless_flag(out, config, inputs):
    (out / "partial.txt").write_text("half-written")
    if not os.path.exists(config["flag"]):
        raise RuntimeError("the flag is not set")
    (out / "out.txt").write_text("ok")


def read_lease_twice(out, config, inputs):
    first = json.loads((out / LEASE_FILE).read_text())["heartbeat"]
    wait_until(
        lambda: json.loads((out / LEASE_FILE).read_text())["heartbeat"] != first, 10, "the heartbeat renewing the lease"
    )


def pipeline(tmp_path, word="b"):
    calls = str(tmp_path / "calls.txt")
    first = Step("first", record_call, {"calls": calls, "word": "a"})
    return first, Step("second", record_call, {"calls": calls, "word": word}, deps=(first,))


def test_output_paths_hash_config_and_upstream_outputs(tmp_path):
    executor = Executor(tmp_path / "steps")
    first, second = pipeline(tmp_path)
    _, second_again = pipeline(tmp_path)
    _, second_changed = pipeline(tmp_path, word="c")
    assert executor.output_path(second) == executor.output_path(second_again)
    assert executor.output_path(second) != executor.output_path(second_changed)
    assert executor.output_path(first).name.startswith("first-")
    moved_first = Step("first", record_call, {"calls": str(tmp_path / "calls.txt"), "word": "z"})
    moved_second = Step("second", record_call, second.config, deps=(moved_first,))
    assert executor.output_path(moved_second) != executor.output_path(second)  # upstream change flows down


def test_a_rerun_skips_finished_steps(tmp_path):
    executor = Executor(tmp_path / "steps")
    _, second = pipeline(tmp_path)
    assert [r.action for r in executor.run([second])] == ["run", "run"]
    assert (executor.output_path(second) / "out.txt").read_text() == "ab"
    assert [r.action for r in Executor(tmp_path / "steps").run([second])] == ["cached", "cached"]
    assert len((tmp_path / "calls.txt").read_text().splitlines()) == 2


def test_dry_run_shows_the_plan_and_runs_nothing(tmp_path):
    executor = Executor(tmp_path / "steps")
    first, second = pipeline(tmp_path)
    executor.run([first])
    plan = executor.run([second], dry_run=True)
    assert [(p.name, p.action) for p in plan] == [("first", "cached"), ("second", "run")]
    assert plan[1].output_path == str(executor.output_path(second))
    assert len((tmp_path / "calls.txt").read_text().splitlines()) == 1


def test_a_failed_step_reruns_only_with_force(tmp_path):
    executor = Executor(tmp_path / "steps")
    step = Step("flaky", fail_unless_flag, {"flag": str(tmp_path / "flag")})
    with pytest.raises(StepFailedError, match="the flag is not set"):
        executor.run([step])
    (tmp_path / "flag").touch()
    with pytest.raises(StepFailedError, match="rerun with force=True"):
        executor.run([step])
    assert [p.action for p in executor.plan([step])] == ["blocked"]
    assert [p.action for p in executor.plan([step], force=True)] == ["rerun"]
    assert [r.action for r in executor.run([step], force=True)] == ["rerun"]
    out = executor.output_path(step)
    assert (out / "out.txt").read_text() == "ok" and json.loads((out / STATUS_FILE).read_text())[
        "status"
    ] == "SUCCEEDED"


RACER = """
import sys, time
from pathlib import Path
from tradewind.cluster import Executor, Step

def slow(out, config, inputs):
    with open(config["calls"], "a") as f:
        f.write("ran\\n")
    time.sleep(0.5)  # the work; the other executor must wait for it rather than start its own
    (out / "out.txt").write_text("done")

tmp = Path(sys.argv[1])
(tmp / f"ready-{sys.argv[2]}").touch()
while not (tmp / "go").exists():
    time.sleep(0.005)
executor = Executor(tmp / "steps", lease_ttl_s=30, heartbeat_s=0.2)
result = executor.run([Step("slow", slow, {"calls": str(tmp / "calls")})])
print(result[0].action)
"""


def test_two_executors_racing_on_one_step_run_it_once(tmp_path):
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), str(i)], stdout=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    wait_until(lambda: all((tmp_path / f"ready-{i}").exists() for i in range(2)), 60, "the racers starting")
    (tmp_path / "go").touch()
    actions = sorted(racer.communicate(timeout=60)[0].strip() for racer in racers)
    assert [racer.returncode for racer in racers] == [0, 0]
    assert actions == ["cached", "run"]
    assert (tmp_path / "calls").read_text() == "ran\n"


def write_lease(out, **fields):
    out.mkdir(parents=True, exist_ok=True)
    lease = {"owner": "other", "host": socket.gethostname(), "pid": 1, "pid_start": None, "heartbeat": time.time()}
    (out / LEASE_FILE).write_text(json.dumps({**lease, **fields}))


def test_a_lease_of_a_dead_executor_on_this_host_is_taken_over_at_once(tmp_path):
    executor = Executor(tmp_path / "steps", lease_ttl_s=3600, wait_s=5)
    step, _ = pipeline(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_lease(executor.output_path(step), pid=int(dead.stdout), pid_start=0)
    assert [r.action for r in executor.run([step])] == ["run"]
    assert not (executor.output_path(step) / LEASE_FILE).exists()


def test_a_stale_lease_from_another_host_is_taken_over_after_its_ttl(tmp_path):
    executor = Executor(tmp_path / "steps", lease_ttl_s=5, wait_s=5)
    step, _ = pipeline(tmp_path)
    write_lease(executor.output_path(step), host="elsewhere", heartbeat=time.time() - 60)
    assert [r.action for r in executor.run([step])] == ["run"]


def test_a_fresh_lease_from_another_host_makes_the_executor_wait_then_give_up(tmp_path):
    executor = Executor(tmp_path / "steps", lease_ttl_s=60, wait_s=0.5)
    step, _ = pipeline(tmp_path)
    write_lease(executor.output_path(step), host="elsewhere")
    with pytest.raises(StepBusyError, match="held by other"):
        executor.run([step])
    assert not (tmp_path / "calls.txt").exists()


def test_the_heartbeat_renews_the_lease_while_a_step_runs(tmp_path):
    executor = Executor(tmp_path / "steps", lease_ttl_s=5, heartbeat_s=0.05)
    assert [r.action for r in executor.run([Step("beat", read_lease_twice)])] == ["run"]


def test_a_pipeline_file_must_define_steps(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(ConfigError, match="must define `steps`"):
        load_pipeline(bad)


def test_the_example_pipeline_plans_four_steps_in_order(tmp_path):
    plan = Executor(tmp_path / "steps").plan(load_pipeline(EXAMPLE))
    assert [(p.name, p.action) for p in plan] == [
        ("tokenize", "run"),
        ("train", "run"),
        ("eval", "run"),
        ("report", "run"),
    ]


def test_a_pipeline_job_writes_its_plan_to_the_output_file_and_prints_it(tmp_path, capsys):
    pipeline_job(pipeline=EXAMPLE, workspace=str(tmp_path), dry_run=True, output_file=str(tmp_path / "plan.json"))
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [(step["name"], step["action"]) for step in plan] == [
        ("tokenize", "run"),
        ("train", "run"),
        ("eval", "run"),
        ("report", "run"),
    ]
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == plan
    assert not (tmp_path / "steps").exists()  # a plan runs nothing


def test_a_pipeline_job_with_a_bad_argument_names_it(tmp_path):
    with pytest.raises(ConfigError, match="pipeline job: workspace: Field required"):
        pipeline_job(pipeline=EXAMPLE)
    with pytest.raises(ConfigError, match="pipeline job: dryrun: Extra inputs are not permitted"):
        pipeline_job(pipeline=EXAMPLE, workspace=str(tmp_path), dryrun=True)


@pytest.mark.slow
def test_the_example_pipeline_runs_as_a_job_and_trains_in_its_train_step(tmp_path):
    backend = LocalBackend(tmp_path / "jobs")
    job = PipelineJob(pipeline=EXAMPLE, workspace=str(tmp_path))
    record = backend.submit(JobSpec(name="pipeline", callable=PIPELINE_CALLABLE, kwargs=job.model_dump()))
    done = backend.wait(record.id, timeout=600)
    assert done.status is JobStatus.SUCCEEDED, backend.logs(record.id).text
    plan = Executor(tmp_path / "steps").plan(load_pipeline(EXAMPLE))
    assert [step.action for step in plan] == ["cached"] * 4
    train_dir = next(step.output_path for step in plan if step.name == "train")
    summary = json.loads((Path(train_dir) / "summary.json").read_text())
    assert summary["steps"] == 30 and (Path(train_dir) / "config.json").is_file()
    report = (Path(plan[-1].output_path) / "report.md").read_text()
    assert f"- final_eval_loss: {summary['final_eval_loss']:.4f}" in report
