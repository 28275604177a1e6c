"""The one-line-per-finding formats for scripts and CI: `--format concise` (a linter's `path:line:col: …`),
`--format github` (GitHub Actions workflow commands, shown on the log file in a pull request) and
`-q/--command-only` (just the corrected command, for `$(…)`)."""
from __future__ import annotations

from vllm_doctor.findings import Diagnosis, Finding
from vllm_doctor.reports.brief import evidence_column

GITHUB_LEVEL = {"error": "error", "warning": "warning"}      # anything else is a notice


def _runs(d: Diagnosis) -> list[Diagnosis]:
    return [*d.earlier, d]


def _place(f: Finding) -> tuple[str, int | None, int | None]:
    """(file, line, column) of the finding's first evidence line; `check`'s predictions have no line."""
    line = f.evidence[0] if f.evidence else None
    if line is None or line.source == "predicted":
        return "<command>", None, None
    return line.source or "<stdin>", line.lineno, evidence_column(f, line)


def _rewrite(run: Diagnosis, f: Finding):
    """The fix as the report gives it: the root's is the combined one (every finding's edits), the others' their own."""
    return (run.combined if run.findings and f is run.findings[0] else None) or f.rewrite


def _fix(d: Diagnosis, f: Finding) -> str:
    rewrite = _rewrite(d, f)
    if rewrite is not None and rewrite.changes:
        return "; fix: " + ", ".join(rewrite.changes)
    return ""


def render_concise(d: Diagnosis) -> str:
    out = []
    for run in _runs(d):
        for f in run.findings:
            path, line, col = _place(f)
            where = ":".join(str(x) for x in (path, line, col) if x is not None)
            out.append(f"{where}: {f.severity}[{f.rule}]: {f.title}{_fix(run, f)}")
    return "".join(f"{line}\n" for line in out)


def _escape(text: str, prop: bool = False) -> str:
    """GitHub's workflow-command escaping (actions/toolkit command.ts): data and, in properties, `:` and `,`."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def render_github(d: Diagnosis) -> str:
    out = []
    for run in _runs(d):
        for f in run.findings:
            path, line, col = _place(f)
            props = [f"file={_escape(path, True)}"] if path != "<command>" else []
            props += [f"line={line}"] if line else []
            props += [f"col={col}"] if col else []
            props.append(f"title={_escape(f'vllm-doctor {f.rule}: {f.title}', True)}")
            body = [f.fix.summary] if f.fix is not None else [f.explanation.split("\n\n")[0]]
            rewrite = _rewrite(run, f)
            if rewrite is not None and rewrite.runnable:
                body.append(f"run: {rewrite.command}")
            level = GITHUB_LEVEL.get(f.severity, "notice")
            out.append(f"::{level} {','.join(props)}::{_escape(chr(10).join(b for b in body if b))}")
    return "".join(f"{line}\n" for line in out)


def command_only(d: Diagnosis) -> tuple[str, str | None]:
    """(stdout, a line for stderr): the corrected command of the last run, or nothing and why."""
    if not d.findings:
        return "", None
    rewrite = d.combined or d.findings[0].rewrite
    if rewrite is not None and rewrite.runnable:
        return rewrite.command + "\n", None
    summary = d.findings[0].fix.summary if d.findings[0].fix is not None else d.findings[0].title
    return "", f"vllm-doctor: no command to print ({d.findings[0].rule}): {summary}"
