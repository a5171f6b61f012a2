"""Runs that live in a bucket (`storage`): two processes that share no folder train from the bucket's copy of the
token cache, checkpoint to the bucket, and resume after a kill to the same losses, bit for bit, as a run that was
never stopped. The buckets are real servers on loopback (`gcp-storage-emulator`, `moto`; see bucket_servers.py),
or real buckets when TRADEWIND_TEST_GCS_BUCKET / TRADEWIND_TEST_S3_BUCKET are set."""

import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
from bucket_servers import S3_SECRET
from data_helpers import cache_files
from polling import wait_until
from runs_helpers import finish, finish_sweep, losses

from tradewind.cluster import JobStatus
from tradewind.core import InvalidInputError, NotFoundError, PathEscapeError
from tradewind.core.buckets import MARKER, download_folder, is_complete, join_url, object_version, remote_fs
from tradewind.data import ByteTokenizer, open_token_cache
from tradewind.runs import RunLayout
from tradewind.runs.layout import run_url
from tradewind.tools import (
    InspectDatasetRequest,
    LaunchTrainingRequest,
    ListDatasetsRequest,
    SampleTextRequest,
    TokenizeDatasetRequest,
    ToolContext,
    get_run,
    inspect_dataset,
    launch_training,
    list_datasets,
    sample_text,
    tokenize_dataset,
)
from tradewind.tools.context import Cancelled
from tradewind.tools.profiling import ProfileRunRequest, profile_run
from tradewind.tools.report_data import load_run
from tradewind.tools.reports import SummarizeReportRequest, render_run, summarize_report
from tradewind.tools.runs import RunRequest
from tradewind.tools.sweeps import LaunchSweepRequest, launch_sweep
from tradewind.trainer.export import export_hf

AUDIT = Path(__file__).parent / "open_audit"
CONSTANT = {"optimizer": {"learning_rate": 1e-2, "warmup_steps": 0, "schedule": "constant"}}


@pytest.fixture(scope="module")
def two_process_reference(ctx, dataset_id, tiny_run_settings):
    """An uninterrupted 2-process run of the workspace (no bucket), checkpointing every 5 steps."""
    settings = {**tiny_run_settings, **CONSTANT, "checkpoints": {"every_steps": 5, "keep_last": 2}, "replicas": 2}
    run = launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, steps=20, **settings))
    done = finish(ctx, run.run_id)
    assert done.status is JobStatus.SUCCEEDED, done.log_tail
    return done, settings


