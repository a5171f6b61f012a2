"""The training loop's hooks, the parts that need no compiled model: where a metrics row goes, and which
steps the checkpoint and profiler hooks want. (The metrics hook's rows are tested through training in
test_trainer_train.py and test_trainer_loop.py.)"""

import json

import pytest

from tradewind.runs import CheckpointConfig, MetricRow, RunLayout, TrainConfig, read_metrics
from tradewind.trainer.hooks import CheckpointHook, ProfileHook, RunWriters
from tradewind.trainer.orbax_checkpoint import Checkpointer
from tradewind.trainer.plan import StepPlan


def config(**fields) -> TrainConfig:
    return TrainConfig(dataset="datasets/ds-x", steps=30, **fields)


def test_a_row_goes_to_metrics_jsonl_stdout_tensorboard_and_progress_without_its_non_finite_figures(tmp_path, capsys):
    layout = RunLayout(tmp_path)
    seen = []
    run = config()
    writers = RunWriters(
        layout, run, StepPlan.of(run), lambda step, total, row: seen.append((step, total, row)), rows=[]
    )
    row = MetricRow(step=10, loss=float("nan"), lr=1e-3, grad_norm=float("inf"), eval_loss=2.5, elapsed=3.25)
    writers.write(row)
    writers.close()
    written = MetricRow(step=10, lr=1e-3, eval_loss=2.5, elapsed=3.25)  # JSON has no NaN or infinity
    assert read_metrics(layout.metrics) == [written] == writers.rows
    assert json.loads(layout.metrics.read_text()) == {"step": 10, "lr": 1e-3, "eval_loss": 2.5, "elapsed": 3.25}
    assert seen == [(10, 30, written)]
    assert capsys.readouterr().out == "step 10/30 | lr 1.00e-03 | eval_loss 2.5000 | 3.2s\n"
    assert [path.name.startswith("events.out.tfevents") for path in layout.tensorboard.iterdir()] == [True]


def test_rows_restored_from_an_earlier_attempt_are_kept_before_the_new_ones(tmp_path):
    earlier = [MetricRow(step=5, loss=3.0, elapsed=1.0)]
    run = config(tensorboard=False)
    writers = RunWriters(RunLayout(tmp_path), run, StepPlan.of(run), None, rows=earlier)
    writers.write(MetricRow(step=10, loss=2.0, elapsed=2.0))
    writers.close()
    assert [row.step for row in writers.rows] == [5, 10]
    assert [row.step for row in read_metrics(RunLayout(tmp_path).metrics)] == [10]  # the file had step 5 already
    assert not RunLayout(tmp_path).tensorboard.exists()


@pytest.mark.parametrize(
    ("policy", "wanted"),
    [
        (CheckpointConfig(), [30]),
        (CheckpointConfig(every_steps=10), [10, 20, 30]),
        (CheckpointConfig(every_steps=7), [7, 14, 21, 28, 30]),
    ],
    ids=["at-the-end", "every-10", "every-7-and-the-end"],
)
def test_the_checkpoint_hook_wants_the_policys_steps_and_always_the_last(tmp_path, policy, wanted):
    hook = CheckpointHook(Checkpointer(tmp_path / "checkpoints", policy), StepPlan.of(config()))
    assert [step for step in range(1, 31) if hook.wants(step)] == wanted


def test_the_profile_hook_wants_the_step_before_its_window_and_every_step_in_it():
    hook = ProfileHook(trace_dir=None, first=3, last=5)
    assert [step for step in range(10) if hook.wants(step)] == [2, 3, 4, 5]
