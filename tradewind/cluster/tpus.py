"""TPU slices as Google Cloud sells them: their hosts, chips and topology, and what one chip of each generation has.

A slice type names a family and a size: `v4-8`, `v5p-128` (v4 and v5p count TensorCores, two per chip, four
chips per host), `v5litepod-16`, `v6e-8` (v5e and v6e count chips: up to eight on one host, then four per
host). `v5e-8` is read as `v5litepod-8`. `tpu_slice` gives the `TpuSlice` of a type: its hosts, chips, the
torus it is wired as, and its `TpuChip`, the figures the compile-only estimate (`tradewind.trainer.compile`)
divides by.

Example:
    v5e = tpu_slice("v5litepod-16")
    v5e.hosts, v5e.chips, v5e.topology, v5e.chip.hbm_bytes  # 4, 16, "4x4", 17179869184
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

GIB = 1024**3
# What libtpu's compile-only client needs in the environment of a process before JAX starts there: no metadata
# server to ask (there is none off Google Cloud), one local host, JAX itself on the CPU, and no claim on the
# machine's TPU (libtpu otherwise takes a lock file that fails every other process compiling at the same time).
TPU_COMPILE_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "JAX_PLATFORMS": "cpu",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}
_ALIASES = {"v5e": "v5litepod"}  # Cloud's marketing name of the v5litepod family


@dataclass(frozen=True)
class TpuChip:
    """One chip of a TPU generation, from Cloud TPU's system-architecture pages.

    Attributes:
        generation: the family's short name (`v4`, `v5e`, `v5p`, `v6e`).
        device_kind: what JAX calls one of its devices.
        hbm_bytes: high-bandwidth memory per chip.
        peak_bf16_flops: dense bfloat16 matmul FLOP/s per chip.
        hbm_bytes_per_s: HBM bandwidth.
        ici_bytes_per_s: inter-chip interconnect bandwidth of one chip, all links, both directions.
        dcn_bytes_per_s: data-centre network bandwidth of one host, between slices.
        torus_dims: 3 for v4 and v5p (cubes), 2 for v5e and v6e.
        megacore: its two TensorCores are one JAX device (v4, v5p).
    """

    generation: str
    device_kind: str
    hbm_bytes: int
    peak_bf16_flops: float
    hbm_bytes_per_s: float
    ici_bytes_per_s: float
    dcn_bytes_per_s: float
    torus_dims: int
    megacore: bool


GBPS = 1e9 / 8  # bytes per second of one gigabit per second
# DCN: 6.4 Tbps per 256-chip v5e pod of 64 hosts, 100 Gbps a host; taken for every generation.
_DCN = 100 * GBPS
CHIPS = {
    "v4": TpuChip("v4", "TPU v4", 32 * GIB, 275e12, 1228e9, 2400 * GBPS, _DCN, 3, True),
    "v5litepod": TpuChip("v5e", "TPU v5 lite", 16 * GIB, 197e12, 819e9, 1600 * GBPS, _DCN, 2, False),
    "v5p": TpuChip("v5p", "TPU v5", 95 * GIB, 459e12, 2765e9, 4800 * GBPS, _DCN, 3, True),
    "v6e": TpuChip("v6e", "TPU v6 lite", 32 * GIB, 918e12, 1640e9, 3584 * GBPS, _DCN, 2, False),
}
_SIZES = {  # slice sizes sold, in the family's own unit (TensorCores for 3-D families, chips for 2-D)
    "v4": (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    "v5litepod": (1, 4, 8, 16, 32, 64, 128, 256),
    "v5p": (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    "v6e": (1, 4, 8, 16, 32, 64, 128, 256),
}
CHIPS_PER_HOST = 4  # of every multi-host slice; a 2-D family's single host holds up to eight


@dataclass(frozen=True)
class TpuSlice:
    """One slice of a TPU type: how many hosts and chips, wired as which torus, with which chip."""

    tpu_type: str
    family: str
    hosts: int
    chips_per_host: int
    chip: TpuChip

    @property
    def chips(self) -> int:
        return self.hosts * self.chips_per_host

    @property
    def torus(self) -> tuple[int, ...]:
        """The chips' torus, as Cloud names slice topologies: (2, 2, 1) for v4-8, (4, 4) for v5litepod-16."""
        if self.chip.torus_dims == 2:
            if self.chips < 4:
                return (1, self.chips)
            shape, grow = [2, 2], itertools.cycle((1, 0))
        else:
            if self.chips == 4:
                return (2, 2, 1)
            shape, grow = [2, 2, 2], itertools.cycle((2, 1, 0))
        while math.prod(shape) < self.chips:
            shape[next(grow)] *= 2
        return tuple(shape)

    @property
    def topology(self) -> str:
        return "x".join(str(size) for size in self.torus)

    @property
    def jax_topology(self) -> str:
        """The topology as JAX's compile-only TPU client names it: `v5e:4x4`, `v4:2x2x1`."""
        return f"{self.chip.generation}:{self.topology}"

    @property
    def host_bounds(self) -> tuple[int, int, int]:
        """The chips of one host as a box `(x, y, z)`, which the compile-only client needs to place hosts."""
        x, y, z = (*self.torus, 1)[:3]
        return (x, y, z) if self.hosts == 1 else (2, 2, 1)


