"""Multi-process (multi-host) start-up, and the check that JAX found the devices the run asked for.

Every process runs the same program on the same global batch order; each feeds only the rows of the batch
that land on its own devices (see `TrainSetup.put_batch`), and only process 0 writes the run's files.
A gang job's replicas find each other through the variables the job backends set
(`tradewind.cluster.distributed_env`); a config's `distributed` section sets the same by hand, or, left
without an address, lets JAX detect a TPU pod or SLURM job. On CPU the collectives go through gloo.

Must run before anything else touches JAX's devices.
"""

from __future__ import annotations

import os

import jax

from tradewind.cluster.jobs import distributed_env
from tradewind.cluster.placement import Accelerator
from tradewind.cluster.tpu_host import describe_holders, lock_holders
from tradewind.core import ConfigError
from tradewind.runs.config import DistributedConfig


def initialize_distributed(config: DistributedConfig) -> None:
    """Join the multi-process job that the gang variables or `config` describe; alone, do nothing.

    Raises:
        ConfigError: JAX could not find the other processes (no address to reach them).
    """
    gang = distributed_env()
    if gang is not None and not config.enabled:
        config = DistributedConfig(
            enabled=True,
            coordinator_address=gang.coordinator_address,
            num_processes=gang.process_count,
            process_id=gang.process_id,
        )
    if not config.enabled:
        return
    if config.coordinator_address is not None and jax.config.jax_platforms in (None, "", "cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            coordinator_address=config.coordinator_address,
            num_processes=config.num_processes,
            process_id=config.process_id,
        )
    except (ValueError, RuntimeError) as error:  # no address to go by, or a coordinator that does not answer
        raise ConfigError(
            f"distributed.enabled: JAX could not find the other processes ({error}). Outside a TPU pod or SLURM "
            "job, launch the run with replicas=N (or a multi-host TPU accelerator) so that the backend connects "
            "them, or set distributed.coordinator_address, num_processes and process_id"
        ) from None


def check_devices(accelerator: Accelerator | None) -> str:
    """Start JAX's devices and check they are what `accelerator` asked for (None: whatever JAX has); returns
    the platform name.

    A TPU run whose hosts have no TPU trains on what JAX has, with a warning: Ray schedules TPU jobs on
    resource names, so a CPU cluster that advertises them tests the scheduling end to end.

    Raises:
        ConfigError: JAX could not start its platform (e.g. JAX_PLATFORMS=cuda without a GPU), another process
            holds this host's TPU chips (the message names it), or a GPU run found no GPU.
    """
    requested = os.environ.get("JAX_PLATFORMS")
    try:
        platform = jax.default_backend()
    except (RuntimeError, AssertionError) as error:
        if "libtpu" in str(error) and "lock" in str(error):  # another process has the chips
            raise ConfigError(f"accelerator '{accelerator or 'tpu'}': {describe_holders(lock_holders())}") from None
        setting = f" JAX_PLATFORMS={requested!r}" if requested else ""
        raise ConfigError(
            f"JAX could not start the devices of{setting or ' this machine'} ({type(error).__name__}: "
            f"{error or 'no backend'}); unset JAX_PLATFORMS or set it to a platform this machine has (cpu), or "
            "install JAX with that platform's support"
        ) from None
    if accelerator is None:
        return platform
    if accelerator.kind == "gpu" and platform != "gpu":
        raise ConfigError(
            f"accelerator '{accelerator}': JAX found no GPU here, only {platform} devices; install JAX with "
            "CUDA support (pip install 'jax[cuda12]') on the hosts, or train with accelerator 'cpu'"
        )
    if accelerator.kind == "tpu" and platform != "tpu":
        print(f"warning: accelerator '{accelerator}' but JAX found only {platform} devices; training on {platform}")
    return platform


def describe_out_of_memory(error: BaseException) -> str | None:
    """A readable reason for a step that ran out of accelerator memory (XLA's `RESOURCE_EXHAUSTED`), with
    XLA's own figures and the device's memory; None for any other error."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text:
        return None
    figures = next((line.strip() for line in text.splitlines() if "allocat" in line.lower()), text.splitlines()[0])
    device = jax.devices()[0]
    limit = (device.memory_stats() or {}).get("bytes_limit")
    has = f" of {limit / 2**30:,.2f} GiB" if limit else ""
    return (
        f"out of memory on {device.device_kind}{has} (XLA: {figures[:300]}); train with a smaller batch_size and "
        "a larger grad_accum, remat='full' with scan_layers=true, or a larger accelerator"
    )


def is_main_process() -> bool:
    """True on the process that writes the run's files (process 0)."""
    return jax.process_index() == 0
