"""The compiling job's entry: `compile_job` compiles each config of a `CompileJob` for its TPU target and writes
the `TpuCompileReport`s (`tradewind.runs.compile`, where the job is described).

    JobSpec(name="compile", callable=COMPILE_CALLABLE, kwargs=CompileJob(...).model_dump(), env=TPU_COMPILE_ENV)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tradewind.core import atomic_write_json, parse_config
from tradewind.runs.compile import CompileJob

PRELOAD = ("tradewind.trainer.tpu_compile",)  # what the fork server imports ahead of the jobs


def compile_job(**job: Any) -> None:
    """The entry of a compiling job: validates its keyword arguments as a `CompileJob`, compiles each config for
    the target (up to the first that fits, with `until_fits`) and writes their `TpuCompileReport`s to
    `output_file`."""
    import jax

    from tradewind.trainer.tpu_compile import compile_for_tpu

    # A compile-only program cannot be loaded, so an entry in JAX's persistent cache would only take its space.
    jax.config.update("jax_enable_compilation_cache", False)
    request = parse_config(CompileJob, job, source="compile job")
    reports = []
    for number, config in enumerate(request.configs, start=1):
        print(f"compiling {number} of {len(request.configs)} for {request.slices} x {request.accelerator}", flush=True)
        report = compile_for_tpu(
            config,
            request.vocab_size,
            request.accelerator.tpu,
            request.slices,
            with_eval=not (request.until_fits or request.train_only),
        )
        reports.append(report.model_dump())
        print(
            f"{report.target}: {report.hbm_bytes / 2**30:,.2f} of {report.hbm_available_bytes / 2**30:,.2f} GiB HBM "
            f"per chip ({'fits' if report.fits else 'does not fit'}); compiled in {report.compile_s:.1f} s",
            flush=True,
        )
        if request.until_fits and report.fits:
            break
    atomic_write_json(Path(request.output_file), reports)
