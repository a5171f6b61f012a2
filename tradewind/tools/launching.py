"""The tool that launches training runs: `launch_training`, and the parts a new or continued run is made of.

A launch request is read once, where the tool receives it, into three typed parts (`resolve_launch`): the
trainer's `TrainConfig` (what the step needs, its dataset a folder), the `Placement` (backend, accelerator,
hosts, retries; `tradewind.cluster`) and the `LedgerEntry` (note, parent, sweep). The request model is those
three models' fields and nothing else, so the MCP schema, the CLI's YAML and Python take the same arguments.
The launch writes the run's folder `runs/<id>/` (its config and its record, `run.json`, see
`tradewind.runs.record`) and then submits its job to the backend the placement names. It is the only tool
that submits training jobs; `tradewind.tools.runs` watches and stops the runs it starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from tradewind.cluster import Backend, JobSpec, Placement
from tradewind.cluster.backends import BACKEND_TYPES
from tradewind.cluster.ledger import check_host_tpu
from tradewind.cluster.placement import this_host_tpu
from tradewind.cluster.tpu_host import describe_holders, host_tpu, lock_holders
from tradewind.cluster.warm import is_warm_process
from tradewind.core import (
    ConfigError,
    InvalidInputError,
    NotFoundError,
    TradewindError,
    describe_validation_error,
    make_id,
    parse_config,
)
from tradewind.core.buckets import ENDPOINT_SETTINGS, is_remote
from tradewind.runs import (
    TRAIN_CALLABLE,
    DistributedConfig,
    LedgerEntry,
    RunLayout,
    RunRecord,
    TrainConfig,
    TrainJob,
    job_end_callback,
    model_for_init_from,
    open_run_data,
    read_record,
    with_dataset_vocabulary,
)
from tradewind.tools.buckets import fetch_model, stage_in_bucket
from tradewind.tools.context import Progress, ToolContext, compile_cache_env, no_progress
from tradewind.tools.datasets import DATASET_HELP, resolve_dataset
from tradewind.tools.limits import active_runs, check_launch_limits, holds_devices_alone
from tradewind.tools.runs import RunInfo, RunRequest, checkpoint_steps, get_run, run_placement
from tradewind.tools.spec import tool
from tradewind.tools.tpu_fit import fit_slice

# What a continued run must share with its parent, so that its data order and results are those of one run.
INHERITED = ("dataset", "model", "seed", "batch_size", "seq_len", "init_from")


class LaunchTrainingRequest(LedgerEntry, Placement, TrainConfig):  # fields: TrainConfig's first
    # A launched run's processes find each other through its backend (replicas, slices); `distributed` is for a
    # gang started by hand, so it is no argument here.
    distributed: SkipJsonSchema[DistributedConfig] = Field(default_factory=DistributedConfig, exclude=True)
    dataset: str | None = Field(default=None, description=DATASET_HELP)
    # Set by the sweep that launches a run (Python), not by an agent.
    sweep_id: SkipJsonSchema[str | None] = None

    @field_validator("distributed", mode="before")
    @classmethod
    def _not_by_hand(cls, value: Any) -> Any:
        raise ValueError(
            "not a launch_training argument: a launched run's processes find each other through its backend "
            "(ask for more with replicas, or slices on TPU); 'distributed' is for a gang started by hand"
        )

    @model_validator(mode="after")
    def _dataset_or_parent(self) -> LaunchTrainingRequest:
        if self.dataset is None and self.resume_from is None:
            raise ValueError("give 'dataset' (or 'resume_from' to continue a run on its dataset)")
        return self

    def placement(self) -> Placement:
        """The placement this request asks for; its accelerator as parsed when the request was read."""
        return Placement(**{name: getattr(self, name) for name in Placement.model_fields})

    def ledger_entry(self) -> LedgerEntry:
        return LedgerEntry(**{name: getattr(self, name) for name in LedgerEntry.model_fields})

    def train_values(self, **options: Any) -> dict[str, Any]:
        """The request's `TrainConfig` fields as JSON values (`options` as for `model_dump`)."""
        return self.model_dump(mode="json", include=set(TrainConfig.model_fields), **options)


