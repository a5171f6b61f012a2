"""`completion/complete` through the real in-memory client: the ids each template and prompt argument takes."""

import os

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, PromptReference, ResourceTemplateReference

from tradewind.prompts import skill_names
from tradewind.runs import RunLayout, RunRecord, write_record
from tradewind.server import build_server
from tradewind.server.completion import COMPLETION_CHARS, MAX_ENTRIES, VALUE_CHARS
from tradewind.tools import TOOLS, ToolContext

pytestmark = pytest.mark.anyio


@pytest.fixture
def fresh(tmp_path) -> ToolContext:
    """An empty workspace of this test's own: the tests here fill its folders with ids."""
    return ToolContext.open(tmp_path / "ws")


def make_ids(folder, ids, suffix=""):
    """A folder (or, given `suffix`, a file) per id, the first the newest: their modification times a second apart,
    so that the order does not hang on the file system's clock."""
    folder.mkdir(parents=True, exist_ok=True)
    for age, name in enumerate(ids):
        path = folder / (name + suffix)
        if suffix:
            path.write_text("# report\n")
        else:
            path.mkdir()
        os.utime(path, ns=(0, (1_000_000 - age) * 10**9))


async def complete(server, ref, name, value):
    async with Client(server) as client:
        return (await client.complete(ref, {"name": name, "value": value})).completion


async def complete_error(server, ref, name, value) -> MCPError:
    async with Client(server) as client:
        with pytest.raises(MCPError) as caught:
            await client.complete(ref, {"name": name, "value": value})
    return caught.value


def template(uri):
    return ResourceTemplateReference(uri=uri)


async def test_run_ids_complete_newest_first_and_filtered_by_what_was_typed(fresh):
    make_ids(fresh.workspace.runs_dir, ["run-b2", "other", "run-a1", "run-b1"])  # newest first
    server = build_server(fresh)
    runs = template("tradewind://runs/{run_id}/metrics")
    every = await complete(server, runs, "run_id", "")
    typed = await complete(server, runs, "run_id", "run-b")
    assert every.values == ["run-b2", "other", "run-a1", "run-b1"] and every.total == 4 and every.has_more is False
    assert typed.values == ["run-b2", "run-b1"] and typed.total == 2 and typed.has_more is False


async def test_at_most_100_run_ids_complete_and_has_more_says_there_are_more(fresh):
    make_ids(fresh.workspace.runs_dir, [f"run-{n:03}" for n in reversed(range(120))])
    completion = await complete(build_server(fresh), template("tradewind://runs/{run_id}/logs"), "run_id", "run-")
    assert completion.values == [f"run-{n:03}" for n in reversed(range(20, 120))]
    assert completion.total == 120 and completion.has_more is True


async def test_dataset_sweep_and_report_ids_complete_newest_first(fresh):
    workspace = fresh.workspace
    make_ids(workspace.datasets_dir, ["ds-new", "ds-old"])
    (workspace.datasets_dir / ".ds-building.partial").mkdir()  # a build in progress is no dataset yet
    make_ids(workspace.sweeps_dir, ["sweep-2", "sweep-1"])
    make_ids(workspace.reports_dir, ["run-x", "compare-y"], suffix=".md")
    (workspace.reports_dir / "run-x.html").write_text("<p>the same report, as a page</p>")
    server = build_server(fresh)
    datasets = await complete(server, template("tradewind://datasets/{dataset_id}/manifest"), "dataset_id", "")
    sweeps = await complete(server, template("tradewind://sweeps/{sweep_id}"), "sweep_id", "sweep-")
    reports = await complete(server, template("tradewind://reports/{report_id}/plot"), "report_id", "")
    assert datasets.values == ["ds-new", "ds-old"]
    assert sweeps.values == ["sweep-2", "sweep-1"]
    assert reports.values == ["run-x", "compare-y"]


async def test_sweep_ids_complete_to_nothing_before_the_first_sweep(fresh):
    assert not fresh.workspace.sweeps_dir.exists()
    completion = await complete(build_server(fresh), template("tradewind://sweeps/{sweep_id}"), "sweep_id", "")
    assert completion.values == [] and completion.total == 0


async def test_skill_names_and_tool_names_complete_in_their_listed_order(fresh):
    server = build_server(fresh)
    skills = await complete(server, template("tradewind://skills/{name}"), "name", "")
    tools = await complete(server, template("tradewind://schema/{tool}"), "tool", "list_")
    assert skills.values == list(skill_names())
    assert tools.values == [tool.__name__ for tool in TOOLS if tool.__name__.startswith("list_")]
    assert len(tools.values) >= 2


async def test_a_read_only_server_completes_the_names_of_its_own_tools_only(fresh):
    completion = await complete(build_server(fresh, read_only=True), template("tradewind://schema/{tool}"), "tool", "")
    assert "get_run" in completion.values and "launch_training" not in completion.values


async def test_prompt_arguments_that_take_run_ids_complete_them(fresh):
    make_ids(fresh.workspace.runs_dir, ["run-3", "run-2", "run-1"])
    server = build_server(fresh)
    debug = await complete(server, PromptReference(name="debug-run"), "run_id", "run-")
    compare = await complete(server, PromptReference(name="compare-runs"), "run_ids", "run-3, run-")
    first = await complete(server, PromptReference(name="compare-runs"), "run_ids", "run-1")
    assert debug.values == ["run-3", "run-2", "run-1"]
    # The ids before the last comma are kept as typed; the one already named is not offered again.
    assert compare.values == ["run-3, run-2", "run-3, run-1"] and compare.total == 2
    assert first.values == ["run-1"]


