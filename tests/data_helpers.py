"""Inputs that several data test files share: a many-paragraph corpus for cache builds, and small text and
JSONL inputs for the readers, and `cache_files`, which compares two token caches byte for byte."""

import json
from pathlib import Path

# More than one tokenizer batch (1,000 documents), so batch boundaries are crossed.
PARAGRAPHS = [f"Paragraph {i}: {'é' * (i % 4)}{'word ' * (i % 7)}end." for i in range(2_500)]

TEXT = "First para,\nline two.\n\n\n   \nSecond para.\n\t\n\nThird\npara\n"
RECORDS = [{"meta": {"body": "alpha"}}, {"meta": {"body": "beta\ngamma"}}, {"meta": {"body": "   "}}]


def texts_and_lines(docs):
    return [(doc.text, doc.line) for doc in docs]


def write_jsonl(path, records, blank_line_after_first=True):
    lines = [json.dumps(r) for r in records]
    if blank_line_after_first:
        lines.insert(1, "")
    path.write_text("\n".join(lines) + "\n")
    return path


def cache_files(folder: Path) -> dict[str, bytes]:
    """Every file of a cache by relative path; the manifest without its creation time."""
    files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("created")
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files