@dataclass(frozen=True)
class Launch:
    """A launch request resolved into what each layer takes: the trainer's config (its dataset, init_from
    and resume_from folders), where it runs, and what the ledger records; and the run it continues, if any,
    with the step of that run's checkpoint it starts from."""

    config: TrainConfig
    placement: Placement
    ledger: LedgerEntry
    parent: str | None = None
    parent_step: int | None = None
    accelerator_note: str | None = None


@tool("Launch a training run", open_world=True, links=("config", "logs"))
def launch_training(ctx: ToolContext, request: LaunchTrainingRequest, progress: Progress = no_progress) -> RunInfo:
    """Train a model on a token cache; returns at once. Use it after tokenize_dataset, then
    wait_for_run.

    The run trains as a job on the backend it names (local processes, or a Ray cluster with GPUs or TPU
    slices); stop it with cancel_run. A run killed from outside
    restarts from its newest checkpoint (max_retries). resume_from continues a run for more steps as a new
    run. `sweep_id` (Python only) marks a run a sweep launched, for the ledger.
    A small model on this machine's CPU trains at several thousand tokens per second
    (a 1.3M-parameter model: about 3 steps of 16 x 128 tokens per second on 2 cores).
    """
    launch = resolve_launch(ctx, request, progress)
    config, placement = launch.config, launch.placement
    check_wandb(config.wandb_project)
    data = open_run_data(config)  # fail now, not minutes later in the training process, if one batch does not fit
    backend_type = BACKEND_TYPES[placement.backend]  # its settings, before connecting to it
    active = active_runs(ctx)
    vocab_size = data.cache.manifest.tokenizer.vocab_size
    on_this_machine = backend_type.on_this_machine
    check_launch_limits(
        ctx, config, placement, vocab_size=vocab_size, on_this_machine=on_this_machine, active_runs=active
    )
    alone = holds_devices_alone(config, on_this_machine)
    notes = [launch.accelerator_note]
    if placement.accelerator.kind == "tpu":  # refused at once where it cannot train, before a cluster is asked
        if on_this_machine:
            check_this_host_tpu(placement, ctx.job_backend(placement.backend))
        fit = fit_slice(ctx, config, placement, vocab_size, progress)
        config = fit.config
        notes.append(fit.note(placement))
    accelerator_note = "; ".join(note for note in notes if note) or None
    backend = ctx.job_backend(placement.backend)

    run_id = make_id("run")
    layout = RunLayout(ctx.workspace.run_dir(run_id, must_exist=False))
    ctx.workspace.make_dir(layout.root, argument="run_id")
    ctx.workspace.write_atomic(layout.config, config.model_dump_json(indent=2), argument="run_id")
    record = RunRecord(
        **launch.ledger.model_dump(),
        run_id=run_id,
        backend=backend.name,
        job_id=run_id,
        address=getattr(backend, "address", None),
        placement=placement,
        processes=placement.processes,
        parent=launch.parent,
        parent_step=launch.parent_step,
        concurrent_runs=len(active),
        accelerator_note=accelerator_note,
    )
    ctx.workspace.write_atomic(layout.record, record.model_dump_json(indent=2), argument="run_id")
    if accelerator_note:  # the run's log starts by saying where it trains and why there, and what was changed to fit
        ctx.workspace.write_atomic(layout.log, f"tradewind: {accelerator_note}\n", argument="run_id")
    run_dir, job_config = str(layout.root), config
    try:
        if placement.storage is not None:
            run_dir, job_config = stage_in_bucket(ctx, placement.storage, layout, config, progress)
    except BaseException:
        shutil.rmtree(layout.root)
        raise
    spec = JobSpec(
        name=f"train {run_id}",
        callable=TRAIN_CALLABLE,
        kwargs=TrainJob(run_dir=run_dir, config=job_config, placement=placement).model_dump(mode="json"),
        log_path=str(layout.log),
        # a run on a time budget holds every CPU of this machine, so that no other job starts beside it
        resources=placement.resources(cpus=backend.capacity.cpus / placement.processes if alone else 1.0),
        replicas=placement.processes,
        env=training_env(ctx, placement, backend),
        max_retries_preemption=placement.max_retries,
        on_end=job_end_callback(layout.record),
        pending_timeout_s=placement.pending_timeout_s or backend.default_pending_timeout_s,
    )
    try:
        backend.submit(spec, job_id=run_id)
    except TradewindError:
        shutil.rmtree(layout.root)  # refused before anything was queued: leave no run behind
        raise
    return get_run(ctx, RunRequest(run_id=run_id))


