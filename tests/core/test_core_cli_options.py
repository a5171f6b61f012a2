"""Command-line options generated from pydantic models: names, types, choices, flags, defaults left to the model."""

import argparse
from typing import Literal

import pydantic
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tradewind.core.cli_options import add_model_options, model_from_args


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="What to read.")
    split: Literal["train", "val"] = Field(default="train", description="Which split.")
    val_fraction: float = Field(default=0.1, gt=0, lt=1, description="Share held out, e.g. 10%.")
    workers: int | None = Field(default=None, ge=1, description="Processes.")
    strict: bool = Field(default=False, description="Fail on bad records.")
    append_eos: bool = Field(default=True, description="End documents with EOS.")


def parser_for(model=Request, **how) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="test")
    add_model_options(parser, model, positional=("path",), **how)
    return parser


def test_options_parse_to_the_model_with_their_types_and_only_the_given_fields_set():
    args = parser_for().parse_args(["in.txt", "--split", "val", "--val-fraction", "0.25", "--workers", "3"])
    request = model_from_args(Request, args)

    assert request == Request(path="in.txt", split="val", val_fraction=0.25, workers=3)
    assert request.model_fields_set == {"path", "split", "val_fraction", "workers"}


def test_a_bool_is_a_flag_that_turns_its_default_around_and_an_alias_sets_the_same_field():
    parser = parser_for(aliases={"--no-eos": "append_eos"})

    assert model_from_args(Request, parser.parse_args(["x"])) == Request(path="x")
    flipped = model_from_args(Request, parser.parse_args(["x", "--strict", "--no-append-eos"]))
    assert (flipped.strict, flipped.append_eos) == (True, False)
    assert model_from_args(Request, parser.parse_args(["x", "--no-eos"])).append_eos is False


def test_help_shows_descriptions_defaults_and_choices(capsys):
    with pytest.raises(SystemExit):
        parser_for().parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())

    assert "--split {train,val} Which split. (default: train)" in shown
    assert "Share held out, e.g. 10%. (default: 0.1)" in shown
    assert "--no-append-eos End documents with EOS. (on by default; this option turns it off)" in shown


def test_a_choice_outside_the_literal_is_refused_by_argparse_and_a_range_by_the_model(capsys):
    with pytest.raises(SystemExit):
        parser_for().parse_args(["x", "--split", "test"])
    assert "invalid choice: 'test'" in capsys.readouterr().err
    with pytest.raises(pydantic.ValidationError, match="val_fraction"):
        model_from_args(Request, parser_for().parse_args(["x", "--val-fraction", "1.5"]))


def test_a_field_that_cannot_be_typed_on_a_command_line_is_a_type_error():
    class Nested(BaseModel):
        names: list[str] = Field(default_factory=list)

    with pytest.raises(TypeError, match=r"Nested\.names"):
        add_model_options(argparse.ArgumentParser(), Nested)
