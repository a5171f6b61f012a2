"""The tool that gives a run's model back: its newest checkpoint as a Hugging Face folder, or a LoRA run's adapters
as a PEFT folder, under the workspace's `exports/`.

The workspace's warm sampling worker writes it (`hf.export_hf`: JAX loads there, never in the server), into a
hidden staging folder that replaces `exports/<run_id>-<format>` only once it is complete, so a failed or
cancelled export leaves the last good one (or none), never a partial folder under the name.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from tradewind.core import NotFoundError, TradewindError, make_id
from tradewind.data import open_token_cache
from tradewind.runs import RunLayout
from tradewind.runs.jobs import ExportJob
from tradewind.tools.context import Progress, ToolContext, no_progress
from tradewind.tools.launching import read_run_config
from tradewind.tools.runs import RunRequest
from tradewind.tools.sampling import (
    WORKER_DEVICE_MEANING,
    ask_sample_worker,
    check_worker_reads,
    worker_device,
    worker_error,
)
from tradewind.tools.spec import tool

EXPORTS_DIR = "exports"
EXPORT_TIMEOUT_S = 600.0


class ExportModelRequest(RunRequest):
    format: Literal["hf", "peft"] = Field("hf", description="hf: a transformers folder; peft: LoRA adapters.")


class ExportModelResult(BaseModel):
    run_id: str
    path: str
    files: list[str]
    device: str = Field(default="cpu", description=f"Where it was written: {WORKER_DEVICE_MEANING}")


@tool("Export a model", destructive=True, idempotent=True)
def export_model(ctx: ToolContext, request: ExportModelRequest, progress: Progress = no_progress) -> ExportModelResult:
    """Export a run's model for transformers or peft. Use it to hand a trained model back.

    The folder is `exports/<run_id>-<format>` in the workspace, replaced by a later export of the same run:
    `config.json`, `model.safetensors` and the tokenizer files with its chat template, or, for `peft`, the
    adapters (`adapter_config.json`, `adapter_model.safetensors`) for the base model the run started from.
    """
    layout = RunLayout(ctx.workspace.run_dir(request.run_id))
    if not layout.checkpoints.is_dir():
        raise NotFoundError(f"run {request.run_id!r} has no checkpoints yet; wait until it saves one")
    config = read_run_config(ctx, layout.root, argument="run_id")
    tokenizer = open_token_cache(Path(config.dataset)).tokenizer_source()
    check_worker_reads(ctx, layout, config, tokenizer, in_bucket=False)
    name = f"{request.run_id}-{request.format}"
    staging = ctx.workspace.make_dir(Path(EXPORTS_DIR) / f".{name}.{make_id('partial')}", argument="run_id")
    job = ExportJob(run_dir=str(layout.root), out_dir=str(staging), peft=request.format == "peft")
    try:
        reply = ask_sample_worker(
            ctx,
            {"op": "export", "job": job.model_dump()},
            timeout_s=EXPORT_TIMEOUT_S,
            activity=f"exporting run {request.run_id!r}",
            progress=progress,
        )
        if error := reply.get("error"):
            raise worker_error(error)
        final = staging.parent / name
        try:
            if final.is_dir():
                shutil.rmtree(final)  # an earlier export of the run; refuses a link
            staging.rename(final)
        except OSError as error:
            raise TradewindError(f"export of run {request.run_id!r}: could not replace {final}: {error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    files = sorted(p.name for p in final.iterdir())
    return ExportModelResult(run_id=request.run_id, path=str(final), files=files, device=worker_device(reply))
