"""Sharded and multi-process training give the same losses as one device.

Both tests run the trainer as separate processes: the device count is fixed when JAX starts, so the
8-device mesh needs `XLA_FLAGS=--xla_force_host_platform_device_count=8` set before JAX is imported.
"""

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from runs_helpers import cpu_devices_env

from tradewind.runs import RunLayout, read_metrics


def prepare(run_dir: Path, config) -> RunLayout:
    layout = RunLayout(run_dir)
    layout.root.mkdir(parents=True)
    layout.config.write_text(config.model_dump_json(), encoding="utf-8")
    return layout


def trainer(run_dir: Path, devices: int = 1, **gang: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tradewind.trainer", str(run_dir)],
        env={**cpu_devices_env(devices), **gang},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen) -> str:
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    return stdout


def losses(layout: RunLayout) -> np.ndarray:
    return np.array([row.loss for row in read_metrics(layout.metrics) if row.loss is not None])


def parallel_config(tiny_config, **mesh):
    return tiny_config(steps=20, log_every=1, eval_every=20, checkpoint=False, tensorboard=False, mesh=mesh)


@pytest.fixture(scope="module")
def single_device_losses(tiny_config, tmp_path_factory) -> np.ndarray:
    """Per-step losses of the 20-step reference run on one device in one process."""
    single = prepare(tmp_path_factory.mktemp("parallel") / "single", parallel_config(tiny_config))
    finish(trainer(single.root))
    return losses(single)


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [{}, {"scan_layers": True, "remat": "full"}], ids=["unrolled", "scanned-remat"])
def test_a_data_fsdp_tensor_mesh_of_eight_cpu_devices_matches_one_device_for_twenty_steps(
    tiny_config, single_device_losses, tmp_path, blocks
):
    config = parallel_config(tiny_config, data=2, fsdp=2, tensor=2).model_copy(update=blocks)
    sharded = prepare(tmp_path / "sharded", config)
    assert "'data': 2, 'fsdp': 2, 'tensor': 2" in finish(trainer(sharded.root, devices=8))
    assert len(single_device_losses) == 20
    np.testing.assert_allclose(losses(sharded), single_device_losses, rtol=1e-5)


SPLASH_ON_EIGHT_DEVICES = """
import json
import jax, numpy as np
from flax import nnx
from tradewind.runs import model_config
from tradewind.runs.config import MeshConfig
from tradewind.trainer.models import build_model
from tradewind.trainer.sharding import batch_sharding, build_mesh, param_shardings, place
from tradewind.trainer.step import loss_and_grads

config = model_config(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=128)
tokens = np.asarray(jax.random.randint(jax.random.key(1), (4, 129), 0, 64), np.int32)
mesh = build_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
results = {}
for attention in ("reference", "splash_interpret"):
    graphdef, params = nnx.split(build_model(config, rngs=nnx.Rngs(0), attention=attention, scan_layers=True))
    params = place(params, param_shardings(mesh, params))
    with jax.set_mesh(mesh):  # as the trainer compiles its steps: splash then runs per device (shard_map)
        step = jax.jit(lambda p, b: loss_and_grads(graphdef, p, b, 1, 0.0, "full"))
        loss, grads = step(params, jax.device_put(tokens, batch_sharding(mesh)))
    results[attention] = (float(loss), [np.asarray(g) for g in jax.tree.leaves(grads)])
(reference, reference_grads), (splash, splash_grads) = results["reference"], results["splash_interpret"]
print(json.dumps({
    "loss_gap": abs(splash - reference),
    "grad_gap": max(float(np.abs(a - b).max()) for a, b in zip(splash_grads, reference_grads)),
}))
"""


@pytest.mark.slow
def test_splash_attention_on_a_data_fsdp_tensor_mesh_of_eight_cpu_devices_matches_the_reference():
    """Splash runs per device under `jax.shard_map` (rows over data x fsdp, heads over tensor): the kernel's own
    code, in Pallas's interpreter, scanned and rematerialised, against the reference on the same mesh."""
    done = subprocess.run(
        [sys.executable, "-c", SPLASH_ON_EIGHT_DEVICES],
        capture_output=True,
        text=True,
        env=cpu_devices_env(8),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    gaps = json.loads(done.stdout.strip().splitlines()[-1])
    assert gaps["loss_gap"] <= 1e-6 and gaps["grad_gap"] <= 1e-6, gaps


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_processes_given_the_gang_variables_train_as_one_process_and_checkpoint_together(
    tiny_config, single_device_losses, tmp_path
):
    config = parallel_config(tiny_config).model_copy(update={"checkpoint": True})
    multi = prepare(tmp_path / "multi", config)
    gang = {"TRADEWIND_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}", "TRADEWIND_PROCESS_COUNT": "2"}
    workers = [trainer(multi.root, **gang, TRADEWIND_PROCESS_ID=str(i)) for i in range(2)]
    outputs = [finish(worker) for worker in workers]
    assert "over 2 process(es)" in outputs[0]
    np.testing.assert_allclose(losses(multi), single_device_losses, rtol=1e-5)
    assert [p.name for p in multi.checkpoints.iterdir() if p.name.isdigit()] == ["20"]
