"""The bad-record policy: count and keep the first few in the default policy, raise on the first when strict."""

import pytest

from tradewind.core import InvalidInputError
from tradewind.data.bad_records import MAX_EXAMPLES, BadRecords


def test_bad_records_are_counted_per_file_and_the_first_ones_kept_as_file_line_reason():
    bad = BadRecords()
    bad.add("a.jsonl", 7, "malformed JSON")
    bad.add("b.jsonl", 2, "no 'text' field")
    bad.add("a.jsonl", 9, "invalid UTF-8")
    assert bad.skipped == 3
    assert bad.per_file == {"a.jsonl": 2, "b.jsonl": 1}
    assert bad.examples == ["a.jsonl:7: malformed JSON", "b.jsonl:2: no 'text' field", "a.jsonl:9: invalid UTF-8"]


def test_only_the_first_examples_are_kept_but_every_record_is_counted():
    bad = BadRecords()
    for line in range(1, MAX_EXAMPLES + 6):
        bad.add("big.jsonl", line, "malformed JSON")
    assert bad.skipped == MAX_EXAMPLES + 5 == bad.per_file["big.jsonl"]
    assert bad.examples == [f"big.jsonl:{line}: malformed JSON" for line in range(1, MAX_EXAMPLES + 1)]


def test_strict_raises_on_the_first_bad_record_naming_it_and_counts_nothing():
    bad = BadRecords(strict=True)
    with pytest.raises(InvalidInputError, match=r"^corpus/a\.jsonl:3: malformed JSON$"):
        bad.add("corpus/a.jsonl", 3, "malformed JSON")
    assert (bad.skipped, bad.per_file, bad.examples) == (0, {}, [])


def test_merge_adds_counts_per_file_and_keeps_at_most_the_example_limit():
    first, second = BadRecords(), BadRecords()
    for line in range(MAX_EXAMPLES - 2):
        first.add("a.txt", line, "empty")
    for line in range(5):
        second.add("a.txt", 100 + line, "truncated")
        second.add("b.txt", line, "truncated")
    first.merge(second)
    assert first.skipped == MAX_EXAMPLES - 2 + 10
    assert first.per_file == {"a.txt": MAX_EXAMPLES - 2 + 5, "b.txt": 5}
    assert len(first.examples) == MAX_EXAMPLES
    assert first.examples[-2:] == second.examples[:2]


def test_the_policy_flag_is_not_part_of_the_reported_counts():
    bad = BadRecords(strict=False)
    bad.add("a.txt", 1, "empty")
    assert bad.model_dump() == {"skipped": 1, "per_file": {"a.txt": 1}, "examples": ["a.txt:1: empty"]}
