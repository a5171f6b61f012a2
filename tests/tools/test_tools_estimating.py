"""estimate_run: a run sized before it queues, its step time from a finished run of the same shape or a probe job."""

import functools
import math
import re
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp_helpers import call
from runs_helpers import CancelAtFirstReport
from tpu_helpers import WIDE_EMBEDDING, needs_libtpu

from tradewind.cluster import JobStatus, Placement
from tradewind.core import NotFoundError, TradewindError
from tradewind.data import build_token_cache, load_tokenizer
from tradewind.runs import RunLayout, TrainConfig, read_summary
from tradewind.runs.compile import COMPILE_CALLABLE
from tradewind.runs.config import with_fields
from tradewind.runs.estimate import ESTIMATE_CALLABLE, PROBE_MIN_STEPS, EstimateJob, estimate_training
from tradewind.server import build_server
from tradewind.tools import ToolContext, tpu_fit
from tradewind.tools.context import Cancelled, no_progress
from tradewind.tools.estimating import EstimateRunRequest, describe_estimate, estimate_run

TINY = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64}, "batch_size": 8, "seq_len": 32}
HUGE_MODEL = {"d_model": 16384, "n_layers": 128, "n_heads": 128, "max_seq_len": 64}
# Weights and optimizer state outweigh the activations; a LoRA run of it is sized without building it.
WIDE = {**TINY, "model": {"d_model": 1024, "n_layers": 8, "n_heads": 8, "max_seq_len": 64}}
LORA = {"rank": 8, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}
ADAPTERS = 8 * 8 * 4 * (1024 + 1024)  # rank * layers * targets * (in + out)


@pytest.fixture
def cache_ctx(tmp_path, small_corpus) -> ToolContext:
    """A workspace with a byte-level token cache at datasets/tiny and no runs."""
    ctx = ToolContext.open(tmp_path / "workspace")
    build_token_cache([small_corpus], ctx.workspace.root / "datasets" / "tiny", load_tokenizer("byte"))
    return ctx


def estimate_jobs(ctx: ToolContext) -> list:
    return [record for record in ctx.backend.list() if record.spec.callable == ESTIMATE_CALLABLE]


def test_without_a_probe_or_an_earlier_run_the_estimate_is_analytic_and_says_how_to_time_it(cache_ctx):
    result = estimate_run(cache_ctx, EstimateRunRequest(config={"dataset": "tiny", **TINY, "steps": 50}, probe=False))

    folder = cache_ctx.workspace.datasets_dir / "tiny"
    analytic = estimate_training(TrainConfig(dataset=str(folder), **TINY, steps=50))
    assert (result.parameters, result.flops_per_token, result.memory_bytes) == (
        analytic.parameters,
        analytic.flops_per_token,
        analytic.memory_bytes,
    )
    assert result.compute_optimal_tokens == 20 * result.parameters
    assert result.fits is True and result.tokens_per_step == 256
    assert [result.step_time_s, result.step_time_source, result.budget_s, result.compute_optimal_budget_s] == [None] * 4
    assert (result.budget_kind, result.steps_in_budget, result.tokens_in_budget) == ("steps", 50, 50 * 256)
    assert result.probed_steps is None
    per_parameter = 50 * 256 / result.parameters
    assert result.advice.startswith(
        f"50 steps train 12,800 tokens: {per_parameter:.1f} tokens per parameter, far below"
    )
    assert result.advice.endswith(
        "No step time: no finished run has this shape; estimate with probe=true to time its steps."
    )
    assert estimate_jobs(cache_ctx) == [] and list(cache_ctx.workspace.runs_dir.iterdir()) == []


