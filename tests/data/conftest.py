"""Data fixtures: the cache-build corpus (`data_helpers.PARAGRAPHS`) as a plain-text and as a JSONL file."""

import json
from pathlib import Path

import pytest
from data_helpers import PARAGRAPHS


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "inputs" / "corpus.txt"
    path.parent.mkdir()
    path.write_text("\n\n".join(PARAGRAPHS) + "\n")
    return path


@pytest.fixture
def jsonl_corpus(tmp_path) -> Path:
    path = tmp_path / "inputs" / "corpus.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(json.dumps({"text": p}) + "\n" for p in PARAGRAPHS))
    return path
