"""Multi-process (multi-host) start-up: `jax.distributed.initialize` driven by `DistributedConfig`.

Every process runs the same program on the same global batch order; each feeds only the rows of the batch
that land on its own devices (see `TrainSetup.put_batch`), and only process 0 writes the run's files.
On CPU the processes' collectives go through gloo. On TPU pods and SLURM, leaving the address, count and
id null lets JAX detect them.

Must run before anything else touches JAX's devices.
"""

from __future__ import annotations

import jax

from tradewind.trainer.config import DistributedConfig


def initialize_distributed(config: DistributedConfig) -> None:
    """Join the multi-process job `config` describes; does nothing when it is not enabled."""
    if not config.enabled:
        return
    if config.coordinator_address is not None and jax.config.jax_platforms in (None, "", "cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=config.coordinator_address,
        num_processes=config.num_processes,
        process_id=config.process_id,
    )


def is_main_process() -> bool:
    """True on the process that writes the run's files (process 0)."""
    return jax.process_index() == 0
