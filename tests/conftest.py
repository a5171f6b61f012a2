"""Fixtures shared across the suite: a workspace with a small real corpus and one finished tiny run."""

import itertools
import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from tradewind.cluster.tpus import TPU_COMPILE_ENV
from tradewind.core.workspace import COMPILE_CACHE_ENV

# The suite compiles the same tiny models in many tests: they share one persistent XLA cache (set before JAX is
# first imported).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="tradewind-test-xla-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# And the training jobs of the suite's many workspaces share one cache of their own, so that the tiny model
# compiles once, not once a workspace (a test of one workspace's cache unsets it).
os.environ.setdefault(COMPILE_CACHE_ENV, tempfile.mkdtemp(prefix="tradewind-test-jobs-xla-"))
# The suite compiles hundreds of small programs, each then run for a few steps, so XLA's CPU optimisations cost
# more than they save: at these flags the suite's tiny train step compiles in 1-3 s instead of 4-7 s and runs
# 1.3-1.5x slower (docs/reports/benchmarks.md, fourteenth session). The programs compute the same values up to
# rounding (the tests' tolerances are unchanged); users' runs compile with XLA's defaults. TPU compiles ignore the
# flags. `.ci/run` starts its Ray head with them, so that a replica on Ray compiles as a local process does.
os.environ["XLA_FLAGS"] = " ".join(
    dict.fromkeys(
        [
            "--xla_backend_optimization_level=0",
            "--xla_cpu_use_fusion_emitters=false",
            *os.environ.get("XLA_FLAGS", "").split(),
        ]
    )
)
# With libtpu installed (the `tpu` extra) JAX would look for a TPU: the suite runs on the CPU, and compiles TPU
# programs with libtpu's compile-only client, which must never ask a metadata server (test_trainer_compile.py).
os.environ.update({**TPU_COMPILE_ENV, **os.environ})

from tradewind.data import build_token_cache, builtin_corpus_path, load_tokenizer, read_documents
from tradewind.tools import (
    LaunchTrainingRequest,
    TokenizeDatasetRequest,
    ToolContext,
    WaitForRunRequest,
    launch_training,
    tokenize_dataset,
    wait_for_run,
)

pytest_plugins = ["bucket_servers"]  # the gs:// and s3:// servers the storage tests start

# CI's Ray head (`.ci/run` sets RAY_ADDRESS): only a test that asks for it (`ray_address`) sees it, so that every
# other test's runs take the local backend, as on a machine without Ray. Its address is kept under another name
# for the pytest-xdist workers, which start with this process's environment.
RAY_HEAD_ENV = "TRADEWIND_TEST_RAY_HEAD"
os.environ.setdefault(RAY_HEAD_ENV, os.environ.pop("RAY_ADDRESS", ""))

# Sampling workers a test starts (one per workspace) end a minute after their last request, not ten: the
# suite makes many workspaces, and each warm worker holds a JAX process.
os.environ.setdefault("TRADEWIND_SAMPLE_WORKER_IDLE_S", "60")
# And the fork servers that start the jobs' processes two minutes after their last job, not five.
os.environ.setdefault("TRADEWIND_FORK_SERVER_IDLE_S", "120")

# A 2-layer, 32-wide model that trains 30 steps in a few seconds on CPU.
TINY_MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64}
TINY_TRAINING = {
    "batch_size": 8,
    "seq_len": 32,
    "eval_every": 10,
    "eval_batches": 2,
    "log_every": 5,
    "optimizer": {"learning_rate": 1e-2, "warmup_steps": 5},
}


# Fixtures that train a model: a test asking for one trains (or waits on training), so it must be marked slow.
TRAINING_FIXTURES = frozenset(
    {"finished_run", "tiny_run", "tiny_setup", "gqa_run", "single_device_losses", "constant_run", "trained_ctx"}
)


def pytest_collection_modifyitems(config, items):
    """Refuse to run a test that uses a training fixture without `@pytest.mark.slow`, so that `-m "not slow"`
    stays the quick suite. Then put the files with the most slow tests first: `make test`'s two processes take
    whole files in this order (`--dist loadfile --no-loadscope-reorder`), so the long files start early and the
    quick ones even out the end, where one process would otherwise wait on the other's last long file."""
    unmarked = [
        item.nodeid
        for item in items
        if TRAINING_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("slow") is None
    ]
    if unmarked:
        raise pytest.UsageError("these tests train a model but are not marked slow: " + ", ".join(unmarked))
    slow_tests = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow_tests[item.path])  # stable: each file's tests stay together, in order


