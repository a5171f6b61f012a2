"""profile_run: a run's training step timed and traced in a profiling job."""

import pytest

from tradewind.core import read_json
from tradewind.data import build_token_cache, load_tokenizer
from tradewind.tools import ToolContext
from tradewind.tools.profiling import ProfileRunRequest, profile_run
from tradewind.trainer import ProfileSummary, RunLayout, TrainConfig
from tradewind.trainer.jobs import PROFILE_CALLABLE, ProfileJob


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
