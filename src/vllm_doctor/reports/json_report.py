"""The JSON report, schema_version 1 (the shape is a public contract; see README)."""
from __future__ import annotations

import json
from typing import Any

from vllm_doctor.findings import Diagnosis, Finding

SCHEMA_VERSION = 1


def finding_dict(f: Finding) -> dict[str, Any]:
    fix = None
    if f.fix is not None:
        fix = {
            "summary": f.fix.summary,
            "command": f.fix_command,
            "env": dict(f.env),
            "alternatives": [{"summary": s, "command": c or ""} for s, c in f.alternatives],
        }
    return {
        "rule": f.rule,
        "title": f.title,
        "severity": f.severity,
        "confidence": f.confidence,
        "evidence": [{"source": ln.source, "line": ln.lineno, "text": ln.raw} for ln in f.evidence],
        "explanation": f.explanation + ("\n\nNote: " + "\nNote: ".join(f.notes + f.errors) if f.notes or f.errors else ""),
        "facts": f.facts,
        "fix": fix,
    }


def report_dict(d: Diagnosis) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "status": d.status,
        "findings": [finding_dict(f) for f in d.findings],
        "facts": d.facts.to_json(),
    }


def render_json(d: Diagnosis) -> str:
    return json.dumps(report_dict(d), indent=2, default=str, ensure_ascii=False) + "\n"
