"""Chat and prompt_completion data: Hugging Face tokenizer folders with their chat templates, rendering as
transformers renders, the assistant-only loss mask, the mask in the token cache, and bad records."""

import itertools
import json
import pickle

import numpy as np
import pytest
from chat_models import CHATML, CHATML_SPECIALS, chat_tokenizer

from tradewind.cluster import LocalTaskRunner
from tradewind.core import InvalidInputError
from tradewind.data import (
    ByteTokenizer,
    HFTokenizer,
    TokenizeConfig,
    build_token_cache,
    load_tokenizer,
    open_token_cache,
    write_hf_tokenizer_files,
)
from tradewind.data.chat import assistant_spans, reply_end_id

# Meta-Llama-3-8B-Instruct's template.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
# Gemma's template: it refuses a system message.
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)
# ChatML with transformers' {% generation %} marks, so that transformers computes an assistant mask to compare.
CHATML_MARKED = (
    "{% for message in messages %}{{ '<|im_start|>' + message.role + '\\n' }}{% if message.role == 'assistant' %}"
    "{% generation %}{{ message.content + '<|im_end|>\\n' }}{% endgeneration %}{% else %}"
    "{{ message.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Drops the reasoning of every reply but the last, as reasoning models' templates do: not prefix-stable.
DROPS_REASONING = (
    "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}"
    "{{ '<|im_start|>assistant\\n' + m.content.split('</think>')[-1] + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<bos>",
    "<eos>",
    "<start_of_turn>",
    "<end_of_turn>",
]
# The tokens each template's model ends a turn with, and its EOS and BOS.
STYLES = {
    "chatml": (CHATML, "<|im_end|>\n", CHATML_SPECIALS),
    "llama3": (LLAMA3, "<|eot_id|>", {"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>"}),
}
CORPUS = [
    "Hello there, how are you doing today? I am fine, thank you very much.",
    "The quick brown fox jumps over the lazy dog; naïve café, 中文, emoji 🎉.",
    "  Leading spaces and\n\nblank lines\ttabs, then a question: what is 2 + 2?",
] * 20
CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "I am fine, thank you."}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": " 4 \n"},
        {"role": "user", "content": "And the quick brown fox?"},
        {"role": "assistant", "content": "It jumps over the lazy dog; naïve café 🎉."},
    ],
    [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "\n\nblank lines"},
        {"role": "assistant", "content": "\n\ttabs"},
        {"role": "user", "content": "no reply to this one"},
    ],
]


def raw_tokenizer():
    """A small byte-level BPE with every special token the templates here use."""
    return chat_tokenizer(CORPUS, vocab_size=420, specials=SPECIALS)


def save_hf_folder(folder, template, specials):
    """A tokenizer folder as transformers' `save_pretrained` writes it."""
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=raw_tokenizer(), **specials)
    fast.chat_template = template
    fast.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=sorted(STYLES))
def style(request, tmp_path_factory):
    """(folder, the end-of-turn text, the transformers tokenizer) of one template style."""
    transformers = pytest.importorskip("transformers")
    template, end_of_turn, specials = STYLES[request.param]
    folder = save_hf_folder(tmp_path_factory.mktemp(request.param), template, specials)
    return folder, end_of_turn, transformers.AutoTokenizer.from_pretrained(folder)


def numbered(count):
    """`count` different one-turn chats (identical records would all land in one split)."""
    return [
        {"messages": [{"role": "user", "content": f"question {i}?"}, {"role": "assistant", "content": f"answer {i}"}]}
        for i in range(count)
    ]


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def mask_runs(tokenizer, ids, mask):
    """The text of each run of consecutive masked tokens, special tokens kept."""
    runs, current = [], []
    for token, flag in zip(ids, mask, strict=True):
        if flag:
            current.append(int(token))
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer._tokenizer.decode(run, skip_special_tokens=False) for run in runs]


def test_render_chat_and_encode_chat_match_transformers_apply_chat_template(style):
    folder, _, reference = style
    tokenizer = load_tokenizer(str(folder))

    for messages in CONVERSATIONS:
        for generation_prompt in (False, True):
            text = tokenizer.render_chat(messages, add_generation_prompt=generation_prompt)
            ids = tokenizer.encode_chat(messages, add_generation_prompt=generation_prompt)
            expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
            expected_ids = reference.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=generation_prompt, return_dict=False
            )
            assert text == expected
            assert ids == list(expected_ids)


