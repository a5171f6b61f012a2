"""estimate_training: a config's size and memory without JAX (a LoRA run's trained adapters and frozen base
apart), and a probed step time against a real run's."""

import subprocess
import sys

import psutil
import pytest
from flax import nnx
from pydantic import ValidationError

from tradewind.cluster import Placement
from tradewind.data import open_token_cache
from tradewind.runs import TrainConfig, read_summary, training_memory
from tradewind.runs.estimate import PROBE_MIN_STEPS, EstimateJob, TrainEstimate, estimate_training
from tradewind.trainer import build_model, count_params, train
from tradewind.trainer.estimate import estimate_job, probe_training
from tradewind.trainer.setup import setup_training

HUGE_MODEL = {"d_model": 16384, "n_layers": 128, "n_heads": 128, "max_seq_len": 64}
# Large enough that weights and optimizer state outweigh one microbatch's activations (never built here).
WIDE_MODEL = {"d_model": 1024, "n_layers": 8, "n_heads": 8, "n_kv_heads": 2}


def test_estimate_counts_the_parameters_of_the_built_model_and_the_configs_flops(tiny_config):
    config = tiny_config()
    estimate = estimate_training(config)

    vocab = open_token_cache(config.dataset).manifest.tokenizer.vocab_size  # the byte tokenizer's, with specials
    model_config = config.model.model_copy(update={"vocab_size": vocab})
    assert estimate.parameters == count_params(build_model(model_config, rngs=nnx.Rngs(0)))
    assert estimate.flops_per_token == model_config.flops_per_token(32)
    assert estimate.tokens_per_step == 8 * 32
    assert estimate.step_time_s is None and estimate.compile_s is None and estimate.probed_steps is None


def test_estimate_splits_training_memory_into_weights_optimizer_and_activations(tiny_config):
    config = tiny_config()
    memory = training_memory(config, open_token_cache(config.dataset).manifest.tokenizer.vocab_size)
    split = estimate_training(config).memory_bytes

    assert split.total == memory.total_bytes == split.params + split.optimizer + split.activations
    assert split.params == split.optimizer == 8 * memory.params  # adamw: weight + gradient, and two moments
    assert split.activations == memory.activation_bytes
    lion = estimate_training(tiny_config(optimizer={"type": "lion"})).memory_bytes
    assert lion.optimizer == split.optimizer // 2


@pytest.mark.parametrize(("optimizer", "moments"), [("adamw", 2), ("lion", 1), ("adafactor", 0)])
def test_a_lora_run_holds_its_base_in_bfloat16_and_float32_adapters_with_gradients_and_moments(
    tiny_config, optimizer, moments
):
    lora = {"rank": 8, "targets": ["q_proj", "v_proj", "down_proj"]}
    config = tiny_config(model=WIDE_MODEL, lora=lora, optimizer={"type": optimizer})
    vocab = open_token_cache(config.dataset).manifest.tokenizer.vocab_size
    model = config.model.model_copy(update={"vocab_size": vocab})
    adapters = 8 * model.n_layers * ((1024 + 1024) + (1024 + 256) + (model.ff_dim + 1024))  # r * (in + out)

    memory = training_memory(config, vocab)
    full = training_memory(config.model_copy(update={"lora": None}), vocab)

    assert (memory.params, memory.frozen) == (adapters, model.count_params())
    assert (config.lora.count_params(model), full.params) == (adapters, model.count_params())
    assert memory.weight_bytes == 2 * model.count_params() + 4 * adapters + 4 * adapters  # base; adapter, gradient
    assert memory.optimizer_bytes == 4 * moments * adapters
    assert (memory.activation_bytes, memory.sequences) == (full.activation_bytes, full.sequences)
    assert memory.total_bytes == memory.weight_bytes + memory.optimizer_bytes + memory.activation_bytes
    assert (full.frozen, full.weight_bytes, full.optimizer_bytes) == (0, 8 * full.params, 4 * moments * full.params)


def test_bf16_moments_halve_the_optimizer_memory_counted_and_nothing_else(tiny_config):
    float32 = training_memory(tiny_config(model=WIDE_MODEL), 258)
    bfloat16 = training_memory(tiny_config(model=WIDE_MODEL, optimizer={"bf16_moments": True}), 258)
    assert 2 * bfloat16.optimizer_bytes == float32.optimizer_bytes == 8 * float32.params
    assert (bfloat16.weight_bytes, bfloat16.activation_bytes) == (float32.weight_bytes, float32.activation_bytes)