def test_a_flop_budget_needs_no_vocab_size_from_the_caller_the_dataset_says_it(cache_ctx):
    with_vocab = {**WIDE, "model": {**WIDE["model"], "vocab_size": 258}}  # the byte tokenizer's
    per_step = TrainConfig(dataset="tiny", **with_vocab).flops_per_token() * 256
    results = [
        estimate_run(
            cache_ctx,
            EstimateRunRequest(config={"dataset": "tiny", **shape, "flop_budget": 40.5 * per_step}, probe=False),
        )
        for shape in (WIDE, with_vocab)
    ]
    assert [(result.budget_kind, result.steps_in_budget) for result in results] == [("flops", 41)] * 2


def test_a_token_budget_fixes_the_steps_and_too_few_tokens_ask_for_more_steps_never_a_smaller_model(cache_ctx):
    # 577,536 tokens for a 100M-parameter model: the case whose advice once named a 28,876-parameter model.
    config = {"dataset": "tiny", **WIDE, "token_budget": 577_536}
    result = estimate_run(cache_ctx, EstimateRunRequest(config=config, probe=False))

    steps = math.ceil(577_536 / 256)
    assert (result.budget_kind, result.steps_in_budget, result.tokens_in_budget) == ("tokens", steps, steps * 256)
    optimal_steps = math.ceil(20 * result.parameters / 256)
    assert result.advice.startswith(
        f"A budget of 577,536 tokens takes {steps:,} steps: {577_536 / result.parameters:.2g} tokens per parameter, "
        "far below the "
        f"compute-optimal 20, so the model will be undertrained; about {optimal_steps:,} steps would reach 20."
    )
    assert "smaller" not in result.advice and "a model of" not in result.advice
    # A time cap beside it cannot be judged without a step time: the work's steps stand.
    capped = estimate_run(cache_ctx, EstimateRunRequest(config=config, time_budget_s=5, probe=False))
    assert (capped.steps_in_budget, capped.budget_s) == (steps, None) and capped.advice == result.advice


def test_far_more_tokens_than_compute_optimal_suggest_a_larger_model_and_a_few_times_more_suggest_nothing(cache_ctx):
    parameters = estimate_run(cache_ctx, EstimateRunRequest(config={"dataset": "tiny", **TINY}, probe=False)).parameters

    def advice(tokens_per_parameter: int) -> str:
        config = {"dataset": "tiny", **TINY, "token_budget": tokens_per_parameter * parameters}
        return estimate_run(cache_ctx, EstimateRunRequest(config=config, probe=False)).advice

    assert "far above the compute-optimal 20: a larger model would likely use them better." in advice(200)
    assert "within 4x of the compute-optimal 20." in advice(60) and "model" not in advice(60)
    assert "within 4x of the compute-optimal 20." in advice(6) and "undertrained" not in advice(6)


def test_a_lora_estimate_counts_adapters_as_trainable_and_the_base_as_frozen_in_far_less_memory(cache_ctx):
    full = estimate_run(cache_ctx, EstimateRunRequest(config={"dataset": "tiny", **WIDE}, probe=False))
    lora = estimate_run(cache_ctx, EstimateRunRequest(config={"dataset": "tiny", **WIDE, "lora": LORA}, probe=False))

    assert (full.parameters, full.frozen_parameters) == (lora.frozen_parameters, 0) and full.parameters > 10**8
    assert lora.parameters == ADAPTERS
    memory = lora.memory_bytes
    assert memory.params == 2 * full.parameters + 2 * 4 * ADAPTERS  # bfloat16 base; float32 adapters and gradients
    assert memory.optimizer == 2 * 4 * ADAPTERS  # adamw's two moments, of the adapters only
    assert memory.activations == full.memory_bytes.activations
    assert memory.total < full.memory_bytes.total / 4
    # The compute-optimal count is the whole model's, as full fine-tuning's.
    assert lora.compute_optimal_tokens == 20 * (ADAPTERS + full.parameters)
    row = "parameters              "
    assert f"{row}{ADAPTERS:,} trainable (LoRA), {full.parameters:,} frozen (bfloat16)\n" in describe_estimate(lora)
    assert f"{row}{full.parameters:,}\n" in describe_estimate(full)
    assert estimate_jobs(cache_ctx) == []


