from tradewind.core import append_jsonl, atomic_write_json, read_json, read_jsonl, tail_lines


def test_atomic_json_round_trip_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "sub" / "state.json"
    atomic_write_json(path, {"a": 1})
    atomic_write_json(path, {"a": 2})
    assert read_json(path) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]


def test_jsonl_reader_skips_a_half_written_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    append_jsonl(path, {"step": 1})
    append_jsonl(path, {"step": 2})
    with open(path, "a") as f:
        f.write('{"step": 3, "lo')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    assert read_jsonl(tmp_path / "absent.jsonl") == []


def test_tail_lines_returns_the_last_lines(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail_lines(path, 3) == ["line 97", "line 98", "line 99"]
    assert tail_lines(tmp_path / "absent.txt", 3) == []