def test_a_lora_estimate_reports_trainable_and_frozen_parameters_and_far_less_memory_than_full_fine_tuning(
    tiny_config,
):
    lora = estimate_training(tiny_config(model=WIDE_MODEL, lora={"rank": 16}))
    full = estimate_training(tiny_config(model=WIDE_MODEL))

    assert (full.parameters, full.frozen_parameters) == (lora.frozen_parameters, 0)
    assert 0 < lora.parameters < full.parameters / 100
    assert lora.memory_bytes.activations == full.memory_bytes.activations
    assert lora.memory_bytes.params < full.memory_bytes.params / 3  # bfloat16 base, no gradient
    assert lora.memory_bytes.optimizer < full.memory_bytes.optimizer / 100
    assert lora.memory_bytes.total < full.memory_bytes.total / 4
    assert lora.tokens_per_step == full.tokens_per_step
    # No gradient of the frozen weights: about 4 FLOPs a weight where full fine-tuning spends 6.
    assert 0.6 < lora.flops_per_token / full.flops_per_token < 0.7


@pytest.mark.slow
@pytest.mark.parametrize("lora", [None, {"rank": 8}])
def test_the_flops_counted_per_token_are_those_xla_computes_for_the_step(tiny_config, lora):
    """Within 4%: XLA's count of the compiled train step (its dots and the rest) against the formula. A LoRA step
    also skips the gradient of the first block's input (its embeddings are frozen), which the formula counts."""
    model = {"d_model": 256, "n_layers": 4, "n_heads": 4, "vocab_size": 258}
    config = tiny_config(model=model, seq_len=64, attention="reference", lora=lora)
    cost = setup_training(config).train_step.cost_analysis()
    computed = (cost[0] if isinstance(cost, list) else cost)["flops"] / config.tokens_per_step
    assert computed == pytest.approx(config.flops_per_token(), rel=0.04)
    if lora is not None:  # six a weight, frozen or not, would be a third too many
        assert config.model.flops_per_token(config.seq_len) > 1.4 * computed


def test_a_lora_config_for_gpt2_is_refused_naming_its_projections(tiny_config):
    with pytest.raises(
        ValidationError, match="a gpt2 model has no q_proj, k_proj, v_proj, o_proj; its projections are"
    ):
        tiny_config(model={"type": "gpt2"}, lora={})


def test_a_cpu_estimate_compares_with_available_ram_and_a_huge_model_does_not_fit(tiny_config):
    small = estimate_training(tiny_config(), Placement())
    assert small.device_memory_source == "available RAM" and small.fits is True
    assert 0.5 < small.device_memory_bytes / psutil.virtual_memory().available < 2

    huge = estimate_training(tiny_config(model=HUGE_MODEL), Placement())
    assert huge.fits is False and huge.memory_bytes.total > huge.device_memory_bytes


def test_a_gpu_estimate_without_the_probe_leaves_device_memory_unknown(tiny_config):
    estimate = estimate_training(tiny_config(), Placement(accelerator="gpu"))
    assert (estimate.device_memory_bytes, estimate.fits) == (None, None)


