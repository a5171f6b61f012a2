"""The Ray backend and task runner against a real Ray head (started by `.ci/run`).

The head advertises fake TPU resources (`TPU: 8`, `TPU-v5litepod-8-head: 1`): a true external
boundary, since no TPU is attached. Jobs asking for them are scheduled by Ray exactly as on a slice.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from polling import wait_until

from tradewind.cluster import JobSpec, JobStatus, LocalTaskRunner, RayTaskRunner, Resources
from tradewind.cluster.process import process_alive
from tradewind.cluster.ray_entry import RESULT_PREFIX
from tradewind.core import InvalidInputError

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def backend(ray_head):
    from tradewind.cluster.ray_backend import RayBackend

    return RayBackend(ray_head)


def shell(script: str, **settings) -> JobSpec:
    return JobSpec(name="ray test", command=["bash", "-c", script], **settings)


def test_a_job_runs_on_ray_and_its_logs_page_by_offset(backend, tmp_path):
    log_path = tmp_path / "mirror.log"
    record = backend.submit(shell("echo first line; echo second line", log_path=str(log_path)))
    done = backend.wait(record.id, timeout=120)
    assert (done.status, done.exit_code, done.attempts) == (JobStatus.SUCCEEDED, 0, 1)
    pages, offset = [], 0
    while chunk := backend.logs(record.id, offset=offset, limit=100):
        if not chunk.text:
            break
        pages.append(chunk.text)
        offset = chunk.next_offset
    text = "".join(pages)
    assert "first line" in text and "second line" in text and offset == chunk.size
    assert log_path.read_text() == text
    assert record.id in [job.id for job in backend.list()]


def test_a_multibyte_log_is_mirrored_byte_for_byte_and_a_listing_carries_no_log_bytes(backend, tmp_path):
    log_path = tmp_path / "mirror.log"
    script = 'for i in $(seq 1500); do echo "ligne $i : café, naïve"; done'
    record = backend.submit(shell(script, log_path=str(log_path)))
    assert backend.wait(record.id, timeout=120).status is JobStatus.SUCCEEDED
    whole = backend.logs(record.id, offset=0, limit=1 << 20)
    assert log_path.read_bytes() == whole.text.encode() and whole.size == len(whole.text.encode())
    assert "ligne 1 : café" in whole.text and "ligne 1500 : café, naïve" in whole.text
    # Statuses and listings ask the launcher for the job's facts, not its log.
    assert all(view["log"] == b"" for view in backend._call("views"))


def test_a_jobs_outcome_survives_foreign_lines_ray_appends_to_its_log_after_the_result(backend):
    # Ray copies the output of job-less workers ("(pid=) ...") into every driver's log, for as long as the
    # driver lives: in CI a TPU compile's 100+ KiB of libtpu logging landed after a job's result line.
    import ray

    record = backend.submit(shell("echo done"))
    assert backend.wait(record.id, timeout=120).status is JobStatus.SUCCEEDED
    jobs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "tradewind-jobs"
    with open(jobs / f"{record.id}.log", "a") as log:
        log.writelines(f"(pid=) I1206 deepsea_compiler_backend.cc:{i}] XLA::TPU program usage\n" for i in range(4000))
    done = backend.status(record.id)
    assert (done.status, done.exit_code, done.attempts) == (JobStatus.SUCCEEDED, 0, 1)


def test_a_launcher_left_by_another_tradewind_version_is_refused_with_how_to_end_it(backend, monkeypatch):
    from tradewind.cluster import ray_backend

    monkeypatch.setattr(ray_backend, "PROTOCOL", ray_backend.PROTOCOL + 1)  # this process is the newer version
    with pytest.raises(InvalidInputError, match=r"started by another version of Tradewind .*ray\.kill\(ray\.get_actor"):
        ray_backend.RayBackend(backend.address)


def test_a_job_outlives_the_process_that_submitted_it_and_another_one_finds_it(backend, ray_address):
    submit = (
        "from tradewind.cluster import JobSpec, RayBackend\n"
        f"print(RayBackend({ray_address!r}).submit(JobSpec(name='elsewhere', command=['sleep', '2'])).id)"
    )
    job_id = subprocess.run([sys.executable, "-c", submit], capture_output=True, text=True, check=True).stdout.split()[
        -1
    ]
    assert job_id in [job.id for job in backend.list()]
    assert backend.wait(job_id, timeout=60).status is JobStatus.SUCCEEDED


def test_two_replicas_on_ray_are_a_gang_with_coordinator_and_process_ids(backend, tmp_path):
    script = (
        f'echo "$TRADEWIND_COORDINATOR_ADDRESS $TRADEWIND_PROCESS_COUNT" > {tmp_path}/replica-$TRADEWIND_PROCESS_ID'
    )
    done = backend.wait(backend.submit(shell(script, replicas=2)).id, timeout=120)
    assert done.status is JobStatus.SUCCEEDED, backend.logs(done.id).text
    lines = [(tmp_path / f"replica-{i}").read_text().split() for i in range(2)]
    assert lines[0] == lines[1] and lines[0][1] == "2" and ":" in lines[0][0]


def test_a_tpu_job_is_scheduled_on_the_tpu_resources_ray_names(backend, tmp_path):
    done = backend.wait(
        backend.submit(shell("echo on tpu", resources=Resources(accelerator="tpu-v5litepod-8"))).id, 120
    )
    assert done.status is JobStatus.SUCCEEDED, backend.logs(done.id).text


@pytest.mark.parametrize(
    ("resources", "change"),
    [
        (
            Resources(accelerator="tpu-v4-2048"),
            "use a TPU type the cluster has: v5litepod-8, or add the hosts of a v4-2048",
        ),
        (
            Resources(accelerator="tpu-v5litepod-16"),
            "use a TPU type the cluster has: v5litepod-8, or add the hosts of a v5",
        ),
        (Resources(accelerator="gpu"), "no node has a GPU: use accelerator 'cpu', or add nodes with GPUs"),
    ],
    ids=["v4-2048", "v5litepod-16", "gpu"],
)
def test_a_job_no_node_could_ever_hold_is_refused_before_anything_is_queued(backend, resources, change):
    from tradewind.core import InvalidInputError, make_id

    job_id = make_id("job")
    with pytest.raises(InvalidInputError) as refused:
        backend.submit(shell("echo never", resources=resources), job_id=job_id)
    message = str(refused.value)
    assert "no alive node can hold bundle 0" in message and change in message
    offers = message.partition("The nodes offer: ")[2]
    assert "(head) {CPU: 4, " in offers and "TPU: 8, " in offers and "memory: " in offers
    assert "TPU-v5litepod-8-head: 1" in offers
    assert job_id not in [job.id for job in backend.list()]


def test_a_gang_ray_cannot_place_waits_as_pending_with_its_bundles_until_cancelled(backend):
    from ray.util import placement_group_table

    # Each host bundle fits the one node, but STRICT_SPREAD needs two nodes: only Ray can tell.
    record = backend.submit(shell("echo never", resources=Resources(accelerator="tpu-v5litepod-8", slices=2)))
    name = f"tradewind-{record.id}"

    def group_waiting():  # the GCS's table (the backend joined the cluster), as CI's head runs no dashboard
        return any(group["name"] == name and group["state"] == "PENDING" for group in placement_group_table().values())

    wait_until(group_waiting, what="the job's placement group waiting for TPU hosts")
    pending = backend.status(record.id)
    assert pending.status is JobStatus.PENDING
    assert pending.reason == (
        "waiting for Ray to place 2 bundles {CPU: 1, TPU: 8, TPU-v5litepod-8-head: 1} x 2 (STRICT_SPREAD)"
    )
    assert record.id in [job.id for job in backend.cluster_status().queued]
    backend.cancel(record.id)
    done = backend.wait(record.id, timeout=60)
    assert done.status is JobStatus.CANCELLED


def test_a_gang_not_placed_within_its_pending_timeout_fails_with_rays_reason(backend):
    spec = shell("echo never", resources=Resources(accelerator="tpu-v5litepod-8", slices=2), pending_timeout_s=15)
    done = backend.wait(backend.submit(spec).id, timeout=120)
    assert (done.status, done.attempts) == (JobStatus.FAILED, 0)
    assert done.reason.startswith(
        "not scheduled within pending_timeout_s=15 s: it waits for 2 bundles {CPU: 1, TPU: 8, "
        "TPU-v5litepod-8-head: 1} x 2 (STRICT_SPREAD), which Ray's placement group scheduler reports INFEASIBLE: "
    )


def test_a_driver_whose_group_no_node_can_hold_fails_with_the_autoscalers_words(ray_address):
    # The preflight refuses such a job; a node that leaves between submission and scheduling does this.
    # Ray's autoscaler repeats an event for one shape at most every 30 s: a CPU amount of this run's own.
    cpus = round(0.1 + os.getpid() % 997 / 10_000, 4)
    spec = shell("echo never", resources=Resources(cpus=cpus, accelerator="gpu"), pending_timeout_s=10)
    driver = subprocess.run(
        [sys.executable, "-m", "tradewind.cluster.ray_entry", "job-driver-test", spec.model_dump_json()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = [line for line in driver.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    outcome = json.loads(result[-1][len(RESULT_PREFIX) :])
    assert (outcome["status"], driver.returncode) == ("FAILED", 1)
    assert "reports INFEASIBLE" in outcome["reason"]
    assert "Ray's autoscaler: Error: No available node types can fulfill resource request" in outcome["reason"]
    asked = outcome["reason"].partition("fulfill resource request ")[2]  # Ray orders the keys as it likes
    assert f"'CPU': {cpus}" in asked and "'GPU': 1.0" in asked


def test_an_address_where_no_ray_answers_is_refused_at_once():
    pytest.importorskip("ray")
    from tradewind.cluster.ray_backend import RayBackend
    from tradewind.core import InvalidInputError

    with pytest.raises(InvalidInputError, match=r"argument 'address': no Ray cluster answers at '127.0.0.1:1'"):
        RayBackend("127.0.0.1:1")


def test_the_ray_backend_by_name_without_an_address_is_refused_rather_than_started_here(monkeypatch, tmp_path):
    pytest.importorskip("ray")
    from tradewind.cluster import get_backend
    from tradewind.core import InvalidInputError

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(InvalidInputError, match="'ray' needs a Ray cluster: set RAY_ADDRESS"):
        get_backend("ray", tmp_path / "jobs")


def test_cancel_on_ray_ends_the_replica_process_group(backend, tmp_path):
    pid_file = tmp_path / "child.pid"
    record = backend.submit(shell(f"sleep 300 & echo $! > {pid_file}; wait"))
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the job writing its pid")
    child = int(pid_file.read_text())
    assert backend.status(record.id).status is JobStatus.RUNNING
    backend.cancel(record.id)
    assert backend.wait(record.id, timeout=60).status is JobStatus.CANCELLED
    wait_until(lambda: not process_alive(child), what="the replica's child ending after cancel")


def test_a_replica_killed_from_outside_on_ray_is_retried_and_succeeds(backend, tmp_path):
    pid_file = tmp_path / "pid"
    script = f"if [ ! -e {pid_file} ]; then echo $$ > {pid_file}; sleep 300; else echo second attempt; fi"
    record = backend.submit(shell(script, max_retries_preemption=1))
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the first attempt starting")
    os.killpg(int(pid_file.read_text()), signal.SIGKILL)  # the replica leads its own process group
    done = backend.wait(record.id, timeout=120)
    assert (done.status, done.attempts, done.preemptions) == (JobStatus.SUCCEEDED, 2, 1)


def test_a_job_past_its_timeout_on_ray_is_failed_with_the_reason(backend):
    done = backend.wait(backend.submit(shell("sleep 300", timeout_s=2)).id, timeout=120)
    assert (done.status, done.reason) == (JobStatus.FAILED, "timed out after 2 s (timeout_s) and was killed")


def test_the_ray_task_runner_returns_what_the_local_one_does(ray_address):
    items = [f"shard {i}" for i in range(6)]
    assert RayTaskRunner(ray_address).map(str.upper, items) == LocalTaskRunner(workers=2).map(str.upper, items)


def test_a_data_pipeline_builds_the_same_token_cache_on_ray_as_locally(ray_address, small_corpus, tmp_path):
    from tradewind.data import ByteTokenizer, build_token_cache

    options = {"val_fraction": 0.2, "shard_bytes": 16_000}
    local = build_token_cache([small_corpus], tmp_path / "local", ByteTokenizer(), runner=LocalTaskRunner(2), **options)
    on_ray = build_token_cache(
        [small_corpus], tmp_path / "ray", ByteTokenizer(), runner=RayTaskRunner(ray_address), **options
    )
    assert local.model_dump(exclude={"created"}) == on_ray.model_dump(exclude={"created"})
    local_files = sorted(p.relative_to(tmp_path / "local") for p in (tmp_path / "local").rglob("*.bin"))
    assert local_files
    for name in local_files:
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "ray" / name).read_bytes()


@pytest.mark.slow
def test_a_real_training_job_runs_through_ray_on_cpu(backend, dataset_id, ctx, tiny_run_settings, tmp_path):
    import sys

    from tradewind.runs import RunLayout, TrainConfig

    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    dataset = str(ctx.workspace.dataset_dir(dataset_id))
    config = TrainConfig.model_validate({"dataset": dataset, "steps": 10, **tiny_run_settings})
    layout.config.write_text(config.model_dump_json())
    spec = JobSpec(name="train on ray", command=[sys.executable, "-m", "tradewind.trainer", str(layout.root)])
    done = backend.wait(backend.submit(spec).id, timeout=240)
    assert done.status is JobStatus.SUCCEEDED, backend.logs(done.id).text[-3000:]
    assert json.loads(layout.summary.read_text())["steps"] == 10


@pytest.mark.slow
def test_two_ray_replicas_initialise_jax_distributed_from_the_gang_environment(backend, tmp_path):
    import sys

    code = (
        "import sys, jax; from tradewind.cluster import distributed_env\n"
        "d = distributed_env()\n"
        "jax.distributed.initialize(d.coordinator_address, d.process_count, d.process_id)\n"
        f"open(f'{tmp_path}/jax-{{d.process_id}}', 'w').write(f'{{jax.process_index()}} {{jax.process_count()}}')\n"
    )
    spec = JobSpec(name="jax gang", command=[sys.executable, "-c", code], replicas=2, timeout_s=180)
    done = backend.wait(backend.submit(spec).id, timeout=240)
    assert done.status is JobStatus.SUCCEEDED, backend.logs(done.id).text[-3000:]
    assert [(tmp_path / f"jax-{i}").read_text() for i in range(2)] == ["0 2", "1 2"]
