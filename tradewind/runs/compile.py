"""What compiling a run for a TPU slice finds, as data: the report, its parts, and the compile job's model.

`tradewind.trainer.tpu_compile` does the compiling (it loads JAX and libtpu) and `tradewind.trainer.compile`
is the job's entry; this module imports neither, so the tools read and return its reports while the server
stays JAX-free. `estimate_run` and `launch_training`
submit a compile as a job on the local backend:

    JobSpec(name="compile", callable="tradewind.trainer.compile:compile_job",
            kwargs={"configs": [{...}], "vocab_size": 32768, "accelerator": "tpu-v5litepod-16", "output_file": "..."},
            env=TPU_COMPILE_ENV)

which writes a list of `TpuCompileReport`s, one per config compiled, as JSON to `output_file`. One job compiles
several configs in order (a run, then the changes that might make it fit, until one does): JAX and libtpu
start once.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tradewind.cluster import Accelerator, AcceleratorName
from tradewind.runs.config import TrainConfig

COMPILE_CALLABLE = "tradewind.trainer.compile:compile_job"


class Collective(BaseModel):
    """The collectives of one kind in a compiled step, per chip."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="all-gather, all-reduce, reduce-scatter, all-to-all or collective-permute.")
    count: int = Field(description="How many the program runs (a loop's body counted once).")
    bytes: int = Field(description="Bytes each chip sends for them, each costed as a ring over its group.")


class StepEstimate(BaseModel):
    """A train step's time on the slice, per chip, from its kinds of work at the rates measured on a chip: an
    estimate, not a measurement."""

    model_config = ConfigDict(extra="forbid")

    seconds: float = Field(
        description="(matmul_s + attention_s + elementwise_s) x (1 + the loop's overhead), or network_s if longer."
    )
    method: str = Field(description="How the figure was reached.")
    calibration: str = Field(description="Where and when the rates it uses were measured on a chip.")
    compute_s: float = Field(description="The model's FLOPs per chip over the chip's peak bfloat16 FLOP/s: MFU 1.")
    matmul_s: float = Field(description="The model's matrix multiplies (the forward again with full remat).")
    attention_s: float = Field(description="The attention kernel: its score and value products.")
    elementwise_s: float = Field(description="Everything else (norms, rotary, copies, loss, optimizer), HBM-bound.")
    network_s: float = Field(description="Collective bytes over the chip's ICI ring bandwidth, plus DCN.")
    mfu: float = Field(description="compute_s / seconds: the model FLOP utilisation expected.")
    tokens_per_s_per_chip: float


class TpuCompileReport(BaseModel):
    """What a run would need of a TPU slice, from compiling its steps for it."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field(description="The TPU type, e.g. 'v5litepod-16'.")
    slices: int
    hosts: int = Field(description="Hosts of all slices.")
    chips: int = Field(description="Chips of all slices: the mesh's devices.")
    device_kind: str
    mesh: dict[str, int] = Field(description="The mesh's axis sizes.")
    compute_dtype: str
    attention: str = Field(description="The attention kernel compiled: 'auto' picks splash on a TPU.")
    compile_s: float = Field(description="Seconds compiling the train (and eval) steps on this machine.")
    fits: bool = Field(description="The train step's HBM fits one chip's.")
    hbm_bytes: int = Field(description="HBM per chip the train step needs; when it does not fit, at least this.")
    hbm_available_bytes: int = Field(description="One chip's HBM (the compiler keeps a little of it for itself).")
    arguments_bytes: int = Field(description="Parameters, optimizer state and batch held by one chip.")
    temporaries_bytes: int = Field(description="Activations, gradients and other temporaries of one chip.")
    eval_hbm_bytes: int | None = Field(
        description="HBM per chip the eval step needs; null when training does not fit or only it was checked."
    )
    collectives: list[Collective]
    step: StepEstimate | None = Field(description="Estimated step time; null when training does not fit.")
    compiler_message: str | None = Field(description="The compiler's out-of-memory message, when it gave one.")


class CompileJob(BaseModel):
    """A compiling process's arguments: the runs to compile, their vocabulary, the target, and where the reports
    go."""

    model_config = ConfigDict(extra="forbid")

    configs: list[TrainConfig] = Field(min_length=1, description="Compiled in this order.")
    vocab_size: int = Field(gt=0)
    accelerator: AcceleratorName = Field(description="The TPU slice compiled for (written as its name).")
    slices: int = Field(default=1, ge=1, le=64)
    until_fits: bool = Field(
        False, description="Stop after the first config that fits the chip; only train steps are compiled."
    )
    train_only: bool = Field(False, description="Compile the train steps alone (whether they fit), no eval step.")
    output_file: str = Field(description="Where the list of `TpuCompileReport`s is written as JSON.")

    @field_validator("accelerator")
    @classmethod
    def _a_tpu(cls, accelerator: Accelerator) -> Accelerator:
        if accelerator.tpu is None:
            raise ValueError(f"a compile targets a TPU slice, not {str(accelerator)!r}")
        return accelerator