def test_the_analytic_estimate_loads_no_jax_with_or_without_lora(tiny_cache):
    code = (
        "import sys\n"
        "from tradewind.runs import TrainConfig\n"
        "from tradewind.runs.estimate import estimate_training\n"
        f"estimate_training(TrainConfig(dataset={str(tiny_cache)!r}, model={{'d_model': 32, 'n_layers': 2, "
        "'n_heads': 2}))\n"
        f"estimate_training(TrainConfig(dataset={str(tiny_cache)!r}, lora={{'rank': 4}}))\n"
        "print([m for m in ('jax', 'flax', 'optax') if m in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_probed_step_time_is_within_a_small_factor_of_a_real_runs(tiny_config, tmp_path):
    config = tiny_config(steps=40, log_every=5, eval_every=40, checkpoint=False, tensorboard=False)
    probed = probe_training(config)
    train(config, tmp_path / "run")
    summary = read_summary(tmp_path / "run" / "summary.json")

    real_step_s = summary.train_s / summary.steps
    assert probed.step_time_s > 0 and probed.compile_s > 0 and probed.probed_steps >= PROBE_MIN_STEPS
    assert 1 / 5 < probed.step_time_s / real_step_s < 5, (probed.step_time_s, real_step_s)
    assert probed.parameters == summary.parameters and probed.flops_per_token == summary.model_flops_per_token


@pytest.mark.slow
def test_estimate_job_writes_the_probed_estimate_as_json(tiny_config, tmp_path, capsys):
    out = tmp_path / "estimate.json"
    job = EstimateJob(config=tiny_config(), output_file=str(out), probe_s=0.2)
    estimate_job(**job.model_dump(mode="json"))

    written = TrainEstimate.model_validate_json(out.read_text())
    assert written.step_time_s > 0 and written.parameters == estimate_training(tiny_config(), Placement()).parameters
    # However short probe_s, at least PROBE_MIN_STEPS steps are timed, and the job's log says how many.
    assert written.probed_steps >= PROBE_MIN_STEPS and f"over {written.probed_steps} steps" in capsys.readouterr().out
    assert written.device_memory_bytes > 0 and written.fits is True


def test_estimate_job_refuses_arguments_it_does_not_know(tiny_config, tmp_path):
    with pytest.raises(Exception, match="probe_steps"):
        estimate_job(config=tiny_config().model_dump(mode="json"), output_file=str(tmp_path / "e.json"), probe_steps=3)


def test_estimate_of_a_config_whose_dataset_is_missing_names_the_folder(tmp_path):
    from tradewind.core import NotFoundError

    with pytest.raises(NotFoundError, match=str(tmp_path / "nowhere")):
        estimate_training(TrainConfig(dataset=str(tmp_path / "nowhere")))


def test_activations_count_what_remat_keeps_and_the_scores_only_a_kernel_that_keeps_them(tiny_config):
    """Korthikanti et al.'s 34 + 5 * heads * seq / d halves of a [tokens, d] float32 activation per block: the
    scores term only for a kernel that keeps them; full remat keeps each block's input (2) and rebuilds one
    block at a time."""
    config = tiny_config(model={"d_model": 64, "n_layers": 4, "n_heads": 4, "max_seq_len": 256}, seq_len=256)
    vocab, tokens, d, layers, heads = 300, 8 * 256, 64, 4, 4
    unit, scores = 2 * tokens * d, 5 * heads * 256 / d
    logits = 3 * 4 * min(tokens * vocab, 8 * 1024 * 1024)

    def activations(platform="cpu", **fields):
        return training_memory(config.model_copy(update=fields), vocab, platform=platform).activation_bytes

    assert activations() == int(unit * layers * (34 + scores) + logits)  # the reference attention, on a CPU
    assert activations("tpu") == activations("gpu") == int(unit * layers * 34 + logits)  # splash, flash: no scores
    assert activations("tpu", attention="reference") == activations()
    assert activations(remat="full") == int(unit * (layers * 2 + 34 + scores) + logits)
    assert activations(remat="save_matmuls") == int(unit * (layers * 34 + 34 + scores) + logits)
    assert activations(remat="full") < activations(remat="save_matmuls") < activations()
    # Full remat of the first block alone: it keeps its input, the other three everything.
    assert activations(remat="full", remat_blocks=1) == int(unit * (2 + 3 * (34 + scores) + 34 + scores) + logits)


def test_remat_blocks_names_the_first_blocks_of_an_unrolled_remat_run(tiny_config):
    config = tiny_config(model={"n_layers": 4}, remat="full", remat_blocks=3)
    assert config.block_remat == ("full", "full", "full", "none") and config.recomputed_blocks == 3
    assert tiny_config(remat="save_matmuls").block_remat == "save_matmuls"
    for fields, message in [
        ({"remat_blocks": 2}, "remat_blocks: needs remat 'full' or 'save_matmuls'"),
        ({"remat": "full", "remat_blocks": 2, "scan_layers": True}, "remat_blocks: needs unrolled blocks"),
        ({"remat": "full", "remat_blocks": 5}, r"remat_blocks \(5\) is more than the model's blocks \(4\)"),
    ]:
        with pytest.raises(ValidationError, match=message):
            tiny_config(model={"n_layers": 4}, **fields)
