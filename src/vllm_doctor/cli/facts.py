"""`vllm-doctor facts`: what the doctor knows about this machine (and a model), or about every node of a
Ray cluster with --ray; --format json writes the snapshot that --facts reads elsewhere."""
from __future__ import annotations

import argparse
import sys

from vllm_doctor.cli.common import command_parser, fail, internal_error
from vllm_doctor.numbers import seconds


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "facts", "Show what the doctor knows about this machine (and a model); --format json saves a snapshot.",
        ["vllm-doctor facts",
         "vllm-doctor facts --format json > gpus.json   (then elsewhere: vllm-doctor --facts gpus.json vllm.log)",
         "vllm-doctor facts --model ./Llama-3-8B --anonymize   (safe to paste into a public issue)",
         "vllm-doctor facts --ray --model /models/llama-70b --format json > cluster.json",
         "vllm-doctor check --facts cluster.json -- vllm serve M -tp 8 -pp 2 --distributed-executor-backend ray"])
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--model", metavar="PATH_OR_ID", help="also read this model's config.json (with --ray: whether "
                                                         "every node has it)")
    p.add_argument("--facts", metavar="SNAPSHOT", help="show a saved snapshot instead of this machine")
    p.add_argument("--online", action="store_true", help="allow Hugging Face hub look-ups")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="probe every node of a running Ray cluster (ADDRESS, else RAY_ADDRESS, else the local "
                        "one); needs vllm-doctor[ray]")
    p.add_argument("--ray-timeout", type=seconds, default=30.0, metavar="SECONDS",
                   help="a node that has not answered by then is reported unreachable (default 30)")
    p.add_argument("--no-color", action="store_true")
    p.add_argument("--anonymize", action="store_true",
                   help="mask host names, IPs, user names, secrets and paths (to paste it publicly); a masked "
                        "snapshot still reads, but its node identities are placeholders")
    return p


def _write(text: str, args, facts=None) -> None:
    """What leaves the program, through the run's masker with --anonymize (JSON string by string); the
    masker knows the host names among the facts (a table row `net.hostname  trainer-a` says it by key)."""
    if args.anonymize:
        from vllm_doctor.reports.anonymize import for_args, mask_json

        mask = for_args(args, facts=facts)
        text = mask_json(text, mask) if args.format == "json" else mask(text)
    sys.stdout.write(text)


def cmd_facts(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.ray is not None:
        return _cluster(args)
    from vllm_doctor.facts import Facts
    from vllm_doctor.facts.gather import gather_facts
    from vllm_doctor.facts.snapshot import SnapshotError
    from vllm_doctor.reports.facts_report import render_facts_text, render_snapshot
    from vllm_doctor.reports.text import terminal_width, use_color

    facts = Facts()
    try:
        notices = gather_facts(facts, model=args.model, online=args.online, live=not args.facts,
                               snapshot=args.facts)
    except SnapshotError as exc:
        return fail(str(exc))
    try:
        text = (render_snapshot(facts) if args.format == "json" else
                render_facts_text(facts, notices,
                                  color=use_color(sys.stdout) and not args.no_color and not args.anonymize,
                                  width=terminal_width(sys.stdout)))
    except Exception as exc:  # a fact of a shape the report did not foresee: one line, never a traceback
        return internal_error(exc, "cannot show these facts")
    _write(text, args, facts)
    return 0


def _cluster(args) -> int:
    import json

    from vllm_doctor.facts.ray_cluster import ClusterError, gather_cluster
    from vllm_doctor.reports.cluster_report import render_cluster_text

    if args.facts:
        return fail("--ray probes a live cluster; --facts shows a saved snapshot: use one of them")
    print(f"probing the Ray cluster's nodes (up to {args.ray_timeout:g} s) ...", file=sys.stderr)
    try:
        doc = gather_cluster(args.ray or None, timeout_s=args.ray_timeout, model=args.model)
    except ClusterError as exc:
        return fail(str(exc))
    if args.format == "json":
        from vllm_doctor.numbers import json_safe

        _write(json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n", args)     # strict JSON
    else:
        _write(render_cluster_text(doc), args)
    return 0