def test_a_lora_estimate_through_mcp_reports_the_counts_without_building_the_model(cache_ctx):
    config = {"dataset": "tiny", **WIDE, "lora": LORA}

    async def estimate():
        async with Client(build_server(cache_ctx)) as client:
            return await call(client, "estimate_run", {"config": config, "probe": False})

    result = anyio.run(estimate)

    expected = estimate_run(cache_ctx, EstimateRunRequest(config=config, probe=False))
    assert (result["parameters"], result["frozen_parameters"]) == (ADAPTERS, expected.frozen_parameters)
    assert result["memory_bytes"] == expected.memory_bytes.model_dump()
    assert result["step_time_source"] is None and estimate_jobs(cache_ctx) == []


async def refusal(ctx, arguments):
    """The error text an agent reads when estimate_run refuses `arguments`."""
    async with Client(build_server(ctx)) as client:
        result = await client.call_tool("estimate_run", arguments)
    assert result.is_error
    return result.content[0].text


@pytest.mark.anyio
async def test_a_lora_estimate_of_a_gpt2_model_is_refused_naming_its_projections(cache_ctx):
    config = {"dataset": "tiny", **TINY, "model": {"type": "gpt2", "max_seq_len": 64}, "lora": LORA}
    message = await refusal(cache_ctx, {"config": config, "probe": False})
    assert re.search(r"argument 'config\.lora': .*a gpt2 model has no q_proj, k_proj", message), message


def test_a_model_too_big_for_memory_does_not_fit_and_the_advice_says_memory(cache_ctx):
    config = {"dataset": "tiny", **TINY, "model": HUGE_MODEL}
    result = estimate_run(cache_ctx, EstimateRunRequest(config=config, probe=False))

    assert result.fits is False and result.memory_bytes.total > result.device_memory_bytes
    assert "memory" in result.advice and "shrink" in result.advice
    assert "DOES NOT FIT" in describe_estimate(result)


def test_a_config_that_does_not_fit_memory_is_never_probed(cache_ctx):
    config = {"dataset": "tiny", **TINY, "model": HUGE_MODEL}
    # A probe would be cut off at timeout_s=1 and fail the call; none must start.
    result = estimate_run(cache_ctx, EstimateRunRequest(config=config, probe=True, timeout_s=1))

    assert result.fits is False and result.step_time_source is None and "memory" in result.advice
    assert estimate_jobs(cache_ctx) == []


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({}, "exactly one of 'config'"),
        ({"config": {"dataset": "tiny"}, "run_id": "r1"}, "exactly one of 'config'"),
    ],
)
def test_estimate_run_wants_exactly_one_of_config_and_run_id(arguments, named):
    with pytest.raises(ValueError, match=named):
        EstimateRunRequest.model_validate(arguments)


@pytest.mark.anyio
async def test_an_unknown_config_field_is_named_with_its_place_in_the_request(cache_ctx):
    unknown = await refusal(cache_ctx, {"config": {"dataset": "tiny", "model": {"d_modle": 32}}, "probe": False})
    assert re.search(r"argument 'config\.model\.d_modle'.*did you mean 'd_model'", unknown), unknown
    assert "argument 'config.steps'" in await refusal(cache_ctx, {"config": {"dataset": "tiny", "steps": 0}})


def test_an_unknown_run_or_dataset_is_named(cache_ctx):
    with pytest.raises(NotFoundError, match="unknown run id 'nope'"):
        estimate_run(cache_ctx, EstimateRunRequest(run_id="nope"))
    with pytest.raises(NotFoundError, match="dataset"):
        estimate_run(cache_ctx, EstimateRunRequest(config={"dataset": "nope"}, probe=False))