def training_env(ctx: ToolContext, placement: Placement, backend: Backend) -> dict[str, str]:
    """The environment of a job that trains on `placement` (a run, estimate_run's probe, profile_run's job).

    A CPU run stays on the CPU even where JAX would find an accelerator (or is told JAX_PLATFORMS=cuda); a TPU
    run on this host lets JAX find the chips, whatever this process was told. A job on this machine reuses the
    workspace's compiled programs (JAX's persistent cache, bounded by settings.yaml's `compile_cache_gb`: a
    shape trained before compiles in a fraction of the time); only this machine reads that folder, so a Ray job
    does not, nor a run whose processes share no disk (`storage`), which gets the launcher's bucket endpoints
    instead."""
    env = {"JAX_PLATFORMS": "cpu"} if placement.accelerator.kind == "cpu" else {}
    if placement.accelerator.kind == "tpu" and backend.on_this_machine:
        env["JAX_PLATFORMS"] = ""  # JAX's own choice: the host's chips (this server keeps itself off them)
    if placement.storage is not None:
        env.update({name: os.environ[name] for name in ENDPOINT_SETTINGS if name in os.environ})
    if backend.on_this_machine and placement.storage is None:  # a run in a bucket shares no folder
        env.update(compile_cache_env(ctx))
    return env


def check_this_host_tpu(placement: Placement, backend: Backend) -> None:
    """Refuse at once a TPU run this host cannot train: chips it does not have (a slice of several hosts, another
    type), or chips held by a process that is not one of the backend's own jobs (those queue it) nor its warm
    process (which runs it), which would fail its start with libtpu's lock-file error.

    Raises:
        InvalidInputError: naming the chips asked for and the host's, or the holder, the lock file and what to do.
    """
    check_host_tpu(placement.resources(), backend.capacity, "the run")
    running = backend.cluster_status().running
    ours = {pid for record in running if record.spec.resources.tpu for pid in record.pids}
    jobs_dir = getattr(backend, "jobs_dir", None)
    outside = [
        (pid, command)
        for pid, command in lock_holders()
        if pid not in ours and not (jobs_dir and is_warm_process(pid, jobs_dir))
    ]
    if outside:
        raise InvalidInputError(f"argument 'accelerator': {placement.accelerator}: {describe_holders(outside)}")


def resolve_launch(ctx: ToolContext, request: LaunchTrainingRequest, progress: Progress = no_progress) -> Launch:
    """`request` as its typed parts, with the dataset, init_from, parent_run and resume_from resolved to runs
    and folders; a continued run (resume_from) takes its parent's config and placement where the request is
    silent.

    Raises:
        NotFoundError, InvalidInputError, PathEscapeError: a dataset, folder or run that is not there or not
            allowed, or a continuation that would change what it must keep; the message names the argument.
    """
    ledger = request.ledger_entry()
    if ledger.parent_run is not None:
        ledger.parent_run = run_folder(ctx, ledger.parent_run, "parent_run").name
    if request.resume_from is not None:
        launch = _continued_launch(ctx, request, ledger, progress)
    else:
        launch = _new_launch(ctx, request, ledger, progress)
    storage = launch.placement.storage
    if launch.parent is None:  # a continued run lives where its parent does (_continued_launch)
        storage = storage or ctx.settings().storage
    if storage is not None:
        ctx.check_bucket(storage, "storage")
    backend = launch.placement.backend or ctx.default_backend()
    placement = launch.placement.model_copy(update={"backend": backend, "storage": storage})
    note = None
    chose = "accelerator" not in request.model_fields_set and placement.replicas == 1  # (replicas: CPU processes)
    if chose and launch.parent is None and backend == "local" and host_tpu():
        placement = placement.model_copy(update={"accelerator": this_host_tpu()})
        note = (
            f"accelerator {placement.accelerator}: this host's TPU, the default on a TPU host "
            "(give accelerator 'cpu' to train on its CPU)"
        )
    return replace(launch, placement=placement, accelerator_note=note)


