"""Fine-tuning an open model through the tools, as an agent does it: a Hugging Face folder (a random Qwen2 model
and a tokenizer with Qwen2.5's chat template, saved by `transformers`), chat data tokenized with that tokenizer,
a run that starts from the folder (`init_from="hf:PATH"`), fully or with LoRA, its samples, and its exports,
which `transformers` and `peft` load with the logits the run's own model gives."""

import json
import re
from pathlib import Path

import anyio
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from chat_models import REPLY_PATTERN, WORDS, format_task, qwen_chat_folder, write_jsonl
from flax import nnx
from hf_models import transformers_logits
from mcp import Client
from mcp_helpers import call

from tradewind.runs import RunLayout, read_metrics, read_train_config
from tradewind.server import build_server
from tradewind.tools import (
    ExportModelRequest,
    LaunchTrainingRequest,
    SampleTextRequest,
    SummarizeReportRequest,
    TokenizeDatasetRequest,
    ToolContext,
    export_model,
    launch_training,
    sample_text,
    summarize_report,
    tokenize_dataset,
)
from tradewind.trainer.export import export_hf
from tradewind.trainer.hf import load_hf_params
from tradewind.trainer.lora import FROZEN

pytestmark = pytest.mark.slow
MODEL = "models/tiny-qwen"
TRAINING = dict(batch_size=8, seq_len=64, eval_every=25, eval_batches=1, log_every=25)


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """A workspace holding the model folder and the format task's chat data tokenized with the folder's
    tokenizer: `(ctx, dataset_id)`."""
    ctx = ToolContext.open(tmp_path_factory.mktemp("finetune"))
    root = ctx.workspace.root
    (root / "settings.yaml").write_text("backend: local\n", encoding="utf-8")
    qwen_chat_folder(root / MODEL, format_task())
    write_jsonl(root / "chat.jsonl", format_task())
    request = TokenizeDatasetRequest(input="chat.jsonl", format="chat", tokenizer=MODEL, val_fraction=0.2)
    return ctx, tokenize_dataset(ctx, request).dataset_id


def finished(ctx, **request):
    from runs_helpers import finish

    new_run = (
        {} if "resume_from" in request else {"init_from": f"hf:{MODEL}", **TRAINING}
    )  # a continued one keeps its own
    run = launch_training(ctx, LaunchTrainingRequest(**new_run, **request))
    done = finish(ctx, run.run_id, timeout_s=600)
    assert done.status == "SUCCEEDED", done.log_tail
    return run.run_id


def eval_losses(ctx, run_id):
    rows = read_metrics(RunLayout(ctx.workspace.run_dir(run_id)).metrics)
    return [row.eval_loss for row in rows if row.eval_loss is not None]


def run_logits(ctx, run_id, tokens):
    from tradewind.trainer.restore import load_run_model

    return np.asarray(load_run_model(ctx.workspace.run_dir(run_id)).model()(tokens))


TOKENS = np.array([[5, 72, 101, 108, 108, 111, 32, 119, 33, 200, 3, 9]], np.int32)


def test_a_chat_fine_tune_learns_the_reply_format_and_its_export_loads_in_transformers(chat, tmp_path):
    ctx, dataset = chat
    run_id = finished(ctx, dataset=dataset, steps=300, optimizer={"learning_rate": 3e-3, "warmup_steps": 10})

    # The held-out assistant tokens: a random model scores about ln(vocab); the fine-tuned one knows the format.
    losses = eval_losses(ctx, run_id)
    assert losses[0] > 5.0 and losses[-1] < losses[0] / 5, losses
    for word in WORDS[:4]:  # a wording no record used
        request = SampleTextRequest(
            run_id=run_id, messages=[{"role": "user", "content": f"Kindly say {word}."}], temperature=0, max_tokens=24
        )
        reply = sample_text(ctx, request).text
        assert re.fullmatch(REPLY_PATTERN, reply), reply

    async def export_through_mcp():
        async with Client(build_server(ctx)) as client:
            return await call(client, "export_model", {"run_id": run_id})

    exported = anyio.run(export_through_mcp)
    assert exported["path"] == str(ctx.workspace.root / "exports" / f"{run_id}-hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(exported["files"])
    assert "chat_template" in json.loads((Path(exported["path"]) / "tokenizer_config.json").read_text())
    logits = transformers_logits(exported["path"], TOKENS)
    np.testing.assert_allclose(logits, run_logits(ctx, run_id, TOKENS), rtol=0, atol=1e-4)
    assert not list((ctx.workspace.root / "exports").glob(".*"))  # no staging folder left


def test_a_lora_fine_tune_saves_only_its_adapters_keeps_its_base_and_exports_merged_and_as_peft(chat, tmp_path):
    ctx, dataset = chat
    lora = {"rank": 4, "alpha": 8, "targets": ["q_proj", "v_proj", "down_proj"]}
    run_id = finished(ctx, dataset=dataset, steps=30, lora=lora, optimizer={"learning_rate": 1e-2, "warmup_steps": 0})
    layout = RunLayout(ctx.workspace.run_dir(run_id))

    losses = eval_losses(ctx, run_id)
    assert losses[-1] < losses[0] - 0.5, losses
    saved = ocp.StandardCheckpointer().metadata(layout.checkpoints / "30" / "default").item_metadata
    names = {jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(saved["params"])}
    assert names and all(re.search(r"\['(q_proj|v_proj|down_proj)'\]\['lora_[ab]'\]", name) for name in names)
    assert len(names) == 2 * 3 * 2  # layers x targets x (a, b)

    from tradewind.trainer.restore import load_run_model

    model = load_run_model(layout.root).model()
    base = load_hf_params(ctx.workspace.root / MODEL)[1]
    frozen = nnx.to_pure_dict(nnx.state(model, FROZEN))
    np.testing.assert_array_equal(
        frozen["blocks"][0]["attn"]["q_proj"]["base"]["kernel"], base["blocks"][0]["attn"]["q_proj"]["kernel"]
    )
    np.testing.assert_array_equal(
        frozen["blocks"][1]["mlp"]["gate_proj"]["kernel"], base["blocks"][1]["mlp"]["gate_proj"]["kernel"]
    )

    ours = run_logits(ctx, run_id, TOKENS)
    merged = export_hf(layout.root, tmp_path / "merged")
    np.testing.assert_allclose(transformers_logits(merged, TOKENS), ours, rtol=0, atol=1e-4)
    adapter = export_model(ctx, ExportModelRequest(run_id=run_id, format="peft")).path
    base = ctx.workspace.root / MODEL
    np.testing.assert_allclose(transformers_logits(base, TOKENS, adapter), ours, rtol=0, atol=1e-4)
    assert np.abs(ours - transformers_logits(base, TOKENS)).max() > 1e-3  # it did train

    report = summarize_report(ctx, SummarizeReportRequest(run_id=run_id, sample=False))
    text = (ctx.workspace.root / report.report_path).read_text(encoding="utf-8")
    assert f"| base model | `{ctx.workspace.root / MODEL}` |" in text
    assert "| fine-tuning | LoRA rank 4, alpha 8, dropout 0 on q_proj, v_proj, down_proj (" in text

    # Continued for more steps, it keeps its base: its checkpoints hold only the adapters.
    child = finished(ctx, resume_from=run_id, steps=40)
    assert read_train_config(RunLayout(ctx.workspace.run_dir(child)).config).init_from == str(
        ctx.workspace.root / MODEL
    )
    assert eval_losses(ctx, child)[-1] < losses[0] - 0.5, eval_losses(ctx, child)
