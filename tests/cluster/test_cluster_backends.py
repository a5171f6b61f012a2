"""`get_backend` builds every backend, and every backend offers the `Backend` protocol."""

import inspect
import subprocess
import sys

import pytest

from tradewind.cluster import Backend, LocalBackend, RayBackend, get_backend
from tradewind.core import InvalidInputError


def test_backends_are_chosen_by_name(tmp_path):
    assert isinstance(get_backend("local", tmp_path / "jobs"), LocalBackend)
    with pytest.raises(InvalidInputError, match="unknown backend 'slurm'"):
        get_backend("slurm", tmp_path / "jobs")


def test_ray_without_an_address_is_refused_rather_than_started_in_this_process(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(InvalidInputError, match="'ray' needs a Ray cluster: set RAY_ADDRESS"):
        get_backend("ray", tmp_path / "jobs")


def test_ray_without_the_extra_installed_is_refused_naming_the_extra(tmp_path):
    # A separate interpreter where `import ray` fails, as it does without the `ray` extra.
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from tradewind.cluster import get_backend\n"
        "from tradewind.core import InvalidInputError\n"
        "try:\n"
        f"    get_backend('ray', {str(tmp_path / 'jobs')!r}, '127.0.0.1:1')\n"
        "except InvalidInputError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "argument 'backend': Ray is not installed (pip install 'tradewind[ray]')"


@pytest.mark.parametrize("backend_class", [LocalBackend, RayBackend])
def test_every_backend_takes_the_protocols_arguments(backend_class):
    for name, method in inspect.getmembers(Backend, inspect.isfunction):
        if name.startswith("_"):
            continue
        wanted = list(inspect.signature(method).parameters)
        offered = list(inspect.signature(getattr(backend_class, name)).parameters)
        assert offered[: len(wanted)] == wanted, f"{backend_class.__name__}.{name}{offered} vs {wanted}"
    assert isinstance(backend_class.name, str)