@pytest.fixture
def unshared(bucket, ctx, dataset_id, tmp_path, monkeypatch) -> ToolContext:
    """A workspace allowed to write under `bucket`, holding the session's dataset, whose training processes each
    record the files they open (see open_audit/sitecustomize.py) in `<tmp_path>/opens`."""
    own = ToolContext.open(tmp_path / "ws", allowed_paths=(bucket,))
    (own.workspace.root / "settings.yaml").write_text("backend: local\n")
    shutil.copytree(ctx.workspace.dataset_dir(dataset_id), own.workspace.dataset_dir(dataset_id, must_exist=False))
    (tmp_path / "opens").mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(AUDIT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TW_TEST_OPEN_LOG", str(tmp_path / "opens"))
    return own


def assert_each_process_kept_to_its_own_folder(ctx: ToolContext, run_id: str, opens: Path) -> None:
    """Each process opened files in its own folder, and never in the other's nor the workspace's runs or datasets."""
    private = {i: ctx.workspace.jobs_dir / run_id / f"replica-{i}" for i in (0, 1)}
    shared = [ctx.workspace.runs_dir, ctx.workspace.datasets_dir]
    logs = list(opens.glob("replica-*.txt"))
    assert {log.name.split("-")[1] for log in logs} == {"0", "1"}
    for log in logs:
        replica = int(log.name.split("-")[1])
        opened = {Path(line) for line in log.read_text().splitlines()}
        assert any(p.is_relative_to(private[replica]) for p in opened), "it trained from its own copy"
        for forbidden in [private[1 - replica], *shared]:
            assert not [p for p in opened if p.is_relative_to(forbidden)], f"replica {replica} read {forbidden}"


# What marks a checkpoint complete: orbax's commit file on gs://, the copy's marker on s3:// (see bucket_checkpoint).
COMMITTED = {"gs": "commit_success.txt", "s3": MARKER}


@pytest.mark.slow
@pytest.mark.parametrize("bucket", ["gcs-emulator", "s3-moto", "gcs-real", "s3-real"], indirect=True)
def test_two_processes_sharing_no_folder_train_from_a_bucket_and_resume_bitwise_after_a_kill(
    bucket, unshared, dataset_id, ctx, two_process_reference, tmp_path
):
    reference, settings = two_process_reference
    run = launch_training(unshared, LaunchTrainingRequest(dataset=dataset_id, steps=20, storage=bucket, **settings))
    assert is_complete(join_url(bucket, "datasets", dataset_id))
    fs, path = remote_fs(join_url(bucket, "runs", run.run_id))
    scheme = bucket.split(":")[0]
    committed = f"{path}/checkpoints/10/{COMMITTED[scheme]}"
    # Each look is two requests to the bucket's server, which shares the two cores with the run's processes.
    wait_until(lambda: fs.invalidate_cache(path) or fs.exists(committed), 240, "checkpoint 10", interval=0.1)
    killed = 1 if scheme == "gs" else 0  # any process: one with only its checkpoint shards, or the one that writes
    os.kill(unshared.backend.status(run.run_id).pids[killed], signal.SIGKILL)

    done = finish(unshared, run.run_id)
    assert done.status is JobStatus.SUCCEEDED, done.log_tail
    assert done.attempts == 2 and done.summary.resumed_from_step >= 10
    assert losses(unshared, run.run_id) == losses(ctx, reference.run_id)
    assert done.summary.final_eval_loss == reference.summary.final_eval_loss
    assert_each_process_kept_to_its_own_folder(unshared, run.run_id, tmp_path / "opens")
    report = "\n".join(render_run(load_run(unshared, run.run_id, sample=False), "plot.png"))
    assert f"| storage | `{bucket}/runs/{run.run_id}` (checkpoints, metrics, summary, log, report) |" in report
    sampled = sample_text(unshared, SampleTextRequest(run_id=run.run_id, max_tokens=8, temperature=0))
    assert sampled.step == 20 and sampled.text  # from the bucket's checkpoint: the workspace holds none
    assert not RunLayout(unshared.workspace.run_dir(run.run_id)).checkpoints.exists()

    # Credentials never enter what the run wrote, here or in the bucket (moto's secret key was planted for this).
    written = [p.read_bytes() for p in unshared.workspace.root.rglob("*") if p.is_file()]
    written += [fs.cat_file(name) for name in fs.find(path)]
    assert len(written) > 10 and not [data for data in written if S3_SECRET.encode() in data]


@pytest.mark.parametrize("bucket", ["gcs-emulator", "s3-moto"], indirect=True)
def test_a_bucket_not_allowed_is_refused_before_anything_is_written(bucket, ctx, dataset_id):
    runs_before = set(ctx.workspace.runs_dir.iterdir())
    with pytest.raises(PathEscapeError, match=rf"argument 'storage': {bucket} is refused .* --allow-path {bucket}"):
        launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, steps=2, storage=bucket))
    fs, path = remote_fs(bucket)
    assert set(ctx.workspace.runs_dir.iterdir()) == runs_before and not fs.find(path)


@pytest.mark.parametrize("bucket", ["gcs-emulator", "s3-moto"], indirect=True)
def test_a_bucket_input_tokenizes_and_a_rewritten_object_gets_a_new_cache_even_with_the_same_bytes(
    bucket, small_corpus, tmp_path
):
    own = ToolContext.open(tmp_path / "ws", allowed_paths=(f"{bucket}/corpus",))
    fs, path = remote_fs(f"{bucket}/corpus/text.txt")
    text = small_corpus.read_bytes()[:20_000]
    fs.pipe_file(path, text)
    first = tokenize_dataset(own, TokenizeDatasetRequest(input=f"{bucket}/corpus"))
    assert first.documents["train"] > 0
    fs.pipe_file(path, text)  # the same bytes, but a new object version (generation / ETag-bearing write)
    fs.invalidate_cache()
    version = object_version(fs.info(path))
    second = tokenize_dataset(own, TokenizeDatasetRequest(input=f"{bucket}/corpus"))
    manifest = open_token_cache(own.workspace.dataset_dir(second.dataset_id)).manifest
    assert [source.version for source in manifest.sources] == [version]
    if bucket.startswith("gs://"):  # a GCS generation is new on every write; an S3 ETag is the bytes' MD5
        assert second.dataset_id != first.dataset_id
    with pytest.raises(PathEscapeError, match=r"argument 'input': .* is refused"):
        tokenize_dataset(own, TokenizeDatasetRequest(input=f"{bucket}/elsewhere"))


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("bucket", ["gcs-emulator"], indirect=True)
def test_a_ray_gang_trains_from_a_bucket_with_each_process_in_its_own_folder(
    ray_address, bucket, unshared, dataset_id, ctx, two_process_reference, tmp_path
):
    # The Ray workers were started before this test: the bucket's endpoint reaches them through the job's env.
    reference, settings = two_process_reference
    request = LaunchTrainingRequest(dataset=dataset_id, steps=10, storage=bucket, backend="ray", **settings)
    done = finish(unshared, launch_training(unshared, request).run_id, timeout_s=600)
    assert done.status is JobStatus.SUCCEEDED, done.log_tail
    assert done.processes == 2 and done.summary.steps == 10
    ours, theirs = losses(unshared, done.run_id), losses(ctx, reference.run_id)[: len(losses(unshared, done.run_id))]
    np.testing.assert_allclose([loss for _, loss in ours], [loss for _, loss in theirs], rtol=1e-5)
    fs, path = remote_fs(join_url(bucket, "runs", done.run_id))
    assert fs.exists(f"{path}/checkpoints/10/commit_success.txt")