def _new_launch(ctx: ToolContext, request: LaunchTrainingRequest, ledger: LedgerEntry, progress: Progress) -> Launch:
    values = request.train_values()
    if request.init_from is not None:  # before the dataset, which may take a tokenization to resolve
        if is_remote(request.init_from):  # (`hf:PATH` is PATH already: `TrainConfig` drops the prefix)
            folder = fetch_model(ctx, request.init_from, progress)
        else:
            folder = ctx.workspace.resolve_input(request.init_from, argument="init_from")
            ctx.workspace.check_tree(folder, argument="init_from")  # read whole by the trainer
        values["init_from"] = str(folder)
        values["model"] = model_for_init_from(request.model, request.model.model_fields_set, folder).model_dump()
    values["dataset"] = str(resolve_dataset(ctx, request.dataset, progress))
    return Launch(with_dataset_vocabulary(TrainConfig.model_validate(values)), request.placement(), ledger)


def _continued_launch(
    ctx: ToolContext, request: LaunchTrainingRequest, ledger: LedgerEntry, progress: Progress
) -> Launch:
    """The launch of a run that continues `request.resume_from`: the parent's config and placement, with the
    fields the request sets; those that fix the data order and the model must stay as they were."""
    parent_dir = run_folder(ctx, request.resume_from, "resume_from")
    _check_parent_ended(ctx, parent_dir)
    parent = read_run_config(ctx, parent_dir, argument="resume_from")
    overrides = request.train_values(exclude_unset=True, exclude={"resume_from"})
    if "dataset" in overrides:
        overrides["dataset"] = str(resolve_dataset(ctx, overrides["dataset"], progress))
    inherited = parent.model_dump(mode="json")
    merged = _merge(inherited, overrides)
    for name in INHERITED:
        if merged[name] != inherited[name]:
            raise InvalidInputError(
                f"argument {name!r}: a run that continues {parent_dir.name} keeps its {name} "
                f"({inherited[name]!r}); leave it out, or launch a new run instead"
            )
    saved = checkpoint_steps(ctx, RunLayout(parent_dir), argument="resume_from")
    if not saved:
        raise NotFoundError(f"argument 'resume_from': run {parent_dir.name} has no checkpoint to continue from")
    merged["resume_from"] = str(parent_dir)
    if merged.get("lora") is None:  # the weights come from the parent's checkpoint
        merged["init_from"] = None  # (a LoRA run's checkpoints hold only its adapters: its base comes from init_from)
    config = with_dataset_vocabulary(TrainConfig.model_validate(merged))
    total = config.total_steps  # None for a time budget: it goes on for its seconds, whatever its steps
    if total is not None and total <= saved[-1]:
        budget = config.budget
        asked = f"{total}" if budget.kind == "steps" else f"{budget.describe()} ({total} steps)"
        example = f" (e.g. steps={saved[-1] * 2})" if budget.kind == "steps" else ""
        raise InvalidInputError(
            f"argument {budget.field!r}: {asked} is the new run's total and must exceed the {saved[-1]} steps of "
            f"{parent_dir.name}'s newest checkpoint{example}"
        )
    inherited_placement = run_placement(ctx, parent_dir, "resume_from")
    placement = Placement(  # validated again: a request's slices may not suit the parent's accelerator
        **{
            name: getattr(request if name in request.model_fields_set else inherited_placement, name)
            for name in Placement.model_fields
        }
    )
    if placement.storage != inherited_placement.storage:  # its processes read the parent's checkpoints there
        raise InvalidInputError(
            f"argument 'storage': a run that continues {parent_dir.name} lives where it does "
            f"({inherited_placement.storage or 'this workspace'}); leave storage out, or launch a new run instead"
        )
    return Launch(config, placement, ledger, parent_dir.name, saved[-1])


