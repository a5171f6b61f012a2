"""tokenize_dataset and inspect_dataset over chat and prompt_completion data: a Hugging Face tokenizer folder in
the workspace as the tokenizer, the cache's format and loss-target counts in the results, and the refusals."""

import json

import numpy as np
import pytest
from chat_models import SIMPLE_CHATML, chat_tokenizer_folder

from tradewind.core import InvalidInputError, PathEscapeError
from tradewind.data import open_token_cache
from tradewind.tools import InspectDatasetRequest, TokenizeDatasetRequest, inspect_dataset, tokenize_dataset


@pytest.fixture
def chat_files(workspace):
    root = workspace.workspace.root
    chat_tokenizer_folder(root / "tok", ["question and answer, user and assistant"] * 10, vocab_size=320)
    chats = [
        {"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
        for i in range(40)
    ]
    (root / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in [*chats, {"messages": []}]))
    pairs = [{"prompt": f"question {i} ", "completion": f"answer {i}"} for i in range(40)]
    (root / "pc.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return workspace


def test_tokenize_dataset_builds_a_chat_cache_with_an_hf_folder_and_says_how_many_tokens_are_targets(chat_files):
    calls = []
    info = tokenize_dataset(
        chat_files,
        TokenizeDatasetRequest(input="chat.jsonl", tokenizer="tok", format="chat"),
        lambda done, total, message: calls.append((done, total, message)),
    )
    report = inspect_dataset(chat_files, InspectDatasetRequest(dataset_id=info.dataset_id, samples=1))

    cache = open_token_cache(info.path)
    masks = {split: int(np.asarray(cache.loss_mask(split)).sum()) for split in ("train", "val")}
    assert info.format == report.format == "chat" and info.targets == report.targets == masks
    assert 0 < masks["train"] < info.tokens["train"]
    assert info.tokenizer == str(chat_files.workspace.root / "tok") and info.bad_records.skipped == 1
    assert info.bad_records.examples[0].endswith(
        "chat.jsonl:41: 'messages' must be a non-empty list of {role, content} objects"
    )
    assert calls and calls[-1][0] == calls[-1][1]
    again = tokenize_dataset(chat_files, TokenizeDatasetRequest(input="chat.jsonl", tokenizer="tok", format="chat"))
    assert again.reused and again.targets == info.targets


def test_prompt_completion_works_with_the_byte_tokenizer_and_text_caches_report_no_targets(chat_files):
    info = tokenize_dataset(chat_files, TokenizeDatasetRequest(input="pc.jsonl", format="prompt_completion"))
    text = tokenize_dataset(chat_files, TokenizeDatasetRequest(input="corpus.txt"))

    completions = sum(len(f"answer {i}") + 1 for i in range(40))  # the completion's bytes and EOS
    assert info.format == "prompt_completion" and sum(info.targets.values()) == completions
    assert (text.format, text.targets) == ("auto", None)
    assert inspect_dataset(chat_files, InspectDatasetRequest(dataset_id=text.dataset_id, samples=0)).targets is None


def test_chat_with_a_tokenizer_without_a_template_is_refused_before_any_work(chat_files):
    with pytest.raises(
        InvalidInputError, match=r"format 'chat'.*tokenizer 'byte' has none; pass as tokenizer a Hugging"
    ):
        tokenize_dataset(chat_files, TokenizeDatasetRequest(input="chat.jsonl", format="chat"))

    datasets = chat_files.workspace.datasets_dir
    assert not datasets.exists() or not [p for p in datasets.iterdir() if not p.name.endswith(".lock")]


def test_a_tokenizer_folder_with_a_file_linking_outside_is_refused(chat_files, tmp_path):
    root = chat_files.workspace.root
    outside = tmp_path / "chat_template.jinja"
    outside.write_text(SIMPLE_CHATML)
    (root / "tok" / "chat_template.jinja").symlink_to(outside)

    with pytest.raises(PathEscapeError, match="argument 'tokenizer'"):
        tokenize_dataset(chat_files, TokenizeDatasetRequest(input="chat.jsonl", tokenizer="tok", format="chat"))
