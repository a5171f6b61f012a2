"""Tokenize -> train -> eval -> report on Tiny Shakespeare, as cached steps (a rerun skips finished ones).

The file is read from the workspace (or a folder allowed with --allow-path), like every path a command takes:
.venv/bin/tradewind cluster pipeline "$PWD/experiments/pipeline_tiny.py" --allow-path "$PWD/experiments" \
    --workspace /tmp/tw [--run]
"""

import json

from tradewind.cluster import Step
from tradewind.data import ByteTokenizer, build_token_cache, builtin_corpus_path


def tokenize(out, cfg, inputs):
    build_token_cache([builtin_corpus_path(cfg["corpus"])], out / "cache", ByteTokenizer(), val_fraction=0.1)


def train_model(out, cfg, inputs):
    from tradewind.runs import TrainConfig
    from tradewind.trainer import train  # here, so that JAX loads only when this step runs

    train(TrainConfig.model_validate({**cfg, "dataset": str(inputs["tokenize"] / "cache")}), out)


def evaluate(out, cfg, inputs):
    summary = json.loads((inputs["train"] / "summary.json").read_text())
    (out / "eval.json").write_text(json.dumps({k: summary[k] for k in ("final_eval_loss", "best_eval_loss")}))


def report(out, cfg, inputs):
    scores = json.loads((inputs["eval"] / "eval.json").read_text())
    (out / "report.md").write_text("# Tiny pipeline\n\n" + "".join(f"- {k}: {v:.4f}\n" for k, v in scores.items()))


model = {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64}
tokens = Step("tokenize", tokenize, {"corpus": "tinyshakespeare"})
trained = Step("train", train_model, {"steps": 30, "batch_size": 8, "seq_len": 32, "model": model}, deps=(tokens,))
scored = Step("eval", evaluate, {}, deps=(trained,))
steps = [Step("report", report, {}, deps=(scored,))]
