"""Sample text from a run's checkpoint with a key/value cache (temperature, top-k, top-p, max tokens).

    python -m tradewind.trainer.sample RUN_DIR --prompt "ROMEO:" [--max-tokens 200] [--temperature 0.8]
        [--top-k 0] [--top-p 1.0] [--seed 0] [--step N] [--out FILE]

prints the text (or writes a `SampleOutput` as JSON to FILE). The prompt is encoded with the dataset's
tokenizer, run through the model once to fill the cache (prefill), then one token at a time is drawn and
fed back; the whole loop is one `jax.jit` program. Exit status 0 on success, 1 on error.

Example:
    tokens = sample_tokens(graphdef, params, model_config, [72, 105], max_tokens=50, temperature=0.8)
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from pydantic import BaseModel

from tradewind.core import InvalidInputError, TradewindError, atomic_write_json
from tradewind.data import load_tokenizer
from tradewind.trainer.config import ModelConfig
from tradewind.trainer.model import init_cache
from tradewind.trainer.restore import load_run_model


class SampleOutput(BaseModel):
    """What a sampling job produced."""

    text: str
    prompt: str
    tokens: list[int]
    step: int


def filter_logits(logits: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:
    """Scale logits [vocab] by 1/temperature and mask (to -inf) all but the top-k and the top-p nucleus."""
    logits = logits / temperature
    if top_k > 0:
        kth = jax.lax.top_k(logits, top_k)[0][-1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        order = jnp.argsort(-logits)
        probs = jax.nn.softmax(logits[order])
        outside = jnp.cumsum(probs) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        logits = logits.at[order].set(jnp.where(outside, -jnp.inf, logits[order]))
    return logits


def _generate(graphdef, params, prompt, key, *, model_config, max_tokens, temperature, top_k, top_p):
    model = nnx.merge(graphdef, params)
    cache = init_cache(model_config, 1, prompt.shape[0] + max_tokens)
    logits, cache = model(prompt[None, :], cache)  # [1, prompt, vocab]

    def draw(carry, step_key):
        last, cache = carry
        if temperature == 0.0:
            token = jnp.argmax(last)
        else:
            token = jax.random.categorical(step_key, filter_logits(last, temperature, top_k, top_p))
        logits, cache = model(token.reshape(1, 1).astype(jnp.int32), cache)
        return (logits[0, -1], cache), token

    _, tokens = jax.lax.scan(draw, (logits[0, -1], cache), jax.random.split(key, max_tokens))
    return tokens


def sample_tokens(
    graphdef: nnx.GraphDef,
    params: Any,
    model_config: ModelConfig,
    prompt: list[int],
    *,
    max_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
) -> list[int]:
    """Continue `prompt` (token ids) by `max_tokens` sampled tokens; temperature 0 is greedy.

    Raises:
        InvalidInputError: the prompt is empty, or prompt plus `max_tokens` exceeds `max_seq_len`.
    """
    if not prompt:
        raise InvalidInputError("argument 'prompt': must encode to at least one token")
    if len(prompt) + max_tokens > model_config.max_seq_len:
        raise InvalidInputError(
            f"argument 'max_tokens': prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the "
            f"model's max_seq_len ({model_config.max_seq_len})"
        )
    generate = jax.jit(
        partial(
            _generate,
            graphdef,
            model_config=model_config,
            max_tokens=max_tokens,
            temperature=float(temperature),
            top_k=int(top_k),
            top_p=float(top_p),
        )
    )
    tokens = generate(params, jnp.asarray(prompt, jnp.int32), jax.random.key(seed))
    return [int(t) for t in tokens]


def sample_run(
    run_dir: Path,
    prompt: str,
    *,
    max_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    step: int | None = None,
) -> SampleOutput:
    """Sample from run `run_dir`'s newest (or `step`'s) checkpoint, with the dataset's tokenizer."""
    loaded = load_run_model(run_dir, step)
    tokenizer = load_tokenizer(loaded.manifest.tokenizer.name)
    ids = tokenizer.encode_batch([prompt])[0]
    out = sample_tokens(
        loaded.graphdef,
        loaded.params,
        loaded.model_config,
        ids,
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
    )
    return SampleOutput(text=tokenizer.decode(out), prompt=prompt, tokens=out, step=loaded.step)


def main(argv: list[str] | None = None) -> int:
    """Sample from the run in RUN_DIR; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tradewind.trainer.sample", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--prompt", default="")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    try:
        result = sample_run(
            args.run_dir,
            args.prompt,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            step=args.step,
        )
    except TradewindError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.out is not None:
        atomic_write_json(args.out, result.model_dump())
    print(result.prompt + result.text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