def rerun_arguments(ctx: ToolContext, run_id: str, *, seed: int, argument: str) -> dict[str, Any]:
    """launch_training's arguments that rerun run `run_id`'s config and placement with `seed`, as a rerun of it
    (its parent_run, no other change), for request argument `argument`.

    Raises:
        InvalidInputError: the run's config cannot be launched again (made by an older Tradewind); the message
            names its file and fields.
    """
    folder = run_folder(ctx, run_id, argument)
    layout = RunLayout(folder)
    with ctx.workspace.open(layout.config, "r", argument=argument) as file:
        arguments = json.load(file)
    if arguments.get("resume_from") is not None:
        raise InvalidInputError(
            f"argument {argument!r}: run {folder.name} continues {Path(arguments['resume_from']).name}, and a "
            "continuation keeps its parent's seed; rerun the run it continues, or a new run of the same config"
        )
    arguments.pop("distributed", None)  # a launch finds its processes through its backend
    placement = run_placement(ctx, folder, argument).model_dump(mode="json", exclude_defaults=True)
    arguments.update(placement, seed=seed, parent_run=folder.name, note=f"rerun of {folder.name} (seed {seed})")
    try:
        LaunchTrainingRequest.model_validate(arguments)
    except ValidationError as error:
        raise InvalidInputError(
            f"argument {argument!r}: run {folder.name}'s config cannot be rerun: "
            + describe_validation_error(error, str(layout.config))
        ) from None
    return arguments


def run_folder(ctx: ToolContext, value: str, argument: str) -> Path:
    """The folder of the run `value` (an id, or a path) names, for request argument `argument`.

    Raises:
        NotFoundError: no such run; the message names `argument`.
        PathEscapeError, InvalidInputError: as `Workspace.run_folder`.
    """
    try:
        return ctx.workspace.run_folder(value, argument=argument)
    except NotFoundError as error:
        raise NotFoundError(f"argument {argument!r}: {error}") from None


def check_wandb(project: str | None) -> None:
    """Refuse a W&B project where the run could not log to it: without the `wandb` extra the trainer would
    skip W&B with a log line nobody reads, and the run would not be where the caller will look for it.

    Raises:
        InvalidInputError: naming `wandb_project` and how to install the extra.
    """
    # find_spec looks for the package without importing it (wandb takes seconds to import).
    if project is not None and importlib.util.find_spec("wandb") is None:
        raise InvalidInputError(
            "argument 'wandb_project': W&B logging needs the wandb package, which is not installed where this "
            "server runs; install it (pip install 'tradewind[wandb]') and restart, or leave wandb_project out"
        )


def _check_parent_ended(ctx: ToolContext, parent_dir: Path) -> None:
    """Refuse to continue a run that is still pending or running: it still writes its checkpoints (and, past
    `keep_last`, deletes them), so two runs would train one lineage from files that change under them."""
    layout = RunLayout(parent_dir)
    if not os.path.lexists(layout.record):
        return  # a folder trained by hand or copied here: no job of ours writes it
    if parent_dir.parent == ctx.workspace.runs_dir:
        status = get_run(ctx, RunRequest(run_id=parent_dir.name)).status  # the record checked against its job
    else:
        status = read_record(layout.record, ctx.workspace.reader("resume_from")).status
    if not status.finished:
        raise InvalidInputError(
            f"argument 'resume_from': run {parent_dir.name} is {status.value}, and a run can be continued only once "
            "it has ended (it still writes and rotates the checkpoints a continued run would start from); "
            "wait_for_run until it ends, or cancel_run it first"
        )


def read_run_config(ctx: ToolContext, run_dir: Path, argument: str) -> TrainConfig:
    """The `config.json` of the run folder `run_dir`, read through the workspace (no link in the run leads out).

    Raises:
        NotFoundError: the run has no config.
        PathEscapeError: its config is a symlink leading outside the workspace and the allowed roots.
        ConfigError: it does not validate; the message names the file and each bad field.
    """
    path = RunLayout(run_dir).config
    with ctx.workspace.open(path, "r", argument=argument) as file:
        text = file.read()
    try:
        values = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from None
    return parse_config(TrainConfig, values, source=str(path))


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` laid over it, section by section."""
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged
