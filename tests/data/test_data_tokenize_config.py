"""What a token cache is made from: the listed input files with size and time, and the tokenize options."""

import os

import pytest
from pydantic import ValidationError

from tradewind.core import InvalidInputError, NotFoundError
from tradewind.data.tokenize_config import TokenizeConfig, source_files


def test_a_folder_and_a_glob_list_their_files_with_size_and_modification_time(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("alpha\n", encoding="utf-8")
    (folder / "b.txt").write_text("beta beta\n", encoding="utf-8")
    os.utime(folder / "a.txt", (1_700_000_000, 1_700_000_000))
    sources = source_files([str(folder)])
    by_name = {os.path.basename(source.path): source for source in sources}
    assert set(by_name) == {"a.txt", "b.txt"}
    assert by_name["a.txt"].size == 6 and by_name["b.txt"].size == 10
    assert by_name["a.txt"].mtime == pytest.approx(1_700_000_000)
    assert [s.path for s in source_files([str(folder / "*.txt")])] == [s.path for s in sources]


def test_a_listing_passed_back_in_is_kept_as_it_is_even_if_the_file_changed(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one\n", encoding="utf-8")
    (listed,) = source_files([path])
    path.write_text("changed, and longer\n", encoding="utf-8")
    assert source_files([listed]) == [listed]
    assert source_files([path])[0].size != listed.size


def test_no_inputs_are_refused():
    with pytest.raises(InvalidInputError, match="no inputs given"):
        source_files([])


def test_an_input_that_matches_nothing_is_not_found(tmp_path):
    with pytest.raises(NotFoundError):
        source_files([str(tmp_path / "missing-*.txt")])


def test_the_tokenize_options_default_to_auto_format_text_field_eos_only_and_32k_fixed_val_tokens():
    assert TokenizeConfig().model_dump() == {
        "format": "auto",
        "text_field": "text",
        "val_fraction": 0.1,
        "strict": False,
        "prepend_bos": False,
        "append_eos": True,
        "val_tokens": 32_768,
    }


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"val_fraction": 0.0}, "val_fraction"), ({"val_fraction": 1.0}, "val_fraction"), ({"fromat": "jsonl"}, "fromat")],
)
def test_a_val_fraction_outside_zero_to_one_or_an_unknown_option_is_refused(fields, field):
    with pytest.raises(ValidationError, match=field):
        TokenizeConfig(**fields)
