"""Compiling a run for TPU slices this machine does not have.

These are real TPU compilations: libtpu's compile-only client (the `tpu` extra) gives the devices of each
topology with no TPU attached, and XLA compiles the run's steps for them; no network is used (tests/conftest.py
puts `TPU_COMPILE_ENV` in the environment before JAX starts). Without libtpu they are skipped, except under
`.ci/run` (TRADEWIND_REQUIRE_TPU_COMPILE), which installs it.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tpu_helpers import needs_libtpu

from tradewind.cluster.tpus import tpu_slice
from tradewind.core import ConfigError, load_config
from tradewind.runs import TrainConfig
from tradewind.runs.compile import Collective
from tradewind.tools.launching import LaunchTrainingRequest
from tradewind.trainer.setup import setup_training
from tradewind.trainer.tpu_compile import STEP_CALIBRATION, estimate_step, lower_abstract_steps

SMALL = {"d_model": 128, "n_layers": 2, "n_heads": 4, "vocab_size": 512, "max_seq_len": 128}


def small_run(fsdp: int = 4, model: dict = SMALL, **settings) -> TrainConfig:
    """A small Llama (by default), batch 16 of 128 tokens, its parameters sharded over `fsdp` chips."""
    fields = {"batch_size": 16, "seq_len": 128, "compute_dtype": "auto", **settings}
    return TrainConfig(dataset="unused", model=model, mesh={"fsdp": fsdp}, **fields)


@pytest.mark.slow
@needs_libtpu
@pytest.mark.parametrize(
    ("tpu_type", "slices", "chips", "hosts"),
    [("v4-8", 1, 4, 1), ("v5litepod-16", 1, 16, 4), ("v5litepod-8", 2, 16, 2)],
)
def test_a_run_compiles_for_a_megacore_chip_a_multi_host_slice_and_two_slices(tpu_type, slices, chips, hosts):
    # Every generation is compiled for by the shipped-experiments test below.
    from tradewind.trainer.tpu_compile import compile_for_tpu

    report = compile_for_tpu(small_run(), vocab_size=512, target=tpu_slice(tpu_type), slices=slices)
    chip = tpu_slice(tpu_type).chip
    assert (report.chips, report.hosts, report.slices) == (chips, hosts, slices)
    assert report.device_kind == chip.device_kind and report.compute_dtype == "bfloat16"
    assert report.mesh == {"data": chips // 4, "fsdp": 4, "tensor": 1}
    assert report.fits and 0 < report.hbm_bytes <= report.hbm_available_bytes == chip.hbm_bytes
    assert 0 < report.eval_hbm_bytes < report.hbm_bytes
    kinds = {collective.kind: collective for collective in report.collectives}
    assert kinds["all-gather"].count > 0 and kinds["all-gather"].bytes > 0  # fsdp gathers the weights it uses
    step = report.step
    work_s = step.matmul_s + step.attention_s + step.elementwise_s
    assert step.seconds == pytest.approx(max(work_s * (1 + STEP_CALIBRATION["v5e"].overhead), step.network_s))
    assert 0 < step.compute_s < work_s and step.network_s > 0
    assert 0 < step.mfu <= 1 and step.tokens_per_s_per_chip > 0 and "estimate" in step.method
    if chip.generation != "v5e":
        assert f"{chip.generation} not measured" in step.calibration


@pytest.mark.slow
@needs_libtpu
def test_fsdp_over_four_chips_holds_a_quarter_of_the_state_per_chip():
    from tradewind.trainer.tpu_compile import compile_for_tpu

    # The train step's state alone: with_eval=False wherever a test looks at the train step only (compiling the
    # eval step too costs about a third more time).
    replicated = compile_for_tpu(small_run(fsdp=1), vocab_size=512, target=tpu_slice("v5litepod-4"), with_eval=False)
    sharded = compile_for_tpu(small_run(fsdp=4), vocab_size=512, target=tpu_slice("v5litepod-4"), with_eval=False)
    # Parameters and Adam's two moments in float32, less the batch's rows; norms' scales stay whole.
    assert 0.25 <= sharded.arguments_bytes / replicated.arguments_bytes < 0.3
    assert "all-gather" not in {collective.kind for collective in replicated.collectives}


@pytest.mark.slow
@needs_libtpu
def test_bf16_moments_hold_the_optimizer_state_in_half_the_bytes_on_the_chip():
    from tradewind.trainer.tpu_compile import compile_for_tpu

    float32, bfloat16 = (
        compile_for_tpu(
            small_run(fsdp=1, optimizer={"bf16_moments": bf16}),
            vocab_size=512,
            target=tpu_slice("v5litepod-1"),
            with_eval=False,
        )
        for bf16 in (False, True)
    )
    parameters = small_run().model.model_copy(update={"vocab_size": 512}).count_params()
    # Adam's two moments, 4 bytes each a parameter, now 2: the step's arguments are 4 bytes a parameter fewer.
    assert float32.arguments_bytes - bfloat16.arguments_bytes == pytest.approx(4 * parameters, rel=0.01)
    assert bfloat16.hbm_bytes < float32.hbm_bytes


@pytest.mark.slow
@needs_libtpu
def test_a_model_too_big_for_a_chips_hbm_is_reported_with_the_compilers_numbers():
    from tradewind.trainer.tpu_compile import compile_for_tpu

    # 1.9 billion parameters, replicated: their float32 weights and Adam moments alone pass a v5e chip's 16 GiB.
    big = TrainConfig(
        dataset="unused",
        model={"d_model": 8192, "n_layers": 2, "n_heads": 64, "vocab_size": 32000, "max_seq_len": 256},
        batch_size=8,
        seq_len=256,
        mesh={"fsdp": 1},
    )
    report = compile_for_tpu(big, vocab_size=32000, target=tpu_slice("v5litepod-8"))
    assert not report.fits and report.step is None and report.eval_hbm_bytes is None
    assert report.hbm_bytes > report.hbm_available_bytes
    assert report.arguments_bytes >= 3 * 4 * big.model.count_params()  # weights and two moments, on every chip
    assert "Ran out of memory" in report.compiler_message


def test_collectives_are_counted_by_kind_with_the_bytes_each_chip_sends_around_a_ring():
    from tradewind.trainer.tpu_compile import collectives_of

    # As compiled TPU programs write them: operands by name, groups listed, as an iota, or as mesh axes.
    hlo = """
  %all-gather.1 = bf16[8,128]{1,0:T(8,128)(2,1)} all-gather(%p), channel_id=1, replica_groups={{0,1,2,3}}
  %all-reduce-start.2 = (f32[128]{0}, f32[128]{0}) all-reduce-start(%g), channel_id=2, replica_groups=[2,4]<=[8]
  %all-reduce-done.2 = f32[128]{0} all-reduce-done(%all-reduce-start.2)
  %reduce-scatter.3 = f32[32]{0} reduce-scatter(%x), replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}
  %add.4 = f32[128]{0} add(%a, %b)
