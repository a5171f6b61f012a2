"""Work budgets: `token_budget` and `flop_budget` fix a run's updates, whatever the machine's speed; beside
them `time_budget_s` is a cap that may end the run sooner but never re-plans its schedule."""

import jax
import pytest

from tradewind.core import ConfigError, InvalidInputError, parse_config
from tradewind.runs import TrainConfig, read_metrics, read_train_config
from tradewind.runs.metrics import MetricRow, planned_steps
from tradewind.trainer import train
from tradewind.trainer.optimizer import learning_rate
from tradewind.trainer.plan import StepPlan, TimeBudget

TOKENS_PER_STEP = 8 * 32  # tiny_config's batch_size * seq_len
TOKEN_BUDGET = 12 * TOKENS_PER_STEP + 1  # one token past 12 updates: the run makes 13


@pytest.fixture(scope="module")
def token_run(tiny_config, tmp_path_factory):
    """A run of TOKEN_BUDGET tokens: its config, folder and summary."""
    config = tiny_config(token_budget=TOKEN_BUDGET)
    run_dir = tmp_path_factory.mktemp("token-run") / "run"
    return config, run_dir, train(config, run_dir)


def test_a_token_budget_run_makes_the_updates_its_tokens_take_and_decays_its_schedule_to_the_last(token_run):
    config, run_dir, summary = token_run
    assert config.total_steps == 13 and config.budget.describe() == f"{TOKEN_BUDGET:,} tokens"
    assert summary.steps == 13 and summary.tokens_seen == 13 * TOKENS_PER_STEP >= TOKEN_BUDGET
    assert (summary.budget_kind, summary.budget, summary.budget_met) == ("tokens", TOKEN_BUDGET, True)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows[-1].step == 13 and rows[-1].eval_loss is not None
    assert rows[-1].lr == pytest.approx(learning_rate(config.optimizer, 12, 13))
    assert rows[-1].lr < 0.15 * config.optimizer.learning_rate  # near the floor, min_lr_ratio 0.1 of the peak


def test_a_token_budget_run_repeats_its_steps_and_val_loss_exactly(token_run, tmp_path):
    config, _, first = token_run
    second = train(config, tmp_path / "again")
    assert second.steps == first.steps
    assert second.val_loss == first.val_loss and second.val_bpb == first.val_bpb  # bitwise: the same work


def test_a_flop_budget_run_makes_the_fewest_updates_whose_model_flops_reach_it(tiny_config, tmp_path):
    byte_model = {"vocab_size": 258}  # the tokenizer's: the FLOPs per token count the output head
    per_step = tiny_config(model=byte_model).model.flops_per_token(32) * TOKENS_PER_STEP
    config = tiny_config(model=byte_model, flop_budget=5.5 * per_step)
    assert config.total_steps == 6 and config.budget.describe() == f"{5.5 * per_step:.3g} FLOPs"
    summary = train(config, tmp_path / "run")
    assert summary.steps == 6 and (summary.budget_kind, summary.budget_met) == ("flops", True)
    flops = summary.model_flops_per_token * summary.tokens_seen
    assert flops >= config.flop_budget > flops - per_step  # one update fewer would fall short


def test_a_flop_budget_without_vocab_size_counts_the_datasets_vocabulary_and_saves_it(tiny_config, tmp_path):
    per_step = tiny_config(model={"vocab_size": 258}).flops_per_token() * TOKENS_PER_STEP
    config = tiny_config(flop_budget=5.5 * per_step)  # its dataset's byte tokenizer has 258 tokens
    with pytest.raises(ConfigError, match=r"model\.vocab_size: the FLOPs per token count the output head"):
        _ = config.total_steps  # not before the run has its dataset
    summary = train(config, tmp_path / "run")
    assert summary.steps == 6 and summary.budget_met
    saved = read_train_config(tmp_path / "run" / "config.json")  # every reader of the run counts the same steps
    assert (saved.model.vocab_size, saved.total_steps) == (258, 6)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"token_budget": 1000, "flop_budget": 1e12, "model": {"vocab_size": 258}}, "token_budget and flop_budget"),
        ({"token_budget": 10**15, "batch_size": 1, "seq_len": 1}, "token_budget: 1,000,000,000,000,000 tokens is"),
    ],
)
def test_a_work_budget_the_run_cannot_count_its_steps_by_is_refused_naming_its_fields(fields, words):
    with pytest.raises(ConfigError) as raised:
        parse_config(TrainConfig, {"dataset": "x", **fields}, source="run.json")
    assert words in str(raised.value)


