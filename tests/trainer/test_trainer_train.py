"""Training a tiny model end to end: the loss falls, and the run folder holds what the trainer promises."""

import json
import os
import re
import struct
import subprocess
import sys

import jax
import numpy as np
import pytest

from tradewind.cluster import Placement
from tradewind.core import ConfigError, InvalidInputError, NotFoundError, TradewindError, read_json
from tradewind.data import TokenizeConfig, build_token_cache, load_tokenizer
from tradewind.runs import (
    RunLayout,
    RunRecord,
    TrainSummary,
    open_run_data,
    read_metrics,
    read_record,
    read_summary,
    write_record,
)
from tradewind.trainer import evaluate, read_checkpoint, setup_training, train


@pytest.fixture(scope="module")
def tiny_run(tiny_config, tmp_path_factory):
    """A finished 20-step run of the tiny model: (config, run folder, returned summary)."""
    config = tiny_config()
    run_dir = tmp_path_factory.mktemp("runs") / "tiny"
    return config, run_dir, train(config, run_dir)


@pytest.fixture(scope="module")
def tiny_setup(tiny_run):
    """The tiny run's setup built afresh: initial parameters and the compiled eval step."""
    config, _, _ = tiny_run
    return setup_training(config)


@pytest.mark.slow
def test_twenty_steps_bring_the_eval_loss_below_its_step_zero_value(tiny_run):
    _, run_dir, summary = tiny_run
    assert summary.final_eval_loss < summary.first_eval_loss - 0.5
    assert summary.best_eval_loss == min(summary.first_eval_loss, summary.final_eval_loss, summary.best_eval_loss)
    assert read_summary(RunLayout(run_dir).summary) == summary


@pytest.mark.slow
def test_summary_counts_steps_tokens_and_parameters(tiny_run):
    _, _, summary = tiny_run
    assert summary.steps == 20
    assert summary.tokens_seen == 20 * 8 * 32
    assert summary.parameters == 258 * 32 + 2 * (4 * 32 * 32 + 3 * 32 * 96 + 2 * 32) + 32  # byte vocab, d_ff 96
    assert summary.mean_tokens_per_s > 0 and summary.compile_s > 0 and summary.wall_s > summary.compile_s


@pytest.mark.slow
def test_the_summary_says_what_memory_the_compiled_step_needs_and_the_cpu_has_no_device_memory(tiny_run, tiny_setup):
    _, _, summary = tiny_run
    memory = tiny_setup.train_step.memory_analysis()  # the same program, compiled again here
    weights = 4 * summary.parameters  # float32: the parameters alone are an argument of the step
    assert summary.step_memory_bytes >= weights and summary.step_memory_bytes >= memory.argument_size_in_bytes
    assert summary.device_memory_bytes is None  # a TPU chip's or GPU's would be its memory (the dashboard shows it)


@pytest.mark.slow
def test_the_summary_says_where_the_start_up_went_stage_by_stage(tiny_run):
    _, _, summary = tiny_run
    stages = ["python and imports", "devices", "data", "model", "compile", "first eval", "first update"]
    assert sorted(summary.startup_s) == sorted(stages) and min(summary.startup_s.values()) >= 0
    assert summary.startup_s["compile"] == summary.compile_s > 0
    # Each stage runs from the end of the one before: together they are the time to the first update.
    assert sum(summary.startup_s.values()) == pytest.approx(summary.first_update_s, abs=0.01)
    assert summary.first_update_s < summary.wall_s


@pytest.mark.slow
def test_metrics_rows_carry_train_fields_at_log_steps_and_eval_loss_at_eval_steps(tiny_run):
    _, run_dir, summary = tiny_run
    rows = read_metrics(RunLayout(run_dir).metrics)
    assert [row.step for row in rows] == [0, 5, 10, 15, 20]
    assert [row.step for row in rows if row.eval_loss is not None] == [0, 10, 20]
    assert [row.step for row in rows if row.loss is not None] == [5, 10, 15, 20]
    for row in rows[1:]:
        assert row.lr > 0 and row.grad_norm > 0 and row.tokens_per_s > 0 and np.isfinite(row.loss)
    assert rows[0].eval_loss == summary.first_eval_loss and rows[-1].eval_loss == summary.final_eval_loss
    assert rows[-1].loss == summary.final_loss
    assert [row.elapsed for row in rows] == sorted(row.elapsed for row in rows)
    # Rows leave out fields that do not apply rather than writing null.
    first_line = RunLayout(run_dir).metrics.read_text(encoding="utf-8").splitlines()[0]
    assert set(json.loads(first_line)) == {"step", "eval_loss", "eval_perplexity", "eval_bits_per_byte", "elapsed"}


@pytest.mark.slow
def test_checkpoint_restores_the_final_parameters_and_step(tiny_run, tiny_setup):
    _, run_dir, summary = tiny_run
    setup = tiny_setup
    state = read_checkpoint(RunLayout(run_dir).checkpoints, setup.state)
    assert (state.step, state.data_step) == (20, 20)
    # The restored parameters reproduce the final eval loss; fresh ones do not.
    assert evaluate(setup, state.params) == pytest.approx(summary.final_eval_loss, abs=1e-6)
    assert evaluate(setup, setup.state.params) == pytest.approx(summary.first_eval_loss, abs=1e-6)
    assert jax.tree.structure(state.opt_state) == jax.tree.structure(setup.state.opt_state)
    assert RunLayout(run_dir).config.exists()


