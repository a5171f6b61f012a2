"""Runs: what a training run is, without JAX.

This layer describes a run for everyone who does not execute it (the MCP tools, the server, the CLI) and for the
trainer that does: the config schema and presets (`config.py`, `models/`), the job models and the callables they
name (`jobs.py`, `estimate.py`, `compile.py`), the run folder (`layout.py`) and its record `run.json`
(`record.py`), the metrics and summary schema and their readers (`metrics.py`), the dataset a run reads
(`batches.py`), FLOP and memory arithmetic (`flops.py`), the analytic estimate (`estimate.py`), the compile
report (`compile.py`), the Hugging Face config mapping (`hf.py`), the sampling worker's client
(`sample_client.py`) and the generated config reference (`reference.py`). It may import only `tradewind.core`,
`tradewind.cluster` and `tradewind.data`, and never JAX, flax, optax or orbax (import-linter contracts).

Example:
    config = read_train_config("run.yaml")
    record = read_record(RunLayout(Path("runs/r1")).record)
"""

from tradewind.runs.batches import RunData, open_run_data, with_dataset_vocabulary
from tradewind.runs.config import (
    CheckpointConfig,
    DistributedConfig,
    LoraConfig,
    MeshConfig,
    OptimizerConfig,
    TrainConfig,
    read_train_config,
)
from tradewind.runs.flops import MemoryEstimate, peak_flops, training_memory
from tradewind.runs.hf import check_matches_hf, model_for_init_from
from tradewind.runs.jobs import (
    PROFILE_CALLABLE,
    SAMPLE_CALLABLE,
    TRAIN_CALLABLE,
    ProfileJob,
    ProfileOptions,
    SampleJob,
    SampleOptions,
    TrainJob,
)
from tradewind.runs.layout import RunLayout
from tradewind.runs.metrics import MetricRow, ProfileSummary, TrainSummary, read_metrics, read_summary
from tradewind.runs.models.base import PRESETS
from tradewind.runs.models.configs import (
    ARCHITECTURES,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    ModelConfig,
    Qwen2Config,
    Qwen3Config,
    model_config,
)
from tradewind.runs.record import LedgerEntry, RunRecord, job_end_callback, read_record, write_record

__all__ = [
    "ARCHITECTURES",
    "PRESETS",
    "PROFILE_CALLABLE",
    "SAMPLE_CALLABLE",
    "TRAIN_CALLABLE",
    "CheckpointConfig",
    "DistributedConfig",
    "GPT2Config",
    "LedgerEntry",
    "LlamaConfig",
    "LoraConfig",
    "MemoryEstimate",
    "MeshConfig",
    "MetricRow",
    "MistralConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ProfileJob",
    "ProfileOptions",
    "ProfileSummary",
    "Qwen2Config",
    "Qwen3Config",
    "RunData",
    "RunLayout",
    "RunRecord",
    "SampleJob",
    "SampleOptions",
    "TrainConfig",
    "TrainJob",
    "TrainSummary",
    "check_matches_hf",
    "job_end_callback",
    "model_config",
    "model_for_init_from",
    "open_run_data",
    "peak_flops",
    "read_metrics",
    "read_record",
    "read_summary",
    "read_train_config",
    "training_memory",
    "with_dataset_vocabulary",
    "write_record",
]
