"""The data and run commands of the `tradewind` CLI: each prints what its tool returns for the same options,
and `--allow-path` / `--allow-code` become the workspace's grants."""

import json
from pathlib import Path

import pytest
from tpu_helpers import WIDE_EMBEDDING, needs_libtpu

from tradewind.cli import build_parser, main
from tradewind.commands import context
from tradewind.core import read_json
from tradewind.data import open_token_cache
from tradewind.runs import ProfileSummary, RunLayout
from tradewind.tools import TokenizeDatasetRequest, tokenize_dataset
from tradewind.tools.sampling import SampleTextRequest, sample_text


def test_cli_tokenize_options_make_the_dataset_the_tool_makes_and_keep_the_old_no_eos(workspace, capsys):
    common = ["--workspace", str(workspace.workspace.root), "--log-level", "WARNING"]
    assert main(["tokenize", "corpus.txt", "--no-eos", "--val-fraction", "0.2", "--workers", "1", *common]) == 0
    by_cli = json.loads(capsys.readouterr().out)

    again = TokenizeDatasetRequest(input="corpus.txt", append_eos=False, val_fraction=0.2)
    assert tokenize_dataset(workspace, again).model_dump() == {**by_cli, "reused": True}
    assert open_token_cache(by_cli["path"]).manifest.append_eos is False


def test_cli_train_tokenizer_tokenize_and_inspect_run_end_to_end(workspace, capsys):
    common = ["--workspace", str(workspace.workspace.root), "--log-level", "WARNING"]
    assert main(["train-tokenizer", "corpus.txt", "--vocab-size", "300", *common]) == 0
    tokenizer = json.loads(capsys.readouterr().out)["tokenizer"]
    assert main(["tokenize", "corpus.txt", "--tokenizer", tokenizer, "--workers", "1", *common]) == 0
    info = json.loads(capsys.readouterr().out)
    assert main(["inspect", info["dataset_id"], "--samples", "1", *common]) == 0
    shown = capsys.readouterr().out

    assert info["vocab_size"] == 300 and info["documents"]["train"] + info["documents"]["val"] == 600
    assert f"dataset {info['dataset_id']}" in shown and "--- document 0" in shown
    assert main(["tokenize", "corpus.txt", "--workers", "0", *common]) == 2
    assert "workers: Input should be greater than or equal to 1" in capsys.readouterr().err


@pytest.mark.slow
def test_tradewind_sample_prints_what_sample_text_returns_for_the_same_options(trained_ctx, capsys):
    options = ["--prompt", "KING:", "--max-tokens", "6", "--temperature", "0.7", "--top-k", "20", "--seed", "5"]
    common = ["--workspace", str(trained_ctx.workspace.root), "--log-level", "WARNING"]
    assert main(["sample", "r1", *options, "--json", *common]) == 0
    by_cli = json.loads(capsys.readouterr().out)

    request = SampleTextRequest(run_id="r1", prompt="KING:", max_tokens=6, temperature=0.7, top_k=20, seed=5)
    by_tool = sample_text(trained_ctx, request)
    assert (by_cli["text"], by_cli["tokens"], by_cli["step"]) == (by_tool.text, 6, 10)
    assert main(["sample", "r1", "--top-p", "0", *common]) == 2
    assert "top_p" in capsys.readouterr().err


def test_allow_code_is_a_repeatable_command_line_grant_apart_from_allow_path(tmp_path):
    grants = ["--allow-path", str(tmp_path / "in")]
    grants += ["--allow-code", str(tmp_path / "a"), "--allow-code", str(tmp_path / "b")]
    args = build_parser().parse_args(["runs", "list", "--workspace", str(tmp_path / "ws"), *grants])
    workspace = context(args).workspace
    assert workspace.code_roots == ((tmp_path / "a").resolve(), (tmp_path / "b").resolve())
    assert workspace.allowed_roots == ((tmp_path / "in").resolve(),)


@pytest.mark.slow
def test_tradewind_profile_and_report_print_what_their_tools_wrote(ctx, finished_run, capsys):
    run = finished_run.run_id
    common = ["--workspace", str(ctx.workspace.root), "--log-level", "WARNING"]
    assert main(["profile", run, "--steps", "2", "--start-step", "3", *common]) == 0
    shown = capsys.readouterr().out
    summary = ProfileSummary.model_validate(read_json(RunLayout(ctx.workspace.run_dir(run)).profile / "summary.json"))
    assert (summary.steps, summary.start_step) == (2, 3)
    assert f"{summary.diagnosis.verdict}: {summary.diagnosis.suggestion}" in shown
    assert f"compute {summary.split.compute:.0%}" in shown and all(op.name in shown for op in summary.top_ops)

    assert main(["report", run, "--no-sample", *common]) == 0
    markdown, html = capsys.readouterr().out.split()
    assert Path(markdown) == ctx.workspace.reports_dir / f"{run}.md" and Path(html).suffix == ".html"
    assert f"# Training report: {run}" in Path(markdown).read_text(encoding="utf-8")
    assert main(["report", run, run, *common]) == 2  # a comparison needs two different runs
    assert "run_ids" in capsys.readouterr().err