@pytest.mark.slow
def test_training_again_into_a_finished_run_folder_is_refused(tiny_run):
    config, run_dir, _ = tiny_run
    with pytest.raises(InvalidInputError, match="earlier run"):
        train(config, run_dir)


@pytest.mark.slow
def test_non_finite_loss_stops_training_naming_the_first_bad_step(tiny_config, tmp_path):
    def failing_step(log_every: int, run_dir) -> int:
        config = tiny_config(
            steps=6, log_every=log_every, checkpoint=False, optimizer={"learning_rate": 1e10, "warmup_steps": 0}
        )
        with pytest.raises(TradewindError, match=r"training loss became (nan|inf|-inf) at step \d+") as raised:
            train(config, run_dir)
        assert not RunLayout(run_dir).summary.exists()
        return int(re.search(r"at step (\d+)", str(raised.value)).group(1))

    # Logging every step shows where the loss first went bad; logging every 6 must name the same step.
    step = failing_step(1, tmp_path / "every-step")
    logged = [row.step for row in read_metrics(RunLayout(tmp_path / "every-step").metrics) if row.loss is not None]
    assert logged == list(range(1, step))
    assert failing_step(6, tmp_path / "every-sixth") == step


def test_model_vocabulary_smaller_than_the_tokenizers_is_refused(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match=r"model.vocab_size: 100 is smaller .* \(258"):
        train(tiny_config(model={"vocab_size": 100}), tmp_path / "run")


def test_a_missing_dataset_is_reported_as_no_token_cache(tiny_config, tmp_path):
    with pytest.raises(TradewindError, match="no token cache"):
        train(tiny_config(dataset=str(tmp_path / "nowhere")), tmp_path / "run")


def run_trainer_module(run_dir, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tradewind.trainer", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize(
    ("config", "env", "expected"),
    [
        ({}, {"JAX_PLATFORMS": "cuda"}, "JAX could not start the devices of JAX_PLATFORMS='cuda'"),
        ({"distributed": {"enabled": True}}, {}, "distributed.enabled: JAX could not find the other processes"),
        ({"accelerator": "gpu"}, {"JAX_PLATFORMS": "cpu"}, "accelerator 'gpu': JAX found no GPU here"),
        ({"replicas": 2}, {}, "replicas: the run asks for 2 processes but 1 joined"),
    ],
    ids=["jax-platforms-cuda-on-cpu", "distributed-without-address", "gpu-on-cpu", "a-gang-of-one"],
)
def test_device_and_distributed_mistakes_end_in_an_error_naming_the_fix_not_a_traceback(
    tiny_config, tmp_path, config, env, expected
):
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    placement = Placement(**{name: value for name, value in config.items() if name in Placement.model_fields})
    trained = {name: value for name, value in config.items() if name not in Placement.model_fields}
    layout.config.write_text(tiny_config(**trained).model_dump_json(), encoding="utf-8")
    write_record(layout.record, RunRecord(run_id="run", backend="local", job_id="run", placement=placement))
    result = run_trainer_module(layout.root, **env)
    assert result.returncode == 1 and expected in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    record = read_record(layout.record)
    assert record.status == "FAILED" and expected in record.reason


