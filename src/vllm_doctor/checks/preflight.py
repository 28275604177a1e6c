"""`vllm-doctor check [--] vllm serve MODEL …`: predict the start-up failures of a launch command, without
starting vLLM.

Each check computes what vLLM would compute (``vllm_math.parallel``; the model sized by ``vllm_math.sizing``,
as `plan` and the memory remedies size it; the argparse oracle in ``command.argcheck``), writes the message
vLLM would print, matches it against the rule catalog (so the rule id and its named captures are the ones a
real log would give) and runs that rule's remedy on the user's command. Findings are marked as predictions:
title "Predicted: …", fact ``predicted: true``, evidence from the source "predicted", and a confidence that
says how sure the arithmetic is.

Checks, in the order vLLM meets them: arguments for the vLLM version (unknown/removed flags, bad values),
max-model-len vs the model's derived maximum, heads/KV heads/vocabulary/MLP sizes vs tensor parallel,
pipeline support, world size vs visible GPUs, dtype vs compute capability, free memory vs the
utilization, weights per GPU, KV cache for max_model_len, /dev/shm (TP > 1 in a container), P2P between
the chosen GPUs (informational: vLLM disables custom all-reduce itself), the API port.

Never changes the system: the port is looked up in /proc/net/tcp{,6} (LISTEN sockets), nothing is bound.
"""
from __future__ import annotations

from typing import Any, Callable

from vllm_doctor.checks.checker import Checker
from vllm_doctor.checks.coverage import Prediction
from vllm_doctor.checks.sizes import size_error
from vllm_doctor.command.versions import parse_version
from vllm_doctor.facts import Facts
from vllm_doctor.facts.ports import port_in_use
from vllm_doctor.vllm_math import parallel as pm

PREDICTED_SOURCE = "predicted"
TITLE_PREFIX = "Predicted: "


class PreflightError(Exception):
    """A command that cannot be checked: one line, exit 2."""



# --------------------------------------------------------------------------- findings

def finding_for(pred: Prediction, catalog, facts: Facts, command, seq: int, source: str = PREDICTED_SOURCE,
                title_prefix: str = TITLE_PREFIX):
    """The Finding a rule gives for the line `pred.message` (what vLLM would print, or what `health` read),
    its remedy run on `command`."""
    from vllm_doctor.findings import Finding, Match
    from vllm_doctor.numbers import as_typed
    from vllm_doctor.remedies.apply import run_remedy
    from vllm_doctor.rules.catalog import match_text
    from vllm_doctor.sources.lines import parse_line

    rule = catalog.rules.get(pred.rule)
    if rule is None:
        return None
    line = parse_line(pred.message, source, seq)
    got = match_text(rule, pred.message)
    pattern = got[0] if got else (rule.patterns[0] if rule.patterns else None)
    captures = dict(got[1]) if got else {}
    for key, value in pred.captures.items():
        captures.setdefault(key, value)
    matches = [Match(rule.id, pattern, captures, line, None, frozenset(), seq)] if pattern is not None else []
    finding_facts = as_typed(captures)
    finding_facts["predicted"] = source == PREDICTED_SOURCE
    finding_facts.update(pred.facts)
    finding = Finding(rule.id, title_prefix + rule.title, pred.severity or rule.severity, pred.confidence,
                      [line], "", facts=finding_facts, priority=rule.priority, first_seq=seq)
    run_remedy(finding, rule, captures, matches, facts, command)
    return finding


def given_devices(facts: Facts, count: int | None, gib: float | None) -> None:
    """`--gpus N --gpu-memory GiB`: N GPUs of that size stand for the target machine's (free memory,
    compute capability and links unknown)."""
    if count is None and gib is None:
        return
    if count is None or gib is None:
        raise PreflightError("give --gpus N and --gpu-memory GiB together")
    if not pm.real_size(count):
        raise PreflightError("--gpus must be at least 1" if count < 1 else pm.not_a_real_size("--gpus", count))
    if not 0 < gib <= 1 << 20:
        raise PreflightError(f"--gpu-memory {gib:g} is not a GPU's memory in GiB")
    facts.set("gpu.count", count, "user")
    facts.set("gpu.devices", [{"index": i, "name": f"GPU ({gib:g} GiB, from --gpu-memory)",
                               "memory_total_mib": gib * 1024} for i in range(count)], "user")


