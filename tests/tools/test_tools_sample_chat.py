"""sample_text with messages: a chat rendered with the run's tokenizer's chat template and its generation prompt,
the reply cut before the tokenizer's EOS; through the Python API, MCP and the command line, and the refusals."""

import json
from pathlib import Path

import pydantic
import pytest
from chat_models import chat_tokenizer_folder
from mcp import Client
from mcp_helpers import call
from runs_helpers import finish

from tradewind.cli import main
from tradewind.cluster import JobStatus
from tradewind.core import InvalidInputError, PathEscapeError
from tradewind.data import load_tokenizer
from tradewind.runs.jobs import SampleOptions
from tradewind.server import build_server
from tradewind.tools import (
    ExportModelRequest,
    LaunchTrainingRequest,
    SampleTextRequest,
    TokenizeDatasetRequest,
    ToolContext,
    export_model,
    launch_training,
    sample_text,
    tokenize_dataset,
)

CHATS = [
    [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}] for i in range(8)
]
ASK = [{"role": "user", "content": "question 3"}]
# Greedy, and long enough that a model which learned the replies ends one with <|im_end|> well before the limit.
GREEDY = {"max_tokens": 24, "temperature": 0.0}


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory, tiny_run_settings):
    """A workspace whose run was trained on a chat dataset tokenized with `tok/` (a ChatML template), long enough
    to learn to end a reply: (the context, the run id, the tokenizer)."""
    ctx = ToolContext.open(tmp_path_factory.mktemp("chat") / "workspace")
    root = ctx.workspace.root
    (root / "settings.yaml").write_text("backend: local\n", encoding="utf-8")
    chat_tokenizer_folder(root / "tok", ["user question assistant answer 0 1 2 3 4 5 6 7"] * 10, vocab_size=300)
    (root / "chat.jsonl").write_text("".join(json.dumps({"messages": chat}) + "\n" for chat in CHATS * 50))
    info = tokenize_dataset(ctx, TokenizeDatasetRequest(input="chat.jsonl", tokenizer="tok", format="chat"))
    run = launch_training(ctx, LaunchTrainingRequest(dataset=info.dataset_id, steps=120, **tiny_run_settings))
    done = finish(ctx, run.run_id)
    assert done.status is JobStatus.SUCCEEDED, done.log_tail
    return ctx, run.run_id, load_tokenizer(str(root / "tok"))


