"""The fix in the user's own shape, and one combined fix for every finding.

Logs are real (logs_corpus); where a launch command is passed with --cmd it is written by us, in the shapes
the threads show (compose `command:` lists, a pod spec's `args:`, `LLM(...)` scripts, `docker run`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from vllm_doctor.command import Command
from vllm_doctor.command.argcheck import accepts
from vllm_doctor.command.edits import DockerOption, RemoveFlag, SetEnv, SetFlag
from vllm_doctor.diagnosis.saved import Options, diagnose_paths
from vllm_doctor.facts import Facts
from vllm_doctor.findings import Finding, Fix
from vllm_doctor.remedies.combine import combine, merge
from vllm_doctor.remedies.shape import FIXED_DEFAULTS, present
from vllm_doctor.rules.catalog import cached_catalog

ROOT = Path(__file__).resolve().parents[1]
TP3 = "logs_corpus/parallel/vicuna13b-tp3.log"


def fix_of(log: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "vllm_doctor", "--no-live", "--format", "json", *args,
                           str(ROOT / log)], capture_output=True, cwd=ROOT, timeout=60, env={**os.environ})
    doc = json.loads(proc.stdout)
    return doc["combined_fix"]


# ---- the shapes --------------------------------------------------------------------------------------
def test_compose_command_list_gets_the_edit_of_its_service():
    fix = fix_of(TP3, "--cmd", 'command: ["--model", "lmsys/vicuna-13b-v1.5", "--tensor-parallel-size", "3"]')
    assert fix["form"] == "edit"
    assert fix["instruction"].startswith("in the vLLM service's `command:`, use: command: [")
    assert '"--tensor-parallel-size", "2"]' in fix["instruction"] and "docker compose up" in fix["instruction"]


def test_docker_compose_up_gets_no_flags_appended():
    fix = fix_of(TP3, "--cmd", "docker compose up")
    assert fix["form"] == "edit" and fix["command"] is None
    assert "`command:`" in fix["instruction"] and "--tensor-parallel-size 2" in fix["instruction"]
    assert "docker compose up --tensor" not in json.dumps(fix)


def test_kubernetes_args_and_pod_spec_for_container_options():
    fix = fix_of(TP3, "--cmd", 'args: ["--model", "lmsys/vicuna-13b-v1.5", "-tp", "3"]')
    assert fix["form"] == "edit" and "in the container's `args:`" in fix["instruction"]
    assert '"-tp", "2"]' in fix["instruction"] and "redeploy" in fix["instruction"]
    shm = present(Command.parse('args: ["--model", "m"]'), [DockerOption("--shm-size", "16g")], Facts())
    assert "emptyDir: {medium: Memory, sizeLimit: 16g}" in shm.instruction and "/dev/shm" in shm.instruction
    ipc = present(Command.parse('args: ["--model", "m"]'), [DockerOption("--ipc", "host")], Facts())
    assert "hostIPC: true" in ipc.instruction


def test_llm_script_frame_becomes_the_edit_of_that_line():
    """c13: a real pydantic error from `LLM(..., dtype="fp16")`; the traceback shows offline_batch.py line 6."""
    fix = fix_of("logs_corpus/config/c13-llm-dtype-fp16-pydantic.log")
    assert fix["form"] == "edit"
    assert fix["instruction"] == 'offline_batch.py line 6: `llm = LLM(model="Qwen/Qwen2.5-0.5B-Instruct", dtype="float16")`'


def test_no_launch_line_prints_only_the_flag_change():
    """rm01 logs no launch line and no model: no `vllm serve MODEL` is made up."""
    fix = fix_of("logs_corpus/real/memory/rm01-kv-29k-rtx3090.log")
    assert fix["form"] == "flags" and fix["command"] is None
    assert fix["changes"] and all(c.startswith("--") for c in fix["changes"])
    assert "--cmd" in fix["instruction"]


def test_a_script_that_shows_the_flag_gets_it_edited_in_place_others_get_nothing_appended():
    shown = fix_of(TP3, "--cmd", "python serve.py --model lmsys/vicuna-13b-v1.5 --tensor-parallel-size 3")
    assert shown["form"] == "command" and shown["command"].endswith("--tensor-parallel-size 2")
    hidden = fix_of(TP3, "--cmd", "python gen.py")
    assert hidden["form"] == "flags" and hidden["command"] is None and "python gen.py" in hidden["instruction"]


def test_a_fix_outside_the_command_never_prints_it_as_the_fix():
    """rg08 (a real driver mismatch under compose): the fix is on the host; `run:` would change nothing."""
    fix = fix_of("logs_corpus/real/platform/rg08-compose-ray-804-phi3.log")
    assert fix["form"] == "outside" and fix["command"] is None


def test_no_flag_is_added_at_its_default():
    cmd = Command.parse("vllm serve m -tp 3")
    rw = present(cmd, [SetFlag("--tensor-parallel-size", "2"), SetFlag("--pipeline-parallel-size", "1")], Facts())
    assert rw.command == "vllm serve m -tp 2"
    kept = present(Command.parse("vllm serve m -tp 3 -pp 3"), [SetFlag("--pipeline-parallel-size", "1")], Facts())
    assert kept.command == "vllm serve m -tp 3 -pp 1"        # the user's own -pp 3 is changed, not left


# ---- one combined fix ----------------------------------------------------------------------------------
def _finding(rule: str, *edits) -> Finding:
    return Finding(rule, rule, "error", "high", [], "", fix=Fix(rule, list(edits)))


def test_edits_of_all_findings_merge_in_root_cause_order():
    facts = Facts()
    facts.set("launch.command", "vllm serve m -tp 3", "user")
    cmd = Command.parse("vllm serve m -tp 3")
    findings = [_finding("tp-heads-indivisible", SetFlag("--tensor-parallel-size", "2")),
                _finding("nccl-p2p", SetEnv("NCCL_P2P_DISABLE", "1")),
                _finding("max-model-len-too-large", SetFlag("--max-model-len", "8192"))]
    rw = combine(findings, cmd, facts)
    assert rw.command == "NCCL_P2P_DISABLE=1 vllm serve m -tp 2 --max-model-len 8192"
    assert rw.rules == ["tp-heads-indivisible", "nccl-p2p", "max-model-len-too-large"] and rw.conflicts == []


def test_two_fixes_that_cannot_both_hold_are_shown_as_a_conflict():
    findings = [_finding("tp-heads-indivisible", SetFlag("--tensor-parallel-size", "2")),
                _finding("tp-kv-heads-indivisible", SetFlag("--tensor-parallel-size", "4"), RemoveFlag("--enforce-eager"))]
    edits, rules, conflicts = merge(findings)
    assert edits == [SetFlag("--tensor-parallel-size", "2"), RemoveFlag("--enforce-eager")]
    assert len(conflicts) == 1 and "tp-kv-heads-indivisible wants --tensor-parallel-size 4" in conflicts[0]
    assert "kept tp-heads-indivisible's" in conflicts[0]


# ---- over the whole corpus -------------------------------------------------------------------------------
def _corpus_cases():
    for toml in sorted(ROOT.glob("logs_corpus/**/cases.toml")):
        for case in tomllib.loads(toml.read_text())["case"]:
            yield toml.parent, case


def test_every_combined_command_parses_carries_every_edit_and_no_default():
    """For every corpus log with a runnable fix: vLLM's own flag list (that version) accepts the combined
    command, every finding's edits hold in it (unless reported as a conflict), no flag is added at its
    default, and it is never the failing command."""
    catalog = cached_catalog(None)
    checked = 0
    for folder, case in _corpus_cases():
        log = folder / (case.get("file") or f"{case['id']}.log")
        d = diagnose_paths([str(log)], catalog, Options(live=False, command=case.get("cmd")))
        rw = d.combined
        if rw is None or rw.form not in ("command", "rebuilt"):
            continue
        checked += 1
        new = Command.parse(rw.command, version=d.facts.get("vllm.version") or d.facts.get("launch.version_estimate"))
        assert rw.command.split() != (rw.was or "").split(), log.name
        usage = d.facts.get("log.usage_flags")
        if new.shape in ("serve", "module") and usage:
            # the installed parser listed its options: the command must use only those (whatever its version)
            unknown = [t for t in new.argv() if t.startswith("--") and t.split("=", 1)[0] not in usage]
            assert not unknown, f"{log.name}: {rw.command}: not in the usage the log printed: {unknown}"
        elif new.shape in ("serve", "module"):
            ok, why = accepts(new.argv(), d.facts.get("vllm.version") or d.facts.get("launch.version_estimate"))
            assert ok, f"{log.name}: {rw.command}: {why}"
        old = d.command
        for f in d.findings:
            for e in (f.fix.edits if f.fix and f.rule in rw.rules else []):
                if isinstance(e, SetFlag) and not any(e.flag in c for c in rw.conflicts):
                    if FIXED_DEFAULTS.get(e.flag, "-") == e.value and old is not None and old.get(e.flag) is None:
                        assert new.get(e.flag) is None, f"{log.name}: {e.flag} {e.value} added at its default"
                    else:
                        assert new.get(e.flag) == (e.value if e.value is not None else True), f"{log.name}: {e}"
    assert checked >= 40