@pytest.mark.slow
@pytest.mark.parametrize("bucket", ["gcs-emulator"], indirect=True)
def test_a_run_exports_to_a_bucket_and_a_run_in_the_bucket_starts_from_that_model(
    bucket, unshared, dataset_id, ctx, two_process_reference, tmp_path
):
    reference, settings = two_process_reference
    exported = export_hf(ctx.workspace.run_dir(reference.run_id), f"{bucket}/hf")
    assert is_complete(exported)
    first = {**settings, "replicas": 1, "steps": 2, "eval_every": 2}
    runs = [  # a local run downloads the model into the workspace; a run in the bucket copies that to its storage
        launch_training(
            unshared, LaunchTrainingRequest(dataset=dataset_id, init_from=exported, storage=storage, **first)
        )
        for storage in (None, bucket)
    ]
    local, in_bucket = (finish(unshared, run.run_id) for run in runs)
    assert in_bucket.status is JobStatus.SUCCEEDED, in_bucket.log_tail
    assert in_bucket.summary.first_eval_loss == local.summary.first_eval_loss
    assert in_bucket.summary.first_eval_loss < 0.9 * reference.summary.first_eval_loss  # trained weights, not new
    fs, path = remote_fs(bucket)
    assert fs.glob(f"{path}/models/hf-*/{MARKER}")
    fs.rm_file(f"{path}/hf/{MARKER}")  # a copy cut off, or a folder copied by other means: not taken as a model
    with pytest.raises(NotFoundError, match=rf"argument 'init_from': {exported} holds no complete copy"):
        launch_training(unshared, LaunchTrainingRequest(dataset=dataset_id, init_from=exported, **first))


@pytest.mark.slow
@pytest.mark.parametrize("bucket", ["gcs-emulator"], indirect=True)
def test_a_sweeps_trials_may_live_in_a_bucket_the_server_allowed(bucket, unshared, dataset_id, tiny_run_settings):
    # The sweep's controller is a job of its own: it must be given the bucket prefixes this server allows.
    base = {"dataset": dataset_id, "steps": 4, "storage": bucket, **tiny_run_settings}
    launched = launch_sweep(unshared, LaunchSweepRequest(base=base, space={"seed": [1]}))
    done = finish_sweep(unshared, launched.sweep_id)
    assert (done.status, done.counts) == ("succeeded", {"finished": 1}), done
    fs, path = remote_fs(run_url(bucket, done.trials[0].run_id))
    assert fs.exists(f"{path}/summary.json")


