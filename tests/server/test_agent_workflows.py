"""The skills' workflows as scripted agent sessions through the real MCP client.

Each test follows one skill in `tradewind/prompts/skills/` step by step (`run-first-experiment`,
`debug-a-diverging-run`, `compare-runs-and-report`, `train-on-tpu-with-ray`), taking every id, path and next
step only from what the calls return, the way an agent must; the filesystem is read only to check the
skill's outcome. Each session holds what an agent's context pays for: at most 12 tool calls, every result
within 8k tokens (32,000 characters: the whole answer, text and structured content; images apart) and no call
blocking over 60 s (`wait_for_run` is called again while it
times out, each call counted). Every test prints its counts.
"""

import math
import time
from pathlib import Path

import pytest
from mcp import Client
from mcp_helpers import answer_chars

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MAX_CALLS = 12
MAX_RESULT_CHARS = 32_000  # about 8k tokens
MAX_CALL_S = 60
WAIT_S = 45  # each wait_for_run call; called again while it times out

TINY_MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64}
TINY_TRAINING = {"batch_size": 8, "seq_len": 32, "eval_every": 10, "eval_batches": 2, "log_every": 5}


class Session:
    """An MCP client session that counts tool calls and measures each one's wall time and result size."""

    def __init__(self, client: Client, workflow: str):
        self.client = client
        self.workflow = workflow
        self.calls: list[tuple[str, float, int]] = []  # (tool, seconds, characters)

    async def call(self, name: str, arguments: dict) -> dict:
        """Call tool `name`; fail on an error result; return its structured content."""
        started = time.monotonic()
        result = await self.client.call_tool(name, arguments)
        seconds = time.monotonic() - started
        self.calls.append((name, seconds, answer_chars(result)))
        assert not result.is_error, f"{name} {arguments}: {result.content}"
        return result.structured_content

    async def wait(self, run_id: str) -> dict:
        """`wait_for_run` until the run ends, in calls of at most WAIT_S seconds (each counted)."""
        while (done := await self.call("wait_for_run", {"run_id": run_id, "timeout_s": WAIT_S}))["timed_out"]:
            assert len(self.calls) < MAX_CALLS, f"run {run_id} still {done['status']} at step {done['step']}"
        return done

    def check_budget(self) -> None:
        """Print the session's counts, then hold it to the budget."""
        largest = max(chars for _, _, chars in self.calls)
        longest = max(seconds for _, seconds, _ in self.calls)
        print(
            f"\n{self.workflow}: {len(self.calls)} tool calls, largest result {largest} chars, "
            f"longest call {longest:.1f} s ({', '.join(f'{name} {s:.1f} s' for name, s, _ in self.calls)})"
        )
        assert len(self.calls) <= MAX_CALLS, self.calls
        for name, seconds, chars in self.calls:
            assert chars <= MAX_RESULT_CHARS, f"{name} returned {chars} characters"
            assert seconds <= MAX_CALL_S, f"{name} blocked for {seconds:.1f} s"


def finite(values) -> bool:
    return all(value is not None and math.isfinite(value) for value in values)


async def test_run_first_experiment_ends_in_a_succeeded_run_whose_eval_loss_fell_and_its_report(server):
    async with Client(server) as client:
        agent = Session(client, "run-first-experiment")
        dataset = await agent.call("tokenize_dataset", {"input": "builtin:tinyshakespeare"})
        launched = await agent.call(
            "launch_training",
            {
                "dataset": dataset["dataset_id"],
                "model": TINY_MODEL,
                "steps": 30,
                **TINY_TRAINING,
                "optimizer": {"learning_rate": 1e-2, "warmup_steps": 5},
                "note": "first experiment",
            },
        )
        run_id = launched["run_id"]
        done = await agent.wait(run_id)
        assert done["status"] == "SUCCEEDED", done["log_tail"]
        metrics = await agent.call("read_metrics", {"run_id": run_id, "series": ["loss", "eval_loss"]})
        eval_losses = metrics["series"]["eval_loss"]["values"]
        assert len(eval_losses) >= 2 and eval_losses[-1] < eval_losses[0], eval_losses
        assert not [a for a in metrics["summary"]["anomalies"] if a["kind"] == "non_finite"], metrics["summary"]
        report = await agent.call("summarize_report", {"run_id": run_id})
    agent.check_budget()
    assert report["run_id"] == run_id and report["status"] == "SUCCEEDED"
    assert report["final_eval_loss"] == pytest.approx(eval_losses[-1], rel=1e-4)
    assert Path(report["report_path"]).is_file() and Path(report["html_path"]).is_file()
    assert report["report_uri"]


