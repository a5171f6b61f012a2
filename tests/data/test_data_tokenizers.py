import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from tradewind.core import InvalidInputError, NotFoundError
from tradewind.data import ByteTokenizer, HFTokenizer, load_tokenizer, write_hf_tokenizer_files

CORPUS = [
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer",
    "The slings and arrows of outrageous fortune,",
    "Or to take arms against a sea of troubles",
] * 5


def train_bpe(path, special_tokens):
    tokenizer = RawTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.save(str(path))
    return path


@given(st.text())
def test_byte_tokenizer_round_trips_any_text_through_utf8_bytes(text):
    tokenizer = ByteTokenizer()

    [ids] = tokenizer.encode_batch([text])

    assert bytes(ids) == text.encode("utf-8")
    assert tokenizer.decode(ids) == text


def test_byte_tokenizer_decode_drops_specials_and_replaces_invalid_utf8():
    tokenizer = ByteTokenizer()

    assert tokenizer.decode([tokenizer.bos_id, 104, 105, tokenizer.eos_id, 0xFF]) == "hi\ufffd"
    assert (tokenizer.vocab_size, tokenizer.eos_id, tokenizer.bos_id, tokenizer.name) == (258, 256, 257, "byte")


def test_load_tokenizer_byte_gives_the_byte_tokenizer():
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)


def test_hf_tokenizer_trained_locally_round_trips_without_adding_special_tokens(tmp_path):
    path = train_bpe(tmp_path / "tokenizer.json", ["<|endoftext|>"])

    from_folder = load_tokenizer(str(tmp_path))
    from_file = load_tokenizer(str(path))
    [ids] = from_folder.encode_batch([CORPUS[0]])

    assert isinstance(from_folder, HFTokenizer)
    assert from_folder.decode(ids) == CORPUS[0]
    assert from_file.encode_batch([CORPUS[0]]) == [ids]
    assert len(ids) < len(CORPUS[0].encode())  # merges were learned, so it is not a byte tokenizer
    assert from_folder.eos_id == 0 and from_folder.eos_id not in ids
    assert from_folder.fingerprint == from_file.fingerprint
    other_eos = load_tokenizer(str(path), eos_token=from_folder._tokenizer.id_to_token(1))
    assert other_eos.eos_id == 1 and other_eos.fingerprint != from_folder.fingerprint
    assert from_folder.name == str(path)
    assert max(ids) < from_folder.vocab_size


def test_hf_tokenizer_without_a_known_eos_token_asks_for_eos_token(tmp_path):
    path = train_bpe(tmp_path / "tokenizer.json", ["<end>"])

    with pytest.raises(InvalidInputError, match=r"tokenizer.json: .*pass eos_token"):
        load_tokenizer(str(path))
    assert HFTokenizer(path, eos_token="<end>").eos_id == 0


def test_hf_tokenizer_refuses_an_eos_token_missing_from_the_vocabulary(tmp_path):
    path = train_bpe(tmp_path / "tokenizer.json", ["<|endoftext|>"])

    with pytest.raises(InvalidInputError, match="'<nope>' is not in"):
        HFTokenizer(path, eos_token="<nope>")


def test_load_tokenizer_raises_not_found_naming_a_missing_path(tmp_path):
    with pytest.raises(NotFoundError, match="missing-dir"):
        load_tokenizer(str(tmp_path / "missing-dir"))


def test_load_tokenizer_refuses_a_file_that_is_not_a_tokenizer(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text("{}")

    with pytest.raises(InvalidInputError, match=r"not a valid tokenizer\.json"):
        load_tokenizer(str(path))


def test_train_bpe_tokenizer_writes_a_loadable_byte_level_tokenizer_with_explicit_specials(tmp_path):
    from tradewind.data import train_bpe_tokenizer

    trained = train_bpe_tokenizer(CORPUS, 300, tmp_path / "tok" / "tokenizer.json")
    loaded = load_tokenizer(str(tmp_path / "tok"))

    assert loaded.fingerprint == trained.fingerprint
    assert loaded.vocab_size == 300 and (loaded.eos_id, loaded.bos_id) == (0, 1)
    text = "Whether 'tis nobler — ünïcode never seen in training"
    ids = loaded.encode_batch([text])[0]
    assert loaded.decode(ids) == text and 0 not in ids and 1 not in ids
    assert len(loaded.encode_batch([CORPUS[0]])[0]) < len(CORPUS[0].encode()) * 0.6  # merges were learned


def test_training_on_files_is_deterministic_and_reads_jsonl_fields(tmp_path):
    import json

    from tradewind.data import train_tokenizer

    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"body": line}) + "\n" for line in CORPUS))
    calls = []
    one = train_tokenizer([path], tmp_path / "one.json", 280, text_field="body", progress=lambda d, t: calls.append(d))
    two = train_tokenizer([tmp_path / "*.jsonl"], tmp_path / "two.json", 280, text_field="body")

    assert one.fingerprint == two.fingerprint and one.vocab_size == 280
    assert calls[-1] == path.stat().st_size


