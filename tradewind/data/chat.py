"""Chat and prompt-completion examples: messages rendered with a tokenizer's own chat template, and the loss
mask that makes only the replies training targets.

A Hugging Face tokenizer folder carries a Jinja chat template (`chat_template` in `tokenizer_config.json`, or
`chat_template.jinja`). `ChatTemplate` renders it as `transformers`' `apply_chat_template` does: a sandboxed
Jinja environment with `trim_blocks` and `lstrip_blocks`, `raise_exception`, `strftime_now`, a `tojson` that
leaves HTML alone, and the variables `messages`, `add_generation_prompt`, `tools`, `documents` and the
tokenizer's named special tokens (`bos_token`, `eos_token`, ...). The text is then encoded without adding
special tokens, so the ids are `apply_chat_template(messages, tokenize=True)`'s.

The loss mask of a conversation marks each assistant turn: its text and the end-of-turn text the template
writes after it (`<|im_end|>\\n`, `<|eot_id|>`). Turn i's span is what rendering the messages through it adds
to rendering those before it with the generation prompt; every token whose characters overlap a span is a
target (as `return_assistant_tokens_mask` counts them). A template that rewrites earlier text as turns are
added (one that drops past reasoning, say) is not prefix-stable: its records are bad records.

Formats (JSONL, one example a line; see `ChatExamples`, `PromptCompletionExamples`):
    chat: `{"messages": [{"role": "system" | "user" | "assistant", "content": str}, ...]}`, at least one
        assistant turn; needs a tokenizer with a chat template.
    prompt_completion: `{"prompt": str, "completion": str}`; the tokens are the prompt's then the
        completion's, encoded apart, and the completion (with the EOS after it) is the target. Any tokenizer.

Example:
    tokenizer = load_tokenizer("models/Qwen2.5-0.5B-Instruct")
    text = tokenizer.render_chat([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    ids = tokenizer.encode_chat([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import numpy as np

from tradewind.core import InvalidInputError
from tradewind.data.bad_records import RecordError

ROLES = ("system", "user", "assistant")
# transformers fills `thinking` and `reasoning_content` from whichever of these a message has.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
Messages = Sequence[Mapping[str, Any]]


class ChatTokenizer(Protocol):
    """What this module asks of a tokenizer. `tokenizers.HFTokenizer` is one (that module imports this one, so the
    protocol is declared here); a shard's wrapper of a tokenizer that reports progress has the two encodes, and a
    prompt_completion record needs only `encode_batch`, which every `Tokenizer` has."""

    def render_chat(self, messages: Messages, add_generation_prompt: bool = False) -> str:
        """`messages` rendered with the tokenizer's chat template."""
        ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        ...

    def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Each text's ids and each id's character span in the text."""
        ...


class ChatTemplateError(InvalidInputError):
    """A chat template failed on some messages (it raised, or is not prefix-stable)."""


class ChatTemplate:
    """A Jinja chat template with the special tokens it renders with; compiled once per process.

    Args:
        source: the template text.
        special_tokens: the named special tokens (`bos_token`, `eos_token`, ...) as template variables.
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str]):
        self.source = source
        self.special_tokens = dict(special_tokens)

    def compile(self) -> Any:
        """The compiled template (a `jinja2.Template`).

        Raises:
            ChatTemplateError: the template is not valid Jinja.
        """
        return _compile(self.source)

    def render(self, messages: Messages, add_generation_prompt: bool = False) -> str:
        """`messages` rendered as `apply_chat_template(messages, tokenize=False)` renders them.

        Raises:
            ChatTemplateError: the template raised (its own `raise_exception` or an error in its code).
        """
        template = self.compile()
        try:
            return template.render(
                messages=_template_messages(messages),
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except Exception as error:  # a template is code: any error in it is the template's
            raise ChatTemplateError(f"the chat template failed: {type(error).__name__}: {error}") from None


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    """`source` compiled as transformers compiles a chat template (jinja2 is imported here, on first use: the
    server imports this layer, and renders no chat until asked)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`, which templates made for transformers' assistant mask wrap
        replies in; rendered as its body (the mask here does not need it)."""

        tags = {"generation"}  # noqa: RUF012 - jinja's Extension API declares tags as a class attribute

        def parse(self, parser: Any) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """Jinja's `namespace` without underscore attributes, which could reach Python internals (as transformers)."""

        def __init__(*args: Any, **kwargs: Any):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template may not set the attribute {name!r}")

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    environment.globals["dict"] = _Dict()
    environment.globals["namespace"] = Namespace
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ChatTemplateError(f"the chat template is not valid Jinja: {error} (line {error.lineno})") from None


class _Dict:
    """Jinja's `dict` without access to the type itself (as transformers)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict:
        return dict.fromkeys(*args)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys=False):
    # Jinja's own tojson escapes HTML characters, which transformers' does not.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _template_messages(messages: Messages) -> list[dict[str, Any]]:
    """The messages as transformers hands them to a template: keys whose value is null dropped, and reasoning
    under both names templates read."""
    out = []
    for message in messages:
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def message_problem(messages: Any) -> str | None:
    """Why `messages` is not a conversation to render, or None: a non-empty list of objects, each with a role
    (system, user or assistant) and a string content."""
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list of {role, content} objects"
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"message {index} is a JSON {type(message).__name__}, expected an object with role and content"
        role = message.get("role")
        if role not in ROLES:
            return f"message {index}: unknown role {role!r} (expected system, user or assistant)"
        content = message.get("content")
        if content is None:
            return f"message {index} ({role}): missing content"
        if not isinstance(content, str):
            return f"message {index} ({role}): content is a JSON {type(content).__name__}, expected a string"
    return None


def reply_end_id(tokenizer: ChatTokenizer) -> int | None:
    """The token that ends a reply in `tokenizer`'s chat template: the first of what it writes after a reply's
    text (ChatML's `<|im_end|>`, Llama 3's `<|eot_id|>`, or EOS itself), which a chat fine-tune learns to emit;
    None when the template writes nothing there. A base model's EOS (`<|endoftext|>`) is often another token.

    Raises:
        ChatTemplateError: the template refuses a one-turn chat.
    """
    messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "ok"}]
    text, spans = assistant_spans(tokenizer.render_chat, messages)
    start, end = spans[0]
    after = text[start:end].split("ok", 1)[-1]  # what follows the reply's text within its turn
    ids = tokenizer.encode_with_offsets([after])[0][0] if after else []
    return ids[0] if ids else None


def assistant_spans(render: Callable[[Messages, bool], str], messages: Messages) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each assistant turn in it (its text and the
    end-of-turn text after it).

    A turn's span is what rendering the conversation through it adds to rendering the turns before it with the
    generation prompt. A template that renders a turn differently once later turns follow (Qwen3's writes a
    thinking block into the last reply only) is not prefix-stable; there the span is the reply's text and its
    end of turn, found in the whole rendering after the text the two renderings share.

    Args:
        render: `render(messages, add_generation_prompt)`, e.g. `HFTokenizer.render_chat`.
        messages: a valid conversation (`message_problem` is None).

    Raises:
        ChatTemplateError: the template failed, or rewrites a reply's own text (drops past reasoning), so that the
            reply cannot be located.
    """
    text = render(messages, False)
    spans: list[tuple[int, int]] = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(messages[:index], True)
        through = render(messages[: index + 1], False)
        if through.startswith(before) and text.startswith(through):
            span = (len(before), len(through))
        else:
            span = _found_reply(text, before, through, message["content"])
        if span is None or (spans and span[0] < spans[-1][1]):
            raise ChatTemplateError(
                f"the chat template is not prefix-stable at message {index}: rendering later turns rewrites the "
                "reply's text, so the assistant turns cannot be located"
            )
        if span[1] > span[0]:
            spans.append(span)
    return text, spans


def _found_reply(text: str, before: str, through: str, content: str) -> tuple[int, int] | None:
    """Where a reply (`content` and the end of turn that follows it in `through`) sits in `text`, searched from
    where `text` stops agreeing with `before` (the conversation up to the reply); None if it is not there."""
    if content not in through:
        return None
    reply = content + through[through.rindex(content) + len(content) :]
    shared = next(
        (i for i, (a, b) in enumerate(zip(before, text, strict=False)) if a != b), min(len(before), len(text))
    )
    start = text.find(reply, shared)
    return None if start < 0 else (start, start + len(reply))


def target_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """uint8, one per token: 1 where the token's characters `[start, end)` overlap a span (the tokens of a reply,
    as transformers' `return_assistant_tokens_mask` marks them), else 0."""
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    mask = np.zeros(len(bounds), dtype=np.uint8)
    for start, end in spans:
        mask[(bounds[:, 0] < end) & (bounds[:, 1] > start)] = 1
    return mask


@dataclass(frozen=True)
class Example:
    """One record of a chat or prompt_completion file, checked and ready to encode.

    Attributes:
        texts: what to encode: the rendered conversation (chat), or the prompt and the completion.
        spans: chat: the assistant turns' character spans in `texts[0]`; prompt_completion: none.
        key: the bytes the train/val split hashes: the record's content, whatever the template makes of it.
    """

    texts: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]
    key: bytes

    @property
    def text_bytes(self) -> int:
        """UTF-8 bytes of the text the tokens encode."""
        return sum(len(text.encode("utf-8")) for text in self.texts)


