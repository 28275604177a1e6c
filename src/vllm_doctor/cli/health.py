"""`vllm-doctor health [URL]`: read a running server twice (checks/health.py), report as every mode does."""
from __future__ import annotations

import argparse
import os
import sys

from vllm_doctor.cli.common import FORMATS, check_ignore, command_parser, fail, internal_error, load_rules
from vllm_doctor.numbers import finite_float


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "health", "Check a running vLLM server from its own endpoints (/health, /v1/models, /version, /metrics), "
                  "read twice a few seconds apart, joined with its launch (--cmd, or the process list) and its GPUs "
                  "(NVML, or --facts): a KV cache that preempts requests, a queue the scheduler holds while the "
                  "cache is idle, a first token that is mostly queueing, an engine alive but making no progress, a "
                  "GPU of the group holding no rank, a GPU holding more than the server's memory budget. Only GET requests, only to URL, unless --probe. Exit 0: "
                  "healthy, 1: findings, 2: no server or usage error, 3: the server's metrics could not be read.",
        ["vllm-doctor health",
         "vllm-doctor health http://127.0.0.1:8001 --interval 10",
         "VLLM_API_KEY=secret vllm-doctor health --format json",
         "vllm-doctor health --probe",
         "vllm-doctor health --watch --interval 2",
         "vllm-doctor health --cmd \"vllm serve Qwen/Qwen2.5-7B-Instruct --max-num-seqs 256\""],
        usage="vllm-doctor health [options] [URL]")
    p.add_argument("url", nargs="?", default="http://127.0.0.1:8000", metavar="URL",
                   help="the server's base URL (default http://127.0.0.1:8000)")
    p.add_argument("--api-key", metavar="KEY", help="the server's --api-key (default: VLLM_API_KEY)")
    p.add_argument("--interval", type=finite_float, default=5.0, metavar="S",
                   help="seconds between the two readings (default 5): counters need two")
    p.add_argument("--cmd", metavar="COMMAND", help="the server's launch command (default: the vLLM server on "
                                                    "the URL's port in this machine's process list)")
    p.add_argument("--facts", metavar="SNAPSHOT", help="the server machine's GPUs from a snapshot (`vllm-doctor "
                                                       "facts --format json` there) instead of this machine's NVML")
    p.add_argument("--probe", action="store_true",
                   help="also send one generation request (8 tokens at temperature 0, the first model the server "
                        "lists; said in the report): a server that answers /health but serves nothing is found")
    p.add_argument("--watch", action="store_true",
                   help="keep reading every --interval seconds: a live view on a terminal, else a line per reading "
                        "and one when a finding appears or clears (Ctrl-C ends it)")
    p.add_argument("--count", type=int, default=0, metavar="N", help="with --watch: stop after N readings")
    p.add_argument("--format", choices=FORMATS, default="text", help="report format")
    p.add_argument("-q", "--command-only", action="store_true", help="print only the corrected command")
    p.add_argument("--ignore", action="append", metavar="RULE", help="do not report findings of RULE")
    p.add_argument("--no-color", action="store_true", help="plain output (also when NO_COLOR is set)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="the explanation, arithmetic and facts")
    p.add_argument("--rules-dir", help=argparse.SUPPRESS)
    return p


def _launch(args):
    """The server's launch command and environment, and the GPU facts of its machine: --cmd and --facts as given;
    else, for a server on this machine (a loopback URL), its process's own command line and this machine's NVML."""
    from urllib.parse import urlsplit

    from vllm_doctor.command import Command
    from vllm_doctor.facts import Facts
    from vllm_doctor.facts.origin import LOOPBACK

    url = urlsplit(args.url)
    local = (url.hostname or "").startswith(LOOPBACK)
    found = None
    if local:
        from vllm_doctor.facts.server_process import find_server

        found = find_server(url.port or (443 if url.scheme == "https" else 80))
    text = args.cmd or (found.command if found else None)
    gpus = Facts()
    if args.facts:
        from vllm_doctor.facts.snapshot import load_snapshot

        load_snapshot(args.facts, gpus)
    elif local:
        from vllm_doctor.facts.nvml import collect_gpu_facts

        collect_gpu_facts(gpus)
    command = Command.parse(text) if text else None
    if command is not None and command.model:
        _model_facts(command, text, gpus)
    return command, (found.environ if found else None), gpus, (found.family if found else frozenset())


def _model_facts(command, text: str, facts) -> None:
    """The launch's flags (args.*) and its model's config, read here and offline (a local directory, the
    Hugging Face cache, or the shipped table; never remote code): the memory model's share of each GPU."""
    from vllm_doctor.diagnosis.launch import resolve_command
    from vllm_doctor.facts.model import load_model_facts

    resolve_command(facts, None, text)
    try:
        load_model_facts(str(command.model), facts, online=False, table=True)
    except Exception:  # noqa: BLE001 - a config of a shape nobody foresaw: the budget alone is judged
        pass


def cmd_health(argv: list[str]) -> int:
    from vllm_doctor.checks.health import diagnose_server, read_twice
    from vllm_doctor.diagnosis.ignore import drop_ignored
    from vllm_doctor.facts.server import ServerUnreachable
    from vllm_doctor.facts.server_metrics import MetricsUnreadable
    from vllm_doctor.facts.snapshot import SnapshotError
    from vllm_doctor.reports.emit import emit
    from vllm_doctor.rules.catalog import CatalogError

    args = _parser().parse_args(argv)
    if not 0 <= args.interval <= 3600:
        return fail(f"--interval {args.interval:g} must be between 0 and 3600 seconds")
    if args.count < 0 or (args.count and not args.watch):
        return fail("--count N needs --watch and N >= 0")
    if args.watch and args.format not in ("text", "json"):
        return fail(f"--watch writes text or json, not {args.format}")
    if not args.url.startswith(("http://", "https://")):
        return fail(f"not an http(s) URL: {args.url!r}")
    try:
        catalog = load_rules(args.rules_dir)
        if (error := check_ignore(args, catalog)) is not None:
            return fail(error)
        command, environ, gpus, server_pids = _launch(args)
        if args.format == "text" and sys.stderr.isatty():
            print(f"vllm-doctor: reading {args.url} twice, {args.interval:g} s apart…", file=sys.stderr)
        api_key = args.api_key or os.environ.get("VLLM_API_KEY")
        if args.watch:
            from vllm_doctor.cli.health_watch import watch

            return watch(args, catalog, command, gpus, environ, api_key, server_pids)
        reading = read_twice(args.url, api_key, args.interval)
        probed = None
        if args.probe and reading.last.models:
            from vllm_doctor.facts.server_probe import probe

            probed = probe(args.url, reading.last.models[0], api_key)
        diagnosis = diagnose_server(reading, catalog, command, gpus, environ, probed, server_pids)
        if args.probe and not reading.last.models:
            diagnosis.notices.append("health --probe sent nothing: /v1/models listed no model")
    except (ServerUnreachable, CatalogError, SnapshotError) as exc:
        return fail(str(exc))
    except MetricsUnreadable as exc:
        print(f"vllm-doctor: {exc}", file=sys.stderr)
        return 3
    except Exception as exc:  # never a traceback
        return internal_error(exc)
    emit(drop_ignored(diagnosis, args.ignored_rules), args)
    if diagnosis.findings:
        return 1
    return 3 if diagnosis.unchecked else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cmd_health(sys.argv[1:]))
