"""A launch's placement: read once into typed parts (backend, accelerator, hosts), each layer asking those parts.

Issue 24 measured the accelerator string parsed 7 times per launch in 11 files, and placement, retries and
ledger fields mixed into the trainer's config; these tests hold the typed split in place.
"""

import ast
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from tradewind.cluster import Placement, parse_accelerator, tpu_topology
from tradewind.cluster import placement as placement_module
from tradewind.cluster.backends import BACKENDS
from tradewind.cluster.placement import tpu_accelerator
from tradewind.runs import LedgerEntry, TrainConfig
from tradewind.tools.launching import LaunchTrainingRequest


def test_a_tpu_accelerator_knows_its_generation_chips_hosts_topology_hbm_and_peak():
    v5e = Placement(backend="ray", accelerator="tpu-v5e-16", slices=2).accelerator
    assert str(v5e) == "tpu-v5litepod-16"
    assert (v5e.generation, v5e.chips, v5e.hosts, v5e.topology) == ("v5e", 16, 4, "4x4")
    assert (v5e.hbm_bytes_per_chip, v5e.peak_bf16_flops) == (16 * 2**30, 197e12)
    v4 = parse_accelerator("tpu-v4-8")
    assert (v4.generation, v4.chips, v4.hosts, v4.topology) == ("v4", 4, 1, "2x2x1")
    gpus = parse_accelerator("gpu:2")
    assert (str(gpus), gpus.chips, gpus.hosts, gpus.hbm_bytes_per_chip) == ("gpu:2", 2, 1, None)
    assert str(parse_accelerator(" GPU ")) == "gpu" and str(parse_accelerator("cpu")) == "cpu"


def test_a_placement_gives_each_process_its_resources_and_counts_the_gang():
    two_slices = Placement(accelerator="tpu-v4-32", slices=2)
    resources = two_slices.resources()
    assert resources.accelerator is two_slices.accelerator  # the typed accelerator itself, not its name
    assert (resources.tpu.tpu_type, resources.slices, two_slices.processes, two_slices.chips) == ("v4-32", 2, 8, 32)
    assert Placement(accelerator="tpu-v5litepod-8").processes == 1
    assert Placement(accelerator="gpu:2", replicas=3).resources().gpus == 2
    assert Placement(accelerator="gpu:2", replicas=3).processes == 3
    assert Placement().resources().tpu is None and Placement().processes == 1
    assert tpu_topology("v5litepod-16") == (4, 4) and tpu_topology("v5p-128") == (16, 4)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"accelerator": "tpu-v9-8"}, "unknown TPU type 'v9-8'; known types: v4-8, "),
        ({"accelerator": "tpu-v5litepod-12"}, "unknown TPU type 'v5litepod-12'; known types: "),
        ({"accelerator": "npu"}, "unknown accelerator 'npu'; use 'cpu', 'gpu', 'gpu:N'"),
        ({"accelerator": "gpu:0"}, "asks for 0 GPUs"),
        ({"accelerator": "gpu", "slices": 2}, "slices=2 needs a TPU accelerator, not 'gpu'"),
        ({"accelerator": "tpu-v4-8", "replicas": 2}, "replicas: a TPU run gets one process per host"),
        ({"backend": "slurm"}, "Input should be 'local' or 'ray'"),
    ],
)
def test_a_bad_placement_is_refused_naming_what_is_accepted(fields, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        Placement(**fields)


def test_the_launch_request_is_the_trainer_config_the_placement_and_the_ledger_entry_and_nothing_else():
    config, placement, ledger = (set(model.model_fields) for model in (TrainConfig, Placement, LedgerEntry))
    assert not config & placement and not config & ledger and not placement & ledger
    assert set(LaunchTrainingRequest.model_fields) == config | placement | ledger
    assert set(BACKENDS) == {"local", "ray"}
    request = LaunchTrainingRequest(dataset="tiny", accelerator="tpu-v5e-8", backend="ray", note="wider", seed=3)
    assert request.placement() == Placement(accelerator="tpu-v5litepod-8", backend="ray")
    assert request.ledger_entry() == LedgerEntry(note="wider")
    assert request.train_values()["seed"] == 3 and "accelerator" not in request.train_values()


def test_the_accelerator_string_is_parsed_once_when_the_request_is_read(monkeypatch):
    calls = []
    parse = placement_module.parse_accelerator
    monkeypatch.setattr(placement_module, "parse_accelerator", lambda text: calls.append(text) or parse(text))
    request = LaunchTrainingRequest(dataset="tiny", accelerator="tpu-v5litepod-16", backend="ray")
    placement = request.placement()
    assert calls == ["tpu-v5litepod-16"]
    assert placement.accelerator is request.accelerator  # the parsed object travels; nothing reads the string
    assert request.model_dump(mode="json")["accelerator"] == "tpu-v5litepod-16"  # and is written as its name


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"kind": "gpu", "gpus": -3}, "give the accelerator as a string"),
        ({"kind": "tpu", "tpu_type": "bogus"}, "give the accelerator as a string"),
        ("gpu:99999999999999999999999", "with 1 <= N <= 1024"),
    ],
)
def test_an_accelerator_is_read_only_from_its_string_and_within_bounds(value, message):
    """A client may send an object where the schema says string: it must not skip the parsing's checks."""
    with pytest.raises(ValidationError, match=message):
        Placement(accelerator=value)


PACKAGE = Path(placement_module.__file__).parents[1]
# Methods that read a string by its start or pieces; an accelerator name given to one of them is being parsed.
STRING_READERS = {"startswith", "removeprefix", "partition", "split", "lstrip", "fullmatch", "match"}
ACCELERATOR_PREFIX = re.compile(r"^\^?(tpu|gpu)(-|:|$)")
# `TRADEWIND_HOST_TPU` names a TPU type (a slice-table key) and forgives a `tpu-` before it; it is read below
# `placement.py`, which imports it, so it cannot ask `parse_accelerator`.
HOST_TPU_OVERRIDE = "cluster/tpu_host.py"


def accelerator_parses(path: Path) -> list[str]:
    """Where `path` parses an accelerator string: a call of `parse_accelerator`, or a string method handed an
    accelerator prefix (`"tpu-"`, `"tpu"`, `"gpu:"`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        prefixes = [
            arg.value
            for arg in node.args
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and ACCELERATOR_PREFIX.match(arg.value)
        ]
        if name == "parse_accelerator" or (name in STRING_READERS and prefixes):
            found.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_but_the_placement_parses_an_accelerator_string():
    """The `Accelerator` travels typed from the request to the process (issue 39): nothing below the launch
    reads its string again, so a new accelerator form is taught to `placement.py` alone."""
    parses = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).as_posix() != "cluster/placement.py"
        for hit in accelerator_parses(path)
        if not hit.startswith(HOST_TPU_OVERRIDE)
    ]
    assert parses == []
    # and the check sees what it looks for
    seen = {hit.split(": ", 1)[1] for hit in accelerator_parses(Path(placement_module.__file__))}
    assert {"name.startswith('tpu-')", "name.removeprefix('tpu-')", "parse_accelerator(value)"} <= seen


def test_the_compile_commands_tpu_type_is_read_with_or_without_its_prefix():
    assert str(tpu_accelerator("v5e-16")) == str(tpu_accelerator(" TPU-v5litepod-16")) == "tpu-v5litepod-16"
    with pytest.raises(ValueError, match="unknown TPU type 'gpu'"):
        tpu_accelerator("gpu")
