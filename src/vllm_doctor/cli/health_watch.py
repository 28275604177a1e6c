"""`vllm-doctor health --watch`: the server read every --interval seconds, each reading judged against the one
before it by the same rules as `health`. On a terminal a compact live view (the last readings and what they
show); elsewhere one line per reading and a line when a finding appears or clears (a log a script can keep);
`--format json`: one JSON object per reading. Ctrl-C (or --count readings) ends it: exit 1 when the last
reading had findings, 0 when not, 2 when the server stopped answering."""
from __future__ import annotations

import json
import sys
import time
from collections import deque

HEAD = ("time", "running", "waiting", "KV %", "tok/s", "req/s", "preempted", "findings")
KEPT = 10              # readings the live view shows


def _row(reading, rules: list[str]) -> tuple[str, ...]:
    a, s = reading.after, reading.seconds or 1.0

    def rate(figure: str) -> str:
        grew = reading.grew(figure)        # less than before: the server restarted in between
        return "-" if grew is None or grew < 0 else f"{grew / s:.1f}"
    kv = "-" if a.kv_usage is None else f"{a.kv_usage * 100:.1f}"
    preempted = reading.grew("preemptions")
    return (time.strftime("%H:%M:%S"), str(int(a.running or 0)), str(int(a.waiting or 0)), kv, rate("generated"),
            rate("finished"), "-" if preempted is None or preempted < 0 else str(int(preempted)),
            ",".join(rules) or "ok")


def _plain(row: tuple[str, ...]) -> str:
    widths = (8, 7, 7, 5, 8, 6, 9)
    return "  ".join(v.rjust(w) for v, w in zip(row, widths)) + "  " + row[-1]


def _view(rows, findings):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(*HEAD, box=None, pad_edge=False, header_style="bold")
    for row in rows:
        table.add_row(*row[:-1], Text(row[-1], style="green" if row[-1] == "ok" else "yellow"))
    lines = [Text.assemble((f"{f.severity}[{f.rule}]: ", "bold yellow"), f.title,
                           ("\n  help: " + f.fix.summary) if f.fix else "") for f in findings]
    return Group(table, *(lines or [Text("no finding in the last reading", style="green")]))


def watch(args, catalog, command, gpus, environ, api_key: str | None, server_pids: frozenset[int] = frozenset(),
          out=None) -> int:
    from vllm_doctor.checks.health import Reading, diagnose_server
    from vllm_doctor.diagnosis.ignore import drop_ignored
    from vllm_doctor.facts.server import ServerUnreachable, read_server
    from vllm_doctor.facts.server_metrics import figures

    out = out or sys.stdout
    live_view = args.format == "text" and out.isatty() and not args.no_color
    previous = read_server(args.url, api_key)
    rows: deque = deque(maxlen=KEPT)
    shown: dict[str, str] = {}                  # rule -> the finding's line, as last printed
    findings: list = []
    live = None
    if live_view:
        from rich.console import Console
        from rich.live import Live

        live = Live(_view(rows, findings), console=Console(file=out), auto_refresh=False, transient=False)
        live.start()
    elif args.format == "text":
        print(_plain(HEAD), file=out, flush=True)
    taken = 1
    try:
        while not args.count or taken < args.count:
            time.sleep(args.interval)
            try:
                sample = read_server(args.url, api_key)
            except ServerUnreachable as exc:
                print(f"vllm-doctor: the server stopped answering: {exc}", file=sys.stderr)
                return 2
            taken += 1
            reading = Reading(previous, sample, figures(previous.metrics_text), figures(sample.metrics_text))
            previous = sample
            d = drop_ignored(diagnose_server(reading, catalog, command, gpus, environ, None, server_pids),
                             args.ignored_rules)
            findings = d.findings
            row = _row(reading, [f.rule for f in findings])
            if live is not None:
                rows.append(row)
                live.update(_view(rows, findings), refresh=True)
            elif args.format == "json":
                print(json.dumps({"time": row[0], "state": d.facts.get("server.state"),
                                  "findings": [{"rule": f.rule, "severity": f.severity, "title": f.title,
                                                "fix": f.fix.summary if f.fix else None} for f in findings]}),
                      file=out, flush=True)
            else:
                print(_plain(row), file=out)
                _changes(findings, shown, out)
                out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    return 1 if findings else 0


def _changes(findings, shown: dict[str, str], out) -> None:
    """A finding said once when it appears, with its fix then, and once when it clears (its figures move with
    every reading: the row says those)."""
    now = {f.rule: f for f in findings}
    for rule, f in now.items():
        if rule not in shown:
            text = f"{f.severity}[{rule}]: {f.title}" + (f"; help: {f.fix.summary}" if f.fix else "")
            print(f"  + {text}", file=out)
            shown[rule] = text
    for rule in [r for r in shown if r not in now]:
        print(f"  - {rule}: cleared", file=out)
        del shown[rule]