@pytest.mark.parametrize("bucket", ["gcs-emulator", "s3-moto"], indirect=True)
def test_a_workspace_with_storage_tokenizes_into_its_bucket_and_another_workspace_reads_that_copy(
    bucket, small_corpus, tmp_path
):
    # The tokenizer is read from the bucket too: the byte tokenizer's own definition, as a tokenizer.json.
    fs, path = remote_fs(f"{bucket}/tok/tokenizer.json")
    fs.pipe_file(path, ByteTokenizer().hf_definition().encode())
    first = ToolContext.open(tmp_path / "first", allowed_paths=(small_corpus.parent, f"{bucket}/tok"))
    (first.workspace.root / "settings.yaml").write_text(f"storage: {bucket}\n")
    made = tokenize_dataset(first, TokenizeDatasetRequest(input=str(small_corpus), tokenizer=f"{bucket}/tok"))
    url = join_url(bucket, "datasets", made.dataset_id)
    assert made.tokenizer == f"{bucket}/tok" and made.copies == [url] and is_complete(url)
    assert list_datasets(first, ListDatasetsRequest()).datasets[0].copies == [url]

    with pytest.raises(PathEscapeError, match=rf"argument 'dataset_id': {url} is refused"):
        inspect_dataset(ToolContext.open(tmp_path / "not-allowed"), InspectDatasetRequest(dataset_id=url))
    other = ToolContext.open(tmp_path / "other", allowed_paths=(bucket,))
    report = inspect_dataset(other, InspectDatasetRequest(dataset_id=url, samples=1))
    assert report.tokens == made.tokens and report.samples[0].text  # decoded by the bucket's tokenizer
    theirs, ours = (ctx.workspace.dataset_dir(made.dataset_id) for ctx in (first, other))
    assert {p.relative_to(ours): p.read_bytes() for p in ours.rglob("*") if p.is_file()} == {
        p.relative_to(theirs): p.read_bytes() for p in theirs.rglob("*") if p.is_file()
    }
    assert list_datasets(other, ListDatasetsRequest()).datasets[0].copies == [url]


@pytest.mark.parametrize("bucket", ["gcs-emulator", "s3-moto"], indirect=True)
def test_a_tokenize_with_output_writes_the_cache_only_to_the_bucket_where_another_workspace_reads_it(
    bucket, small_corpus, tmp_path
):
    reference = ToolContext.open(tmp_path / "reference", allowed_paths=(small_corpus.parent,))
    local = tokenize_dataset(reference, TokenizeDatasetRequest(input=str(small_corpus)))
    own = ToolContext.open(tmp_path / "own", allowed_paths=(small_corpus.parent, bucket))
    request = TokenizeDatasetRequest(input=str(small_corpus), output=f"{bucket}/caches/")

    made = tokenize_dataset(own, request)
    url = join_url(bucket, "caches", made.dataset_id)
    assert (made.dataset_id, made.path, made.reused, made.tokens) == (local.dataset_id, url, False, local.tokens)
    assert is_complete(url)
    assert not list(own.workspace.datasets_dir.iterdir())  # the staging folder went once the bucket had it all
    again = tokenize_dataset(own, request)
    assert (again.reused, again.path, again.tokens, again.shards) == (True, url, made.tokens, made.shards)

    # What a launch with this dataset reads: the bucket's copy, fetched into the workspace (resolve_dataset).
    other = ToolContext.open(tmp_path / "other", allowed_paths=(bucket,))
    report = inspect_dataset(other, InspectDatasetRequest(dataset_id=url, samples=1))
    assert report.tokens == local.tokens and report.samples[0].text
    fetched = other.workspace.dataset_dir(made.dataset_id)
    files = cache_files(fetched)
    assert json.loads(files.pop("copies.json")) == [url]  # where the other workspace fetched it from
    assert files == cache_files(reference.workspace.dataset_dir(local.dataset_id))
    open_token_cache(fetched).verify()


def write_shard_inputs(folder: Path) -> None:
    """Four input files, so four shards: a small first one, then three of about 2 MB each."""
    folder.mkdir()
    for part, paragraphs in enumerate([20, 10_000, 10_000, 10_000]):
        text = "\n\n".join(f"part {part} paragraph {i} " + "x" * (i % 300) for i in range(paragraphs))
        (folder / f"part{part}.txt").write_text(text + "\n")


