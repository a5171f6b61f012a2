"""Tokens/s of Tradewind's CPU training against a hand-written PyTorch loop of the same model and batches.

Command:
    .venv/bin/python benchmarks/train_vs_torch.py [--steps 12] [--pairs 3]

The model is issue 12's: a Llama of 7.36M parameters (vocabulary 8192 from a byte-level BPE trained on Tiny
Shakespeare, d_model 256, 4 layers, 4 heads, d_ff 688, untied head), sequence 256, batch 16, AdamW with
clipping, float32 weights. Tradewind trains it through `tradewind.trainer.train` (its `mean_tokens_per_s`
counts step time only, compilation excluded). PyTorch trains a nanoGPT-style module of the same shape
(RMSNorm, rotary, SwiGLU, `scaled_dot_product_attention`) on the same token windows, in three variants:
eager float32, `torch.compile` float32, and `torch.compile` under bfloat16 autocast when the CPU has AMX or
AVX512-BF16. Each variant is built and compiled once, then timed (after two warm-up steps) in every pair;
the runs take turns at going first. Each pair gives one ratio, Tradewind ÷ the fastest PyTorch variant of
that pair, and the result is their median (a shared machine drifts by tens of percent over minutes).
Target >= 1.0.

Last line: one JSON object; value is Tradewind's median tokens/s, baseline the fastest variant's median.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path
from statistics import median

import numpy as np

from tradewind.data import PackedLoader, build_token_cache, builtin_corpus_path, open_token_cache, train_tokenizer
from tradewind.runs import TrainConfig
from tradewind.trainer import train

VOCAB, D_MODEL, LAYERS, HEADS, D_FF, SEQ, BATCH = 8192, 256, 4, 4, 688, 256, 16
MODEL = {"d_model": D_MODEL, "n_layers": LAYERS, "n_heads": HEADS, "d_ff": D_FF, "max_seq_len": SEQ}
MODEL |= {"tie_embeddings": False, "vocab_size": VOCAB}


def cpu_has_bf16() -> bool:
    """AMX-BF16 or AVX512-BF16 in /proc/cpuinfo's flags (False where there is no such file)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def make_cache(folder: Path) -> Path:
    corpus = builtin_corpus_path("tinyshakespeare")
    tokenizer = train_tokenizer([corpus], folder / "tokenizer.json", VOCAB)
    build_token_cache([corpus], folder / "cache", tokenizer)
    return folder / "cache"


def tradewind_tokens_per_s(cache: Path, steps: int, out: Path) -> float:
    config = TrainConfig(
        dataset=str(cache),
        model=MODEL,
        steps=steps,
        batch_size=BATCH,
        seq_len=SEQ,
        eval_every=steps,
        eval_batches=1,
        log_every=steps,
        checkpoint=False,
        tensorboard=False,
    )
    return train(config, out).mean_tokens_per_s


class TorchTrainer:
    """One PyTorch variant: the model, AdamW and a step function, built (and compiled) once."""

    def __init__(self, compiled: bool, bf16: bool):
        import torch

        self.torch, self.bf16 = torch, bf16
        torch.manual_seed(0)
        self.model = _torch_llama(torch)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), foreach=True)
        self.forward = torch.compile(self.model) if compiled else self.model

    def step(self, batch: np.ndarray) -> float:
        torch = self.torch
        tokens = torch.from_numpy(batch.astype(np.int64))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.forward(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB), tokens[:, 1:].reshape(-1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return loss.item()

    def tokens_per_s(self, loader: PackedLoader, steps: int) -> float:
        for i in range(2):  # warm-up: compilation and allocator
            self.step(loader.batch(i))
        start = time.perf_counter()
        for i in range(steps):
            self.step(loader.batch(2 + i))
        return steps * BATCH * SEQ / (time.perf_counter() - start)


def _torch_llama(torch):
    """A Llama of the benchmark's shape in plain PyTorch (nanoGPT style)."""
    nn, functional = torch.nn, torch.nn.functional
    head_dim = D_MODEL // HEADS
    inverse = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(SEQ).float(), inverse)  # [seq, head_dim / 2]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    def rotate(x):  # x [batch, heads, seq, head_dim], HF half-split layout
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos[: x.shape[2]] + rotated * sin[: x.shape[2]]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = nn.RMSNorm(D_MODEL, eps=1e-6), nn.RMSNorm(D_MODEL, eps=1e-6)
            self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL, bias=False)
            self.out = nn.Linear(D_MODEL, D_MODEL, bias=False)
            self.gate_up = nn.Linear(D_MODEL, 2 * D_FF, bias=False)
            self.down = nn.Linear(D_FF, D_MODEL, bias=False)

        def forward(self, x):
            batch, seq, _ = x.shape
            q, k, v = self.qkv(self.attn_norm(x)).view(batch, seq, 3, HEADS, head_dim).permute(2, 0, 3, 1, 4)
            attended = functional.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=True)
            x = x + self.out(attended.transpose(1, 2).reshape(batch, seq, D_MODEL))
            gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, -1)
            return x + self.down(functional.silu(gate) * up)

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, D_MODEL)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.norm = nn.RMSNorm(D_MODEL, eps=1e-6)
            self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
            for parameter in self.parameters():
                if parameter.dim() >= 2:
                    nn.init.normal_(parameter, std=0.02)
            for block in self.blocks:
                for projection in (block.out, block.down):
                    nn.init.normal_(projection.weight, std=0.02 / math.sqrt(2 * LAYERS))

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return Llama()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    variants = {"eager fp32": (False, False), "compiled fp32": (True, False)}
    if cpu_has_bf16():
        variants["compiled bf16 autocast"] = (True, True)
    with tempfile.TemporaryDirectory() as tmp:
        cache = make_cache(Path(tmp))
        loader = PackedLoader(open_token_cache(cache).tokens("train"), batch_size=BATCH, seq_len=SEQ, seed=0)
        trainers = {name: TorchTrainer(*how) for name, how in variants.items()}
        ours, theirs, ratios = [], {name: [] for name in variants}, []
        for pair in range(args.pairs):
            if pair % 2 == 0:
                ours.append(tradewind_tokens_per_s(cache, args.steps, Path(tmp) / f"run{pair}"))
            for name, trainer in trainers.items():
                theirs[name].append(trainer.tokens_per_s(loader, args.steps))
            if pair % 2 == 1:
                ours.append(tradewind_tokens_per_s(cache, args.steps, Path(tmp) / f"run{pair}"))
            ratios.append(ours[-1] / max(runs[-1] for runs in theirs.values()))
        print(f"tradewind: {median(ours):,.0f} tok/s (runs: {', '.join(f'{x:,.0f}' for x in ours)})")
        for name, runs in theirs.items():
            print(f"pytorch {name}: {median(runs):,.0f} tok/s (runs: {', '.join(f'{x:,.0f}' for x in runs)})")
        print(f"ratio to the fastest per pair: {', '.join(f'{x:.3f}' for x in ratios)} -> median {median(ratios):.3f}")
    fastest = max(median(runs) for runs in theirs.values())
    print(
        json.dumps(
            {
                "benchmark": "train_vs_torch_tokens_per_s",
                "value": round(median(ours), 1),
                "baseline": round(fastest, 1),
                "ratio": round(median(ratios), 3),
                "unit": "tokens/s",
            }
        )
    )


if __name__ == "__main__":
    main()
