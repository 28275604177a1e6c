"""What a remedy gets: the rule, its evidence, the facts and the launch command, with the accessors every
remedy family reads them through (one toolkit, so no family borrows another's private helpers).

Capture and pattern names are passed as string literals (`ctx.capture("tp")`, `ctx.has_pattern("watchdog")`):
a test reads them out of the remedies and checks that each one exists in the rule's TOML.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from vllm_doctor.facts import gpus as _gpus
from vllm_doctor.facts.shape import ModelShape
from vllm_doctor.numbers import as_float, as_int

IMAGE_VERSION = re.compile(r"vllm/vllm-openai:v?(\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)")

if TYPE_CHECKING:
    from vllm_doctor.command.model import Command
    from vllm_doctor.facts import Facts
    from vllm_doctor.findings import Match
    from vllm_doctor.rules.catalog import Rule


@dataclass
class RemedyContext:
    rule: Rule
    captures: dict[str, str]    # the finding's captures: fatal matches first, then supporting ones
    matches: list[Match]        # the rule's matches, in log order
    facts: Facts
    command: Command | None     # the launch command model (None when there is none)

    # ---- evidence ------------------------------------------------------------------------------
    def capture(self, name: str) -> str | None:
        """The finding's capture `name`, else the first match (in log order) that captured it."""
        value = self.captures.get(name)
        if value is not None:
            return value
        return next((m.captures[name] for m in self.matches if m.captures.get(name) is not None), None)

    def capture_int(self, name: str) -> int | None:
        return as_int(self.capture(name))

    def capture_float(self, name: str) -> float | None:
        return as_float(self.capture(name))

    def captures_all(self, name: str) -> list[str]:
        """Every match's value of capture `name`, in log order."""
        values = [m.captures[name] for m in self.matches if m.captures.get(name) is not None]
        if not values and self.captures.get(name) is not None:
            values.append(self.captures[name])
        return values

    @property
    def pattern_names(self) -> set[str]:
        return {m.pattern.name for m in self.matches}

    def has_pattern(self, *names: str) -> bool:
        """Whether any match came from one of these patterns."""
        return any(m.pattern.name in names for m in self.matches)

    def matches_named(self, *names: str) -> list[Match]:
        return [m for m in self.matches if m.pattern.name in names]

    @property
    def lines(self) -> list[str]:
        """The evidence lines' raw text, in log order (for the rare remedy that must read text)."""
        return [m.line.raw for m in self.matches]

    # ---- facts ---------------------------------------------------------------------------------
    def fact(self, *keys: str, default: Any = None) -> Any:
        """The first of these facts that is known."""
        for key in keys:
            value = self.facts.get(key)
            if value is not None:
                return value
        return default

    def fact_int(self, *keys: str) -> int | None:
        return next((v for v in (as_int(self.facts.get(k)) for k in keys) if v is not None), None)

    def fact_float(self, *keys: str) -> float | None:
        return next((v for v in (as_float(self.facts.get(k)) for k in keys) if v is not None), None)

    # ---- launch arguments ----------------------------------------------------------------------
    def flag(self, flag: str) -> Any:
        """The launch command's own value of `flag` (see Command.get: str, True for a switch, False when
        negated), or None without a command or without the flag."""
        return None if self.command is None else self.command.get(flag)

    def arg(self, name: str) -> Any:
        """A launch argument by its snake_case dest ("tensor_parallel_size"). One precedence everywhere:
        the launch command's own flag (`--tensor-parallel-size`, aliases understood) first, then the
        `args.<name>` fact (the arguments the log printed), else None. "", "none" and "null" are None."""
        value = self.flag("--" + name.replace("_", "-"))
        if value is None:
            value = self.facts.get("args." + name)
        if isinstance(value, str) and value.strip().lower() in ("", "none", "null"):
            return None
        return value

    def arg_int(self, name: str) -> int | None:
        return as_int(self.arg(name))

    def arg_float(self, name: str) -> float | None:
        return as_float(self.arg(name))

    def env(self, name: str) -> str | None:
        """An environment variable as the server would see it: the command's own assignments (its
        `NAME=V` prefix, or a container's `-e` options), then the environment facts (`env.vars`)."""
        if self.command is not None and name in self.command.env:
            return self.command.env[name]
        env_vars = self.facts.get("env.vars")
        return env_vars.get(name) if isinstance(env_vars, dict) else None

    @property
    def is_docker(self) -> bool:
        """The command starts a container itself (docker/podman run, a compose service)."""
        return self.command is not None and self.command.shape in ("docker", "compose")

    @property
    def in_container(self) -> bool:
        """vLLM runs in a container: the command starts one, or the environment facts say so."""
        return self.is_docker or bool(self.facts.get("env.in_container"))

    @property
    def world_size(self) -> int | None:
        """tensor × pipeline parallel size, None when the tensor-parallel size is unknown."""
        tp = self.arg_int("tensor_parallel_size")
        return tp * (self.arg_int("pipeline_parallel_size") or 1) if tp else None

    @property
    def version(self) -> str | None:
        """The vLLM version the log shows (`vllm.version`)."""
        value = self.facts.get("vllm.version")
        return str(value) if value else None

    @property
    def launch_version(self) -> str | None:
        """The vLLM release that ran: the log's banner, else the docker image's tag (argparse and config errors
        can fail before the banner), else the newest release that had every argument the log printed."""
        found = IMAGE_VERSION.search(self.command.image or "") if self.version is None and self.command else None
        return self.version or (found.group(1) if found else None) or self.fact("launch.version_estimate")

    @property
    def gpus(self) -> list[dict]:
        """The `gpu.devices` entries; read their fields through vllm_doctor.facts.gpus."""
        return _gpus.devices(self.facts)

    @cached_property
    def shape(self) -> ModelShape:
        """The model's dimensions from the facts (vllm_doctor.facts.shape), read once."""
        return ModelShape.from_facts(self.facts)
