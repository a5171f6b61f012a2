"""The trainer package and the runs layer load without JAX, and the trainer's lazy names resolve to the real
objects."""

import inspect
import subprocess
import sys


def test_importing_the_trainer_package_and_every_runs_module_does_not_import_jax():
    code = (
        "import sys, tradewind.trainer, tradewind.trainer.cli, tradewind.runs, tradewind.runs.compile, "
        "tradewind.runs.estimate, tradewind.runs.reference, tradewind.runs.sample_client\n"
        "print([m for m in ('jax', 'flax', 'optax', 'orbax') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_exported_name_resolves_and_train_stays_the_function_after_its_module_loads():
    # Loading the submodules (as `python -m` and internal imports do) must not shadow the lazy names.
    import tradewind.trainer
    import tradewind.trainer.loop
    import tradewind.trainer.profile

    for name in tradewind.trainer.__all__:
        assert getattr(tradewind.trainer, name) is not None, name
    from tradewind.trainer import profile_training, train

    assert inspect.isfunction(train) and train.__name__ == "train"
    assert inspect.isfunction(profile_training)