class ChatExamples:
    """`chat` records: rendered with `tokenizer`'s chat template, masked to the assistant turns.

    Args:
        tokenizer: the tokenizer itself, with its chat template (a shard encodes through a wrapper of it that
            reports progress).

    A reply a template rewrites once later turns follow (dropping its past reasoning) cannot be located: such a
    record is a bad record, named with its file and line (`assistant_spans`).
    """

    eos_target = False  # the template's end-of-turn text ends each reply; an EOS after the record is no reply

    def __init__(self, tokenizer: ChatTokenizer):
        self.tokenizer = tokenizer

    def prepare(self, record: dict[str, Any]) -> Example:
        """The example of one JSONL record.

        Raises:
            RecordError: no `messages`, a bad message, no assistant turn, or the template failed on it.
        """
        if "messages" not in record:
            raise RecordError('missing field \'messages\' (a chat record is {"messages": [{"role", "content"}, ...]})')
        messages = record["messages"]
        problem = message_problem(messages)
        if problem is None and not any(message["role"] == "assistant" for message in messages):
            problem = "no assistant message: nothing to train on"
        if problem is not None:
            raise RecordError(problem)
        try:
            text, spans = assistant_spans(self.tokenizer.render_chat, messages)
        except ChatTemplateError as error:
            raise RecordError(str(error)) from None
        key = json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")
        return Example(texts=(text,), spans=tuple(spans), key=key)

    def encode(self, examples: Sequence[Example], tokenizer: ChatTokenizer) -> list[tuple[list[int], np.ndarray]]:
        """The ids and loss mask of each example, from one pass of `tokenizer` (an `HFTokenizer`, or the build's
        wrapper of it that reports progress) that gives each id's character span too."""
        encoded = tokenizer.encode_with_offsets([example.texts[0] for example in examples])
        return [
            (list(ids), target_mask(offsets, example.spans))
            for example, (ids, offsets) in zip(examples, encoded, strict=True)
        ]


