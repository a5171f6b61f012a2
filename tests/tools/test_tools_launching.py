"""launch_training: accelerators refused before anything is queued, and `resume_from`, which continues a
finished run exactly as one longer run and refuses what would change it, a run that has not ended, and a run
whose files link outside; unknown runs named with their argument; W&B refused without its extra."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client
from polling import wait_until
from runs_helpers import finish, losses, pending_run, workspace_with_dataset
from tpu_helpers import WIDE_EMBEDDING, holding_open, needs_libtpu

from tradewind.cluster import JobStatus
from tradewind.cluster.tpu_host import HOST_TPU_ENV, LIBTPU_LOCKFILE, lock_holders
from tradewind.core import InvalidInputError, NotFoundError, PathEscapeError
from tradewind.runs import RunLayout, TrainConfig
from tradewind.runs.compile import COMPILE_CALLABLE
from tradewind.server import build_server
from tradewind.tools import LaunchTrainingRequest, RunRequest, ToolContext, cancel_run, get_run, launch_training
from tradewind.tools.estimating import EstimateRunRequest, estimate_run
from tradewind.tools.launching import resolve_launch
from tradewind.tools.tpu_fit import can_compile_for_tpu

pytestmark = pytest.mark.anyio


def tool_text(result) -> str:
    return " ".join(block.text for block in result.content)


async def test_unknown_tpu_types_and_a_gpu_here_are_refused_at_once_and_nothing_is_queued(ctx, dataset_id):
    before = sorted(p.name for p in ctx.workspace.runs_dir.iterdir())
    jobs_before = len(ctx.backend.list())
    calls = [
        ({"accelerator": "tpu-v9-8"}, "unknown TPU type 'v9-8'; known types: v4-8"),
        ({"accelerator": "gpu", "backend": "local"}, "GPU"),
        ({"accelerator": "tpu-v5litepod-8", "backend": "local"}, "backend 'ray'"),
    ]
    async with Client(build_server(ctx)) as client:
        for arguments, expected in calls:  # how fast: benchmarks/cluster.py (well under the 2 s asked for)
            result = await client.call_tool("launch_training", {"dataset": dataset_id, **arguments})
            assert result.is_error and expected in tool_text(result), tool_text(result)
    assert sorted(p.name for p in ctx.workspace.runs_dir.iterdir()) == before
    assert len(ctx.backend.list()) == jobs_before


@pytest.mark.slow
def test_resume_from_continues_a_finished_run_exactly_as_one_longer_run(ctx, dataset_id, constant_run):
    reference, settings = constant_run
    parent = launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, steps=20, **settings))
    assert finish(ctx, parent.run_id).status is JobStatus.SUCCEEDED

    child = launch_training(ctx, LaunchTrainingRequest(resume_from=parent.run_id, steps=30))
    done = finish(ctx, child.run_id)
    assert done.status is JobStatus.SUCCEEDED, done.log_tail
    assert done.parent == parent.run_id and done.summary.resumed_from_step == 20
    assert losses(ctx, child.run_id) == losses(ctx, reference.run_id)
    assert done.summary.final_eval_loss == reference.summary.final_eval_loss
    assert get_run(ctx, RunRequest(run_id=parent.run_id)).status is JobStatus.SUCCEEDED  # the parent is untouched


@pytest.mark.slow
def test_resume_from_refuses_what_would_change_the_run_and_steps_that_do_not_go_further(ctx, constant_run):
    reference, _ = constant_run
    with pytest.raises(InvalidInputError, match=r"argument 'steps': 30 is the new run's total and must exceed the 30"):
        launch_training(ctx, LaunchTrainingRequest(resume_from=reference.run_id, steps=30))
    with pytest.raises(InvalidInputError, match=r"argument 'seed': a run that continues .* keeps its seed"):
        launch_training(ctx, LaunchTrainingRequest(resume_from=reference.run_id, steps=40, seed=7))
    with pytest.raises(InvalidInputError, match=r"argument 'model'"):
        launch_training(ctx, LaunchTrainingRequest(resume_from=reference.run_id, steps=40, model={"d_model": 64}))
    tokens = 30 * 8 * 32  # the tiny batch's tokens over the parent's 30 steps
    with pytest.raises(InvalidInputError, match=r"argument 'token_budget': 7,680 tokens \(30 steps\) is the new"):
        launch_training(ctx, LaunchTrainingRequest(resume_from=reference.run_id, token_budget=tokens))
    further = resolve_launch(ctx, LaunchTrainingRequest(resume_from=reference.run_id, token_budget=2 * tokens))
    assert further.config.total_steps == 60 and further.parent_step == 30  # a token budget is a total too


@pytest.fixture
def own_ctx(tmp_path, ctx, dataset_id) -> tuple[ToolContext, str]:
    """A fresh workspace (its own job ledger, so holding its CPUs blocks no other test) with the suite's dataset."""
    dataset = ctx.workspace.dataset_dir(dataset_id)
    fresh = ToolContext.open(tmp_path / "ws", allowed_paths=(dataset.parent,))
    fresh.settings_path.write_text("backend: local\n", encoding="utf-8")
    return fresh, str(dataset)


