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


Edit = SetFlag | RemoveFlag | SetEnv | DockerOption
