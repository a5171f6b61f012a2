"""Tools: typed functions an agent calls, composing the layers below.

Each tool is `tool(ctx: ToolContext, request: <Request model>[, progress]) -> <Result model>`; the first
line of its docstring is what an agent reads. Plain Python, no MCP: the server adapts `TOOLS` to MCP,
and the CLI and tests call them directly. May import `core`, `prompts`, `cluster`, `data`, `trainer`.
"""

from tradewind.tools.anomalies import Anomaly, detect_anomalies
from tradewind.tools.cluster import (
    ClusterStatus,
    ClusterStatusRequest,
    RunPipelineRequest,
    RunPipelineResult,
    cluster_status,
    run_pipeline,
)
from tradewind.tools.comparing import CompareRunsRequest, Comparison, compare_runs
from tradewind.tools.context import Progress, ToolContext, no_progress
from tradewind.tools.datasets import (
    DatasetList,
    DatasetReport,
    InspectDatasetRequest,
    ListDatasetsRequest,
    inspect_dataset,
    list_datasets,
)
from tradewind.tools.estimating import EstimateRunRequest, RunEstimate, estimate_run
from tradewind.tools.experiments import (
    Experiment,
    ExperimentList,
    ListExperimentsRequest,
    RerunBaselineRequest,
    Reruns,
    SetExperimentStatusRequest,
    list_experiments,
    rerun_baseline,
    set_experiment_status,
)
from tradewind.tools.exporting import ExportModelRequest, ExportModelResult, export_model
from tradewind.tools.launching import LaunchTrainingRequest, launch_training
from tradewind.tools.logs import LogHint, LogPage, TailLogsRequest, tail_logs
from tradewind.tools.metrics import Metrics, MetricsSummary, ReadMetricsRequest, Series, read_metrics
from tradewind.tools.profiling import ProfileResult, ProfileRunRequest, profile_run
from tradewind.tools.report_data import RunFigures
from tradewind.tools.reports import ReportInfo, SummarizeReportRequest, summarize_report
from tradewind.tools.runs import (
    ListRunsRequest,
    RunEntry,
    RunInfo,
    RunList,
    RunRequest,
    UnreadableRun,
    WaitForRunRequest,
    WaitForRunResult,
    cancel_run,
    get_run,
    list_runs,
    wait_for_run,
)
from tradewind.tools.sampling import SampleTextRequest, SampleTextResult, sample_text
from tradewind.tools.sweeps import LaunchSweepRequest, SweepInfo, SweepRequest, cancel_sweep, get_sweep, launch_sweep
from tradewind.tools.tokenizing import (
    BadRecordReport,
    DatasetInfo,
    TokenizeDatasetRequest,
    TrainedTokenizer,
    TrainTokenizerRequest,
    tokenize_dataset,
    train_tokenizer,
)

# The order agents see them in: the loop from text to report.
TOOLS = (
    tokenize_dataset,
    train_tokenizer,
    inspect_dataset,
    list_datasets,
    estimate_run,
    launch_training,
    get_run,
    wait_for_run,
    list_runs,
    cancel_run,
    read_metrics,
    tail_logs,
    profile_run,
    summarize_report,
    compare_runs,
    list_experiments,
    set_experiment_status,
    rerun_baseline,
    launch_sweep,
    get_sweep,
    cancel_sweep,
    sample_text,
    export_model,
    run_pipeline,
    cluster_status,
)

__all__ = [
    "TOOLS",
    "EstimateRunRequest",
    "RunEstimate",
    "estimate_run",
    "Experiment",
    "ExperimentList",
    "ListExperimentsRequest",
    "SetExperimentStatusRequest",
    "RerunBaselineRequest",
    "Reruns",
    "list_experiments",
    "rerun_baseline",
    "set_experiment_status",
    "LaunchSweepRequest",
    "SweepInfo",
    "SweepRequest",
    "cancel_sweep",
    "get_sweep",
    "launch_sweep",
    "Anomaly",
    "CompareRunsRequest",
    "Comparison",
    "RunFigures",
    "SummarizeReportRequest",
    "compare_runs",
    "detect_anomalies",
    "ClusterStatus",
    "ClusterStatusRequest",
    "RunPipelineRequest",
    "RunPipelineResult",
    "ExportModelRequest",
    "ExportModelResult",
    "SampleTextRequest",
    "SampleTextResult",
    "cluster_status",
    "run_pipeline",
    "export_model",
    "sample_text",
    "BadRecordReport",
    "DatasetInfo",
    "DatasetList",
    "DatasetReport",
    "InspectDatasetRequest",
    "ListDatasetsRequest",
    "LaunchTrainingRequest",
    "ListRunsRequest",
    "Metrics",
    "MetricsSummary",
    "ProfileResult",
    "ProfileRunRequest",
    "Progress",
    "ReadMetricsRequest",
    "ReportInfo",
    "RunInfo",
    "RunEntry",
    "RunList",
    "Series",
    "RunRequest",
    "TokenizeDatasetRequest",
    "ToolContext",
    "TrainTokenizerRequest",
    "TrainedTokenizer",
    "UnreadableRun",
    "cancel_run",
    "WaitForRunRequest",
    "WaitForRunResult",
    "get_run",
    "inspect_dataset",
    "launch_training",
    "list_datasets",
    "list_runs",
    "no_progress",
    "profile_run",
    "read_metrics",
    "summarize_report",
    "tokenize_dataset",
    "train_tokenizer",
    "wait_for_run",
    "LogHint",
    "LogPage",
    "TailLogsRequest",
    "tail_logs",
]
