"""Remedy contexts built by the real engine, for the remedy and refine-hook tests.

    remedy_context(lines, *, facts=None, command=None, rule=None) -> RemedyContext

Feeds `lines` (real log lines: the rule's own [[examples]] texts from rules/<id>.toml, or lines from a
logs_corpus log; one string with newlines, or a list) through the scanner and the real Diagnoser
(vllm_doctor.diagnosis.engine) with the shipped catalog (rules.catalog.cached_catalog), and returns the
RemedyContext the engine handed to the remedy of `rule` (default: the top finding's rule), built by
remedies.apply.context_for exactly as in production. Refine hooks have run (a relabelled match sits in its
new rule's context), and so has the remedy; call it on the context to test it:

    def test_shm_in_docker(remedy_context):
        ctx = remedy_context("gpu2:2143:2561 [1] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : "
                             "No space left on device", command="docker run --gpus all img m -tp 2",
                             facts={"env.shm_total_bytes": 64 << 20}, rule="nccl-shm")
        fix = nccl.fix_shm(ctx)

`facts`: a dict, set as "user" facts before the log is read, or a Facts (say from collect_gpu_facts over a
fake_nvml machine), used as it is. `command`: the launch command as `--cmd` gives it (it becomes
launch.command and, through diagnosis.launch.resolve_command, the args.* facts and ctx.command); without
one the command is rebuilt from the arguments the log printed, as for a log that shows none.

    diagnose(lines, *, facts=None, command=None) -> Diagnosis

The same run, returning the Diagnosis: which rule a refine hook gave a match is
`[f.rule for f in diagnosis.findings]`.
"""
from __future__ import annotations

import pytest

from vllm_doctor.facts import Facts


def _run(lines, facts=None, command: str | None = None):
    from vllm_doctor.diagnosis.engine import Diagnoser
    from vllm_doctor.diagnosis.launch import resolve_command
    from vllm_doctor.rules.catalog import cached_catalog
    from vllm_doctor.sources.scan import Scanner

    if not isinstance(facts, Facts):
        given, facts = facts or {}, Facts()
        for key, value in given.items():
            facts.set(key, value, "user")
    if command:
        facts.set("launch.command", command, "user")
    diagnoser = Diagnoser(cached_catalog(), facts)
    texts = lines.splitlines() if isinstance(lines, str) else list(lines)
    scanner = Scanner(diagnoser.scan_literals, diagnoser, source="test.log")
    scanner.feed(("\n".join(texts) + "\n").encode())
    scanner.close()
    diagnoser.lines = len(texts)
    return diagnoser.finish(resolve_command(facts, diagnoser.logfacts, command))


@pytest.fixture
def diagnose():
    return _run


@pytest.fixture
def remedy_context(monkeypatch):
    from vllm_doctor.remedies import apply

    built: dict = {}
    real = apply.context_for

    def recording(rule, *args, **kwargs):
        built[rule.id] = ctx = real(rule, *args, **kwargs)
        return ctx

    monkeypatch.setattr(apply, "context_for", recording)

    def build(lines, *, facts=None, command: str | None = None, rule: str | None = None):
        built.clear()
        diagnosis = _run(lines, facts, command)
        want = rule or (diagnosis.findings[0].rule if diagnosis.findings else None)
        assert want in built, f"no remedy ran for {want!r}; findings: {[f.rule for f in diagnosis.findings]}"
        return built[want]

    return build
