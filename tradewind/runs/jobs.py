"""What the training, sampling and profiling processes are given, as pydantic models that load no JAX.

A tool builds one of these jobs, passes it as the keyword arguments of a callable `JobSpec`, and the
process validates the same model again (`start.train_job`, `sample.sample_job`, `profile.profile_job`).
The options models are also the tools' request fields (`SampleTextRequest` inherits `SampleOptions`), so
each option and the description an agent reads are declared once. This module must stay free of JAX: the
MCP server imports it.

Example:
    job = SampleJob(run_dir="runs/r1", output_file="runs/r1/samples/s1.json", prompt="ROMEO:", max_tokens=50)
    JobSpec(name="sample r1", callable=SAMPLE_CALLABLE, kwargs=job.model_dump())
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tradewind.cluster.placement import Placement
from tradewind.core.files import write_confined
from tradewind.core.text import MULTILINE
from tradewind.runs.config import TrainConfig

TRAIN_CALLABLE = "tradewind.trainer.start:train_job"
SAMPLE_CALLABLE = "tradewind.trainer.sample:sample_job"
SAMPLE_WORKER_CALLABLE = "tradewind.trainer.sample_worker:sample_worker_job"
PROFILE_CALLABLE = "tradewind.trainer.profile:profile_job"
PROMPT_CHARS = 10_000  # a prompt's characters, and a chat's contents' together
CHAT_MESSAGES = 100


class TrainJob(BaseModel):
    """A training process's arguments: its run folder, the config to train and where its launch placed it."""

    model_config = ConfigDict(extra="forbid")

    run_dir: str = Field(description="The run folder (holding config.json and run.json).")
    config: TrainConfig
    placement: Placement = Field(default_factory=Placement)


# One chat turn. (No docstring: pydantic would list it in tools/list, which has a character budget.)
class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]  # `data.chat.ROLES`
    content: Annotated[str, MULTILINE] = Field(max_length=PROMPT_CHARS)


class SampleOptions(BaseModel):
    """How to sample: the prompt (or a chat to reply to), how many tokens, and the sampling filters.

    `messages` is rendered with the run's tokenizer's chat template and its generation prompt, and the reply
    is cut at its end of turn (the token the template ends a reply with, or EOS); it is exclusive with `prompt`.
    """

    model_config = ConfigDict(extra="forbid")

    prompt: Annotated[str, MULTILINE] = Field(default="", max_length=PROMPT_CHARS, description="Text to continue.")
    messages: list[ChatMessage] | None = Field(
        default=None,
        min_length=1,
        max_length=CHAT_MESSAGES,
        description="Chat turns to reply to, instead of prompt.",
    )
    max_tokens: int = Field(default=200, ge=1, le=4096)
    temperature: float = Field(default=0.8, ge=0, le=5, description="0: always the likeliest.")
    top_k: int = Field(default=0, ge=0, le=2**20, description="0: all tokens.")
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int = Field(default=0, ge=0, lt=2**32, description="Same seed, same text.")
    step: int | None = Field(default=None, ge=0, le=10**9, description="Checkpoint step; null: the newest.")

    @model_validator(mode="after")
    def _one_prompt(self) -> SampleOptions:
        if self.messages is None:
            return self
        if self.prompt:
            raise ValueError("give prompt or messages, not both")
        chars = sum(len(message.content) for message in self.messages)
        if chars > PROMPT_CHARS:
            raise ValueError(f"messages: {chars:,} characters of content in all; the limit is {PROMPT_CHARS:,}")
        return self


class SampleJob(SampleOptions):
    """A sampling process's arguments: the run to sample from, where the result goes, and the options."""

    run_dir: str = Field(description="The run folder whose checkpoints to sample from.")
    output_file: str = Field(description="Where the result (a `SampleOutput`) is written as JSON.")


def write_sample(job: SampleJob, text: str, path: str | None = None) -> None:
    """Write `text` to `path` (default: the job's output file) atomically, confined to the job's run folder: a
    symlink planted there (`samples/` leading out) is refused, not followed. The sampling job and the warm
    worker both write their results through it."""
    run_dir = Path(job.run_dir).resolve()
    write_confined(path or job.output_file, text.encode("utf-8"), roots=(run_dir,), argument="run_id")


class ExportJob(BaseModel):
    """An export the warm worker writes: a run's checkpoint as a Hugging Face folder (`hf.export_hf`)."""

    model_config = ConfigDict(extra="forbid")

    run_dir: str = Field(description="The run folder whose checkpoint to export.")
    out_dir: str = Field(description="An empty folder to write into.")
    peft: bool = Field(False, description="A LoRA run's adapters alone, as a PEFT folder.")


class SampleWorkerJob(BaseModel):
    """The warm sampling worker's arguments: the socket it answers on and how long it waits for a request."""

    model_config = ConfigDict(extra="forbid")

    socket_path: str = Field(description="Unix socket the worker listens on; it exits once the file is gone.")
    idle_s: float = Field(default=600, gt=0, le=86_400, description="Exit after this long without a request.")


class ProfileOptions(BaseModel):
    """How much of the training step to profile."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=5, ge=1, le=100)
    start_step: int = Field(default=2, ge=2, le=1000)


class ProfileJob(ProfileOptions):
    """A profiling process's arguments: the run whose `config.json` to profile, and the options."""

    run_dir: str = Field(description="The run folder; the summary and trace go to its `profile/`.")