@pytest.mark.slow
def test_the_probe_runs_as_a_job_times_many_steps_and_queues_no_run(cache_ctx):
    config = {"dataset": "datasets/tiny", **TINY, "token_budget": 100 * 256}
    result = estimate_run(cache_ctx, EstimateRunRequest(config=config))

    assert result.step_time_source == "probe" and result.step_time_s > 0 and result.compile_s > 0
    assert result.probed_steps >= PROBE_MIN_STEPS  # not 3 steps' noise
    assert result.tokens_per_s == pytest.approx(256 / result.step_time_s)
    # The token budget fixes the steps; the step time gives their seconds.
    assert (result.budget_kind, result.steps_in_budget, result.tokens_in_budget) == ("tokens", 100, 100 * 256)
    assert result.budget_s == pytest.approx(100 * result.step_time_s)
    assert result.compute_optimal_budget_s == pytest.approx(20 * result.parameters / result.tokens_per_s)
    [record] = estimate_jobs(cache_ctx)
    job = EstimateJob.model_validate(record.spec.kwargs)
    assert job.config.dataset == str(cache_ctx.workspace.datasets_dir / "tiny") and job.config.token_budget == 25_600
    assert f"over {result.probed_steps} steps" in Path(record.spec.log_path).read_text(encoding="utf-8")
    # Trained as the run will be: on the CPU, with the workspace's compiled programs (which it leaves there).
    assert record.spec.env["JAX_PLATFORMS"] == "cpu"
    assert record.spec.env["JAX_COMPILATION_CACHE_DIR"] == str(cache_ctx.workspace.compile_cache_dir)
    assert any(cache_ctx.workspace.compile_cache_dir.iterdir())
    assert list(cache_ctx.workspace.runs_dir.iterdir()) == []


@pytest.mark.slow
def test_a_finished_run_of_the_same_shape_gives_the_step_time_and_the_probe_is_skipped(trained_ctx):
    before = len(estimate_jobs(trained_ctx))
    summary = read_summary(RunLayout(trained_ctx.workspace.run_dir("r1")).summary)
    step_s = summary.train_s / summary.steps  # its loop's seconds per step, evaluations included

    # Another step count, seed and learning rate: the same shape.
    config = {"dataset": "datasets/tiny", **TINY, "steps": 500, "seed": 3, "optimizer": {"learning_rate": 1e-3}}
    by_config = estimate_run(trained_ctx, EstimateRunRequest(config=config))
    by_run = estimate_run(trained_ctx, EstimateRunRequest(run_id="r1", time_budget_s=60))

    assert by_config.step_time_source == by_run.step_time_source == "run r1"
    assert by_config.step_time_s == pytest.approx(step_s) and by_run.step_time_s == pytest.approx(step_s)
    assert by_config.budget_s == pytest.approx(500 * step_s) and by_config.steps_in_budget == 500
    assert (by_run.budget_kind, by_run.budget_s, by_run.parameters) == ("time", 60, summary.parameters)
    assert by_run.steps_in_budget == math.floor(60 / step_s) and by_config.probed_steps is None

    # Beside a token budget, a time budget is a cap: it ends the work sooner only when it runs out first.
    work = {**config, "token_budget": 1000 * 256}
    capped = estimate_run(trained_ctx, EstimateRunRequest(config=work, time_budget_s=100.5 * step_s))
    assert (capped.budget_kind, capped.steps_in_budget, capped.budget_s) == ("tokens", 100, 100.5 * step_s)
    assert "s cap ends the run after 100 of the 1,000 steps that 256,000 tokens take (25,600 tokens):" in capped.advice
    uncapped = estimate_run(trained_ctx, EstimateRunRequest(config=work, time_budget_s=2000 * step_s))
    assert (uncapped.steps_in_budget, uncapped.budget_s) == (1000, pytest.approx(1000 * step_s))
    assert len(estimate_jobs(trained_ctx)) == before  # nothing probed

    other_shape = estimate_run(trained_ctx, EstimateRunRequest(config={**config, "batch_size": 4}, probe=False))
    assert other_shape.step_time_source is None


