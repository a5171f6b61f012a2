"""A run exported in Hugging Face format: its newest (or a chosen) checkpoint as `config.json` +
`model.safetensors` and its tokenizer's files, LoRA adapters merged or as a PEFT adapter folder.

Above `hf` (the tensors and the safetensors files), `lora` (merging, the PEFT files) and `restore` (loading the
run's model), which it puts together; `tradewind export` (`cli.py`) and the warm sampling worker call it.

Example:
    export_hf(Path("runs/r1"), Path("exports/r1"))
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tradewind.core import ConfigError
from tradewind.core.buckets import is_remote, upload_folder
from tradewind.data import write_hf_tokenizer_files
from tradewind.trainer.hf import write_hf_model
from tradewind.trainer.lora import merged_params, write_peft_adapter
from tradewind.trainer.restore import load_run_model


def export_hf(run_dir: Path, out_dir: Path | str, step: int | None = None, *, peft: bool = False) -> Path | str:
    """Write the run's newest (or `step`'s) checkpoint and its tokenizer to `out_dir` in Hugging Face format.

    A LoRA run exports its adapters merged into the base model's weights, or with `peft` as a PEFT adapter
    folder (`adapter_config.json`, `adapter_model.safetensors`) for the base model it was trained from, which
    `peft.PeftModel.from_pretrained` puts on that model. A bucket URL (`gs://`, `s3://`) gets the folder copied
    whole, marker last (`core.buckets.upload_folder`).

    Raises:
        ConfigError: the run's tokenizer file changed since the dataset was built; `peft` for a run without LoRA.
        NotFoundError: no run config, dataset, checkpoint or tokenizer.
    """
    if is_remote(out_dir):
        with tempfile.TemporaryDirectory() as staging:
            upload_folder(export_hf(run_dir, Path(staging), step, peft=peft), str(out_dir))
        return out_dir
    loaded = load_run_model(run_dir, step)
    lora = loaded.config.lora
    if peft and lora is None:
        raise ConfigError(f"export: run {run_dir} trained every weight (no lora); export it as a whole model")
    if peft and not loaded.config.init_from:
        raise ConfigError(
            f"export: run {run_dir} trained LoRA adapters on a randomly initialised model (no init_from), which no "
            f"PEFT folder can name as its base; export it as a whole model"
        )
    tokenizer = loaded.cache.tokenizer()  # refused if it is not the one the run trained with
    out_dir = Path(out_dir)
    if peft:
        write_peft_adapter(out_dir, loaded.model_config, lora, loaded.model(), loaded.config.init_from)
    else:
        write_hf_model(
            out_dir,
            loaded.model_config,
            merged_params(loaded.model()),
            eos_id=tokenizer.eos_id,
            bos_id=tokenizer.bos_id,
        )
    write_hf_tokenizer_files(tokenizer, out_dir, model_max_length=loaded.model_config.max_seq_len)
    return out_dir
