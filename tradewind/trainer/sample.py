"""Sample text from a run's checkpoint with a key/value cache (temperature, top-k, top-p, max tokens).

As a job (what the `sample_text` tool submits; the keyword arguments are a `SampleJob`):
    JobSpec(name="sample r1", callable="tradewind.trainer.sample:sample_job",
            kwargs={"run_dir": "RUN_DIR", "output_file": "OUT.json", "prompt": "ROMEO:", "max_tokens": 200})

writes a `SampleOutput` as JSON to the output file and prints the text. The prompt is encoded with the
dataset's tokenizer, run through the model once to fill the cache (prefill), then one token at a time is
drawn and fed back; the whole loop is one `jax.jit` program, kept (per model and options) for the next
call in the same process, which is what the warm worker (`sample_worker.py`) relies on. Given `messages`
instead of a prompt, the job renders them with the tokenizer's chat template and its generation prompt
(`encode_chat(messages, add_generation_prompt=True)`), and the reply ends before the first EOS drawn.

Example:
    tokens = sample_tokens(graphdef, params, model_config, [72, 105], max_tokens=50, temperature=0.8)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from pydantic import BaseModel

from tradewind.core import InvalidInputError, parse_config
from tradewind.data import ChatTemplateError, Tokenizer
from tradewind.data.chat import reply_end_id
from tradewind.runs.jobs import ChatMessage, SampleJob, SampleOptions, write_sample
from tradewind.runs.models.configs import ModelConfig
from tradewind.trainer.models import init_cache
from tradewind.trainer.restore import LoadedRun, load_run_model

# Compiled sampling programs kept per process: (id(graphdef), config, options) -> (graphdef, jitted function).
COMPILED_PROGRAMS = 16
_compiled: OrderedDict[tuple, tuple[nnx.GraphDef, Callable]] = OrderedDict()
_compiled_lock = threading.Lock()


class SampleOutput(BaseModel):
    """What a sampling job produced: the text of `tokens`, the prompt as the model saw it (a chat rendered with
    its template), and the checkpoint step. With messages, `tokens` stops before the first EOS."""

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
    generate = _generate_program(graphdef, model_config, max_tokens, float(temperature), int(top_k), float(top_p))
    tokens = generate(params, jnp.asarray(prompt, jnp.int32), jax.random.key(seed))
    return [int(t) for t in tokens]


def _generate_program(graphdef, model_config, max_tokens, temperature, top_k, top_p) -> Callable:
    """The jitted `_generate` for this model and these options: the same object for the same graph (so JAX's
    trace and compile caches hit), a new one otherwise; the newest `COMPILED_PROGRAMS` are kept."""
    key = (id(graphdef), model_config.model_dump_json(), max_tokens, temperature, top_k, top_p)
    with _compiled_lock:
        hit = _compiled.get(key)
        if hit is not None and hit[0] is graphdef:  # an id is only reused once its graph is gone
            _compiled.move_to_end(key)
            return hit[1]
        options = {"max_tokens": max_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p}
        program = jax.jit(partial(_generate, graphdef, model_config=model_config, **options))
        _compiled[key] = (graphdef, program)
        while len(_compiled) > COMPILED_PROGRAMS:
            _compiled.popitem(last=False)
        return program


def sample_run(run_dir: Path, options: SampleOptions) -> SampleOutput:
    """Sample from run `run_dir`'s newest (or `options.step`'s) checkpoint, with the dataset's tokenizer."""
    loaded = load_run_model(run_dir, options.step)
    return sample_loaded(loaded, loaded.cache.tokenizer(), options)


def sample_loaded(loaded: LoadedRun, tokenizer: Tokenizer, options: SampleOptions) -> SampleOutput:
    """Sample from a run's model already loaded (`load_run_model`) with its dataset's tokenizer.

    Raises:
        InvalidInputError: as `sample_tokens`, or `options.messages` with a tokenizer that has no chat template
            (or whose template refuses them).
    """
    if options.messages is not None:
        prompt, ids = chat_prompt(tokenizer, options.messages)
    else:
        prompt, ids = options.prompt, prompt_ids(tokenizer, options.prompt)
    out = sample_tokens(
        loaded.graphdef,
        loaded.params,
        loaded.model_config,
        ids,
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        top_k=options.top_k,
        top_p=options.top_p,
        seed=options.seed,
    )
    if options.messages is not None:  # the reply ends at its end of turn (or EOS); what follows is no part of it
        stops = {tokenizer.eos_id, reply_end_id(tokenizer)}
        out = out[: next((i for i, token in enumerate(out) if token in stops), len(out))]
    return SampleOutput(text=tokenizer.decode(out), prompt=prompt, tokens=out, step=loaded.step)


def prompt_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """The token ids sampling starts from: the prompt's; for an empty prompt the tokenizer's BOS token, or a
    newline when it has none (the model needs one token before it can draw the next)."""
    ids = tokenizer.encode_batch([prompt])[0]
    if ids:
        return ids
    return [tokenizer.bos_id] if tokenizer.bos_id is not None else tokenizer.encode_batch(["\n"])[0]


def chat_prompt(tokenizer: Tokenizer, messages: list[ChatMessage]) -> tuple[str, list[int]]:
    """The text and token ids a reply to `messages` starts from: the chat rendered with the tokenizer's template
    and its generation prompt (the ids of `encode_chat(messages, add_generation_prompt=True)`).

    Raises:
        InvalidInputError: the tokenizer has no chat template, or the template refuses these messages.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidInputError(
            f"argument 'messages': the run's tokenizer {tokenizer.name!r} has no chat template; tokenize the "
            "data with a Hugging Face tokenizer folder that has one (tokenize_dataset's tokenizer, format 'chat') "
            "and train on it, or sample with prompt"
        )
    chat = [message.model_dump() for message in messages]
    try:
        text = tokenizer.render_chat(chat, add_generation_prompt=True)
    except ChatTemplateError as error:  # the worker names an error's class, and the tools know InvalidInputError
        raise InvalidInputError(f"argument 'messages': {error}") from None
    return text, tokenizer.encode_batch([text])[0]  # what encode_chat gives, without rendering the chat again


def sample_job(**job: Any) -> None:
    """The entry of a sampling job: validates its keyword arguments as a `SampleJob`, samples, writes the result.

    Raises:
        ConfigError: an argument is missing or out of range (the message names it).
        InvalidInputError, NotFoundError: as `sample_tokens` and `load_run_model`.
    """
    request = parse_config(SampleJob, job, source="sample job")
    result = sample_run(Path(request.run_dir), request)
    write_sample(request, result.model_dump_json())
    print(result.prompt + result.text)  # the job's log shows what was sampled