def test_a_cancelled_probe_stops_within_a_second_and_cancels_its_job(cache_ctx):
    cancel = CancelAtFirstReport()
    with pytest.raises(Cancelled):
        estimate_run(cache_ctx, EstimateRunRequest(config={"dataset": "tiny", **TINY, "steps": 10}), cancel)
    assert cancel.seconds_since() < 1.0
    [job] = estimate_jobs(cache_ctx)
    assert cache_ctx.backend.wait(job.id, timeout=30).status is JobStatus.CANCELLED


@pytest.mark.slow
@needs_libtpu
def test_a_tpu_run_is_compiled_for_its_slice_in_a_job_and_gets_fits_hbm_and_an_estimated_step(cache_ctx):
    # A real TPU compile (libtpu's compile-only client, no TPU and no network), in a job on the local backend.
    config = {"dataset": "tiny", **TINY, "batch_size": 16, "accelerator": "tpu-v5litepod-16", "mesh": {"fsdp": 4}}
    result = estimate_run(cache_ctx, EstimateRunRequest(config=config, time_budget_s=60))

    assert result.fits is True and 0 < result.hbm_per_chip_bytes <= result.device_memory_bytes == 16 * 2**30
    memory = result.memory_bytes  # one chip's, as compiled: its parts add up to the compiled HBM
    assert memory.total == result.hbm_per_chip_bytes == memory.params + memory.optimizer + memory.activations
    shards = 4  # mesh.fsdp: weights, gradients and Adam's two moments, each float32, a quarter on each chip
    assert memory.params == 8 * result.parameters // shards and memory.optimizer >= 8 * result.parameters // shards
    assert result.device_memory_source == "HBM of one TPU v5 lite chip (1 x v5litepod-16, compiled)"
    assert result.step_time_source == "TPU compile, calibrated estimate" and result.step_time_s > 0
    assert 0 < result.estimated_mfu <= 1 and result.compile_s > 0
    assert result.steps_in_budget == math.floor(60 / result.step_time_s)
    [job] = cache_ctx.backend.list()
    assert job.spec.callable == COMPILE_CALLABLE and job.status is JobStatus.SUCCEEDED
    assert job.spec.resources.tpu is None  # compiled here, on the CPU
    assert estimate_jobs(cache_ctx) == [] and list(cache_ctx.workspace.runs_dir.iterdir()) == []


@pytest.mark.slow
@needs_libtpu
def test_a_tpu_compile_is_reused_until_the_trainers_code_changes(cache_ctx, monkeypatch):
    config = {"dataset": "tiny", **TINY, "batch_size": 16, "accelerator": "tpu-v5litepod-4", "mesh": {"fsdp": 4}}

    def compiles() -> int:
        return sum(job.spec.callable == COMPILE_CALLABLE for job in cache_ctx.backend.list())

    first = estimate_run(cache_ctx, EstimateRunRequest(config=config))
    again = estimate_run(cache_ctx, EstimateRunRequest(config=config))
    assert compiles() == 1 and again.hbm_per_chip_bytes == first.hbm_per_chip_bytes  # from cache/tpu/
    # Another Tradewind (its model, step or sharding code changed) compiles afresh: the old figures may be wrong.
    monkeypatch.setattr(tpu_fit, "trainer_source_hash", lambda: "another trainer")
    estimate_run(cache_ctx, EstimateRunRequest(config=config))
    assert compiles() == 2