def test_a_time_cap_ends_a_token_budget_run_early_on_the_schedule_of_the_whole_budget(tiny_config, tmp_path):
    total = 100_000  # far more updates than fit in the cap
    config = tiny_config(token_budget=total * TOKENS_PER_STEP, time_budget_s=1.0)
    summary = train(config, tmp_path / "run")

    assert summary.steps < total and (summary.budget_kind, summary.budget_met) == ("tokens", False)
    assert summary.steps > 2 * config.log_every  # rows past the warm-up, where a re-planned schedule would differ
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert rows[-1].step == summary.steps and rows[-1].eval_loss is not None  # the cap's stop is a last step
    assert (tmp_path / "run" / "checkpoints" / str(summary.steps)).is_dir()
    for row in rows[1:]:
        assert row.lr == pytest.approx(learning_rate(config.optimizer, row.step - 1, total))
    assert rows[-1].lr > 0.99 * config.optimizer.learning_rate  # not decayed: the budget's schedule has barely begun


def test_a_time_cap_moves_the_last_step_but_never_the_schedules_total_nor_past_it(tiny_config):
    config = tiny_config(token_budget=20 * TOKENS_PER_STEP, time_budget_s=600.0)
    roomy = StepPlan.of(config)
    budget = TimeBudget(roomy, seconds=600.0, first_step=0, cap=True)
    for step in range(1, 21):
        budget.tick(step, jax.numpy.zeros(()))
        assert (roomy.total_steps, roomy.last_step) == (20, 20)  # the cap adds no work

    spent = StepPlan.of(config)
    budget = TimeBudget(spent, seconds=0.0, first_step=0, cap=True)
    budget.tick(1, None)  # the first update starts the clock
    budget.tick(2, jax.numpy.zeros(()))
    assert (spent.total_steps, spent.last_step) == (20, 2)  # ends at the update in flight, on the same schedule


def test_planned_steps_are_a_work_budgets_steps_capped_by_what_fits_in_the_time_left(tiny_config):
    rows = [
        MetricRow(step=0, eval_loss=5.0, elapsed=1.0),
        MetricRow(step=10, loss=4.0, step_time_s=0.2, elapsed=3.0),  # 2 s of updates
        MetricRow(step=20, loss=3.0, step_time_s=0.1, elapsed=4.0),  # 1 s more
    ]
    assert planned_steps(tiny_config(token_budget=500 * TOKENS_PER_STEP), rows) == 500
    assert planned_steps(tiny_config(token_budget=500 * TOKENS_PER_STEP, time_budget_s=10.0), rows) == 20 + 70
    assert planned_steps(tiny_config(token_budget=50 * TOKENS_PER_STEP, time_budget_s=10.0), rows) == 50
    assert planned_steps(tiny_config(token_budget=500 * TOKENS_PER_STEP, time_budget_s=10.0), rows[:1]) == 500
    assert planned_steps(tiny_config(time_budget_s=10.0), rows) == 20 + 70  # a time budget alone, as before


def test_a_run_resumed_from_a_parent_at_or_past_its_token_budget_is_refused_naming_it(token_run, tiny_config, tmp_path):
    _, parent, _ = token_run  # its last checkpoint is step 13
    config = tiny_config(token_budget=13 * TOKENS_PER_STEP, resume_from=str(parent))
    with pytest.raises(InvalidInputError, match=r"token_budget: .* \(13 updates\) is the run's total"):
        train(config, tmp_path / "child")


def test_a_budgets_description_names_its_size_and_unit(tiny_config):
    assert tiny_config(time_budget_s=60).budget.describe() == "60 s"
    assert tiny_config(steps=200).budget.describe() == "200 steps"
    assert tiny_config(token_budget=2_048_000).budget.describe() == "2,048,000 tokens"
    assert tiny_config(flop_budget=1.2e12, model={"vocab_size": 258}).budget.describe() == "1.2e+12 FLOPs"