"""
    found = {c.kind: (c.count, c.bytes) for c in collectives_of(hlo)}
    assert found == {
        "all-gather": (1, 8 * 128 * 2 * 3 // 4),  # each of 4 chips receives the 3 quarters it lacks
        "all-reduce": (1, 2 * 128 * 4 * 3 // 4),  # a reduce-scatter then an all-gather
        "reduce-scatter": (1, 32 * 4 * 3),  # 3 of the input's 4 parts go out
    }


def test_a_collective_in_a_loop_body_counts_once_per_iteration_nested_loops_multiplying():
    from tradewind.trainer.tpu_compile import collectives_of

    hlo = """HloModule jit_train_step

%cond.1 (p: (s32[])) -> pred[] {
  %constant.1 = s32[] constant(12)
  ROOT %lt.1 = pred[] compare(%gte.1, %constant.1), direction=LT
}

%layer.2 (p: (s32[], f32[128])) -> (s32[], f32[128]) {
  %all-reduce.2 = f32[128]{0} all-reduce(%g), channel_id=2, replica_groups={{0,1}}
}

%cond.3 (p: (s32[])) -> pred[] {
  %constant.3 = s32[] constant(4)
  ROOT %lt.3 = pred[] compare(%gte.3, %constant.3), direction=LT
}

%microbatch.4 (p: (s32[])) -> (s32[]) {
  %while.4 = (s32[], f32[128]) while(%t), condition=%cond.1, body=%layer.2
}