def test_a_vocabulary_too_small_for_the_bytes_is_refused(tmp_path):
    from tradewind.data import train_bpe_tokenizer

    with pytest.raises(InvalidInputError, match="vocab_size must be at least 258"):
        train_bpe_tokenizer(CORPUS, 100, tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


def test_a_pickled_hf_tokenizer_encodes_the_same_and_is_rebuilt_once_per_process(tmp_path):
    import pickle

    tokenizer = HFTokenizer(train_bpe(tmp_path / "t.json", ["<|endoftext|>"]))
    data = pickle.dumps(tokenizer)

    first, second = pickle.loads(data), pickle.loads(data)

    assert first is second and first.fingerprint == tokenizer.fingerprint and first.eos_id == tokenizer.eos_id
    assert first.encode_batch(CORPUS[:2]) == tokenizer.encode_batch(CORPUS[:2])


@pytest.fixture(scope="module")
def byte_hf_files(tmp_path_factory):
    """The byte tokenizer written as Hugging Face tokenizer files."""
    directory = tmp_path_factory.mktemp("byte-hf")
    write_hf_tokenizer_files(ByteTokenizer(), directory, model_max_length=64)
    return directory


def read_hf_files(directory):
    """The `tokenizers` tokenizer of `directory`, set up as its tokenizer_config.json says, and that config."""
    config = json.loads((directory / "tokenizer_config.json").read_text())
    tokenizer = RawTokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.encode_special_tokens = config["split_special_tokens"]
    return tokenizer, config


@given(st.text())
@example("plain ASCII, with punctuation: don't stop .")
@example("é, naïve café")
@example("emoji 🎉🚀 and CJK 中文字符")
@example("  two spaces\n\nblank line\ttab \r\n trailing ")
@example("a document may mention <|endoftext|> or <|begin_of_text|> as text")
def test_byte_tokenizer_hf_files_encode_any_text_to_its_bytes_and_decode_it_back(byte_hf_files, text):
    tokenizer, _ = read_hf_files(byte_hf_files)

    ids = tokenizer.encode(text, add_special_tokens=False).ids

    assert ids == ByteTokenizer().encode_batch([text])[0]
    assert tokenizer.decode(ids) == text


def test_byte_tokenizer_hf_files_name_its_eos_and_bos_with_their_ids(byte_hf_files):
    tokenizer, config = read_hf_files(byte_hf_files)
    specials = json.loads((byte_hf_files / "special_tokens_map.json").read_text())

    assert tokenizer.token_to_id(config["eos_token"]) == ByteTokenizer.eos_id == 256
    assert tokenizer.token_to_id(config["bos_token"]) == ByteTokenizer.bos_id == 257
    assert specials == {"eos_token": config["eos_token"], "bos_token": config["bos_token"]}
    assert tokenizer.get_vocab_size() == ByteTokenizer.vocab_size and config["model_max_length"] == 64
    assert tokenizer.decode([104, 256, 105, 257]) == "hi"


def test_hf_tokenizer_files_copy_its_tokenizer_json_so_it_reloads_with_the_same_fingerprint(tmp_path):
    path = train_bpe(tmp_path / "tokenizer.json", ["<|endoftext|>", "<|begin_of_text|>"])
    original = HFTokenizer(path)
    out = tmp_path / "out"
    out.mkdir()

    write_hf_tokenizer_files(original, out)
    tokenizer, config = read_hf_files(out)

    assert (out / "tokenizer.json").read_bytes() == path.read_bytes()
    assert load_tokenizer(str(out)).fingerprint == original.fingerprint
    assert (config["eos_token"], config["bos_token"]) == ("<|endoftext|>", "<|begin_of_text|>")
    assert tokenizer.encode(CORPUS[1], add_special_tokens=False).ids == original.encode_batch([CORPUS[1]])[0]
    assert "model_max_length" not in config
