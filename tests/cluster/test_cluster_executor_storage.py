"""Step outputs kept in a bucket: hosts that share no disk share finished steps, against real servers on loopback
(see bucket_servers)."""

import json
from pathlib import Path

from tradewind.cli import main
from tradewind.cluster import Executor, Step
from tradewind.cluster.executor import META_FILES
from tradewind.core.buckets import MARKER, download_folder, is_complete, join_url, remote_fs


def write_outputs(out, config, inputs):
    """Log the call, then write a text built from the inputs and a nested binary file."""
    with open(config["calls"], "a") as f:
        f.write(f"{out.name}\n")
    text = "".join((path / "out.txt").read_text() for path in inputs.values())
    (out / "out.txt").write_text(text + config["word"])
    (out / "nested").mkdir()
    (out / "nested" / "bytes.bin").write_bytes(bytes(range(256)) * 8)


def write_host(out, config, inputs):
    """Write which host made the output, so that a copy says whose it is."""
    (out / "host.txt").write_text(str(out.parent))


def pipeline(tmp_path, word="b"):
    calls = str(tmp_path / "calls.txt")
    first = Step("first", write_outputs, {"calls": calls, "word": "a"})
    return first, Step("second", write_outputs, {"calls": calls, "word": word}, deps=(first,))


def calls(tmp_path) -> list[str]:
    return (tmp_path / "calls.txt").read_text().splitlines()


def output_files(folder) -> dict[str, bytes]:
    """The files a step wrote, without the executor's status and lease."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in Path(folder).rglob("*")
        if p.is_file() and p.name not in META_FILES
    }


def bucket_files(url) -> set[str]:
    fs, path = remote_fs(url)
    fs.invalidate_cache(path)
    return {name.removeprefix(f"{path}/") for name in fs.find(path)}


def test_a_host_sharing_no_disk_takes_finished_steps_from_the_bucket_without_running_them(bucket, tmp_path):
    host_a = Executor(tmp_path / "a" / "steps", storage=bucket)
    host_b = Executor(tmp_path / "b" / "steps", storage=bucket)
    first, second = pipeline(tmp_path)
    assert [r.action for r in host_a.run([second])] == ["run", "run"]
    urls = [join_url(bucket, "steps", host_a.output_path(step).name) for step in (first, second)]
    assert all(is_complete(url) for url in urls)

    plan = host_b.plan([second])
    assert [(p.name, p.action, p.url) for p in plan] == [("first", "cached", urls[0]), ("second", "cached", urls[1])]
    third = Step("third", write_outputs, {"calls": str(tmp_path / "calls.txt"), "word": "c"}, deps=(second,))
    done = host_b.run([third])
    assert [(r.name, r.action) for r in done] == [("first", "cached"), ("second", "cached"), ("third", "run")]
    assert calls(tmp_path) == [host_a.output_path(step).name for step in (first, second, third)]
    for step in (first, second):
        assert output_files(host_b.output_path(step)) == output_files(host_a.output_path(step))
        assert host_b.read_status(step)["status"] == "SUCCEEDED"
    # The third step read its input from the folder the second step was downloaded to.
    assert (host_b.output_path(third) / "out.txt").read_text() == "abc"
    assert [r.action for r in host_b.run([third])] == ["cached"] * 3


def test_a_copy_cut_off_before_its_marker_is_not_trusted_and_the_next_host_runs_the_step_and_completes_it(
    bucket, tmp_path
):
    host_a = Executor(tmp_path / "a" / "steps", storage=bucket)
    host_b = Executor(tmp_path / "b" / "steps", storage=bucket)
    first, _ = pipeline(tmp_path)
    url = join_url(bucket, "steps", host_a.output_path(first).name)
    Executor(tmp_path / "a" / "steps").run([first])
    fs, path = remote_fs(url)
    fs.pipe_file(f"{path}/out.txt", b"half")  # a copy cut off after its first file: no marker

    assert [(p.action, p.url) for p in host_b.plan([first])] == [("run", url)]
    assert [r.action for r in host_b.run([first])] == ["run"]
    assert len(calls(tmp_path)) == 2
    assert is_complete(url)
    copy = download_folder(url, tmp_path / "copy")
    assert output_files(copy) == output_files(host_b.output_path(first))


def test_a_step_finished_before_storage_was_set_is_published_without_the_executors_files(bucket, tmp_path):
    first, second = pipeline(tmp_path)
    Executor(tmp_path / "steps").run([second])
    executor = Executor(tmp_path / "steps", storage=bucket)
    urls = [join_url(bucket, "steps", executor.output_path(step).name) for step in (first, second)]
    assert not any(is_complete(url) for url in urls)

    done = executor.run([second])
    assert [(r.action, r.url) for r in done] == [("cached", urls[0]), ("cached", urls[1])]
    assert len(calls(tmp_path)) == 2
    assert bucket_files(urls[1]) == {"out.txt", "nested/bytes.bin", MARKER}
    copy = download_folder(urls[1], tmp_path / "copy")
    assert output_files(copy) == output_files(executor.output_path(second))


def test_the_first_complete_copy_is_kept_when_a_second_host_finishes_the_same_step(bucket, tmp_path):
    step = Step("host", write_host, {})
    # Names of different lengths: a copy resumed over files of the same size would not send them again.
    host_a = Executor(tmp_path / "first" / "steps", storage=bucket)
    host_b = Executor(tmp_path / "second" / "steps", storage=bucket)
    Executor(tmp_path / "second" / "steps").run([step])  # it computed the step too, before it had storage
    host_a.run([step])
    [done] = host_b.run([step])
    assert done.action == "cached"
    copy = download_folder(done.url, tmp_path / "copy")
    assert (copy / "host.txt").read_text() == str(tmp_path / "first" / "steps")


def test_the_pipeline_command_with_storage_publishes_every_step(bucket, tmp_path, capsys):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "pipe.py").write_text(
        "from tradewind.cluster import Step\n"
        "def write(out, cfg, inputs):\n    (out / 'out.txt').write_text(cfg['word'])\n"
        "steps = [Step('only', write, {'word': 'hello'})]\n"
    )
    command = ["cluster", "pipeline", "pipe.py", "--run", "--storage", bucket, "--workspace", str(workspace)]
    assert main(command) == 0
    [step] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert step["action"] == "run" and step["url"] == join_url(bucket, "steps", Path(step["output_path"]).name)
    assert (download_folder(step["url"], tmp_path / "copy") / "out.txt").read_text() == "hello"
