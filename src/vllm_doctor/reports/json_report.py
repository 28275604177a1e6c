"""The JSON report, schema_version 2 (the shape is a public contract; see README).

Schema 2 keeps every schema-1 field with its meaning and adds: findings[].notes and findings[].errors
(notes are no longer folded into `explanation`), and top-level `warnings` (predictive warnings, one per
rule) and `notices` (what fact gathering could not do). `read_report` reads either version.

Later additions, all optional to a reader: fix.form / fix.changes / fix.instruction (and the same on each
alternative) say how the fix reaches the user (findings.Rewrite: `command` is null unless the form gives
an edited text); top-level `combined_fix` (every finding's edits in one command), `run` and `earlier_runs`
(several launches in the input: the earlier ones, each a report of this shape); `first_failure` (where
the root cause was printed first: node, process, rank, line) and `nodes` (a log of several nodes: the
story, one entry per node with its processes and first fatal line).
"""
from __future__ import annotations

import json
from typing import Any

from vllm_doctor.findings import Diagnosis, Finding, Rewrite
from vllm_doctor.numbers import json_loads, json_safe

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
V1_NOTE = "\n\nNote: "           # how schema 1 appended a finding's notes to its explanation
V1_NOTE_SEP = "\nNote: "
V1_ERROR_PREFIX = "no fix computed ("   # a remedy that raised, which schema 1 showed as a note


class ReportError(ValueError):
    """A document that is not a vllm-doctor JSON report of a readable schema_version."""


def _evidence(ln) -> dict[str, Any]:
    return {"source": ln.source, "line": ln.lineno, "text": ln.raw}


def rewrite_dict(rw: Rewrite | None) -> dict[str, Any]:
    """How the fix reaches the user (findings.Rewrite): form, the edited text, the changes one by one."""
    if rw is None:
        return {"form": None, "changes": [], "instruction": ""}
    return {"form": rw.form, "changes": list(rw.changes), "instruction": rw.instruction}


def finding_dict(f: Finding) -> dict[str, Any]:
    fix = None
    if f.fix is not None:
        alts = [{"summary": s, "command": c or "", **rewrite_dict(f.alt_rewrites[i] if i < len(f.alt_rewrites) else None)}
                for i, (s, c) in enumerate(f.alternatives)]
        fix = {
            "summary": f.fix.summary,
            "command": f.fix_command,
            "unchanged": f.unchanged,
            "env": dict(f.env),
            **rewrite_dict(f.rewrite),
            "alternatives": alts,
        }
    return {
        "rule": f.rule,
        "title": f.title,
        "severity": f.severity,
        "confidence": f.confidence,
        "evidence": [_evidence(ln) for ln in f.evidence],
        "more_like_it": f.more_like_it,       # lines matching like the evidence, not in it (a flood's count)
        "explanation": f.explanation,
        "notes": list(f.notes),
        "errors": list(f.errors),
        "facts": f.facts,
        "fix": fix,
    }


def warning_dicts(d: Diagnosis, catalog=None) -> list[dict[str, Any]]:
    """The predictive warnings, one per rule at its first occurrence (the pipe announces each once too).
    Title and severity are the rule's (severity: of the failure the warning predicts)."""
    first = d.first_warnings()
    if first and catalog is None:
        from vllm_doctor.rules.catalog import CatalogError, cached_catalog

        try:
            catalog = cached_catalog(None)
        except CatalogError:
            catalog = None
    out = []
    for m in first:
        rule = catalog.rules.get(m.rule_id) if catalog is not None else None
        out.append({"rule": m.rule_id, "title": rule.title if rule else m.rule_id,
                    "severity": rule.severity if rule else "warning", "evidence": _evidence(m.line)})
    return out


