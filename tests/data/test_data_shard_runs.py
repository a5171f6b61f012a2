"""Running a cache build's shards: the progress they report rises to the total input size."""

from tradewind.data import ByteTokenizer, build_token_cache


def test_progress_rises_to_the_total_input_size(tmp_path, jsonl_corpus):
    calls = []

    build_token_cache(
        [jsonl_corpus], tmp_path / "cache", ByteTokenizer(), shard_bytes=20_000, progress=lambda d, t: calls.append(d)
    )

    assert calls == sorted(calls) and calls[-1] == jsonl_corpus.stat().st_size
