"""The bad-record policy: skip and count malformed input records, or fail on the first one.

A bad record is a malformed JSON line, a missing or non-string text field, a line of invalid UTF-8, an
empty or truncated compressed file, or a chat or prompt_completion record that makes no example (an unknown
role, missing content, a chat template that fails on it; see `chat.py`). Readers hand each one to a
`BadRecords` collector: in the default policy it counts them per file and keeps the first few as
`file:line: reason`; with `strict=True` it raises `InvalidInputError("file:line: reason")` instead. Nothing
is ever dropped without being counted.

Example:
    bad = BadRecords()
    docs = list(read_documents("corpus/", bad_records=bad))
    print(bad.skipped, bad.examples)        # 2 ['corpus/a.jsonl:7: malformed JSON: ...', ...]
"""

from __future__ import annotations

import pydantic

from tradewind.core import InvalidInputError

MAX_EXAMPLES = 10


class RecordError(Exception):
    """A record is bad for the reason in the message; whoever read it hands that to `BadRecords.add` with the
    record's file and line (`readers.read_file_examples` does)."""


class BadRecords(pydantic.BaseModel):
    """Bad records seen so far: a count per file and the first few as `file:line: reason`.

    Attributes:
        strict: raise on the first bad record instead of counting it.
        skipped: bad records skipped in all files.
        per_file: bad records skipped, by file.
        examples: the first `MAX_EXAMPLES`, each `file:line: reason`.
    """

    strict: bool = pydantic.Field(default=False, exclude=True)
    skipped: int = 0
    per_file: dict[str, int] = pydantic.Field(default_factory=dict)
    examples: list[str] = pydantic.Field(default_factory=list)

    def add(self, file: str, line: int, reason: str) -> None:
        """Record one bad record at `file:line`.

        Raises:
            InvalidInputError: `strict` is set; the message is `file:line: reason`.
        """
        message = f"{file}:{line}: {reason}"
        if self.strict:
            raise InvalidInputError(message)
        self.skipped += 1
        self.per_file[file] = self.per_file.get(file, 0) + 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(message)

    def merge(self, other: BadRecords) -> None:
        """Add the counts and examples of `other` (another shard's, say) to these."""
        self.skipped += other.skipped
        for file, count in other.per_file.items():
            self.per_file[file] = self.per_file.get(file, 0) + count
        self.examples.extend(other.examples[: MAX_EXAMPLES - len(self.examples)])