def prepare(command_text: str, *, model: str | None = None, snapshot: str | None = None, live: bool = True,
            online: bool = False, vllm_version: str | None = None, nvml: Any = None,
            environ: Any = None, given_gpus: tuple[int | None, float | None] = (None, None)
            ) -> tuple[Facts, Any, list[str]]:
    """(facts, command, notices) for `command_text`: the command parsed, its flags as args.* facts, the model's
    config and the GPUs (this machine or a snapshot) gathered. Raises PreflightError on a bad command."""
    from vllm_doctor.command import Command
    from vllm_doctor.facts.gather import gather_facts
    from vllm_doctor.diagnosis.launch import resolve_command

    text = (command_text or "").strip()
    if not text:
        raise PreflightError("give the launch command: vllm-doctor check -- vllm serve MODEL …  (or --cmd \"…\")")
    try:
        command = Command.parse(text)
    except Exception as exc:
        raise PreflightError(f"cannot read the command: {exc}") from None
    if command.shape == "unknown":
        raise PreflightError(f"not a vLLM launch command: {text[:80]!r}")
    if not command.model:
        raise PreflightError("the command names no model (vllm serve MODEL …)")
    facts = Facts()
    if vllm_version:
        if parse_version(vllm_version) is None:
            raise PreflightError(f"--vllm-version {vllm_version!r} is not a version (e.g. 0.11.0)")
        facts.set("vllm.version", vllm_version, "user")
    command = resolve_command(facts, None, text) or command
    given = given_gpus[0] is not None or given_gpus[1] is not None
    # a snapshot (or --gpus) describes the machine the command will run on: it replaces this one's facts,
    # whose NVML error (a laptop) would otherwise stand beside the snapshot's GPUs and void them
    here = live and not given and not snapshot
    notices = gather_facts(facts, table=True, model=model or command.model, online=online, live=here,
                           snapshot=snapshot, environ=environ, nvml=nvml) or []
    given_devices(facts, *given_gpus)
    return facts, command, notices


def predict(command_text: str, catalog, *, model: str | None = None, snapshot: str | None = None,
            live: bool = True, online: bool = False, vllm_version: str | None = None, nvml: Any = None,
            environ: Any = None, port_probe: Callable[[int], bool | None] | None | str = "auto",
            given_gpus: tuple[int | None, float | None] = (None, None)):
    """The Diagnosis `check` prints: predicted findings for `command_text` on this machine / a snapshot."""
    from vllm_doctor.findings import Diagnosis

    facts, command, notices = prepare(command_text, model=model, snapshot=snapshot, live=live, online=online,
                                      vllm_version=vllm_version, nvml=nvml, environ=environ, given_gpus=given_gpus)
    refused = size_error(facts)          # `-tp 0`, `-tp 100000000`: no check runs on sizes no machine has
    if refused:
        raise PreflightError(refused)
    if port_probe == "auto":
        port_probe = port_in_use if live and not snapshot and given_gpus == (None, None) else None
    from vllm_doctor.checks.coverage import NO_GPUS, NO_GPUS_IN_SNAPSHOT, NO_GPUS_NOT_LOOKED

    # the snapshot was passed: it has no GPU, NVML here is beside the point; --no-live: NVML was not asked
    checker = Checker(facts, command, port_probe, live=live and not snapshot and given_gpus == (None, None),
                      no_gpus=NO_GPUS_IN_SNAPSHOT if snapshot else NO_GPUS if live else NO_GPUS_NOT_LOOKED)
    preds, more = checker.run()
    notices += more
    findings = [f for i, p in enumerate(preds, 1) if (f := finding_for(p, catalog, facts, command, i))]
    findings.sort(key=lambda f: (f.severity == "info", -f.priority, f.first_seq))
    from vllm_doctor.remedies.combine import combine

    diagnosis = Diagnosis(findings, facts, [], command, 0, [PREDICTED_SOURCE], notices, coverage=checker.coverage,
                          memory=checker.memory_summary())
    diagnosis.combined = combine(findings, command, facts)     # one command for every predicted failure
    return diagnosis


COULD_NOT_CHECK = 3     # no failure predicted, but a check that matters for this command could not run


def exit_code(diagnosis) -> int:
    """1: a failure predicted; 3: none predicted but an essential check could not run; 0: all clear."""
    if any(f.severity != "info" for f in diagnosis.findings):
        return 1
    return COULD_NOT_CHECK if diagnosis.unchecked else 0
