"""Structured edits a remedy asks for; the command model applies them in the user's own launch shape."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SetFlag:
    flag: str                 # canonical long form, e.g. "--tensor-parallel-size"
    value: str | None = None  # None: a boolean switch such as --enforce-eager


@dataclass(frozen=True)
class RemoveFlag:
    flag: str


@dataclass(frozen=True)
class SetEnv:
    name: str
    value: str


@dataclass(frozen=True)
class DockerOption:
    name: str                 # e.g. "--shm-size", "--ipc", "--gpus"
    value: str | None = None


@dataclass(frozen=True)
class DropLauncher:
    """Remove launcher words (`vllm serve`, `python3 -m vllm.entrypoints.openai.api_server`) typed after a
    container image whose entrypoint already runs the server; a note and no change in other shapes."""


@dataclass(frozen=True)
class SetModel:
    """The model, written the way this launch shape takes it: the first positional argument of
    `vllm serve` (any `--model` removed), `--model VALUE` for the api_server module (and old images),
    `model="VALUE"` in LLM(...)."""
    value: str


Edit = SetFlag | RemoveFlag | SetEnv | DockerOption | DropLauncher | SetModel
