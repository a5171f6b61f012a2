"""Training in the warm process (tradewind.cluster.warm), on the CPU: runs one after another in one process train
as they would alone, leave nothing on the devices, and the second finds its steps compiled."""

import re

from tradewind.cluster import JobSpec, JobStatus, LocalBackend
from tradewind.cluster.warm import release, warm_process
from tradewind.runs import RunLayout, TrainJob
from tradewind.runs.jobs import TRAIN_CALLABLE
from tradewind.runs.metrics import read_metrics
from tradewind.trainer.setup import setup_training


def test_runs_in_the_warm_process_train_as_they_would_alone_and_leave_it_warm(tmp_path, tiny_config):
    backend = LocalBackend(tmp_path / "jobs", cpus=2, memory_gb=4)
    config = tiny_config(steps=10, checkpoint=False)
    records, layouts = [], []
    try:
        for name in ("first", "second"):
            layout = RunLayout(tmp_path / name)
            layout.root.mkdir()
            job = TrainJob(run_dir=str(layout.root), config=config).model_dump(mode="json")
            spec = JobSpec(name=name, callable=TRAIN_CALLABLE, kwargs=job, env={"JAX_PLATFORMS": "cpu"}, warm=True)
            records.append(backend.wait(backend.submit(spec).id, timeout=300))
            layouts.append(layout)
        assert [record.status for record in records] == [JobStatus.SUCCEEDED] * 2, backend.logs(records[-1].id).text
        logs = [backend.logs(record.id).text for record in records]
        pids = [re.search(r"in the warm process (\d+) \((.*?)\)", log).groups() for log in logs]
        assert pids[0][0] == pids[1][0] and pids[1][1] == "warm after 1 job"
        assert warm_process(backend.jobs_dir) == int(pids[0][0])  # the first run left no array behind
        first, second = ([(row.step, row.loss) for row in read_metrics(layout.metrics)] for layout in layouts)
        assert first == second and len(first) >= 2
    finally:
        release(backend.jobs_dir)


def test_a_process_that_trains_the_same_config_again_reuses_its_compiled_steps(tiny_config):
    config = tiny_config(steps=2)
    once, again = setup_training(config), setup_training(config)
    assert again.train_step is once.train_step and again.eval_step is once.eval_step
    other = setup_training(tiny_config(steps=2, batch_size=4))
    assert other.train_step is not once.train_step
