"""Where a run's processes go: the backend, the accelerator of each host, how many hosts and retries, and the
bucket its files live in when its hosts share no disk (`storage`, see `tradewind.trainer.remote`).

A launch names its placement in a few strings and numbers (`backend: ray`, `accelerator: tpu-v5e-16`,
`slices: 2`). `Placement` reads them once, where the launch is received, into typed parts: the accelerator
becomes an `Accelerator` that knows its TPU generation, chips, hosts, topology, HBM and peak FLOP/s, and
everything below the tools asks it rather than the string. The trainer's config (`TrainConfig`) holds none of
this: a step is the same program wherever it runs.

Example:
    placement = Placement(backend="ray", accelerator="tpu-v5e-16", slices=2)
    placement.accelerator.chips, placement.accelerator.topology, placement.processes  # 16, "4x4", 8
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    model_validator,
)

from tradewind.cluster.tpu_host import host_tpu
from tradewind.cluster.tpus import TpuSlice, canonical_tpu_type, tpu_slice
from tradewind.core.buckets import bucket_url

BackendName = Literal["local", "ray"]
MAX_GPUS = 1024  # GPUs per host a placement may ask for: past any machine


class Accelerator(BaseModel):
    """What an accelerator string names: `cpu`, `gpu` / `gpu:N` (N per host) or `tpu-<type>` (one slice).

    `str(accelerator)` is its canonical name (`tpu-v5e-8` reads as `tpu-v5litepod-8`); the TPU figures are
    those of `tradewind.cluster.tpus`, and None for a CPU or a GPU, whose model the string does not name.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["cpu", "gpu", "tpu"]
    gpus: int = Field(default=0, description="GPUs per host.")
    tpu_type: str | None = Field(default=None, description="TPU slice type, e.g. 'v5litepod-8'.")

    def __str__(self) -> str:
        if self.kind == "tpu":
            return f"tpu-{self.tpu_type}"
        return "gpu" if self.kind == "gpu" and self.gpus == 1 else f"gpu:{self.gpus}" if self.kind == "gpu" else "cpu"

    @property
    def tpu(self) -> TpuSlice | None:
        """The TPU slice, with its chip's figures; None for a CPU or GPU."""
        return tpu_slice(self.tpu_type) if self.tpu_type else None

    @property
    def hosts(self) -> int:
        """Hosts of one slice: a TPU type's, else 1."""
        return self.tpu.hosts if self.tpu else 1

    @property
    def chips(self) -> int:
        """Accelerator chips of one slice (TPU) or host (GPU); 0 for a CPU."""
        return self.tpu.chips if self.tpu else self.gpus

    @property
    def generation(self) -> str | None:
        return self.tpu.chip.generation if self.tpu else None

    @property
    def topology(self) -> str | None:
        return self.tpu.topology if self.tpu else None

    @property
    def hbm_bytes_per_chip(self) -> int | None:
        return self.tpu.chip.hbm_bytes if self.tpu else None

    @property
    def peak_bf16_flops(self) -> float | None:
        """Dense bfloat16 FLOP/s of one chip."""
        return self.tpu.chip.peak_bf16_flops if self.tpu else None


def parse_accelerator(text: str) -> Accelerator:
    """Read an accelerator string: `cpu`, `gpu`, `gpu:N`, `tpu` (this host's chips, as their type), or
    `tpu-<type>` with a type from `TPU_TYPES` (e.g. `tpu-v5litepod-8`, `tpu-v4-32`, `tpu-v5p-128`; `tpu-v5e-8` is
    read as `tpu-v5litepod-8`).

    Raises:
        ValueError: anything else; the message lists the accepted forms (and the known TPU types).
    """
    name = text.strip().lower()
    if name == "cpu":
        return Accelerator(kind="cpu")
    if match := re.fullmatch(r"gpu(?::(\d+))?", name):
        gpus = int(match.group(1) or 1)
        if not 1 <= gpus <= MAX_GPUS:
            raise ValueError(
                f"accelerator {text!r} asks for {gpus} GPUs; use 'cpu', 'gpu' or 'gpu:N' with 1 <= N <= {MAX_GPUS}"
            )
        return Accelerator(kind="gpu", gpus=gpus)
    if name == "tpu":
        return this_host_tpu(text)
    if name.startswith("tpu-"):
        return Accelerator(kind="tpu", tpu_type=canonical_tpu_type(name.removeprefix("tpu-")))
    raise ValueError(
        f"unknown accelerator {text!r}; use 'cpu', 'gpu', 'gpu:N' (N GPUs per host), 'tpu' (this host's) or "
        "'tpu-<type>' such as 'tpu-v5litepod-8', 'tpu-v4-32', 'tpu-v5p-128'"
    )