ENTRY %main.5 (p: f32[128]) -> f32[128] {
  %while.5 = (s32[]) while(%t), condition=%cond.3, body=%microbatch.4
  %all-reduce.5 = f32[128]{0} all-reduce(%h), channel_id=5, replica_groups={{0,1}}
}
"""
    # 12 layers in each of 4 microbatches, and one more outside both loops.
    assert collectives_of(hlo) == [Collective(kind="all-reduce", count=4 * 12 + 1, bytes=(4 * 12 + 1) * 512)]


@pytest.mark.slow
@needs_libtpu
def test_another_process_compiles_while_this_one_holds_libtpu(tmp_path):
    from tradewind.trainer.tpu_compile import compile_for_tpu

    here = compile_for_tpu(  # libtpu loaded in this process
        small_run(), vocab_size=512, target=tpu_slice("v5litepod-4"), with_eval=False
    )
    config = tmp_path / "small.yaml"
    config.write_text(
        "dataset: builtin:tinyshakespeare\nmodel: {d_model: 128, n_layers: 2, n_heads: 4, vocab_size: 512, "
        "max_seq_len: 128}\nbatch_size: 16\nseq_len: 128\nmesh: {fsdp: 4}\n",
        encoding="utf-8",
    )
    command = [sys.executable, "-m", "tradewind", "compile", str(config), "--accelerator", "v5litepod-4", "--json"]
    done = subprocess.run([*command, "--workspace", str(tmp_path / "ws")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert here.fits and json.loads(done.stdout)["fits"] is True


@pytest.mark.slow
@needs_libtpu
def test_rematerialising_blocks_cuts_the_temporaries_a_chip_holds():
    from tradewind.trainer.tpu_compile import compile_for_tpu

    # Long sequences, where activations (the reference attention's scores above all; splash, auto's pick on a
    # TPU, keeps none) outweigh the weights many times over. (save_matmuls lies between the two:
    # benchmarks/tpu_compile.py --remat.)
    deep = {**SMALL, "n_layers": 3, "max_seq_len": 512}
    shape = {"dataset": "unused", "model": deep, "batch_size": 32, "seq_len": 512, "mesh": {"fsdp": 4}}
    temporaries = {
        remat: compile_for_tpu(
            TrainConfig(**shape, remat=remat, attention="reference"),
            vocab_size=512,
            target=tpu_slice("v5litepod-4"),
            with_eval=False,
        ).temporaries_bytes
        for remat in ("none", "full")
    }
    assert temporaries["full"] < temporaries["none"] / 2, temporaries


@pytest.mark.slow
@needs_libtpu
def test_auto_attention_compiles_splash_for_a_tpu_split_over_chips_by_tensor_in_less_memory_than_the_reference():
    from tradewind.trainer.tpu_compile import compile_for_tpu

    # 8 query and 4 key/value heads split over tensor=2: the kernel runs per chip on its own heads and rows.
    model = {**SMALL, "n_heads": 8, "n_kv_heads": 4, "max_seq_len": 512}
    shape = {"dataset": "unused", "model": model, "batch_size": 2, "seq_len": 512, "mesh": {"fsdp": 2, "tensor": 2}}
    reports = {
        attention: compile_for_tpu(
            TrainConfig(**shape, attention=attention), vocab_size=512, target=tpu_slice("v5litepod-4"), with_eval=False
        )
        for attention in ("reference", "auto")
    }
    splash, reference = reports["auto"], reports["reference"]
    assert (splash.attention, reference.attention) == ("splash", "reference")
    assert splash.fits and splash.temporaries_bytes < reference.temporaries_bytes, reports

    def gathered(report):
        return sum(c.bytes for c in report.collectives if c.kind == "all-gather")

    assert gathered(splash) <= gathered(reference)  # nothing is gathered for the kernel: it runs on each chip's part
    # Four chips of tensor and 4 key/value heads for 8 query heads split; 2 would not, and each chip takes all.
    for kv_heads in (4, 2):
        grouped = {**shape, "model": {**model, "n_kv_heads": kv_heads}, "mesh": {"fsdp": 1, "tensor": 4}}
        report = compile_for_tpu(
            TrainConfig(**grouped), vocab_size=512, target=tpu_slice("v5litepod-4"), with_eval=False
        )
        assert report.attention == "splash" and report.fits, kv_heads


@needs_libtpu
def test_a_1b_model_without_fsdp_on_a_v5litepod_8_is_refused_with_the_compilers_numbers():
    from tradewind.trainer.tpu_compile import compile_for_tpu

    # Every chip would hold all 1.1B float32 weights and their AdamW moments (11.6 GiB) and the gradients.
    model = {"preset": "llama-1b", "vocab_size": 32768, "max_seq_len": 512}
    config = TrainConfig(dataset="unused", model=model, seq_len=512, batch_size=8, scan_layers=True)
    report = compile_for_tpu(config, vocab_size=32768, target=tpu_slice("v5litepod-8"))
    assert not report.fits and report.mesh == {"data": 8, "fsdp": 1, "tensor": 1}
    params = config.model.count_params()
    assert report.arguments_bytes >= 12 * params  # weights and two moments, float32, whole on each chip
    assert report.hbm_bytes > report.hbm_available_bytes == 16 * 2**30
    assert "RESOURCE_EXHAUSTED" in report.compiler_message and report.step is None


SHIPPED = sorted((Path(__file__).parents[2] / "experiments").glob("*.yaml"))
TARGETS = [("v4-8", 1), ("v5litepod-8", 1), ("v5litepod-16", 1), ("v5p-8", 1), ("v6e-8", 1), ("v5litepod-8", 2)]


def shrunk(path: Path) -> TrainConfig:
    """The shipped config with a one-block, 64-wide model on 64-token sequences; everything else as shipped (its
    optimizer, batch and grad accumulation, z-loss, precision, skip policy, mesh and head). Its full size is
    `benchmarks/tpu_compile.py`'s to compile."""
    config = TrainConfig(**load_config(LaunchTrainingRequest, path).train_values())  # the launch's placement aside
    grouped = config.model.kv_heads < config.model.n_heads
    small = {"d_model": 64, "n_layers": 1, "n_heads": 4, "d_ff": None, "max_seq_len": 64, "vocab_size": 512}
    model = config.model.model_copy(update=small | ({"n_kv_heads": 2} if grouped else {}))
    return config.model_copy(update={"model": model, "seq_len": 64})


