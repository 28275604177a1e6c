"""One report, in the format the user asked for, written to a stream (anonymized on request).

`args` is the parsed command line (format, no_color, anonymize); every front-end renders through here.
"""
from __future__ import annotations

import sys

from vllm_doctor.findings import Diagnosis


def render(diagnosis: Diagnosis, args, stream) -> str:
    if getattr(args, "command_only", False):
        from vllm_doctor.reports.concise import command_only

        text, why = command_only(diagnosis)
        if why:
            print(why, file=sys.stderr)
        return text
    if args.format in ("concise", "github"):
        from vllm_doctor.reports.concise import render_concise, render_github

        return render_concise(diagnosis) if args.format == "concise" else render_github(diagnosis)
    if args.format == "json":
        from vllm_doctor.reports.json_report import render_json

        catalog = None
        if diagnosis.warnings and getattr(args, "rules_dir", None):   # warning titles from the rules in use
            from vllm_doctor.rules.catalog import cached_catalog

            catalog = cached_catalog(args.rules_dir)
        return render_json(diagnosis, catalog)
    if args.format == "markdown":
        from vllm_doctor.reports.markdown import render_markdown

        return render_markdown(diagnosis, verbose=getattr(args, "verbose", 0))
    from vllm_doctor.reports.text import render_text, use_color

    color = False if (args.no_color or getattr(args, "anonymize", False)) else use_color(stream)
    return render_text(diagnosis, None, color=color, verbose=getattr(args, "verbose", 0),
                       all_runs=getattr(args, "all_runs", False))


def emit(diagnosis: Diagnosis, args, stream=None) -> None:
    stream = stream or sys.stdout
    text = render(diagnosis, args, stream)
    if getattr(args, "anonymize", False):
        from vllm_doctor.reports.anonymize import for_args, mask_json

        mask = for_args(args, diagnosis)     # the run's masker: the same placeholders as its notices
        text = mask_json(text, mask) if args.format == "json" else mask(text)
    stream.write(text)
    stream.flush()