def test_a_pending_run_cannot_be_continued_and_the_refusal_names_its_status(own_ctx, tiny_run_settings):
    ctx, dataset = own_ctx
    with pending_run(ctx, dataset, tiny_run_settings) as parent:
        before = sorted(p.name for p in ctx.workspace.runs_dir.iterdir())
        with pytest.raises(InvalidInputError, match=rf"argument 'resume_from': run {parent.run_id} is PENDING") as no:
            launch_training(ctx, LaunchTrainingRequest(resume_from=parent.run_id, steps=20))
        assert "wait_for_run" in str(no.value) and "cancel_run" in str(no.value)
        assert sorted(p.name for p in ctx.workspace.runs_dir.iterdir()) == before


@pytest.mark.slow
def test_a_running_run_cannot_be_continued_while_it_rotates_its_checkpoints(own_ctx, tiny_run_settings):
    ctx, dataset = own_ctx
    settings = {**tiny_run_settings, "checkpoints": {"every_steps": 5, "keep_last": 1}}
    parent = launch_training(ctx, LaunchTrainingRequest(dataset=dataset, steps=100_000, **settings))
    try:
        wait_until(lambda: get_run(ctx, RunRequest(run_id=parent.run_id)).step >= 5, timeout=240, what="a checkpoint")
        with pytest.raises(InvalidInputError, match=rf"argument 'resume_from': run {parent.run_id} is RUNNING"):
            launch_training(ctx, LaunchTrainingRequest(resume_from=parent.run_id, steps=200_000))
        assert [p.name for p in ctx.workspace.runs_dir.iterdir()] == [parent.run_id]
    finally:
        cancel_run(ctx, RunRequest(run_id=parent.run_id))


@pytest.mark.parametrize("argument", ["parent_run", "resume_from"])
def test_an_unknown_parent_or_resumed_run_is_named_with_its_argument(ctx, dataset_id, argument):
    with pytest.raises(NotFoundError, match=rf"^argument '{argument}': unknown run id 'run-nope'"):
        launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, steps=10, **{argument: "run-nope"}))


def test_a_wandb_project_without_the_wandb_extra_is_refused_before_any_run_exists(own_ctx, tiny_run_settings):
    ctx, dataset = own_ctx
    # A fresh interpreter where `import wandb` fails, as it does without the extra.
    code = (
        "import sys; sys.modules['wandb'] = None\n"
        "from tradewind.tools import LaunchTrainingRequest, ToolContext, launch_training\n"
        f"ctx = ToolContext.open({str(ctx.workspace.root)!r}, allowed_paths=({str(Path(dataset).parent)!r},))\n"
        f"request = LaunchTrainingRequest(dataset={dataset!r}, steps=10, wandb_project='tw', **{tiny_run_settings!r})\n"
        "launch_training(ctx, request)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "InvalidInputError: argument 'wandb_project': W&B logging needs the wandb package" in result.stderr
    assert "pip install 'tradewind[wandb]'" in result.stderr
    assert list(ctx.workspace.runs_dir.iterdir()) == [] and ctx.backend.list() == []


def test_resume_from_refuses_a_run_whose_checkpoints_or_config_link_outside(own_ctx, tmp_path):
    ctx, dataset = own_ctx
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "config.json").write_text(TrainConfig(dataset=dataset).model_dump_json(), encoding="utf-8")
    layout = RunLayout(ctx.workspace.run_dir("copied", must_exist=False))
    (layout.checkpoints / "10").mkdir(parents=True)
    layout.config.write_text(TrainConfig(dataset=dataset).model_dump_json(), encoding="utf-8")
    (layout.checkpoints / "10" / "state").symlink_to(secret)
    with pytest.raises(PathEscapeError, match=r"argument 'resume_from': .*checkpoints/10/state"):
        launch_training(ctx, LaunchTrainingRequest(resume_from="copied", steps=20))
    layout.config.unlink()
    layout.config.symlink_to(secret / "config.json")
    with pytest.raises(PathEscapeError, match=r"argument 'resume_from': .*config\.json"):
        launch_training(ctx, LaunchTrainingRequest(resume_from="copied", steps=20))
    assert [p.name for p in ctx.workspace.runs_dir.iterdir()] == ["copied"]