@pytest.mark.slow
@needs_libtpu
@pytest.mark.parametrize("path", SHIPPED, ids=[path.stem for path in SHIPPED])
def test_every_shipped_experiment_compiles_for_each_target_or_is_refused_for_its_mesh(path):
    from tradewind.trainer.tpu_compile import compile_for_tpu

    config = shrunk(path)
    for tpu_type, slices in TARGETS:
        chips = tpu_slice(tpu_type).chips * slices
        if chips % (config.mesh.fsdp * config.mesh.tensor):
            with pytest.raises(ConfigError, match=r"mesh: fsdp \* tensor = \d+ does not divide"):
                compile_for_tpu(config, vocab_size=512, target=tpu_slice(tpu_type), slices=slices)
            continue
        report = compile_for_tpu(config, vocab_size=512, target=tpu_slice(tpu_type), slices=slices)
        assert report.chips == chips and report.fits and report.step is not None, (tpu_type, slices)


@needs_libtpu
def test_over_two_slices_only_the_data_axis_spans_them():
    from jax.experimental import topologies

    from tradewind.runs.config import MeshConfig
    from tradewind.trainer.sharding import build_mesh

    target = tpu_slice("v5litepod-8")
    devices = topologies.get_topology_desc(
        platform="tpu", topology_name=target.jax_topology, chips_per_host_bounds=target.host_bounds, num_slices=2
    ).devices
    mesh = build_mesh(MeshConfig(data=4, fsdp=4), list(devices))
    assert [{device.slice_index for device in row.flat} for row in mesh.devices] == [{0}, {0}, {1}, {1}]
    with pytest.raises(ConfigError, match=r"data = 1 must be a multiple of the 2 slices.*fsdp \* tensor = 16"):
        build_mesh(MeshConfig(data=1, fsdp=16), list(devices))