@pytest.mark.slow
@needs_libtpu
def test_a_tpu_run_too_big_for_its_chips_is_said_not_to_fit_with_the_compilers_numbers(cache_ctx):
    # Adam's state alone passes a chip; on eight chips it fits, its parameters sharded.
    config = {"dataset": "tiny", **TINY, "model": WIDE_EMBEDDING, "accelerator": "tpu-v5litepod-8"}
    sharded = estimate_run(cache_ctx, EstimateRunRequest(config=config))
    assert sharded.fits and sharded.advice.startswith("As given it does not fit 1 x v5litepod-8 (its weights")
    assert "so it trains with mesh.data=-1 and mesh.fsdp=8: " in sharded.advice

    # 1.9 billion parameters on one chip: with float32 weights and gradients (8 bytes a parameter) no memory
    # change brings it within 16 GiB once compiled.
    big = {"d_model": 8192, "n_layers": 2, "n_heads": 64, "vocab_size": 32000, "max_seq_len": 64}
    config = {**config, "model": big, "accelerator": "tpu-v5litepod-1"}
    result = estimate_run(cache_ctx, EstimateRunRequest(config=config))
    assert result.fits is False and result.step_time_s is None and result.estimated_mfu is None
    assert result.hbm_per_chip_bytes > result.device_memory_bytes
    assert result.advice.startswith("It does not fit a chip: the compiled step needs") and "mesh.fsdp" in result.advice


def test_a_fit_recomputes_fewer_blocks_unrolled_only_where_its_change_scanned_them_and_two_keep_activations(
    cache_ctx, monkeypatch
):
    asked, kept = [], {"blocks": 2}

    def recompute_fewer(ctx, config, placement, vocab_size, **kwargs):  # as if the compiles left room for `kept`
        asked.append(config)
        if config.scan_layers:
            return None
        return with_fields(config, {"remat_blocks": config.model.n_layers - kept["blocks"]}), None

    monkeypatch.setattr(tpu_fit, "recompute_fewer", recompute_fewer)
    placement = Placement(accelerator="tpu-v5litepod-1")

    def refined(given: TrainConfig, change_name: str) -> tpu_fit.SliceFit:
        change = next(change for change in tpu_fit.memory_changes(given, placement) if change.name == change_name)
        fit = tpu_fit.SliceFit(change.applied_to(given), None, change.name, change.cost, "needed")
        return tpu_fit.fewer_recomputed(cache_ctx, fit, change, given, placement, 128256, no_progress)

    unrolled = TrainConfig(dataset="unused", model={"preset": "llama-1b"}, batch_size=8, seq_len=2048)
    fit = refined(unrolled, "remat=full and scan_layers=true")
    assert not asked[-1].scan_layers and (fit.config.scan_layers, fit.config.remat_blocks) == (False, 14)
    assert fit.change == "remat=full, scan_layers=false and remat_blocks=14"
    assert fit.cost.endswith("; full remat in the first 14 of the 16 blocks only; " + tpu_fit.UNROLLED_COST)
    kept["blocks"] = 1  # no faster than scanned: the scanned fit stands
    assert refined(unrolled, "remat=full and scan_layers=true").change == "remat=full and scan_layers=true"
    fit = refined(with_fields(unrolled, {"remat": "full"}), "optimizer.bf16_moments=true")  # the run's own remat
    assert fit.change == "optimizer.bf16_moments=true and remat_blocks=15" and not fit.config.scan_layers
    refined(with_fields(unrolled, {"scan_layers": True}), "remat=full and scan_layers=true")
    assert asked[-1].scan_layers  # the run's own scanned blocks stay scanned


def test_a_refinement_whose_compile_fails_or_runs_too_long_leaves_every_block_recomputed(cache_ctx, monkeypatch):
    # Unrolled, a large model's blocks compile for long: past the compile's time limit the fit found stands.
    def too_long(*args, **kwargs):
        raise TradewindError("compiling for 1 x v5litepod-1 took longer than timeout_s=600.0")

    monkeypatch.setattr(tpu_fit, "compile_in_order", too_long)
    model = {"d_model": 64, "n_layers": 3, "n_heads": 2, "vocab_size": 512, "max_seq_len": 256}
    every = TrainConfig(dataset="unused", model=model, batch_size=8, seq_len=256, remat="full")
    placement = Placement(accelerator="tpu-v5litepod-1")
    assert tpu_fit.recompute_fewer(cache_ctx, every, placement, 512) is None

    def cancelled(*args, **kwargs):
        raise Cancelled("the caller cancelled")

    monkeypatch.setattr(tpu_fit, "compile_in_order", cancelled)
    with pytest.raises(Cancelled):  # a cancel still ends the launch
        tpu_fit.recompute_fewer(cache_ctx, every, placement, 512)