def _types() -> dict[str, tuple[int, int]]:
    """Every slice type sold, with `(hosts, chips per host)`."""
    table = {}
    for family, sizes in _SIZES.items():
        chip = CHIPS[family]
        for size in sizes:
            chips = size // 2 if chip.megacore else size
            one_host = chips <= (CHIPS_PER_HOST if chip.megacore else 2 * CHIPS_PER_HOST)
            table[f"{family}-{size}"] = (1, chips) if one_host else (chips // CHIPS_PER_HOST, CHIPS_PER_HOST)
    return table


TPU_TYPES = _types()


def canonical_tpu_type(tpu_type: str) -> str:
    """The name `TPU_TYPES` knows `tpu_type` by (`v5e-8` is `v5litepod-8`).

    Raises:
        ValueError: a type not in `TPU_TYPES`; the message lists the known ones.
    """
    family, _, size = tpu_type.strip().lower().partition("-")
    name = f"{_ALIASES.get(family, family)}-{size}"
    if name not in TPU_TYPES:
        raise ValueError(f"unknown TPU type {tpu_type!r}; known types: {', '.join(TPU_TYPES)}")
    return name


def tpu_topology(tpu_type: str) -> tuple[int, int]:
    """`(hosts, chips per host)` of one slice of `tpu_type`, e.g. `v5litepod-16` -> `(4, 4)`.

    Raises:
        ValueError: a type not in `TPU_TYPES`; the message lists the known ones.
    """
    return TPU_TYPES[canonical_tpu_type(tpu_type)]


def tpu_slice(tpu_type: str) -> TpuSlice:
    """The `TpuSlice` of `tpu_type` (`v5litepod-16`, `v5e-16`, `v4-8`, ...).

    Raises:
        ValueError: a type not in `TPU_TYPES`; the message lists the known ones.
    """
    name = canonical_tpu_type(tpu_type)
    hosts, per_host = TPU_TYPES[name]
    family = name.partition("-")[0]
    return TpuSlice(tpu_type=name, family=family, hosts=hosts, chips_per_host=per_host, chip=CHIPS[family])


# libtpu's multi-slice coordinator listens on this port of slice 0's first host.
MEGASCALE_PORT = 8081


def megascale_env(coordinator_host: str, slices: int, slice_id: int) -> dict[str, str]:
    """What libtpu reads to join `slices` TPU slices over the data-centre network (multi-slice JAX): slice 0's
    first host as the coordinator, how many slices, and which one this host is in."""
    return {
        "MEGASCALE_COORDINATOR_ADDRESS": f"{coordinator_host}:{MEGASCALE_PORT}",
        "MEGASCALE_PORT": str(MEGASCALE_PORT),
        "MEGASCALE_NUM_SLICES": str(slices),
        "MEGASCALE_SLICE_ID": str(slice_id),
    }