@pytest.fixture(scope="session")
def tiny_run_settings() -> dict:
    """`launch_training` arguments (less dataset and steps) for a run that takes seconds."""
    return {"model": TINY_MODEL, **TINY_TRAINING}


@pytest.fixture(scope="session")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """The first 600 speeches of Tiny Shakespeare (about 84 kB) as a plain-text file, one paragraph each."""
    documents = read_documents(builtin_corpus_path("tinyshakespeare"))
    speeches = [document.text for document in itertools.islice(documents, 600)]
    path = tmp_path_factory.mktemp("corpus") / "speeches.txt"
    path.write_text("\n\n".join(speeches) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def ctx(tmp_path_factory, small_corpus) -> ToolContext:
    """A tool context on a fresh workspace holding `corpus.txt`, whose runs default to the local backend
    (CI sets RAY_ADDRESS, which would send them to Ray; the Ray tests ask for it by name)."""
    context = ToolContext.open(tmp_path_factory.mktemp("workspace"))
    shutil.copy(small_corpus, context.workspace.root / "corpus.txt")
    (context.workspace.root / "settings.yaml").write_text("backend: local\n", encoding="utf-8")
    return context


@pytest.fixture(scope="session")
def dataset_id(ctx) -> str:
    return tokenize_dataset(ctx, TokenizeDatasetRequest(input="corpus.txt")).dataset_id


@pytest.fixture(scope="session")
def finished_run(ctx, dataset_id):
    """A tiny training run that has finished, launched and awaited through the Python tool API."""
    run = launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, model=TINY_MODEL, steps=30, **TINY_TRAINING))
    done = wait_for_run(ctx, WaitForRunRequest(run_id=run.run_id, timeout_s=240))
    assert done.status == "SUCCEEDED", done.log_tail
    return done


@pytest.fixture
def workspace(tmp_path, small_corpus) -> ToolContext:
    context = ToolContext.open(tmp_path / "ws")
    shutil.copy(small_corpus, context.workspace.root / "corpus.txt")
    folder = context.workspace.root / "jsonl"
    folder.mkdir()
    for part in range(2):
        rows = [json.dumps({"meta": {"body": f"part {part} document {i} " + "la " * i}}) for i in range(200)]
        rows.insert(5, "not json")
        (folder / f"p{part}.jsonl").write_text("\n".join(rows) + "\n")
    return context


@pytest.fixture(scope="session")
def trained_ctx(tmp_path_factory, small_corpus):
    """A workspace with one finished 10-step run, `r1`, of a tiny byte-level model."""
    from tradewind.runs import TrainConfig
    from tradewind.trainer import train  # here, not at the top: train loads JAX

    ctx = ToolContext.open(tmp_path_factory.mktemp("sampling") / "workspace")
    cache = ctx.workspace.root / "datasets" / "tiny"
    build_token_cache([small_corpus], cache, load_tokenizer("byte"))
    config = TrainConfig(
        dataset=str(cache),
        model={"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
        steps=10,
        batch_size=8,
        seq_len=32,
        eval_every=10,
        eval_batches=1,
        tensorboard=False,
    )
    train(config, ctx.workspace.run_dir("r1", must_exist=False))
    return ctx


@pytest.fixture(scope="session")
def ray_head() -> str:
    """The address of the Ray head `.ci/run` starts (with fake TPU resources: `TPU: 8`, `TPU-v5litepod-8-head: 1`)."""
    if not (address := os.environ[RAY_HEAD_ENV]):
        if os.environ.get("TRADEWIND_REQUIRE_RAY"):
            pytest.fail("RAY_ADDRESS is unset but TRADEWIND_REQUIRE_RAY is set: .ci/run should have started a Ray head")
        pytest.skip("RAY_ADDRESS is unset: start a head as .ci/run does to run the Ray tests")
    return address


@pytest.fixture
def ray_address(ray_head, monkeypatch) -> str:
    """The Ray head's address, set as RAY_ADDRESS for this test (and the processes it starts) alone."""
    monkeypatch.setenv("RAY_ADDRESS", ray_head)
    return ray_head
