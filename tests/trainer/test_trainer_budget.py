"""Budgeted runs: `time_budget_s` trains for that long (compilation excluded), decays the schedule to its end
within it, and ends with val_loss and val_bpb on the dataset's fixed val tokens."""

import json
import math
import shutil
from types import SimpleNamespace

import jax
import numpy as np
import optax
import pytest
from chat_models import chat_tokenizer_folder
from flax import nnx

from tradewind.data import build_token_cache, builtin_corpus_path, load_tokenizer, open_token_cache
from tradewind.runs import TrainConfig, read_metrics
from tradewind.trainer import load_run_model, train
from tradewind.trainer import plan as plan_module
from tradewind.trainer.plan import StepPlan, TimeBudget
from tradewind.trainer.validation import fixed_val_tokens

BUDGET_S = 30.0


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    """The whole of Tiny Shakespeare, byte-level."""
    folder = tmp_path_factory.mktemp("shakespeare") / "cache"
    build_token_cache([builtin_corpus_path("tinyshakespeare")], folder, load_tokenizer("byte"))
    return folder


def independent_val_bpb(run_dir, cache_dir, seq_len):
    """val_loss and val_bpb of the run's last checkpoint, from the model's logits and optax's cross-entropy on the
    first val_tokens of the val split, and the bytes of the text the scored tokens decode to."""
    loaded = load_run_model(run_dir)
    cache = open_token_cache(cache_dir)
    count = min(cache.manifest.val_tokens, len(cache.tokens("val")) - 1) // seq_len
    stream = np.asarray(cache.tokens("val")[: count * seq_len + 1], dtype=np.int32)
    windows = np.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in range(count)])
    model = nnx.merge(loaded.graphdef, loaded.params)
    losses = [
        optax.softmax_cross_entropy_with_integer_labels(model(jnp_rows[:, :-1]), jnp_rows[:, 1:]).mean()
        for jnp_rows in np.array_split(windows, max(1, count // 16))
    ]
    sizes = [len(rows) for rows in np.array_split(windows, max(1, count // 16))]
    loss = sum(float(x) * n for x, n in zip(losses, sizes, strict=True)) / count
    text_bytes = len(load_tokenizer("byte").decode(stream[1:].tolist()).encode("utf-8"))
    return loss, loss * count * seq_len / math.log(2) / text_bytes, count * seq_len


@pytest.mark.slow  # trains for 30 seconds
def test_a_budgeted_run_stops_within_5_percent_of_its_budget_with_a_decayed_schedule_and_exact_val_bpb(
    shakespeare, tmp_path
):
    config = TrainConfig(
        dataset=str(shakespeare),
        model={"d_model": 64, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
        optimizer={"learning_rate": 3e-3, "warmup_steps": 10, "min_lr_ratio": 0.1},
        time_budget_s=BUDGET_S,
        batch_size=16,
        seq_len=64,
        eval_every=100,
        log_every=10,
    )
    summary = train(config, tmp_path / "run")

    assert summary.train_s == pytest.approx(BUDGET_S, rel=0.05)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    # The rows' own clock: from the row before the first update to the row of the last, about the budget too.
    assert rows[-1].elapsed - rows[0].elapsed == pytest.approx(BUDGET_S, rel=0.05)
    assert summary.steps == rows[-1].step > 50 and summary.time_budget_s == BUDGET_S
    assert rows[-1].eval_loss is not None  # the last step evaluated as any run's last does
    assert rows[-1].lr < 3e-3 * 0.15  # decayed to (near) its floor, 3e-4, by the last update
    assert summary.compile_s > 0 and summary.val_s is not None

    loss, bpb, tokens = independent_val_bpb(tmp_path / "run", shakespeare, config.seq_len)
    assert summary.val_tokens == tokens
    assert summary.val_loss == pytest.approx(loss, rel=1e-4)
    assert summary.val_bpb == pytest.approx(bpb, rel=1e-4)
    assert summary.val_bpb < 8.0 * 0.5  # learned something: a uniform byte model is 8 bits per byte


def test_the_budget_replans_the_step_count_from_the_measured_speed_and_ends_where_it_runs_out(tiny_config, monkeypatch):
    clock = [0.0]  # the budget's clock, moved by the test: a loaded machine's sleeps overrun, this one's never do
    monkeypatch.setattr(plan_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    plan = StepPlan.of(tiny_config(time_budget_s=1.0))
    budget = TimeBudget(plan, seconds=1.0, first_step=0)
    step, planned = 0, []
    while step < plan.total_steps and step < 1000:
        step += 1
        budget.tick(step, jax.numpy.zeros(()))  # after dispatching update `step`
        clock[0] += 0.02  # what update `step` takes
        planned.append(plan.total_steps)
    assert 45 <= step <= 50  # 1 s of 20 ms updates, the last one included
    assert all(45 <= total <= 52 for total in planned[5:])  # planned from the speed after the warm-up
    assert budget.spent() == pytest.approx(1.0, abs=0.05)


def test_the_fixed_val_tokens_are_the_first_of_the_val_split_and_lack_bytes_without_their_tokenizer(
    tiny_cache, tmp_path
):
    cache = open_token_cache(tiny_cache)
    val = fixed_val_tokens(cache, seq_len=32)
    stream = np.asarray(cache.tokens("val")[: val.windows.shape[0] * 32 + 1])
    assert val.windows.shape[0] == min(cache.manifest.val_tokens, len(cache.tokens("val")) - 1) // 32
    assert (val.windows[1] == stream[32:65]).all() and val.scored == val.windows.shape[0] * 32
    assert val.bytes == len(load_tokenizer("byte").decode(stream[1:].tolist()).encode("utf-8"))

    # A run where the dataset's tokenizer file is not (a Ray host without it) still scores val_loss.
    moved = tmp_path / "cache"
    shutil.copytree(tiny_cache, moved)
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["tokenizer"]["name"] = str(tmp_path / "gone" / "tokenizer.json")
    (moved / "manifest.json").write_text(json.dumps(manifest))
    assert fixed_val_tokens(open_token_cache(moved), seq_len=32).bytes is None


def test_a_cache_copied_alone_to_another_folder_counts_the_same_val_bytes_with_its_own_tokenizer(tmp_path):
    """What val_bpb divides by: a Hugging Face tokenizer's cache carries the tokenizer, so another host (here
    another folder, the tokenizer's own folder gone) scores the same bits per byte."""
    text = builtin_corpus_path("tinyshakespeare").read_bytes()[:200_000].decode("utf-8", "ignore")
    (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
    folder = chat_tokenizer_folder(tmp_path / "tok", text.split("\n\n")[:500], vocab_size=400)
    build_token_cache([str(tmp_path / "corpus.txt")], tmp_path / "cache", load_tokenizer(str(folder)))
    here = fixed_val_tokens(open_token_cache(tmp_path / "cache"), seq_len=32)
    shutil.copytree(tmp_path / "cache", tmp_path / "elsewhere")
    shutil.rmtree(folder)
    there = fixed_val_tokens(open_token_cache(tmp_path / "elsewhere"), seq_len=32)
    assert here.bytes is not None and there.bytes == here.bytes and there.scored == here.scored