def test_tradewind_estimate_prints_what_estimate_run_returns_for_the_yaml_with_overrides(workspace, capsys):
    from tradewind.tools.estimating import EstimateRunRequest, estimate_run

    common = ["--workspace", str(workspace.workspace.root), "--log-level", "WARNING"]
    dataset = tokenize_dataset(workspace, TokenizeDatasetRequest(input="corpus.txt")).dataset_id
    config = workspace.workspace.root / "tiny.yaml"
    config.write_text(
        f"dataset: {dataset}\nmodel: {{d_model: 32, n_layers: 2, n_heads: 2, max_seq_len: 64}}\nseq_len: 32\n",
        encoding="utf-8",
    )
    options = [str(config), "--set", "batch_size=4", "--set", "steps=70", "--no-probe", *common]
    assert main(["estimate", *options, "--json"]) == 0
    by_cli = json.loads(capsys.readouterr().out)

    fields = {"dataset": dataset, "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64}}
    request = EstimateRunRequest(config={**fields, "seq_len": 32, "batch_size": 4, "steps": 70}, probe=False)
    by_tool = estimate_run(workspace, request).model_dump(mode="json")
    device = by_cli.pop("device_memory_bytes") / by_tool.pop("device_memory_bytes")  # free RAM moves a little
    assert by_cli == by_tool and 0.5 < device < 2
    assert (by_cli["tokens_per_step"], by_cli["steps_in_budget"], by_cli["step_time_source"]) == (128, 70, None)

    assert main(["estimate", *options]) == 0
    shown = capsys.readouterr().out
    assert f"{by_tool['parameters']:,}" in shown and by_tool["advice"] in shown and "not measured" in shown
    assert main(["estimate", *options, "--set", "model.d_modle=64"]) == 2
    assert "d_modle" in capsys.readouterr().err


@pytest.mark.slow
@needs_libtpu
def test_tradewind_compile_prints_the_slices_fit_and_estimate_and_fails_a_run_that_does_not_fit(workspace, capsys):
    # Real TPU compiles (libtpu's compile-only client): v5litepod-16 is 4 hosts of 4 chips.
    common = ["--workspace", str(workspace.workspace.root), "--log-level", "WARNING"]
    dataset = tokenize_dataset(workspace, TokenizeDatasetRequest(input="corpus.txt")).dataset_id
    config = workspace.workspace.root / "small.yaml"
    config.write_text(
        f"dataset: {dataset}\nmodel: {{d_model: 64, n_layers: 2, n_heads: 2, max_seq_len: 64}}\nseq_len: 64\n"
        "batch_size: 16\nmesh: {fsdp: 4}\n",
        encoding="utf-8",
    )
    assert main(["compile", str(config), "--accelerator", "v5litepod-16", "--json", *common]) == 0
    by_cli = json.loads(capsys.readouterr().out)
    assert by_cli["fits"] is True and 0 < by_cli["hbm_per_chip_bytes"] <= by_cli["device_memory_bytes"]
    assert by_cli["device_memory_source"] == "HBM of one TPU v5 lite chip (1 x v5litepod-16, compiled)"

    # Adam's state alone passes a chip, and it fits eight with its parameters sharded over them.
    wide = ["--set", f"model={json.dumps(WIDE_EMBEDDING)}", "--set", "mesh.fsdp=1"]
    assert main(["compile", str(config), "--accelerator", "tpu-v5litepod-8", *wide, *common]) == 0
    assert "so it trains with mesh.data=-1 and mesh.fsdp=8" in capsys.readouterr().out  # fitted, and said so
    big = ["--set", "model={d_model: 8192, n_layers: 2, n_heads: 64, max_seq_len: 64}", "--set", "mesh.fsdp=1"]
    assert main(["compile", str(config), "--accelerator", "tpu-v5litepod-1", *big, *common]) == 1
    shown = capsys.readouterr().out
    assert "DOES NOT FIT" in shown and "HBM per chip (compiled)" in shown and "It does not fit a chip" in shown


def test_report_compares_on_the_metrics_compare_runs_takes_and_defaults_to_its_default():
    import typing

    from tradewind.tools.comparing import CompareMetric, CompareRunsRequest

    commands = next(action for action in build_parser()._actions if action.dest == "command")
    metric = next(action for action in commands.choices["report"]._actions if action.dest == "metric")
    assert metric.choices == list(typing.get_args(CompareMetric))
    assert metric.default == CompareRunsRequest.model_fields["metric"].default