@needs_libtpu
@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_a_block_split_over_four_chips_by_tensor_needs_megatrons_two_all_reduces(architecture):
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.experimental import topologies
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from tradewind.runs import model_config
    from tradewind.runs.config import MeshConfig
    from tradewind.trainer.models import build_model
    from tradewind.trainer.sharding import build_mesh, param_shardings
    from tradewind.trainer.tpu_compile import collectives_of

    target = tpu_slice("v5litepod-4")
    devices = topologies.get_topology_desc(
        platform="tpu", topology_name=target.jax_topology, chips_per_host_bounds=target.host_bounds
    ).devices
    mesh = build_mesh(MeshConfig(data=1, fsdp=1, tensor=4), list(devices))
    config = model_config(type=architecture, vocab_size=512, d_model=256, n_layers=1, n_heads=8, max_seq_len=128)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: build_model(config, rngs=nnx.Rngs(0))).blocks[0])
    params = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params, param_shardings(mesh, params)
    )
    whole = NamedSharding(mesh, P())
    x = jax.ShapeDtypeStruct((8, 128, 256), jnp.float32, sharding=whole)
    forward = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x, jnp.arange(128))[0], out_shardings=whole)
    kinds = {c.kind: c.count for c in collectives_of(forward.lower(params, x).compile().as_text())}
    # After the attention's output projection and after the MLP's down projection; no weight is gathered.
    assert kinds.get("all-reduce") == 2 and "all-gather" not in kinds and "reduce-scatter" not in kinds, kinds


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
# The rows of the code as it is, each file with the shape fields it was measured with where they have changed since
# (a row of 2026-12-08 on holds its whole config): the 350M preset had 16 heads of 64 (8 KV) before its 128-wide
# ones, and the 1B scanned all of its blocks, each recomputed, before it took the launch's pick.
NARROW_350M = {"350m": {"model": {"n_heads": 16, "n_kv_heads": 8}}}
SCANNED_1B = {"1b": {"scan_layers": True, "remat_blocks": None}}
CHIP_RESULTS = {
    RESULTS / "tpu_chip-2026-12-06c.jsonl": NARROW_350M | SCANNED_1B,
    RESULTS / "tpu_chip-2026-12-07.jsonl": NARROW_350M | SCANNED_1B,
    RESULTS / "tpu_chip-2026-12-07b.jsonl": NARROW_350M | SCANNED_1B,
    RESULTS / "tpu_chip-2026-12-07c.jsonl": {},
    RESULTS / "tpu_chip-2026-12-08.jsonl": {},
}


def test_the_step_estimate_lands_within_20_percent_of_every_step_measured_on_a_v5e_chip():
    # The chip's measurements (benchmarks/tpu_chip.py on a v5e) are the calibration's source; the estimate of each
    # config measured there with the trainer's code as it is must stay within 20% of its measured step.
    sys.path.insert(0, str(RESULTS.parent))
    import tpu_chip

    measured = []
    for results, as_measured in CHIP_RESULTS.items():
        rows = [json.loads(line) for line in results.read_text().splitlines()]
        rows = [row for row in rows if row["kind"] == "choice" and row["fits"] and row["current_code"]]
        measured += [(row, as_measured) for row in rows]
    assert {row["shape"] for row, _ in measured} == {"125m", "350m", "1b"}
    for row, as_measured in measured:
        if "config" in row:
            config = TrainConfig.model_validate({**row["config"], "dataset": "unused"})
        else:
            shape = tpu_chip.config_fields(tpu_chip.SHAPES[row["shape"]], as_measured.get(row["shape"], {}))
            change = {k: v for k, v in tpu_chip.CHOICES.get(row["choice"], {}).items() if k != "constants"}
            config = tpu_chip.config_for(shape, change, "unused", 10, tpu_chip.SEQ_LEN)
            config = config.model_copy(update={"batch_size": row["batch_size"]})
        step = estimate_step(config, config.model, tpu_slice("v5litepod-1"), 1, [])
        assert 0.8 <= step.seconds / row["step_s"] <= 1.2, (row["shape"], row["choice"], step.seconds, row["step_s"])


def program(compiled) -> str:
    """A compiled step's HLO without its debug information (the source lines that traced each op, which differ
    with the caller's file; JAX's compile cache leaves them out of its key too)."""
    debug_tables = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
    blocks = [block for block in compiled.as_text().split("\n\n") if block.split("\n")[0] not in debug_tables]
    return re.sub(r", metadata=\{[^}]*\}", "", "\n\n".join(blocks))


@pytest.mark.parametrize(
    "options", [{}, {"scan_layers": True, "remat": "full", "optimizer": {"host_state": True}, "grad_accum": 2}]
)
def test_the_steps_lowered_from_abstract_arrays_are_the_programs_a_run_compiles(tiny_config, options):
    # A TPU compile reads them, and the chip benchmark compiles them ahead for its runs to load from the cache:
    # each must be the very program the run executes, not one like it.
    setup = setup_training(tiny_config(**options))
    train_lowered, eval_lowered, _ = lower_abstract_steps(setup.config, setup.model_config, setup.mesh, "cpu")
    assert program(train_lowered.compile()) == program(setup.train_step)
    assert program(eval_lowered.compile()) == program(setup.eval_step)
