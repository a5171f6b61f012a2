"""The research guidance agrees with itself and with the tools: the instructions, the `plan-experiment` prompt
and the `autoresearch-loop` skill each name the one metric the ledger decides on and the work budget it
compares runs by, and tell the agent to measure the noise; none names another metric to decide on, nor a
time budget as the one every experiment shares."""

import re

import pytest

from tradewind.prompts import load_skill, render_prompt, server_instructions
from tradewind.runs.config import BUDGET_FIELDS
from tradewind.tools import CompareRunsRequest, Experiment, LaunchTrainingRequest, RerunBaselineRequest
from tradewind.tools.noise import DECISION_METRIC

WORK_BUDGET = BUDGET_FIELDS["tokens"]
GUIDES = {
    "instructions": server_instructions(),
    "plan-experiment prompt": render_prompt("plan-experiment", goal="Is lr 6e-3 better?", dataset="d", budget="b"),
    "autoresearch-loop skill": load_skill("autoresearch-loop"),
}


def test_the_tools_decide_on_the_metric_and_take_the_budget_the_guidance_names():
    assert DECISION_METRIC in Experiment.model_fields and WORK_BUDGET in LaunchTrainingRequest.model_fields
    assert CompareRunsRequest.model_fields["metric"].default == DECISION_METRIC
    assert RerunBaselineRequest.model_fields["run_id"].is_required()


@pytest.mark.parametrize("guide", GUIDES)
def test_each_guide_names_the_decision_metric_the_work_budget_and_the_reruns(guide):
    text = GUIDES[guide]
    for name in (DECISION_METRIC, WORK_BUDGET, "rerun_baseline"):
        assert f"`{name}`" in text, f"{guide} does not name `{name}`"


@pytest.mark.parametrize("guide", GUIDES)
def test_no_guide_decides_on_another_metric_or_shares_a_time_budget(guide):
    sentences = re.split(r"(?<=[.:])\s", " ".join(GUIDES[guide].split()))
    deciding = [s for s in sentences if re.search(r"\bdecid|\bmetric\b|\bscored? by\b", s)]
    for sentence in deciding:
        named = set(re.findall(r"`(\w+)`", sentence))
        assert not named & {"eval_loss", "final_eval_loss", "loss"} - {DECISION_METRIC} or "not decide" in sentence, (
            guide,
            sentence,
        )
    assert not re.search(r"same `time_budget_s`", GUIDES[guide]), guide