@pytest.mark.slow
@needs_libtpu
def test_a_tpu_run_too_big_for_its_chip_trains_with_the_least_costly_memory_change_that_fits_and_says_which(
    tmp_path, monkeypatch, ctx, dataset_id, tiny_run_settings
):
    """Real TPU compiles for a v5e chip (libtpu's compile-only client), on a host declared a one-chip v5e one
    (`TRADEWIND_HOST_TPU`). The run is launched into a queue held full, so it never trains here."""
    if lock_holders():
        pytest.skip(f"a process holds {LIBTPU_LOCKFILE}: a real TPU program")
    monkeypatch.setenv(HOST_TPU_ENV, "v5litepod-1")
    fresh = workspace_with_dataset(ctx, dataset_id, tmp_path / "ws")
    # Its weights, gradients and Adam's float32 moments alone pass one chip's 16 GiB. Compiled, neither bfloat16
    # moments, nor they with full remat (scanned blocks or unrolled), nor the moments in host memory bring it within
    # the chip (its step's temporaries hold float32 copies of the embedding's size); the frugal end (Adafactor, with
    # full remat) is the first that does.
    big = WIDE_EMBEDDING
    settings = {**tiny_run_settings, "model": big, "batch_size": 8, "seq_len": 64}
    parameters = TrainConfig(dataset="unused", model=big).model.count_params()
    change = "optimizer.type=adafactor, remat=full and scan_layers=true"
    as_given = (
        f"as given it does not fit 1 x v5litepod-1 (its weights, gradients and adamw state alone need "
        f"{16 * parameters / 2**30:,.2f} GiB of HBM per chip), so it trains with {change}: "
    )
    # estimate_run says what launch_training will do, and compiles it first (the launch below finds it compiled:
    # a compile job would wait in the held queue).
    estimate = estimate_run(fresh, EstimateRunRequest(config={"dataset": dataset_id, **settings}))
    assert estimate.fits and estimate.advice.startswith(as_given[0].upper() + as_given[1:]), estimate.advice
    assert estimate.hbm_per_chip_bytes <= estimate.device_memory_bytes
    reports = [json.loads(path.read_text()) for path in (fresh.workspace.root / "cache" / "tpu").iterdir()]
    # Those four were compiled before it, in one job, and did not fit; the run as given and the changes that keep
    # its float32 moments were not (their state alone passes the chip).
    assert sorted(report["fits"] for report in reports) == [False, False, False, False, True]
    assert sum(job.spec.callable == COMPILE_CALLABLE for job in fresh.backend.list()) == 1
    with pending_run(fresh, dataset_id, settings) as run:
        config = TrainConfig.model_validate_json(RunLayout(Path(run.run_dir)).config.read_text())
        assert config.optimizer.type == "adafactor" and config.remat == "full" and config.scan_layers
        assert as_given in run.accelerator_note and "Adafactor (a factored second moment" in run.accelerator_note
        assert as_given in RunLayout(Path(run.run_dir)).log.read_text().splitlines()[0]


