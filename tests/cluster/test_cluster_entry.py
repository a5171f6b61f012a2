"""The entry of a callable job: it imports `pkg.module:function`, calls it, and exits 0, or 1 with the error."""

import json
import subprocess
from pathlib import Path

import pytest

from tradewind.cluster import JobSpec, JobStatus
from tradewind.cluster.entry import load_callable
from tradewind.cluster.forkserver import FORK_SERVER_ENV
from tradewind.core import read_json


def test_load_callable_follows_a_dotted_attribute_path_after_the_module():
    assert load_callable("json:dumps") is json.dumps
    assert load_callable("tradewind.cluster:JobSpec.model_validate") == JobSpec.model_validate


def test_load_callable_of_a_missing_attribute_or_module_raises_the_import_error():
    with pytest.raises(AttributeError, match="no_such_function"):
        load_callable("json:no_such_function")
    with pytest.raises(ModuleNotFoundError):
        load_callable("no_such_module_xyz:f")


def run_entry(spec: JobSpec) -> subprocess.CompletedProcess:
    return subprocess.run(spec.argv(), capture_output=True, text=True, timeout=120)


def test_a_callable_job_is_called_with_its_arguments_and_exits_zero(tmp_path):
    out = tmp_path / "out.json"
    spec = JobSpec(name="write", callable="tradewind.core:atomic_write_json", args=[str(out)], kwargs={"obj": [1, 2]})
    done = run_entry(spec)
    assert done.returncode == 0, done.stderr
    assert read_json(out) == [1, 2]


def test_a_tradewind_error_exits_one_with_its_message_and_no_traceback(tmp_path):
    spec = JobSpec(name="read", callable="tradewind.runs.record:read_record", args=[str(tmp_path / "run.json")])
    done = run_entry(spec)
    assert done.returncode == 1
    assert done.stderr.strip() == f"error: no run record run.json in {tmp_path}"


def test_any_other_exception_exits_one_with_its_traceback():
    spec = JobSpec(name="bad", callable="json:loads", args=["{not json"])
    done = run_entry(spec)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "JSONDecodeError" in done.stderr


# A job that returns with work still under way: a thread that finishes only after the call has returned, and an
# exit handler. OUT is given by the job (`runpy.run_path`'s `init_globals`).
UNFINISHED = """
import atexit, gc, json, threading

def after_the_call():
    threading.main_thread().join()  # returns once the call has returned and the process is ending
    with open(OUT + ".thread", "w") as out:
        out.write("finished")

def at_exit():
    with open(OUT + ".atexit", "w") as out:
        json.dump({"frozen": gc.get_freeze_count()}, out)

threading.Thread(target=after_the_call).start()
atexit.register(at_exit)
"""


@pytest.mark.parametrize("fork_server", ["1", "0"])
def test_a_job_process_ends_as_python_ends_any_but_without_its_final_collections(
    fork_server, backend, tmp_path, monkeypatch
):
    monkeypatch.setenv(FORK_SERVER_ENV, fork_server)  # the backend's supervisors read it
    script, out = tmp_path / "unfinished.py", str(tmp_path / "out")
    script.write_text(UNFINISHED)
    spec = JobSpec(
        name="unfinished", callable="runpy:run_path", args=[str(script)], kwargs={"init_globals": {"OUT": out}}
    )
    done = backend.wait(backend.submit(spec).id, timeout=120)
    assert (done.status, done.exit_code) == (JobStatus.SUCCEEDED, 0), backend.logs(done.id).text
    assert Path(out + ".thread").read_text() == "finished"  # its threads were joined, its exit handlers run
    assert read_json(Path(out + ".atexit"))["frozen"] > 0  # and the garbage collector left its objects alone