@pytest.mark.slow
def test_trainer_module_trains_a_two_step_run_from_its_config_json(tiny_config, tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    layout.config.write_text(tiny_config(steps=2, log_every=1).model_dump_json(), encoding="utf-8")
    result = run_trainer_module(layout.root)
    assert result.returncode == 0, result.stderr
    assert "step 2/2" in result.stdout
    summary = TrainSummary.model_validate(read_json(layout.summary))
    assert summary.steps == 2
    # The start-up is timed from the process's start: Python and the imports are its first stage.
    assert f"first update {summary.first_update_s:.1f} s after the start (python and imports " in result.stdout
    assert summary.startup_s["python and imports"] > 0
    assert [row.step for row in read_metrics(layout.metrics)] == [0, 1, 2]
    assert (layout.checkpoints / "2").is_dir()


def test_trainer_module_reports_a_bad_config_on_stderr_and_exits_one(tiny_config, tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    data = tiny_config().model_dump(mode="json")
    data["model"]["n_heads"] = 3
    layout.config.write_text(json.dumps(data), encoding="utf-8")
    result = run_trainer_module(layout.root)
    assert result.returncode == 1
    assert f"{layout.config}: model.n_heads: " in result.stderr
    assert "Traceback" not in result.stderr
    assert not layout.metrics.exists()


@pytest.mark.slow
def test_restoring_a_step_that_was_not_saved_names_the_saved_steps(tiny_run, tiny_setup, tmp_path):
    _, run_dir, _ = tiny_run
    setup = tiny_setup
    with pytest.raises(NotFoundError, match=r"step 7 .* saved steps: \[20\]"):
        read_checkpoint(RunLayout(run_dir).checkpoints, setup.state, step=7)
    with pytest.raises(NotFoundError, match="no checkpoints"):
        read_checkpoint(tmp_path / "empty", setup.state)


@pytest.mark.slow
def test_summary_and_rows_report_flops_mfu_perplexity_and_bits_per_byte(tiny_run):
    import math

    from tradewind.data import open_token_cache

    config, run_dir, summary = tiny_run
    model = config.model.model_copy(update={"vocab_size": 258})
    assert summary.model_flops_per_token == model.flops_per_token(config.seq_len)
    assert 0 < summary.mfu < 1 and summary.peak_flops > 0 and "estimate" in summary.peak_flops_source
    val = open_token_cache(config.dataset).manifest.splits["val"]
    for row in read_metrics(RunLayout(run_dir).metrics):
        if row.eval_loss is not None:
            assert row.eval_perplexity == pytest.approx(math.exp(row.eval_loss))
            assert row.eval_bits_per_byte == pytest.approx(row.eval_loss / math.log(2) * val.tokens / val.bytes)
        if row.loss is not None:
            assert row.param_norm > 0 and row.step_time_s > 0 and 0 < row.mfu < 1
    assert summary.final_eval_perplexity == pytest.approx(math.exp(summary.final_eval_loss))


@pytest.mark.slow
def test_the_run_writes_one_tensorboard_event_per_metrics_row(tiny_run):
    _, run_dir, _ = tiny_run
    (events,) = RunLayout(run_dir).tensorboard.glob("events.out.tfevents.*")
    raw = events.read_bytes()
    count, pos = 0, 0
    while pos < len(raw):
        (length,) = struct.unpack("<Q", raw[pos : pos + 8])
        pos += 16 + length
        count += 1
    assert count == 1 + len(read_metrics(RunLayout(run_dir).metrics))  # the version header, then the rows


def wandb_records(path):
    """The protobuf records of a W&B run file, decoded independently of wandb's own reader.

    The file is a 7-byte header (":W&B", magic, version), then LevelDB log chunks in 32 KiB blocks: a
    4-byte checksum, 2-byte length and 1-byte type (1 whole record, 2 first, 3 middle, 4 last part).
    """
    from wandb.proto.wandb_internal_pb2 import Record

    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B"
    pos, parts, records = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(Record.FromString(parts))
            parts = b""
    return records


@pytest.mark.slow
def test_with_wandb_project_set_every_metrics_row_is_logged_to_wandb(tiny_config, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    # W&B's offline mode is the boundary: it writes the run file that `wandb sync` would upload.
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    train(tiny_config(wandb_project="tradewind-test"), tmp_path / "wb-run")

    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.project == "tradewind-test" and run.display_name == "wb-run"
    logged = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            logged[items["_step"]] = items
    rows = read_metrics(RunLayout(tmp_path / "wb-run").metrics)
    assert sorted(logged) == [row.step for row in rows]
    for row in rows:
        expected = {k: v for k, v in row.model_dump(exclude_none=True).items() if k != "step"}
        assert {k: logged[row.step][k] for k in expected} == pytest.approx(expected)


@pytest.mark.slow
def test_skip_policy_finishes_a_run_whose_losses_go_non_finite_and_counts_the_skips(tiny_config, tmp_path):
    config = tiny_config(
        steps=6,
        log_every=3,
        checkpoint=False,
        on_nonfinite="skip",
        optimizer={"learning_rate": 1e10, "warmup_steps": 0},
    )
    summary = train(config, tmp_path / "run")
    assert summary.skipped_steps is not None and summary.skipped_steps >= 1
    assert summary.steps == 6


@pytest.mark.slow
def test_a_packed_documents_run_counts_the_documents_tokens_not_the_padding_in_tokens_per_s_and_mfu(
    tiny_config, tmp_path
):
    # Short prompt/completion records, whole in each window: most of every window is padding.
    records = [{"prompt": f"question {i} ", "completion": f"answer {i}"} for i in range(400)]
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    build_token_cache([source], tmp_path / "cache", load_tokenizer("byte"), TokenizeConfig(format="prompt_completion"))
    config = tiny_config(dataset=str(tmp_path / "cache"), steps=4, log_every=2, eval_every=4)
    summary = train(config, tmp_path / "run")

    loader = open_run_data(config).train  # the same batches, in the same order
    batches = [loader.batch(step) for step in range(4)]
    real = [int((batch.segments[:, :-1] > 0).sum()) for batch in batches]
    assert sum(real) < 0.8 * 4 * config.tokens_per_step  # the case: a good share of each window is padding
    rows = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if row.step_time_s is not None]
    for row, tokens in zip(rows, (sum(real[:2]), sum(real[2:])), strict=True):
        assert row.tokens_per_s * 2 * row.step_time_s == pytest.approx(tokens)
        assert row.mfu == pytest.approx(row.tokens_per_s * summary.model_flops_per_token / summary.peak_flops)
    assert summary.mean_tokens_per_s == pytest.approx(sum(real) / sum(2 * row.step_time_s for row in rows))