def first_failure(d: Diagnosis) -> dict[str, Any] | None:
    """Where the root cause was printed first: {node, process, rank, line}, null fields where unknown; the
    node only in a log of several (events/nodes.py's story). None without a finding or a log line."""
    from vllm_doctor.events.deaths import victim
    from vllm_doctor.events.nodes import process_of

    if d.nodes is not None:
        story = d.nodes
        return {"node": story.first, "process": story.first_process, "rank": story.first_rank,
                "line": story.first_line}
    evidence = d.findings[0].evidence if d.findings else []
    if not evidence or evidence[0].source == "predicted":
        return None
    line = evidence[0]
    facts = d.findings[0].facts
    if "failed_first_line" in facts:    # a failure no rule names: its first crash line (events/nodes.py Crash)
        return {"node": facts.get("failed_first_on"), "process": facts.get("failed_first_process"),
                "rank": facts.get("failed_first_rank"), "line": facts["failed_first_line"]}
    # no story (one machine): the evidence line's own node and process, or the process it says died
    process, rank = victim(line) or process_of(line)
    node = line.ip or (f"pod/{line.pod}" if line.pod else None)
    return {"node": node, "process": process, "rank": rank, "line": line.lineno}


def report_dict(d: Diagnosis, catalog=None) -> dict[str, Any]:
    """`catalog`: where warning titles come from (default: the installed rules)."""
    combined = d.combined
    return {
        "schema_version": SCHEMA_VERSION,
        "status": d.status,
        "findings": [finding_dict(f) for f in d.findings],
        "combined_fix": None if combined is None else {
            "command": combined.command, "was": combined.was, **rewrite_dict(combined),
            "rules": list(combined.rules), "conflicts": list(combined.conflicts)},
        "warnings": warning_dicts(d, catalog),
        "notices": list(d.notices),
        **({"coverage": [c.as_dict() for c in d.coverage]} if d.coverage else {}),
        **({"memory": d.memory} if d.memory else {}),
        "first_failure": first_failure(d),
        **({"ignored": d.ignored} if d.ignored else {}),
        **({"nodes": d.nodes.as_dict()} if d.nodes is not None else {}),
        **({"outcome": d.outcome} if d.outcome else {}),
        "facts": d.facts.to_json(),
        "run": d.run_label,
        "earlier_runs": [report_dict(e, catalog) for e in d.earlier],
    }


def render_json(d: Diagnosis, catalog=None) -> str:
    """The report as strict JSON: a NaN or infinite value anywhere (a fact, a capture) is written as null,
    never as the `NaN` / `Infinity` that json.loads of other languages refuses."""
    return json.dumps(json_safe(report_dict(d, catalog)), indent=2, default=str, ensure_ascii=False,
                      allow_nan=False) + "\n"


# ---- reading a report (either schema) ---------------------------------------------------------------
def _upgrade_finding(f: dict[str, Any]) -> dict[str, Any]:
    f = dict(f)
    explanation = f.get("explanation") or ""
    head, sep, tail = explanation.partition(V1_NOTE)
    notes = tail.split(V1_NOTE_SEP) if sep else []
    f["explanation"] = head
    f["notes"] = [n for n in notes if not n.startswith(V1_ERROR_PREFIX)]
    f["errors"] = [n for n in notes if n.startswith(V1_ERROR_PREFIX)]
    return f


def read_report(doc: str | bytes | dict) -> dict[str, Any]:
    """A JSON report (text or parsed) of schema_version 1 or 2, returned in the schema-2 shape: a
    schema-1 report gets its notes split back out of `explanation` ("no fix computed (...)" ones as
    errors) and empty `warnings` and `notices`, which schema 1 did not record."""
    if isinstance(doc, (str, bytes)):
        try:
            doc = json_loads(doc)
        except json.JSONDecodeError as exc:
            raise ReportError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        except ValueError as exc:           # nested too deeply
            raise ReportError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("findings"), list) or "status" not in doc:
        raise ReportError("not a vllm-doctor report (needs 'status' and a 'findings' list)")
    version = doc.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise ReportError(f"unsupported report schema_version {version!r} (readable: "
                          f"{', '.join(map(str, READABLE_VERSIONS))})")
    out = dict(doc)
    if version == 1:
        out["findings"] = [_upgrade_finding(f) for f in doc["findings"]]
    else:
        out["findings"] = [{"notes": [], "errors": [], **f} for f in doc["findings"]]
    for f in out["findings"]:         # `fix.unchanged` came after the first schema-2 reports
        if isinstance(f.get("fix"), dict):
            f["fix"] = {"unchanged": False, **f["fix"]}
    out.setdefault("warnings", [])
    out.setdefault("notices", [])
    out.setdefault("facts", {})
    return out
