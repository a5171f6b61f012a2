"""Sampling: the key/value cache reproduces the full forward pass, the filters keep what they promise, and a chat's
prompt is its template's rendering (sampling with messages end to end: tests/tools/test_tools_sample_chat.py)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import models, pre_tokenizers

from tradewind.cluster.entry import load_callable
from tradewind.core import ConfigError, InvalidInputError
from tradewind.data import HFTokenizer, load_tokenizer
from tradewind.runs import model_config
from tradewind.runs.jobs import SAMPLE_CALLABLE, SampleOptions
from tradewind.trainer import build_model
from tradewind.trainer.models import init_cache
from tradewind.trainer.sample import chat_prompt, filter_logits, sample_job, sample_tokens

# Each architecture, and the Llama family's own head width and grouped key/value heads (as Qwen3 has them).
FAMILY_SHAPE = {"n_kv_heads": 2, "d_head": 16}


@pytest.mark.parametrize(
    ("model_type", "shape"),
    [("llama", {}), ("gpt2", {}), ("mistral", FAMILY_SHAPE), ("qwen2", FAMILY_SHAPE), ("qwen3", FAMILY_SHAPE)],
)
def test_decoding_token_by_token_with_the_cache_gives_the_full_forward_logits(model_type, shape):
    config = model_config(type=model_type, vocab_size=50, d_model=32, n_layers=2, n_heads=4, max_seq_len=16, **shape)
    model = build_model(config, rngs=nnx.Rngs(0))
    forward = nnx.jit(lambda m, t, c: m(t, c))
    tokens = jax.random.randint(jax.random.key(1), (2, 10), 0, 50)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)
    cache = init_cache(config, batch=2, max_len=16)
    prefill, cache = forward(model, tokens[:, :6], cache)
    steps = [prefill]
    for i in range(6, 10):
        logits, cache = forward(model, tokens[:, i : i + 1], cache)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5)
    assert int(cache["index"]) == 10


def test_greedy_sampling_follows_the_argmax_of_the_full_forward_pass():
    config = model_config(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)
    model = build_model(config, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    out = sample_tokens(graphdef, params, config, [3, 1, 4], max_tokens=6, temperature=0.0)
    # Causal: the logits at position i ignore what follows, so one padded length serves every step.
    forward = nnx.jit(lambda m, t: m(t))
    sequence = [3, 1, 4]
    for _ in range(6):
        padded = jnp.asarray([sequence + [0] * (9 - len(sequence))])
        sequence.append(int(jnp.argmax(forward(model, padded)[0, len(sequence) - 1])))
    assert out == sequence[3:]


def test_top_k_and_top_p_leave_only_the_most_likely_tokens():
    logits = jnp.log(jnp.asarray([0.5, 0.3, 0.15, 0.05]))
    assert np.isfinite(filter_logits(logits, 1.0, top_k=2, top_p=1.0)).tolist() == [True, True, False, False]
    assert np.isfinite(filter_logits(logits, 1.0, top_k=0, top_p=0.7)).tolist() == [True, True, False, False]
    assert np.isfinite(filter_logits(logits, 1.0, top_k=0, top_p=0.45)).tolist() == [True, False, False, False]
    np.testing.assert_allclose(filter_logits(logits, 2.0, 0, 1.0), logits / 2)


def test_a_prompt_plus_max_tokens_beyond_the_context_is_refused():
    config = model_config(vocab_size=50, d_model=32, n_layers=1, n_heads=4, max_seq_len=8)
    graphdef, params = nnx.split(build_model(config, rngs=nnx.Rngs(0)))
    with pytest.raises(InvalidInputError, match="max_seq_len"):
        sample_tokens(graphdef, params, config, [1, 2, 3], max_tokens=6)


def test_a_sampling_job_with_a_bad_or_missing_argument_names_it(tmp_path):
    assert load_callable(SAMPLE_CALLABLE) is sample_job
    out = str(tmp_path / "out.json")
    with pytest.raises(ConfigError, match="sample job: temperature: Input should be less than or equal to 5"):
        sample_job(run_dir=str(tmp_path), output_file=out, temperature=9)
    with pytest.raises(ConfigError, match="sample job: run_dir: Field required"):
        sample_job(output_file=out)
    assert not (tmp_path / "out.json").exists()


def test_a_chat_prompt_is_its_rendering_with_the_generation_prompt_and_needs_a_template(tmp_path):
    # A template that refuses a system message, as Gemma's does.
    template = (
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    tokenizer = RawTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.add_tokens(list(pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|im_end|>"}))
    chat = HFTokenizer.from_folder(tmp_path)
    messages = [{"role": "user", "content": "Hi\nthere"}]

    text, ids = chat_prompt(chat, SampleOptions(messages=messages).messages)
    assert text == "<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n"
    assert ids == chat.encode_chat(messages, add_generation_prompt=True) == chat.encode_batch([text])[0]
    # The worker sends an error back by its class's name: a template's refusal must be an InvalidInputError.
    with pytest.raises(InvalidInputError, match=r"argument 'messages': the chat template failed.*System role") as error:
        chat_prompt(chat, SampleOptions(messages=[{"role": "system", "content": "x"}]).messages)
    assert type(error.value) is InvalidInputError
    with pytest.raises(InvalidInputError, match="the run's tokenizer 'byte' has no chat template; tokenize the data"):
        chat_prompt(load_tokenizer("byte"), SampleOptions(messages=messages).messages)
