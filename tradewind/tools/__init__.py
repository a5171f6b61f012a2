"""Tools: typed functions an agent calls, composing the layers below.

Each tool is `tool(ctx: ToolContext, request: <Request model>[, progress]) -> <Result model>`; the first
line of its docstring is what an agent reads. Plain Python, no MCP: the server adapts `TOOLS` to MCP,
and the CLI and tests call them directly. May import `core`, `prompts`, `cluster`, `data`, `trainer`.
"""

from tradewind.tools.context import Progress, ToolContext, no_progress
from tradewind.tools.datasets import DatasetInfo, TokenizeDatasetRequest, tokenize_dataset
from tradewind.tools.profiling import ProfileResult, ProfileRunRequest, profile_run
from tradewind.tools.reports import ReportInfo, summarize_report
from tradewind.tools.runs import (
    LaunchTrainingRequest,
    ListRunsRequest,
    MetricsPage,
    ReadMetricsRequest,
    RunInfo,
    RunList,
    RunRequest,
    WaitForRunRequest,
    WaitForRunResult,
    get_run,
    launch_training,
    list_runs,
    read_metrics,
    wait_for_run,
)

# The order agents see them in: the loop from text to report.
TOOLS = (
    tokenize_dataset,
    launch_training,
    get_run,
    wait_for_run,
    list_runs,
    read_metrics,
    profile_run,
    summarize_report,
)

__all__ = [
    "TOOLS",
    "DatasetInfo",
    "LaunchTrainingRequest",
    "ListRunsRequest",
    "MetricsPage",
    "ProfileResult",
    "ProfileRunRequest",
    "Progress",
    "ReadMetricsRequest",
    "ReportInfo",
    "RunInfo",
    "RunList",
    "RunRequest",
    "TokenizeDatasetRequest",
    "ToolContext",
    "WaitForRunRequest",
    "WaitForRunResult",
    "get_run",
    "launch_training",
    "list_runs",
    "no_progress",
    "profile_run",
    "read_metrics",
    "summarize_report",
    "tokenize_dataset",
    "wait_for_run",
]