def test_a_folder_gives_the_chat_template_and_the_configs_eos_and_bos(style):
    folder, _, reference = style
    tokenizer = load_tokenizer(str(folder))
    alone = load_tokenizer(str(folder / "tokenizer.json"))

    assert isinstance(tokenizer, HFTokenizer) and tokenizer.name == str(folder)
    assert tokenizer.chat_template == reference.chat_template
    assert (tokenizer.eos_id, tokenizer.bos_id) == (reference.eos_token_id, reference.bos_token_id)
    assert alone.chat_template is None and alone.fingerprint != tokenizer.fingerprint
    restored = pickle.loads(pickle.dumps(tokenizer))
    assert restored.fingerprint == tokenizer.fingerprint
    assert restored.render_chat(CONVERSATIONS[1]) == tokenizer.render_chat(CONVERSATIONS[1])


def test_the_fingerprint_changes_with_the_chat_template_and_not_otherwise(tmp_path):
    first = save_hf_folder(tmp_path / "a", CHATML, STYLES["chatml"][2])
    same = save_hf_folder(tmp_path / "b", CHATML, STYLES["chatml"][2])
    other = save_hf_folder(tmp_path / "c", CHATML.replace("helpful", "useful"), STYLES["chatml"][2])

    assert load_tokenizer(str(first)).fingerprint == load_tokenizer(str(same)).fingerprint
    assert load_tokenizer(str(first)).fingerprint != load_tokenizer(str(other)).fingerprint


def test_a_legacy_config_key_and_added_token_objects_are_read_as_transformers_reads_them(tmp_path):
    transformers = pytest.importorskip("transformers")
    raw_tokenizer().save(str(tmp_path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": [{"name": "default", "template": LLAMA3}, {"name": "other", "template": CHATML}],
        "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "special": True},
        "eos_token": "<|endoftext|>",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    # Without added_tokens_decoder in the config, transformers reads this file over it.
    specials = {"eos_token": {"content": "<|eot_id|>", "lstrip": False, "rstrip": False, "special": True}}
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(specials))
    tokenizer = load_tokenizer(str(tmp_path))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path)

    assert tokenizer.chat_template == LLAMA3
    assert tokenizer.eos_id == reference.eos_token_id == tokenizer._tokenizer.token_to_id("<|eot_id|>")
    assert tokenizer.bos_id == reference.bos_token_id == tokenizer._tokenizer.token_to_id("<|begin_of_text|>")
    assert tokenizer.render_chat(CONVERSATIONS[1]) == reference.apply_chat_template(CONVERSATIONS[1], tokenize=False)


def test_an_export_keeps_the_chat_template_and_reloads_with_the_same_fingerprint(style, tmp_path):
    transformers = pytest.importorskip("transformers")
    folder, _, _ = style
    tokenizer = load_tokenizer(str(folder))

    write_hf_tokenizer_files(tokenizer, tmp_path)
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path)

    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"] == tokenizer.chat_template
    assert load_tokenizer(str(tmp_path)).fingerprint == tokenizer.fingerprint
    for messages in CONVERSATIONS:
        assert exported.apply_chat_template(messages, tokenize=False) == tokenizer.render_chat(messages)
    assert (exported.eos_token_id, exported.bos_token_id) == (tokenizer.eos_id, tokenizer.bos_id)