@pytest.mark.parametrize("bucket", ["gcs-emulator", "s3-moto"], indirect=True)
def test_a_tokenize_to_a_bucket_cancelled_after_a_shard_resumes_without_tokenizing_that_shard_again(bucket, tmp_path):
    own = ToolContext.open(tmp_path / "ws", allowed_paths=(bucket,))
    write_shard_inputs(own.workspace.root / "inputs")
    request = TokenizeDatasetRequest(input="inputs", output=bucket, workers=1)
    fs, path = remote_fs(bucket)

    def cancel_after_the_first_shard(done, total, message):
        fs.invalidate_cache()
        if fs.glob(f"{path}/*/shards/shard-00000.json"):
            raise Cancelled("the caller cancelled")

    with pytest.raises(Cancelled):
        tokenize_dataset(own, request, cancel_after_the_first_shard)
    [prefix] = fs.ls(path, detail=False)
    first = f"{prefix}/train/shard-00000.bin"
    version = object_version(fs.info(first))
    assert not fs.exists(f"{prefix}/{MARKER}") and not fs.exists(f"{prefix}/manifest.json")
    assert not list(own.workspace.datasets_dir.iterdir())  # a cancel removes the local build: only the bucket kept it

    # The first shard's input, rewritten with other bytes of the same size and time, keeps the dataset id; only a
    # build that takes that shard from the bucket instead of tokenizing it again matches an uninterrupted one.
    part0 = own.workspace.root / "inputs" / "part0.txt"
    original, stat = part0.read_bytes(), part0.stat()
    part0.write_bytes(original.replace(b"part 0", b"PART 0"))
    os.utime(part0, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    resumed = tokenize_dataset(own, request)
    assert not resumed.reused and resumed.path == f"{bucket}/{resumed.dataset_id}" and is_complete(resumed.path)
    assert object_version(fs.info(first)) == version  # not written again

    part0.write_bytes(original)
    os.utime(part0, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    local = tokenize_dataset(own, request.model_copy(update={"output": None}))
    assert local.dataset_id == resumed.dataset_id and not local.reused and local.shards == 4
    download_folder(resumed.path, tmp_path / "copy")
    assert cache_files(tmp_path / "copy") == cache_files(Path(local.path))


@pytest.mark.parametrize("bucket", ["gcs-emulator"], indirect=True)
def test_a_tokenize_output_that_is_not_an_allowed_bucket_is_refused_naming_output(bucket, small_corpus, tmp_path):
    own = ToolContext.open(tmp_path / "ws", allowed_paths=(small_corpus.parent, f"{bucket}/allowed"))
    for output, error, says in [
        ("datasets", InvalidInputError, "'datasets' is not a bucket URL: give gs://BUCKET/PREFIX"),
        ("file:///tmp/x", InvalidInputError, "'file:///tmp/x' is not a bucket URL"),
        (f"{bucket}/other", PathEscapeError, f"{bucket}/other is refused because it is under none of the allowed"),
    ]:
        with pytest.raises(error, match=f"argument 'output': {says}"):
            tokenize_dataset(own, TokenizeDatasetRequest(input=str(small_corpus), output=output))
    assert not list(own.workspace.datasets_dir.iterdir())
    fs, path = remote_fs(bucket)
    assert not fs.exists(path)


@pytest.mark.slow
@pytest.mark.parametrize("bucket", ["gcs-emulator"], indirect=True)
def test_a_run_in_a_bucket_is_continued_there_exactly_as_one_longer_run_and_keeps_its_files_there(
    bucket, unshared, dataset_id, tiny_run_settings
):
    settings = {**tiny_run_settings, **CONSTANT, "checkpoints": {"every_steps": 5}}
    straight, parent = (
        finish(unshared, launch_training(unshared, LaunchTrainingRequest(**request, **settings)).run_id)
        for request in ({"dataset": dataset_id, "steps": 10}, {"dataset": dataset_id, "steps": 5, "storage": bucket})
    )
    assert parent.status is JobStatus.SUCCEEDED, parent.log_tail
    with pytest.raises(InvalidInputError, match=r"argument 'storage': a run that continues .* \(this workspace\)"):
        launch_training(unshared, LaunchTrainingRequest(resume_from=straight.run_id, steps=20, storage=bucket))

    child = finish(
        unshared, launch_training(unshared, LaunchTrainingRequest(resume_from=parent.run_id, steps=10)).run_id
    )
    assert child.status is JobStatus.SUCCEEDED, child.log_tail
    assert (child.storage, child.summary.resumed_from_step) == (bucket, 5)
    assert losses(unshared, child.run_id) == losses(unshared, straight.run_id)
    assert get_run(unshared, RunRequest(run_id=straight.run_id)).storage is None

    # Its log, its report and a profile's trace go beside its checkpoints in the bucket.
    summarize_report(unshared, SummarizeReportRequest(run_id=child.run_id, sample=False))
    profile_run(unshared, ProfileRunRequest(run_id=child.run_id, steps=1))
    fs, path = remote_fs(run_url(bucket, child.run_id))
    log = RunLayout(unshared.workspace.run_dir(child.run_id)).log
    assert fs.cat_file(f"{path}/train.log") == log.read_bytes()
    assert fs.exists(f"{path}/report/{child.run_id}.md") and fs.exists(f"{path}/report/{child.run_id}.html")
    assert is_complete(f"{bucket.split('://')[0]}://{path}/profile")
