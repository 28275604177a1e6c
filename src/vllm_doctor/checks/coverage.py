"""What the checks of `check` hand on: a Prediction (the message vLLM would print, for a rule) and a CheckRun
(whether a check ran, and why not, for the report's coverage)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Prediction:
    rule: str
    message: str                     # what vLLM would print
    captures: dict[str, str] = field(default_factory=dict)
    confidence: str = "high"
    facts: dict[str, Any] = field(default_factory=dict)
    severity: str | None = None      # None: the rule's own


@dataclass(frozen=True)
class CheckRun:
    """One check of `check`, for the report's coverage: whether it ran, and why not."""
    label: str
    ran: bool
    why: str = ""                    # why it could not run
    essential: bool = False          # could not run -> "could not check", never "no failure predicted"

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.label, "ran": self.ran, "why": self.why or None, "essential": self.essential}


NO_CONFIG = "no model config (pass --model DIR, or have the model in the Hugging Face cache)"
NO_GPUS = "no GPU facts (no NVML here: pass --facts SNAPSHOT, or --gpus N --gpu-memory GiB)"
NO_GPUS_NOT_LOOKED = "no GPU facts (--no-live: pass --facts SNAPSHOT, or --gpus N --gpu-memory GiB)"
NO_GPUS_IN_SNAPSHOT = "no GPU facts (the snapshot lists no GPU: take it on the GPU host, or pass --gpus N --gpu-memory GiB)"
