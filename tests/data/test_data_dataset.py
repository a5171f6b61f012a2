import functools
import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard

from tradewind.cluster import get_task_runner
from tradewind.core import InvalidInputError
from tradewind.data import Dataset, read_documents


def has_even_id(record):
    return record["id"] % 2 == 0


def shout(record):
    return {**record, "text": record["text"].upper()}


def split_words(record):
    return [{"id": record["id"], "text": word} for word in record["text"].split()]


def tag(record, label):
    return {**record, "label": label}


@pytest.fixture
def inputs(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for shard in range(3):
        rows = [{"id": shard * 100 + i, "text": f"doc {shard} {i}"} for i in range(10)]
        (folder / f"s{shard}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_map_filter_flat_map_and_take_compose_per_shard_in_order(inputs):
    dataset = Dataset.from_files(inputs).filter(has_even_id).map(shout).flat_map(split_words).take(4)

    records = list(dataset)

    expected = []
    for shard in range(3):  # per shard: ids 0 and 2 pass the filter, each gives 3 words; take keeps 4
        first, second = shard * 100, shard * 100 + 2
        expected += [(first, "DOC"), (first, str(shard)), (first, "0"), (second, "DOC")]
    assert [(r["id"], r["text"]) for r in records] == expected


def test_shard_selects_every_count_th_input_file(inputs):
    ids = [r["id"] for r in Dataset.from_files(inputs).shard(1, 2)]

    assert ids == list(range(100, 110))
    with pytest.raises(InvalidInputError, match="index must be in"):
        Dataset.from_files(inputs).shard(2, 2)


@pytest.mark.parametrize(("compression", "opener"), [("none", open), ("gz", gzip.open), ("zst", zstandard.open)])
def test_write_jsonl_writes_one_readable_file_per_shard(inputs, tmp_path, compression, opener):
    result = Dataset.from_files(inputs).filter(has_even_id).write_jsonl(tmp_path / "out", compression=compression)

    suffix = ".jsonl" if compression == "none" else f".jsonl.{compression}"
    assert result.files == [str(tmp_path / "out" / f"part-0000{i}{suffix}") for i in range(3)]
    assert result.records == [5, 5, 5]
    with opener(result.files[1], "rt") as f:
        assert [json.loads(line)["id"] for line in f] == [100, 102, 104, 106, 108]
    assert [d.text for d in read_documents(tmp_path / "out")][:2] == ["doc 0 0", "doc 0 2"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"part-0000{i}{suffix}" for i in range(3)]


def test_write_parquet_round_trips_records_and_reads_back_as_documents(inputs, tmp_path):
    result = Dataset.from_files(inputs).map(shout).write_parquet(tmp_path / "pq")

    table = pq.read_table(result.files[2])
    assert table.column_names == ["id", "text"] and table.column("id").to_pylist() == list(range(200, 210))
    assert [d.text for d in read_documents(tmp_path / "pq")][:3] == ["DOC 0 0", "DOC 0 1", "DOC 0 2"]


def test_worker_processes_give_the_same_files_as_one_process(inputs, tmp_path):
    pipeline = Dataset.from_files(inputs).filter(has_even_id).map(functools.partial(tag, label="x"))

    one = pipeline.write_jsonl(tmp_path / "one", compression="gz")
    two = pipeline.write_jsonl(tmp_path / "two", compression="gz", runner=get_task_runner(workers=2))

    assert two.records == one.records == [5, 5, 5]
    for a, b in zip(one.files, two.files, strict=True):
        assert Path(a).read_bytes() == Path(b).read_bytes()


def test_bad_records_are_counted_in_the_write_result_or_fail_under_strict(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "ok"}\nnot json\n[1, 2]\n{"text": "fine"}\n')

    result = Dataset.from_files(path).write_jsonl(tmp_path / "out")

    assert result.records == [2] and result.bad_records.skipped == 2
    assert result.bad_records.examples[1] == f"{path}:3: a JSON list, expected an object"
    with pytest.raises(InvalidInputError, match=r"in\.jsonl:2: malformed JSON"):
        Dataset.from_files(path, strict=True).write_jsonl(tmp_path / "strict")


def test_a_file_that_is_not_parquet_is_a_bad_record_and_leaves_no_partial_output(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"this is not parquet")

    result = Dataset.from_files(path).write_jsonl(tmp_path / "out")

    assert result.records == [0] and result.bad_records.skipped == 1
    assert result.bad_records.examples[0].startswith(f"{path}:1: not a readable Parquet file")
    with pytest.raises(InvalidInputError, match=r"broken\.parquet:1: not a readable Parquet file"):
        Dataset.from_files(path, strict=True).write_jsonl(tmp_path / "strict")
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "strict").rglob("*"))


def test_iterating_a_dataset_warns_of_skipped_records(tmp_path, caplog):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "ok"}\nnot json\n')

    assert list(Dataset.from_files(path)) == [{"text": "ok"}]
    assert f"skipped 1 bad records: {path}:2: malformed JSON" in caplog.text


def test_text_files_give_one_text_record_per_paragraph(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one\ntwo\n\nthree\n")

    assert list(Dataset.from_files(path)) == [{"text": "one\ntwo"}, {"text": "three"}]