def tpu_accelerator(text: str | None) -> Accelerator:
    """A TPU accelerator named by its type, with or without `tpu-` (`v5litepod-16`, `tpu-v5e-8`), as the CLI's
    `--accelerator` takes it; None or empty: this host's chips (`tpu`).

    Raises:
        ValueError: an unknown TPU type, or no TPU on this host.
    """
    if not text or not text.strip():
        return this_host_tpu()
    return parse_accelerator(f"tpu-{text.strip().lower().removeprefix('tpu-')}")


def this_host_tpu(text: str = "tpu") -> Accelerator:
    """The accelerator `tpu` names: every TPU chip of this host, as their slice type.

    Raises:
        ValueError: this host has no TPU chip.
    """
    host = host_tpu()
    if host is None:
        raise ValueError(
            f"accelerator {text!r} means this host's TPU chips, and this host has none; name a slice type "
            "(e.g. 'tpu-v5litepod-8') to train on a Ray cluster's TPUs, or use 'cpu'"
        )
    return Accelerator(kind="tpu", tpu_type=host.tpu_type)


def _read_accelerator(value: Any) -> Accelerator:
    """An accelerator as written (a string) or as built (an `Accelerator`); nothing else, so an object a client
    sends cannot skip `parse_accelerator`'s checks."""
    if isinstance(value, Accelerator):
        return value
    if not isinstance(value, str):
        raise ValueError("give the accelerator as a string: 'cpu', 'gpu', 'gpu:N', 'tpu' or a TPU type")
    return parse_accelerator(value)


# An `Accelerator` that requests, configs and records write as its string.
AcceleratorName = Annotated[
    Accelerator,
    BeforeValidator(_read_accelerator),
    PlainSerializer(str, return_type=str),
    WithJsonSchema({"type": "string"}),
]


BucketURL = Annotated[str, AfterValidator(bucket_url)]


class Resources(BaseModel):
    """What one process of a job needs: CPU cores, memory, and its accelerator, typed as the placement read it
    (a TPU process holds one host of each of `slices` slices). The local ledger admits a job only when all of it
    is free."""

    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(default=1.0, ge=0, description="CPU cores per process.")
    memory_gb: float = Field(default=0.0, ge=0, description="Memory per process in GiB (0: not accounted).")
    accelerator: AcceleratorName = Field(
        "cpu", validate_default=True, description="cpu, gpu[:N] (GPUs per process) or a TPU slice type."
    )
    slices: int = Field(default=1, ge=1, description="TPU slices of `accelerator` the job's processes span.")

    @property
    def gpus(self) -> int:
        return self.accelerator.gpus

    @property
    def tpu(self) -> TpuSlice | None:
        """The TPU slice (its hosts, chips and chip), which every backend reads; None without a TPU."""
        return self.accelerator.tpu


class Placement(BaseModel):
    """Where a run's processes go and how many: the backend, each host's accelerator, slices or replicas,
    and how long and how often the backend may wait for and restart them."""

    model_config = ConfigDict(extra="forbid")

    backend: BackendName | None = Field(None, description="null: settings.yaml's, else ray if RAY_ADDRESS, else local.")
    accelerator: AcceleratorName = Field(
        "cpu",
        validate_default=True,
        description="cpu, gpu[:N], tpu (this host's) or a TPU slice, e.g. tpu-v5e-8.",
    )
    slices: int = Field(1, ge=1, le=64, description="TPU slices.")
    replicas: int = Field(1, ge=1, le=64, description="Data-parallel processes of a cpu/gpu run.")
    max_retries: int = Field(1, ge=0, le=100, description="Restarts after a kill/preemption.")
    pending_timeout_s: float | None = Field(
        None, gt=0, le=604800, description="Fail if not started by then; null: 1800 s on Ray."
    )
    storage: BucketURL | None = Field(None, description="gs:// or s3:// prefix; null: settings.yaml's.")

    @model_validator(mode="after")
    def _gang_fits_accelerator(self) -> Placement:
        if self.accelerator.kind != "tpu" and self.slices != 1:
            raise ValueError(f"slices={self.slices} needs a TPU accelerator, not {str(self.accelerator)!r}")
        if self.accelerator.kind == "tpu" and self.replicas != 1:
            raise ValueError(
                f"replicas: a TPU run gets one process per host of each slice; leave replicas at 1 "
                f"(got {self.replicas} for {self.accelerator})"
            )
        return self

    @property
    def processes(self) -> int:
        """Processes of the gang: one per host of each TPU slice, else `replicas`."""
        return self.accelerator.hosts * self.slices * self.replicas

    @property
    def chips(self) -> int:
        """TPU chips of all slices (the mesh's devices), GPUs of all replicas, or 0 on CPUs."""
        return self.accelerator.chips * self.slices * self.replicas

    def resources(self, cpus: float = 1.0, memory_gb: float = 0.0) -> Resources:
        """What one process of the gang asks its backend for."""
        return Resources(cpus=cpus, memory_gb=memory_gb, accelerator=self.accelerator, slices=self.slices)
