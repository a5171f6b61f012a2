"""The shipped experiments/*.yaml run as written: each loads as a launch, and its dataset resolves and holds a batch.

Each runs on one fresh workspace, as a new user's would be; the built-in corpus they name is tokenized
there once, by the first config, and reused by the rest.
"""

from pathlib import Path

import pytest

from tradewind.core import load_config
from tradewind.runs import open_run_data
from tradewind.tools import ToolContext
from tradewind.tools.launching import LaunchTrainingRequest, resolve_launch

EXPERIMENTS = sorted((Path(__file__).parents[1] / "experiments").glob("*.yaml"))


@pytest.fixture(scope="session")
def fresh_workspace(tmp_path_factory) -> ToolContext:
    return ToolContext.open(tmp_path_factory.mktemp("fresh-workspace"))


def test_the_experiments_folder_ships_configs():
    assert len(EXPERIMENTS) >= 5


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[path.stem for path in EXPERIMENTS])
def test_an_experiment_config_loads_and_its_dataset_fits_a_batch_on_a_fresh_workspace(path, fresh_workspace):
    config = resolve_launch(fresh_workspace, load_config(LaunchTrainingRequest, path)).config
    dataset = Path(config.dataset)
    data = open_run_data(config)  # raises if a split lacks a batch

    assert data.cache.path == dataset and dataset.is_relative_to(fresh_workspace.workspace.root)
    assert min(data.train.num_windows, data.val.num_windows) >= config.batch_size
