"""profile_run: a run's training step timed and traced in a profiling job; its profile/ folder confined to the
workspace; a cancel stops it and its job."""

import pytest
from runs_helpers import CancelAtFirstReport

from tradewind.cluster import JobStatus
from tradewind.core import PathEscapeError, read_json
from tradewind.data import build_token_cache, load_tokenizer
from tradewind.runs import ProfileSummary, RunLayout, TrainConfig
from tradewind.runs.jobs import PROFILE_CALLABLE, ProfileJob
from tradewind.tools import ToolContext
from tradewind.tools.context import Cancelled
from tradewind.tools.profiling import ProfileRunRequest, profile_run


@pytest.mark.slow
def test_profile_run_runs_a_callable_job_whose_kwargs_are_the_profile_job(tmp_path, small_corpus):
    ctx = ToolContext.open(tmp_path / "workspace")
    cache = ctx.workspace.root / "datasets" / "tiny"
    build_token_cache([small_corpus], cache, load_tokenizer("byte"))
    layout = RunLayout(ctx.workspace.run_dir("r1", must_exist=False))
    layout.root.mkdir(parents=True)
    config = TrainConfig(
        dataset=str(cache),
        model={"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
        batch_size=4,
        seq_len=32,
    )
    layout.config.write_text(config.model_dump_json(), encoding="utf-8")

    result = profile_run(ctx, ProfileRunRequest(run_id="r1", steps=2, start_step=3))

    assert result.steps == 2 and result.run_id == "r1" and result.log_file == str(layout.profile / "profile.log")
    summary = ProfileSummary.model_validate(read_json(layout.profile / "summary.json"))
    assert summary == ProfileSummary.model_validate(result.model_dump(exclude={"run_id", "log_file"}))
    assert result.start_step == 3 and result.diagnosis.verdict and result.diagnosis.suggestion and result.top_ops
    [record] = ctx.backend.list()
    assert (record.spec.callable, record.spec.command) == (PROFILE_CALLABLE, None)
    assert ProfileJob.model_validate(record.spec.kwargs) == ProfileJob(run_dir=str(layout.root), steps=2, start_step=3)


def test_profile_run_never_writes_through_a_profile_folder_that_links_outside(hand_made, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    RunLayout(hand_made.workspace.run_dir("r1")).profile.symlink_to(outside)
    with pytest.raises(PathEscapeError, match=r"argument 'run_id': .*profile"):
        profile_run(hand_made, ProfileRunRequest(run_id="r1", steps=2))
    assert list(outside.iterdir()) == [] and hand_made.backend.list() == []


def test_a_cancelled_profile_run_stops_within_a_second_and_cancels_its_job(hand_made):
    cancel = CancelAtFirstReport()
    with pytest.raises(Cancelled):
        profile_run(hand_made, ProfileRunRequest(run_id="r1", steps=2), cancel)
    assert cancel.seconds_since() < 1.0
    [job] = hand_made.backend.list()
    assert hand_made.backend.wait(job.id, timeout=30).status is JobStatus.CANCELLED