def test_an_adafactor_run_is_offered_neither_its_moments_halved_nor_moved_nor_the_same_change_twice():
    # Compiled for one v5e, a 1B Llama with Adafactor needed 21.32 GiB with bfloat16 moments and without.
    config = TrainConfig(dataset="unused", model={"preset": "llama-1b"}, optimizer={"type": "adafactor"})
    names = [change.name for change in tpu_fit.memory_changes(config, Placement(accelerator="tpu-v5litepod-1"))]
    assert names == [
        "remat=full and scan_layers=true",
        "remat=full and scan_layers=false",
        "grad_accum=2",
        "optimizer.type=adafactor, remat=full, scan_layers=true and grad_accum=16",
    ]


def test_the_memory_changes_of_a_run_that_remats_its_first_blocks_recompute_every_block():
    config = TrainConfig(
        dataset="unused", model={"preset": "llama-1b"}, batch_size=8, seq_len=2048, remat="full", remat_blocks=10
    )
    one_chip = Placement(accelerator="tpu-v5litepod-1")
    changes = {change.name: change.applied_to(config) for change in tpu_fit.memory_changes(config, one_chip)}
    everywhere = [changed for changed in changes.values() if changed.remat == "full" and changed.remat_blocks is None]
    assert {changed.scan_layers for changed in everywhere} == {True, False}, list(changes)
    assert "remat=full, scan_layers=false and remat_blocks=null" in changes


@pytest.mark.slow
@needs_libtpu
def test_a_run_that_fits_with_every_block_recomputed_recomputes_the_fewest_that_fit(cache_ctx):
    # Real compiles for one v5e chip (libtpu's compile-only client) of a 3-block model, small enough to compile in
    # seconds. Recomputing the last block saves nothing (its backward follows its forward at once), so with three
    # blocks one is recomputed where the budget lies just below no remat, and two where it lies just below one.
    placement = Placement(accelerator="tpu-v5litepod-1")
    model = {"d_model": 64, "n_layers": 3, "n_heads": 2, "vocab_size": 512, "max_seq_len": 256}
    folder = str(cache_ctx.workspace.datasets_dir / "tiny")
    every = TrainConfig(dataset=folder, model=model, batch_size=8, seq_len=256, remat="full")
    configs = [every, *(with_fields(every, change) for change in ({"remat": "none"}, {"remat_blocks": 1}))]
    every_report, none, first = tpu_fit.compile_in_order(cache_ctx, configs, placement, 512, train_only=True)
    assert every_report.hbm_bytes < first.hbm_bytes < none.hbm_bytes
    fewer = functools.partial(tpu_fit.recompute_fewer, cache_ctx, every, placement, 512)
    config, report = fewer(budget_bytes=none.hbm_bytes - 1)  # room for all but one block's activations
    assert config.remat_blocks == 1 and config.block_remat == ("full", "none", "none")
    assert report == first and report.fits
    config, report = fewer(budget_bytes=first.hbm_bytes - 1)
    assert config.remat_blocks == 2 and report.hbm_bytes < first.hbm_bytes
    assert fewer(budget_bytes=every_report.hbm_bytes + 1) is None  # less to spare than a block's activations
    scanned = with_fields(every, {"scan_layers": True})  # scanned blocks are recomputed all alike
    assert tpu_fit.recompute_fewer(cache_ctx, scanned, placement, 512, budget_bytes=none.hbm_bytes) is None
    assert sum(job.spec.callable == COMPILE_CALLABLE for job in cache_ctx.backend.list()) == 2  # the rest cached
