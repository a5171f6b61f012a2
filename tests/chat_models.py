"""A small chat model for the fine-tuning tests: a byte-level BPE tokenizer with Qwen2.5's chat template and a
random Qwen2 model, saved together in one folder as `transformers` saves them (no network), and a synthetic chat
task that a random model cannot do: answer every request in one fixed format."""

import json
from pathlib import Path

import pytest
from hf_models import transformers_folder
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

# Qwen2.5's template (its tool-call branches cut), as in the model's tokenizer_config.json.
CHATML = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {{- '# Tools\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' }}{{- tool | tojson }}
    {%- endfor %}
    {{- '\\n</tools><|im_end|>\\n' }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# ChatML without a default system turn: what the smaller tests render.
SIMPLE_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_SPECIALS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
CHATML_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# The task: whatever the request's wording, the reply is the requested word in one fixed format.
WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "maple",
    "tiger",
    "lemon",
    "comet",
    "piano",
    "violet",
    "ember",
    "harbor",
    "falcon",
    "meadow",
    "copper",
]
REQUESTS = ["Say {}.", "Please say {}.", "Repeat the word {}.", "Echo {}!", "Give me {}."]
REPLY = "<answer>{}</answer>"
REPLY_PATTERN = r"<answer>([a-z]+)</answer>"


def format_task() -> list[dict]:
    """Every request for every word, with its reply, as `messages` records."""
    return [
        {
            "messages": [
                {"role": "user", "content": request.format(word)},
                {"role": "assistant", "content": REPLY.format(word)},
            ]
        }
        for word in WORDS
        for request in REQUESTS
    ]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def chat_tokenizer(corpus: list[str], vocab_size: int = 400, specials: list[str] = CHATML_TOKENS) -> RawTokenizer:
    """A byte-level BPE trained on `corpus`, with `specials` (ChatML's special tokens)."""
    tokenizer = RawTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def chat_tokenizer_folder(folder, corpus: list[str], vocab_size: int) -> Path:
    """A tokenizer folder as a chat model ships it, written without transformers: `tokenizer.json` (a BPE trained
    on `corpus`) and a `tokenizer_config.json` with a ChatML template whose EOS is the end of a turn."""
    folder.mkdir()
    chat_tokenizer(corpus, vocab_size).save(str(folder / "tokenizer.json"))
    config = {"chat_template": SIMPLE_CHATML, **CHATML_SPECIALS}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def qwen_chat_folder(folder, records: list[dict], **shape) -> int:
    """Save a tokenizer trained on `records`' texts (with Qwen2.5's chat template) and a random Qwen2 model of
    `shape` (config.json keys) for its vocabulary into `folder`, as `save_pretrained` writes them; its vocabulary
    size."""
    transformers = pytest.importorskip("transformers")
    corpus = [message["content"] for record in records for message in record["messages"]] * 4
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=chat_tokenizer(corpus), **CHATML_SPECIALS)
    fast.chat_template = CHATML
    fast.save_pretrained(folder)
    config = {
        "model_type": "qwen2",
        "vocab_size": len(fast),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
        **shape,
    }
    transformers_folder(folder, config)
    return len(fast)