@pytest.mark.slow
def test_messages_are_sampled_from_their_chat_prompt_and_the_reply_is_cut_before_the_eos(chat_run):
    from tradewind.trainer.restore import load_run_model
    from tradewind.trainer.sample import chat_prompt, sample_tokens

    ctx, run_id, tokenizer = chat_run
    result = sample_text(ctx, SampleTextRequest(run_id=run_id, messages=ASK, **GREEDY))

    rendered = tokenizer.render_chat(ASK, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n") and result.prompt == rendered
    text, ids = chat_prompt(tokenizer, SampleOptions(messages=ASK).messages)
    assert (text, ids) == (rendered, tokenizer.encode_chat(ASK, add_generation_prompt=True))
    # The same model continuing those ids, uncut: the worker's reply is what comes before its first EOS.
    loaded = load_run_model(ctx.workspace.run_dir(run_id), None)
    whole = sample_tokens(loaded.graphdef, loaded.params, loaded.model_config, ids, **GREEDY)
    saved = json.loads(Path(result.output_file).read_text(encoding="utf-8"))
    assert tokenizer.eos_id in whole, "the model never ended its reply: the cut is untested"
    assert saved["tokens"] == whole[: whole.index(tokenizer.eos_id)] and result.tokens == len(saved["tokens"])
    assert result.tokens < GREEDY["max_tokens"] and tokenizer.eos_id not in saved["tokens"]
    assert result.text == saved["text"] == tokenizer.decode(saved["tokens"]) and "<|im_end|>" not in result.text
    assert result.text.startswith("answer")  # it learned the replies
    log = Path(result.output_file).with_suffix(".log").read_text(encoding="utf-8")
    assert log == rendered + result.text + "\n"

    # A plain prompt on the same run is continued as before: max_tokens tokens, EOS or not.
    plain = sample_text(ctx, SampleTextRequest(run_id=run_id, prompt=rendered, **GREEDY))
    assert (plain.prompt, plain.tokens) == (rendered, GREEDY["max_tokens"])
    assert json.loads(Path(plain.output_file).read_text(encoding="utf-8"))["tokens"] == whole
    assert plain.text.startswith(result.text) and len(plain.text) > len(result.text)  # what the cut left out


@pytest.mark.slow
@pytest.mark.anyio
async def test_sample_text_with_messages_through_mcp(chat_run):
    ctx, run_id, tokenizer = chat_run
    async with Client(build_server(ctx)) as client:
        data = await call(client, "sample_text", {"run_id": run_id, "messages": ASK, **GREEDY})
        both = await client.call_tool("sample_text", {"run_id": run_id, "prompt": "x", "messages": ASK})
    assert data["prompt"] == tokenizer.render_chat(ASK, add_generation_prompt=True)
    assert 0 < data["tokens"] < GREEDY["max_tokens"] and "<|im_end|>" not in data["text"]
    assert both.is_error and "give prompt or messages, not both" in both.content[0].text


@pytest.mark.slow
def test_tradewind_sample_takes_messages_as_json_text_or_a_file(chat_run, capsys):
    ctx, run_id, tokenizer = chat_run
    root = ctx.workspace.root
    (root / "ask.json").write_text(json.dumps({"messages": ASK}))
    common = ["--workspace", str(root), "--max-tokens", "24", "--temperature", "0", "--json"]
    assert main(["sample", run_id, "--messages", json.dumps(ASK), *common]) == 0
    inline = json.loads(capsys.readouterr().out)
    assert main(["sample", run_id, "--messages", "ask.json", *common]) == 0
    from_file = json.loads(capsys.readouterr().out)

    assert inline["prompt"] == from_file["prompt"] == tokenizer.render_chat(ASK, add_generation_prompt=True)
    assert inline["text"] == from_file["text"] and inline["tokens"] < 24
    assert main(["sample", run_id, "--messages", "[{", "--workspace", str(root)]) == 2
    assert "argument 'messages': its text is not valid JSON" in capsys.readouterr().err


@pytest.mark.slow
def test_a_link_leading_out_of_the_tokenizer_folder_is_refused_before_the_worker_reads_it(chat_run, tmp_path):
    ctx, run_id, _ = chat_run
    outside = tmp_path / "chat_template.jinja"
    outside.write_text("{{ 'secret' }}", encoding="utf-8")
    (read,) = (ctx.workspace.root / "datasets").glob("*/tokenizer")  # the dataset's own copy of `tok/`
    link = read / "chat_template.jinja"
    link.symlink_to(outside)
    try:
        with pytest.raises(PathEscapeError, match="argument 'run_id'"):
            sample_text(ctx, SampleTextRequest(run_id=run_id, messages=ASK, **GREEDY))
        with pytest.raises(PathEscapeError, match="argument 'run_id'"):
            export_model(ctx, ExportModelRequest(run_id=run_id))
    finally:
        link.unlink()
    assert not (ctx.workspace.root / "exports").exists() or not any((ctx.workspace.root / "exports").iterdir())


@pytest.mark.slow
def test_messages_on_a_run_whose_tokenizer_has_no_chat_template_are_refused_naming_it(trained_ctx):
    with pytest.raises(
        InvalidInputError, match=r"argument 'messages': the run's tokenizer 'byte' has no chat template"
    ):
        sample_text(trained_ctx, SampleTextRequest(run_id="r1", messages=ASK, max_tokens=2))


def test_prompt_and_messages_together_are_refused_naming_both():
    with pytest.raises(pydantic.ValidationError, match="give prompt or messages, not both"):
        SampleTextRequest(run_id="r1", prompt="ROMEO:", messages=ASK)


def test_messages_are_bounded_in_number_role_and_content():
    long = [{"role": "user", "content": "x" * 6_000}, {"role": "assistant", "content": "y" * 4_001}]
    with pytest.raises(pydantic.ValidationError, match="10,001 characters of content in all; the limit is 10,000"):
        SampleOptions(messages=long)
    with pytest.raises(pydantic.ValidationError, match="at most 100 items"):
        SampleOptions(messages=ASK * 101)
    with pytest.raises(pydantic.ValidationError, match="at least 1 item"):
        SampleOptions(messages=[])
    with pytest.raises(pydantic.ValidationError, match="role"):
        SampleOptions(messages=[{"role": "tool", "content": "x"}])
    with pytest.raises(pydantic.ValidationError, match="name"):
        SampleOptions(messages=[{"role": "user", "content": "x", "name": "bob"}])
    assert SampleOptions(messages=[{"role": "user", "content": "two\nlines"}]).prompt == ""