async def test_plan_experiments_dataset_completes_dataset_ids_then_the_builtin_corpora(fresh):
    make_ids(fresh.workspace.datasets_dir, ["ds-1"])
    completion = await complete(build_server(fresh), PromptReference(name="plan-experiment"), "dataset", "")
    assert completion.values == ["ds-1", "builtin:tinyshakespeare"]


@pytest.mark.parametrize(
    ("ref", "argument"),
    [
        (PromptReference(name="plan-experiment"), "goal"),
        (PromptReference(name="scale-out"), "accelerator"),
    ],
)
async def test_an_argument_that_takes_no_id_completes_to_nothing(fresh, ref, argument):
    make_ids(fresh.workspace.runs_dir, ["run-1"])
    completion = await complete(build_server(fresh), ref, argument, "")
    assert completion.values == [] and completion.total == 0 and completion.has_more is False


@pytest.mark.parametrize(
    ("ref", "named"),
    [
        (PromptReference(name="no-such-prompt"), "unknown prompt 'no-such-prompt'"),
        (
            template("tradewind://runs/{run_id}/nowhere"),
            "unknown resource template 'tradewind://runs/{run_id}/nowhere'",
        ),
        (template("tradewind://runs/{run_id}"), "unknown resource template 'tradewind://runs/{run_id}'"),
    ],
)
async def test_a_prompt_or_template_the_server_does_not_list_is_an_invalid_params_error(fresh, ref, named):
    make_ids(fresh.workspace.runs_dir, ["run-1"])
    error = await complete_error(build_server(fresh), ref, "run_id", "")
    assert error.error.code == INVALID_PARAMS and named in error.error.message


@pytest.mark.parametrize(
    ("ref", "argument", "takes"),
    [
        (template("tradewind://runs/{run_id}/logs"), "dataset_id", "it takes: run_id"),
        (PromptReference(name="debug-run"), "run_ids", "it takes: run_id"),
        (template("tradewind://runs/{run_id}/logs"), "no_such_argument", "it takes: run_id"),
    ],
)
async def test_an_argument_the_prompt_or_template_does_not_take_is_an_invalid_params_error(fresh, ref, argument, takes):
    # Each of these names an argument that lists ids elsewhere (or none at all): none may complete here.
    make_ids(fresh.workspace.runs_dir, ["run-1"])
    make_ids(fresh.workspace.datasets_dir, ["ds-1"])
    error = await complete_error(build_server(fresh), ref, argument, "")
    assert error.error.code == INVALID_PARAMS and takes in error.error.message and argument in error.error.message


async def test_a_run_ids_value_of_10000_ids_is_refused_without_being_echoed(fresh):
    make_ids(fresh.workspace.runs_dir, [f"run-{n}" for n in range(5)])
    typed = ", ".join(f"old-{n}" for n in range(10_000)) + ", run-"
    error = await complete_error(build_server(fresh), PromptReference(name="compare-runs"), "run_ids", typed)
    assert error.error.code == INVALID_PARAMS and f"at most {VALUE_CHARS:,}" in error.error.message
    assert len(error.error.model_dump_json()) < 1_000


async def test_a_long_run_ids_value_completes_within_the_answers_budget(fresh):
    make_ids(fresh.workspace.runs_dir, [f"run-{n:03}" for n in reversed(range(120))])
    typed = "".join(f"{'r' * 120}-{n}, " for n in range(7)) + "run-"  # seven long ids, then the one being typed
    assert len(typed) <= VALUE_CHARS
    completion = await complete(build_server(fresh), PromptReference(name="compare-runs"), "run_ids", typed)
    assert 0 < len(completion.values) < 100 and completion.total == 120 and completion.has_more is True
    assert completion.values[0] == typed + "119" and len(completion.model_dump_json()) <= COMPLETION_CHARS + 100


async def test_a_folder_of_more_ids_than_max_entries_is_read_no_further(fresh):
    runs = fresh.workspace.runs_dir
    for n in range(MAX_ENTRIES + 50):
        (runs / f"run-{n:05}").mkdir()
    completion = await complete(build_server(fresh), template("tradewind://runs/{run_id}/logs"), "run_id", "")
    assert len(completion.values) == 100 and completion.total == MAX_ENTRIES and completion.has_more is True


async def test_run_ids_complete_by_when_each_run_was_made_not_when_its_folder_last_changed(fresh):
    # Made in this order, a sweep's three runs inside one second; then the oldest and the middle one are written
    # to (a report, a resumed attempt), which moves their folders' times past the newest's.
    made = [("run-20261206-101500-ffffffff", "10:15:00.100"), ("other", "10:15:00.200")]
    made += [("run-20261206-101500-00000000", "10:15:00.300")]
    for age, (run_id, time) in enumerate(made):
        layout = RunLayout(fresh.workspace.run_dir(run_id, must_exist=False))
        layout.root.mkdir(parents=True)
        write_record(layout.record, RunRecord(run_id=run_id, backend="process", created_at=f"2026-12-06T{time}+00:00"))
        os.utime(layout.root, ns=(0, (1_000_000 + [9, 8, 0][age]) * 10**9))
    make_ids(fresh.workspace.runs_dir, ["run-unfinished"])  # no record yet (or a damaged one): after the others
    completion = await complete(build_server(fresh), template("tradewind://runs/{run_id}/metrics"), "run_id", "")
    assert completion.values == [run_id for run_id, _ in reversed(made)] + ["run-unfinished"]