@pytest.mark.slow
def test_a_tpu_run_too_big_for_its_chip_with_every_memory_change_is_refused_before_anything_compiles_or_queues(
    tmp_path, ctx, dataset_id
):
    fresh = ToolContext.open(tmp_path / "ws", allowed_paths=(ctx.workspace.datasets_dir,))
    # 9.4 billion parameters: their float32 weights and gradients alone (8 bytes each) pass a chip's 16 GiB.
    huge = {"d_model": 8192, "n_layers": 1, "n_heads": 64, "vocab_size": 2**20, "max_seq_len": 64}
    request = LaunchTrainingRequest(
        dataset=str(ctx.workspace.dataset_dir(dataset_id)),
        model=huge,
        batch_size=8,
        seq_len=64,
        accelerator="tpu-v5litepod-1",
        backend="ray",  # not asked: the run is refused before its backend is
    )
    if not can_compile_for_tpu():
        pytest.skip("without libtpu a TPU run is let through unchecked")
    with pytest.raises(InvalidInputError) as refused:
        launch_training(fresh, request)
    floor = 16 * TrainConfig(dataset="unused", model=huge).model.count_params() / 2**30
    message = str(refused.value)
    assert message.startswith(
        "argument 'accelerator': the run does not fit 1 x v5litepod-1: its weights, gradients and adamw state "
        f"alone need {floor:,.2f} GiB of HBM per chip, and a TPU v5 lite chip has 16.00 GiB; "
        "optimizer.bf16_moments=true or "
    ), message
    assert "optimizer.type=adafactor, remat=full and scan_layers=true or " in message
    assert message.endswith("does not fit either: take a larger slice, or a smaller model, batch_size or seq_len")
    assert list(fresh.workspace.runs_dir.iterdir()) == [] and fresh.backend.list() == []  # nothing compiled


@needs_libtpu
def test_a_tpu_batch_that_does_not_split_over_the_slices_chips_is_refused_naming_it(ctx, dataset_id):
    request = LaunchTrainingRequest(dataset=dataset_id, batch_size=12, accelerator="tpu-v5litepod-8", backend="ray")
    with pytest.raises(InvalidInputError, match=r"argument 'batch_size': batch_size / grad_accum = 12 / 1 must be"):
        launch_training(ctx, request)


@pytest.mark.slow
@needs_libtpu
def test_on_a_tpu_host_a_run_defaults_to_its_chips_and_an_outside_holder_of_them_is_named(
    tmp_path, monkeypatch, ctx, dataset_id, tiny_run_settings
):
    """This machine declared a one-chip v5e host (`TRADEWIND_HOST_TPU`, read by every process of the workspace):
    the launch places the run on the chip, compiles it for one there, and trains; JAX here has no TPU, so the
    trainer trains on the CPU with a warning (tests/tpu/ runs the same on a real chip)."""
    if lock_holders():
        pytest.skip(f"a process holds {LIBTPU_LOCKFILE}: a real TPU program")
    existed = os.path.exists(LIBTPU_LOCKFILE)  # libtpu leaves it behind
    monkeypatch.setenv(HOST_TPU_ENV, "v5litepod-1")
    fresh = workspace_with_dataset(ctx, dataset_id, tmp_path / "ws")
    request = LaunchTrainingRequest(dataset=dataset_id, steps=10, **tiny_run_settings)
    try:
        with holding_open(LIBTPU_LOCKFILE) as holder:
            lock = rf"which holds libtpu's lock file {LIBTPU_LOCKFILE}"
            named = rf"held by process {holder.pid} \(.*\), {lock}.*kill {holder.pid}"
            with pytest.raises(InvalidInputError, match=rf"tpu-v5litepod-1: this host's TPU chips are {named}"):
                launch_training(fresh, request)
    finally:
        if not existed:
            os.remove(LIBTPU_LOCKFILE)
    assert list(fresh.workspace.runs_dir.iterdir()) == []
    run = launch_training(fresh, request)
    assert str(run.accelerator) == "tpu-v5litepod-1"
    note = "accelerator tpu-v5litepod-1: this host's TPU, the default on a TPU host"
    assert note in RunLayout(Path(run.run_dir)).log.read_text().splitlines()[0]
    assert fresh.backend.cluster_status().capacity["tpus"] == 1
    assert finish(fresh, run.run_id).status is JobStatus.SUCCEEDED
