"""tokenize_dataset and train_tokenizer: reusing a cache, globs and skipped records, inputs confined to the
workspace, the dataset id, and every TokenizeConfig field as a tool argument."""

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer

from tradewind.cli import main
from tradewind.core import InvalidInputError, PathEscapeError
from tradewind.data import TokenizeConfig, cache_id, load_tokenizer, open_token_cache, source_files
from tradewind.server.adapter import as_mcp_tool
from tradewind.tools import TokenizeDatasetRequest, TrainTokenizerRequest, tokenize_dataset, train_tokenizer


def test_tokenize_dataset_reuses_the_cache_for_the_same_inputs_tokenizer_and_options(workspace):
    calls = []
    first = tokenize_dataset(
        workspace, TokenizeDatasetRequest(input="corpus.txt"), lambda d, t, m: calls.append((d, t, m))
    )
    again = tokenize_dataset(workspace, TokenizeDatasetRequest(input="corpus.txt", workers=2))
    other = tokenize_dataset(workspace, TokenizeDatasetRequest(input="corpus.txt", val_fraction=0.2))

    assert (first.reused, again.reused, other.reused) == (False, True, False)
    assert first.dataset_id == again.dataset_id != other.dataset_id
    assert first.documents["train"] + first.documents["val"] == 600 and first.shards == 1
    assert calls[-1] == (calls[-1][1], calls[-1][1], "input bytes tokenized")


def test_tokenize_dataset_reads_a_glob_of_jsonl_and_reports_skipped_records(workspace):
    info = tokenize_dataset(workspace, TokenizeDatasetRequest(input="jsonl/*.jsonl", text_field="meta.body", workers=2))

    root = workspace.workspace.root
    assert info.documents["train"] + info.documents["val"] == 400 and info.shards == 2
    assert info.bad_records.skipped == 2
    assert info.bad_records.per_file == {str(root / "jsonl" / "p0.jsonl"): 1, str(root / "jsonl" / "p1.jsonl"): 1}
    assert info.bad_records.examples[0].startswith(f"{root / 'jsonl' / 'p0.jsonl'}:6: malformed JSON")
    with pytest.raises(InvalidInputError, match=r"p0\.jsonl:6: malformed JSON"):
        tokenize_dataset(workspace, TokenizeDatasetRequest(input="jsonl/*.jsonl", text_field="meta.body", strict=True))


def test_a_glob_may_not_climb_out_of_the_workspace(workspace):
    with pytest.raises(PathEscapeError, match="argument 'input'"):
        tokenize_dataset(workspace, TokenizeDatasetRequest(input="../../*.txt"))
    with pytest.raises(InvalidInputError, match=r"may not contain '\.\.'"):
        tokenize_dataset(workspace, TokenizeDatasetRequest(input="jsonl/*/../../../x"))


def test_train_tokenizer_then_tokenize_with_it_records_its_fingerprint_and_bos(workspace):
    trained = train_tokenizer(workspace, TrainTokenizerRequest(input="corpus.txt", vocab_size=400))
    again = train_tokenizer(workspace, TrainTokenizerRequest(input="corpus.txt", vocab_size=400))
    info = tokenize_dataset(
        workspace, TokenizeDatasetRequest(input="corpus.txt", tokenizer=trained.tokenizer, prepend_bos=True)
    )

    assert (trained.reused, again.reused) == (False, True) and trained.tokenizer == again.tokenizer
    assert trained.vocab_size == 400 and (trained.eos_id, trained.bos_id) == (0, 1)
    manifest = open_token_cache(info.path).manifest
    assert manifest.tokenizer.fingerprint == trained.fingerprint and manifest.prepend_bos is True
    assert info.vocab_size == 400 and info.dtype == "uint16"
    byte_tokens = tokenize_dataset(workspace, TokenizeDatasetRequest(input="corpus.txt")).tokens["train"]
    assert info.tokens["train"] < byte_tokens * 0.7  # merges shorten the stream even at 400 tokens


def test_the_dataset_id_is_the_cache_id_of_the_files_the_tokenizer_and_the_tokenize_config(workspace):
    request = TokenizeDatasetRequest(input="corpus.txt", val_fraction=0.2, prepend_bos=True, workers=1)
    info = tokenize_dataset(workspace, request)

    sources = source_files([workspace.workspace.root / "corpus.txt"])
    config = TokenizeConfig(val_fraction=0.2, prepend_bos=True)
    assert info.dataset_id == cache_id(sources, load_tokenizer("byte"), config)


@pytest.mark.anyio
async def test_every_tokenize_config_field_is_a_tool_argument_and_a_cli_option(workspace, capsys):
    server = MCPServer(name="dataset-tools")
    server.add_tool(as_mcp_tool(tokenize_dataset, workspace), name="tokenize_dataset", structured_output=True)
    async with Client(server) as client:
        (tool,) = (await client.list_tools()).tools
    with pytest.raises(SystemExit):
        main(["tokenize", "--help"])
    shown = capsys.readouterr().out

    assert set(TokenizeConfig.model_fields) <= set(tool.input_schema["properties"])
    for name in TokenizeConfig.model_fields:
        option = "--" + name.replace("_", "-")
        assert option in shown or "--no-" + option[2:] in shown, name


@pytest.mark.parametrize("argument", ["linked", "linked/*.txt"])
def test_a_folder_or_glob_that_reaches_outside_through_a_symlink_is_refused(workspace, tmp_path, argument):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret paragraph\n")
    folder = workspace.workspace.root / "linked"
    folder.mkdir()
    (folder / "fine.txt").write_text("a paragraph\n")
    (folder / "leak.txt").symlink_to(outside)

    with pytest.raises(PathEscapeError, match="symlink that leads outside"):
        tokenize_dataset(workspace, TokenizeDatasetRequest(input=argument))
