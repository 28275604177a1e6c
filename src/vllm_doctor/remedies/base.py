"""Types shared by every remedy."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_doctor.findings import Alternative, Fix  # noqa: F401  (the remedies' vocabulary)
from vllm_doctor.numbers import as_int


@dataclass
class RemedyContext:
    rule: Any                 # vllm_doctor.rules.catalog.Rule
    captures: dict[str, str]  # named captures of the evidence, first match wins
    matches: list[Any]        # vllm_doctor.engine.Match, in log order
    facts: Any                # vllm_doctor.facts.Facts
    command: Any              # vllm_doctor.command.Command or None

    def int_capture(self, name: str) -> int | None:
        return as_int(self.captures.get(name))

    def fact_int(self, *keys: str) -> int | None:
        for key in keys:
            value = as_int(self.facts.get(key))
            if value is not None:
                return value
        return None
