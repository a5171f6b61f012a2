"""The job models handed to training, sampling and profiling processes: JAX-free, strict, validated again."""

import subprocess
import sys

import pytest
from pydantic import ValidationError

from tradewind.cluster import JobSpec
from tradewind.runs import ProfileJob, SampleJob, SampleOptions, TrainConfig, TrainJob
from tradewind.runs.jobs import PROFILE_CALLABLE, SAMPLE_CALLABLE, TRAIN_CALLABLE


def test_the_job_models_load_without_jax_so_the_server_can_build_jobs():
    code = "import sys, tradewind.runs.jobs\nprint([m for m in ('jax', 'flax', 'optax', 'orbax') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("model", "callable_path", "fields"),
    [
        (TrainJob, TRAIN_CALLABLE, {"run_dir": "runs/r1", "config": TrainConfig(dataset="datasets/ds-1", steps=7)}),
        (
            SampleJob,
            SAMPLE_CALLABLE,
            {"run_dir": "runs/r1", "output_file": "runs/r1/samples/s1.json", "prompt": "ROMEO:", "top_k": 5},
        ),
        (ProfileJob, PROFILE_CALLABLE, {"run_dir": "runs/r1", "steps": 3}),
    ],
    ids=["train", "sample", "profile"],
)
def test_a_job_passed_as_callable_kwargs_validates_again_to_the_same_job(model, callable_path, fields):
    job = model(**fields)
    spec = JobSpec(name="job", callable=callable_path, kwargs=job.model_dump(mode="json"))
    # What the process receives went through JSON (the entry's command line).
    received = JobSpec.model_validate_json(spec.model_dump_json())
    assert model.model_validate(received.kwargs) == job
    assert received.callable.startswith("tradewind.trainer.") and ":" in received.callable


@pytest.mark.parametrize(
    ("model", "minimal"),
    [
        (TrainJob, {"run_dir": "r", "config": {"dataset": "d"}}),
        (SampleJob, {"run_dir": "r", "output_file": "o.json"}),
        (ProfileJob, {"run_dir": "r"}),
    ],
    ids=["train", "sample", "profile"],
)
def test_a_job_refuses_an_argument_it_does_not_declare(model, minimal):
    model.model_validate(minimal)
    with pytest.raises(ValidationError, match="stpes"):
        model.model_validate({**minimal, "stpes": 3})


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 4097}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"prompt": "x" * 10_001}, "prompt"),
        ({"seed": 2**32}, "seed"),
    ],
)
def test_sampling_options_outside_their_documented_range_are_refused(fields, field):
    with pytest.raises(ValidationError, match=field):
        SampleOptions(**fields)


def test_profile_steps_are_bounded():
    with pytest.raises(ValidationError, match="steps"):
        ProfileJob(run_dir="r", steps=0)
    with pytest.raises(ValidationError, match="steps"):
        ProfileJob(run_dir="r", steps=101)