class PromptCompletionExamples:
    """`prompt_completion` records: the prompt's tokens then the completion's, the completion the target."""

    eos_target = True  # ending the completion is part of what is learned

    def prepare(self, record: dict[str, Any]) -> Example:
        """The example of one JSONL record.

        Raises:
            RecordError: a missing or non-string `prompt` or `completion`, or an empty completion.
        """
        for field in ("prompt", "completion"):
            if field not in record:
                raise RecordError(
                    f'missing field {field!r} (a prompt_completion record is {{"prompt": str, "completion": str}})'
                )
            if not isinstance(record[field], str):
                raise RecordError(f"field {field!r} is a JSON {type(record[field]).__name__}, expected a string")
        prompt, completion = record["prompt"], record["completion"]
        if not completion.strip():
            raise RecordError("empty completion: nothing to train on")
        key = json.dumps([prompt, completion], ensure_ascii=False).encode("utf-8")
        return Example(texts=(prompt, completion), spans=(), key=key)

    def encode(self, examples: Sequence[Example], tokenizer: ChatTokenizer) -> list[tuple[list[int], np.ndarray]]:
        """The ids and loss mask of each example: 0 over the prompt, 1 over the completion."""
        ids = tokenizer.encode_batch([text for example in examples for text in example.texts])
        out = []
        for prompt, completion in zip(ids[0::2], ids[1::2], strict=True):
            mask = np.concatenate([np.zeros(len(prompt), np.uint8), np.ones(len(completion), np.uint8)])
            out.append(([*prompt, *completion], mask))
        return out
