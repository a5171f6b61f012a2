"""Sharded and multi-process training give the same losses as one device.

Both tests run the trainer as separate processes: the device count is fixed when JAX starts, so the
8-device mesh needs `XLA_FLAGS=--xla_force_host_platform_device_count=8` set before JAX is imported.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tradewind.trainer import RunLayout, read_metrics


def prepare(run_dir: Path, config) -> RunLayout:
    layout = RunLayout(run_dir)
    layout.root.mkdir(parents=True)
    layout.config.write_text(config.model_dump_json(), encoding="utf-8")
    return layout


def trainer(run_dir: Path, devices: int = 1, **gang: str) -> subprocess.Popen:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, "-m", "tradewind.trainer", str(run_dir)],
        env={**env, **gang},
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