def test_an_export_of_a_folder_whose_config_sets_tokens_to_null_keeps_its_fingerprint(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    raw_tokenizer().save(str(source / "tokenizer.json"))
    config = {"chat_template": CHATML, "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (source / "tokenizer_config.json").write_text(json.dumps(config))  # as Qwen2.5's: BOS set to null
    tokenizer = load_tokenizer(str(source))

    (tmp_path / "out").mkdir()
    write_hf_tokenizer_files(tokenizer, tmp_path / "out")
    exported = load_tokenizer(str(tmp_path / "out"))

    assert tokenizer.bos_id is None and exported.bos_id is None
    assert exported.fingerprint == tokenizer.fingerprint and exported.chat_template == CHATML


def test_the_loss_mask_matches_transformers_assistant_mask_on_a_marked_template(tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = save_hf_folder(tmp_path / "tok", CHATML_MARKED, {"eos_token": "<|im_end|>"})
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in CONVERSATIONS])

    build_token_cache([path], tmp_path / "cache", load_tokenizer(str(folder)), format="chat", append_eos=False)
    cache = open_token_cache(tmp_path / "cache")
    found = {}
    for split in ("train", "val"):
        tokens, mask, starts = cache.tokens(split), cache.loss_mask(split), cache.document_starts(split)
        for start, end in itertools.pairwise(starts):
            found[tuple(np.asarray(tokens[start:end]).tolist())] = np.asarray(mask[start:end]).tolist()

    for messages in CONVERSATIONS:
        out = reference.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
        assert found[tuple(out["input_ids"])] == list(out["assistant_masks"])


def test_a_chat_cache_masks_exactly_the_assistant_turns_and_their_end_of_turn(style, tmp_path):
    folder, end_of_turn, reference = style
    tokenizer = load_tokenizer(str(folder))
    records = [
        [{"role": "user", "content": f"question {i}?"}, {"role": "assistant", "content": f"answer {i}, café"}]
        + ([{"role": "user", "content": "more"}, {"role": "assistant", "content": f"  second {i} 🎉"}] if i % 2 else [])
        for i in range(40)
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in records])

    manifest = build_token_cache(
        [path], tmp_path / "cache", tokenizer, TokenizeConfig(format="chat", val_fraction=0.25), shard_bytes=1500
    )
    cache = open_token_cache(tmp_path / "cache")
    cache.verify()

    assert manifest.loss_mask and manifest.format == "chat" and len(manifest.splits["train"].shards) > 1
    seen = 0
    for split in ("train", "val"):
        tokens, mask, starts = np.asarray(cache.tokens(split)), np.asarray(cache.loss_mask(split)), None
        starts = cache.document_starts(split)
        assert mask.dtype == np.uint8 and len(mask) == len(tokens) == starts[-1]
        assert starts[0] == 0 and len(starts) == manifest.splits[split].documents + 1
        assert int(mask.sum()) == manifest.splits[split].targets
        for start, end in itertools.pairwise(starts):
            ids, flags = tokens[start:end], mask[start:end]
            assert ids[-1] == tokenizer.eos_id and flags[-1] == 0  # the EOS after a record is no target
            question = reference.decode(ids.tolist()).split("question ")[1].split("?")[0]
            replies = [m["content"] for m in records[int(question)] if m["role"] == "assistant"]
            if end_of_turn == "<|eot_id|>":  # Llama 3's template trims the content
                replies = [reply.strip() for reply in replies]
            assert mask_runs(tokenizer, ids, flags) == [reply + end_of_turn for reply in replies]
            seen += 1
    assert seen == len(records)


def test_chat_caches_are_byte_identical_across_worker_counts(tmp_path):
    folder = save_hf_folder(tmp_path / "tok", CHATML, STYLES["chatml"][2])
    records = [{"messages": CONVERSATIONS[i % 3] + [{"role": "user", "content": str(i)}]} for i in range(60)]
    path = write_jsonl(tmp_path / "chat.jsonl", records)
    tokenizer = load_tokenizer(str(folder))

    one = build_token_cache([path], tmp_path / "one", tokenizer, format="chat", shard_bytes=3000)
    two = build_token_cache(
        [path], tmp_path / "two", tokenizer, format="chat", shard_bytes=3000, runner=LocalTaskRunner(workers=2)
    )

    assert one.splits == two.splits
    for part in sorted((tmp_path / "one" / "train").iterdir()):
        assert part.read_bytes() == (tmp_path / "two" / "train" / part.name).read_bytes()


def test_a_corrupted_or_missing_mask_file_fails_verification(tmp_path):
    folder = save_hf_folder(tmp_path / "tok", CHATML, STYLES["chatml"][2])
    path = write_jsonl(tmp_path / "chat.jsonl", numbered(30))
    build_token_cache([path], tmp_path / "cache", load_tokenizer(str(folder)), format="chat")
    cache = open_token_cache(tmp_path / "cache")
    [mask_path] = cache.mask_files("train")
    good = mask_path.read_bytes()

    flipped = bytearray(good)
    flipped[0] ^= 1
    mask_path.write_bytes(bytes(flipped))
    with pytest.raises(InvalidInputError, match=r"shard-00000\.mask\.bin: sha256"):
        cache.verify()
    mask_path.write_bytes(good[:-1])
    with pytest.raises(InvalidInputError, match=r"mask\.bin: \d+ bytes, the manifest says"):
        cache.verify()
    mask_path.unlink()
    with pytest.raises(InvalidInputError, match=r"mask\.bin: missing"):
        cache.verify()


