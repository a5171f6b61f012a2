"""Start-up checks of a training process: JAX's devices are what the accelerator asked for; alone, no gang."""

import jax
import pytest

from tradewind.cluster import parse_accelerator
from tradewind.core import ConfigError
from tradewind.runs import DistributedConfig
from tradewind.trainer.distributed import (
    check_devices,
    describe_out_of_memory,
    initialize_distributed,
    is_main_process,
)

on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks what a CPU-only machine reports")


@on_cpu
def test_a_cpu_run_on_cpu_devices_reports_the_cpu_platform():
    assert check_devices(parse_accelerator("cpu")) == "cpu" and check_devices(None) == "cpu"


@on_cpu
@pytest.mark.parametrize("accelerator", ["gpu", "gpu:2"])
def test_a_gpu_run_where_jax_finds_no_gpu_is_refused_naming_the_fix(accelerator):
    with pytest.raises(ConfigError, match=rf"accelerator '{accelerator}': JAX found no GPU here, only cpu devices"):
        check_devices(parse_accelerator(accelerator))


@on_cpu
def test_a_tpu_run_without_tpus_trains_on_what_jax_has_with_a_warning(capsys):
    assert check_devices(parse_accelerator("tpu-v5litepod-8")) == "cpu"
    assert "warning: accelerator 'tpu-v5litepod-8' but JAX found only cpu devices; training on cpu" in (
        capsys.readouterr().out
    )


def test_a_process_outside_any_gang_with_distributed_off_stays_alone_and_is_the_main_process(monkeypatch):
    for name in ("TRADEWIND_COORDINATOR_ADDRESS", "TRADEWIND_PROCESS_ID", "TRADEWIND_PROCESS_COUNT"):
        monkeypatch.delenv(name, raising=False)
    initialize_distributed(DistributedConfig())
    assert jax.process_count() == 1 and is_main_process()


def test_running_out_of_device_memory_is_described_with_xlas_figures_and_what_to_change():
    # A real allocation past this machine's memory (1 TiB): XLA's RESOURCE_EXHAUSTED, as a chip gives it.
    with pytest.raises(jax.errors.JaxRuntimeError) as exhausted:
        jax.numpy.ones((2**38,), jax.numpy.float32).block_until_ready()
    reason = describe_out_of_memory(exhausted.value)
    assert reason.startswith("out of memory on cpu (XLA: RESOURCE_EXHAUSTED: Out of memory allocating 1099511627776")
    assert reason.endswith("remat='full' with scan_layers=true, or a larger accelerator")
    assert describe_out_of_memory(ValueError("not memory")) is None