async def test_debug_a_diverging_run_relaunches_one_whose_loss_stays_finite_and_compares_them(server, dataset_id):
    async with Client(server) as client:
        agent = Session(client, "debug-a-diverging-run")
        settings = {"dataset": dataset_id, "model": TINY_MODEL, "steps": 20, **TINY_TRAINING, "log_every": 1}
        diverging = await agent.call(
            "launch_training", {**settings, "optimizer": {"learning_rate": 1e10, "warmup_steps": 0}}
        )
        bad_id = diverging["run_id"]
        await agent.wait(bad_id)
        failed = await agent.call("get_run", {"run_id": bad_id})
        assert failed["status"] == "FAILED" and failed["log_tail"], failed
        assert "non-finite" in failed["reason"] or "loss became" in failed["reason"], failed["reason"]
        logs = await agent.call("tail_logs", {"run_id": bad_id})
        assert logs["finished"] and logs["hints"], logs
        next_step = logs["hints"][0]["next_step"]
        assert "learning_rate" in next_step and "warmup_steps" in next_step, next_step
        metrics = await agent.call("read_metrics", {"run_id": bad_id, "series": ["loss", "grad_norm", "lr"]})
        # The curve ends where the run stopped; the row of the non-finite step was never written, and the
        # summary's anomalies name that step from the run's reason.
        assert metrics["summary"]["last_step"] < failed["total_steps"], metrics["summary"]
        stopped = [a for a in metrics["summary"]["anomalies"] if a["kind"] == "non_finite"]
        assert stopped and f"at step {stopped[0]['step']}" in failed["reason"], metrics["summary"]
        # The hint's fix: a far lower learning rate, with warmup, and the gradients clipped.
        relaunched = await agent.call(
            "launch_training",
            {
                **settings,
                "optimizer": {"learning_rate": 1e-2, "warmup_steps": 5, "grad_clip": 1.0},
                "parent_run": bad_id,
                "note": "lower learning rate after divergence",
            },
        )
        good_id = relaunched["run_id"]
        assert relaunched["parent_run"] == bad_id  # get_run and wait_for_run show the experiment's parent
        done = await agent.wait(good_id)
        assert done["status"] == "SUCCEEDED", done["log_tail"]
        confirmed = await agent.call("read_metrics", {"run_id": good_id, "series": ["loss", "grad_norm", "lr"]})
        comparison = await agent.call("compare_runs", {"run_ids": [bad_id, good_id], "metric": "loss"})
    agent.check_budget()
    assert finite([done["summary"]["final_loss"], done["summary"]["final_eval_loss"]]), done["summary"]
    assert finite(confirmed["series"]["loss"]["values"]) and confirmed["summary"]["last_step"] == 20
    assert not [a for a in confirmed["summary"]["anomalies"] if a["kind"] == "non_finite"], confirmed["summary"]
    assert comparison["config_differences"]["optimizer.learning_rate"] == {bad_id: 1e10, good_id: 1e-2}
    figures = {run["run_id"]: run for run in comparison["runs"]}
    assert [a for a in figures[bad_id]["anomalies"] if a["kind"] == "non_finite"], figures[bad_id]
    assert not [a for a in figures[good_id]["anomalies"] if a["kind"] == "non_finite"], figures[good_id]
    # At equal tokens (the few the diverged run logged before it stopped) the two may tie: never the diverged one.
    assert comparison["best_run"] in (None, good_id), comparison["values"]
    assert Path(comparison["report_path"]).is_file()


async def test_compare_runs_and_report_names_the_better_run_and_writes_the_report(server, dataset_id):
    async with Client(server) as client:
        agent = Session(client, "compare-runs-and-report")
        settings = {"dataset": dataset_id, "model": TINY_MODEL, "steps": 30, **TINY_TRAINING}
        run_ids = []
        for learning_rate in (1e-2, 1e-4):
            launched = await agent.call(
                "launch_training",
                {**settings, "optimizer": {"learning_rate": learning_rate, "warmup_steps": 5}},
            )
            run_ids.append(launched["run_id"])
        for run_id in run_ids:
            done = await agent.wait(run_id)
            assert done["status"] == "SUCCEEDED", done["log_tail"]
        comparison = await agent.call("compare_runs", {"run_ids": run_ids, "metric": "eval_loss"})
        report = await agent.call("summarize_report", {"run_ids": run_ids})
    agent.check_budget()
    assert list(comparison["config_differences"]) == ["optimizer.learning_rate"], comparison["config_differences"]
    assert comparison["best_run"] == run_ids[0], comparison["values"]  # 1e-2 beats 1e-4 in 30 steps
    assert comparison["at_tokens"] > 0 and set(comparison["values"]) == set(run_ids)
    assert Path(comparison["report_path"]).is_file()
    assert [run["run_id"] for run in report["runs"]] == run_ids
    assert Path(report["report_path"]).is_file() and Path(report["html_path"]).is_file()


@pytest.mark.ray
async def test_train_on_tpu_with_ray_ends_in_a_succeeded_run_on_the_slice(ray_address, server, dataset_id):
    # On `.ci/run`'s fake-TPU head the run is placed on its `TPU-v5litepod-8-head` and JAX trains on the CPU.
    async with Client(server) as client:
        agent = Session(client, "train-on-tpu-with-ray")
        status = await agent.call("cluster_status", {"backend": "ray"})
        ray = next(backend for backend in status["backends"] if backend["name"] == "ray")
        assert ray["available"], ray
        assert ray["capacity"].get("TPU", 0) >= 8, ray["capacity"]
        assert any(name.startswith("TPU-v5litepod-8") for name in ray["capacity"]), ray["capacity"]
        launched = await agent.call(
            "launch_training",
            {
                "dataset": dataset_id,
                "model": TINY_MODEL,
                "steps": 10,
                **TINY_TRAINING,
                "backend": "ray",
                "accelerator": "tpu-v5litepod-8",
            },
        )
        run_id = launched["run_id"]
        done = await agent.wait(run_id)
        run = await agent.call("get_run", {"run_id": run_id})
    agent.check_budget()
    assert done["status"] == "SUCCEEDED" == run["status"], done["log_tail"]
    assert (run["backend"], run["accelerator"], run["processes"]) == ("ray", "tpu-v5litepod-8", 1)
    assert run["step"] == 10 == run["total_steps"] and run["job_id"]
    assert run["platform"] == "cpu"  # the fake head has no TPU attached: JAX trains on the CPU there