def test_bad_chat_records_are_named_by_file_and_line_and_strict_fails_on_the_first(tmp_path):
    folder = save_hf_folder(tmp_path / "tok", CHATML, STYLES["chatml"][2])
    good = numbered(21)
    path = write_jsonl(
        tmp_path / "chat.jsonl",
        [
            good[0],
            {"messages": [{"role": "tool", "content": "42"}, {"role": "assistant", "content": "ok"}]},
            {"messages": [{"role": "user"}, {"role": "assistant", "content": "ok"}]},
            {"messages": [{"role": "user", "content": ["a", "list"]}, {"role": "assistant", "content": "ok"}]},
            {"text": "a document, not a chat"},
            {"messages": [{"role": "user", "content": "no reply"}]},
            "[1, 2]",
            "{not json",
            *good[1:],
        ],
    )
    tokenizer = load_tokenizer(str(folder))

    manifest = build_token_cache([path], tmp_path / "cache", tokenizer, format="chat")

    assert manifest.bad_records.skipped == 7 and manifest.bad_records.per_file == {str(path): 7}
    assert manifest.bad_records.examples == [
        f"{path}:2: message 0: unknown role 'tool' (expected system, user or assistant)",
        f"{path}:3: message 0 (user): missing content",
        f"{path}:4: message 0 (user): content is a JSON list, expected a string",
        f'{path}:5: missing field \'messages\' (a chat record is {{"messages": [{{"role", "content"}}, ...]}})',
        f"{path}:6: no assistant message: nothing to train on",
        f"{path}:7: a JSON list, expected an object",
        f"{path}:8: malformed JSON: Expecting property name enclosed in double quotes (column 2)",
    ]
    assert sum(s.documents for s in manifest.splits.values()) == 21
    with pytest.raises(InvalidInputError, match=rf"{path}:2: message 0: unknown role 'tool'"):
        build_token_cache([path], tmp_path / "strict", tokenizer, format="chat", strict=True)
    assert not (tmp_path / "strict").exists() and not (tmp_path / ".strict.partial").exists()


def test_a_template_that_raises_or_rewrites_earlier_turns_makes_a_bad_record(tmp_path):
    gemma = save_hf_folder(tmp_path / "gemma", GEMMA, {"bos_token": "<bos>", "eos_token": "<eos>"})
    dropping = save_hf_folder(tmp_path / "drops", DROPS_REASONING, {"eos_token": "<|im_end|>"})
    two_replies = [*CONVERSATIONS[0], {"role": "user", "content": "?"}, {"role": "assistant", "content": "!"}]
    reasoning = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "<think>hm</think>b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    path = write_jsonl(
        tmp_path / "chat.jsonl",
        [
            *numbered(10),
            {"messages": CONVERSATIONS[1]},
            {"messages": two_replies},
            *numbered(20)[10:],
            {"messages": reasoning},
        ],
    )

    raised = build_token_cache([path], tmp_path / "gemma-cache", load_tokenizer(str(gemma)), format="chat")
    rewritten = build_token_cache([path], tmp_path / "drops-cache", load_tokenizer(str(dropping)), format="chat")

    assert raised.bad_records.examples == [
        f"{path}:11: the chat template failed: TemplateError: System role not supported"
    ]
    assert rewritten.bad_records.examples == [
        f"{path}:23: the chat template is not prefix-stable at message 1: rendering later turns rewrites the "
        "reply's text, so the assistant turns cannot be located"
    ]


def test_prompt_completion_with_the_byte_tokenizer_trains_on_the_completion_and_eos(tmp_path):
    records = [{"prompt": f"Q{i}: 2+2=", "completion": f" {i}é"} for i in range(30)]
    bad = [{"prompt": "no completion"}, {"prompt": 3, "completion": "x"}, {"prompt": "p", "completion": "  "}]
    path = write_jsonl(tmp_path / "pc.jsonl", [*records, *bad])
    tokenizer = ByteTokenizer()

    manifest = build_token_cache(
        [path], tmp_path / "cache", tokenizer, TokenizeConfig(format="prompt_completion", prepend_bos=True)
    )
    cache = open_token_cache(tmp_path / "cache")
    cache.verify()

    assert manifest.loss_mask and manifest.bad_records.examples == [
        f'{path}:31: missing field \'completion\' (a prompt_completion record is {{"prompt": str, "completion": str}})',
        f"{path}:32: field 'prompt' is a JSON int, expected a string",
        f"{path}:33: empty completion: nothing to train on",
    ]
    documents = 0
    for split in ("train", "val"):
        tokens, mask, starts = cache.tokens(split), cache.loss_mask(split), cache.document_starts(split)
        for start, end in itertools.pairwise(starts):
            ids, flags = np.asarray(tokens[start:end]).tolist(), np.asarray(mask[start:end]).tolist()
            i = int(bytes(ids[2 : ids.index(ord(":"))]).decode())
            prompt, completion = (records[i][key].encode() for key in ("prompt", "completion"))
            assert ids == [tokenizer.bos_id, *prompt, *completion, tokenizer.eos_id]
            assert flags == [0] * (1 + len(prompt)) + [1] * (len(completion) + 1)
            documents += 1
    assert documents == 30
    targets = sum(len(record["completion"].encode()) + 1 for record in records)
    assert sum(stats.targets for stats in manifest.splits.values()) == targets


def test_chat_with_a_tokenizer_without_a_chat_template_is_refused_before_any_work(tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[0]}])
    raw_tokenizer().save(str(tmp_path / "tokenizer.json"))

    for tokenizer in (ByteTokenizer(), load_tokenizer(str(tmp_path / "tokenizer.json"))):
        with pytest.raises(InvalidInputError, match=rf"format 'chat'.*tokenizer '{tokenizer.name}' has none; pass"):
            build_token_cache([path], tmp_path / "cache", tokenizer, format="chat")
        assert not (tmp_path / "cache").exists() and not (tmp_path / ".cache.partial").exists()
    with pytest.raises(InvalidInputError, match="tokenizer 'byte' has no chat template"):
        ByteTokenizer().render_chat(CONVERSATIONS[0])
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}{{ m }"}))
    with pytest.raises(InvalidInputError, match=r"format 'chat': tokenizer '.*': the chat template is not valid Jinja"):
        build_token_cache([path], tmp_path / "cache", load_tokenizer(str(tmp_path)), format="chat")
    assert not (tmp_path / "cache").exists()


def test_render_chat_refuses_malformed_messages_by_name(tmp_path):
    tokenizer = load_tokenizer(str(save_hf_folder(tmp_path / "tok", CHATML, STYLES["chatml"][2])))

    with pytest.raises(InvalidInputError, match=r"messages: message 1: unknown role 'robot'"):
        tokenizer.render_chat([{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}])
    with pytest.raises(InvalidInputError, match="messages: 'messages' must be a non-empty list"):
        tokenizer.render_chat([])


def test_a_text_cache_has_no_loss_mask(corpus, tmp_path):
    build_token_cache([corpus], tmp_path / "cache", ByteTokenizer())
    cache = open_token_cache(tmp_path / "cache")

    assert cache.loss_mask("train") is None and not cache.manifest.loss_mask
    assert cache.manifest.splits["train"].targets is None
    assert not list((tmp_path / "cache" / "train").glob("*.mask.bin"))
    assert cache.document_starts("train")[-1] == len(cache.tokens("train"))


def test_a_reply_ends_with_the_token_its_template_writes_after_it_whatever_the_eos(style, tmp_path):
    folder, end_of_turn, theirs = style
    assert reply_end_id(load_tokenizer(str(folder))) == theirs.convert_tokens_to_ids(end_of_turn.strip())
    # A base model's tokenizer: its EOS ends documents, while its chat template ends a turn with <|im_end|>.
    base = load_tokenizer(str(save_hf_folder(tmp_path / "base", CHATML, {"eos_token": "<|endoftext|>"})))
    im_end = base.encode_with_offsets(["<|im_end|>"])[0][0]
    assert [reply_end_id(base)] == im_end and im_end != [base.eos_id]


# Qwen3's way: an (empty) thinking block written into the last reply only, so no rendering is a prefix of the next.
THINKS_IN_LAST_REPLY = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{% if m.role == 'assistant' and loop.last %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{{ m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_template_that_thinks_in_the_last_reply_only_still_masks_each_reply_and_its_end_of_turn(tmp_path):
    tokenizer = load_tokenizer(str(save_hf_folder(tmp_path / "thinks", THINKS_IN_LAST_REPLY, CHATML_SPECIALS)))
    chat = [*CONVERSATIONS[0], {"role": "user", "content": "again?"}, {"role": "assistant", "content": "Yes."}]
    text, spans = assistant_spans(tokenizer.render_chat, chat)
    assert text == tokenizer.render_chat(chat)
    # The last reply is the one a sampled reply continues: all the template writes for it is a target.
    last = "<think>\n\n</think>\n\nYes.<|im_end|>\n"
    assert [text[start:end] for start, end in spans] == ["I am fine, thank you.<|im_end|>\n", last]
