"""Command line: `vllm-doctor [diagnose] LOG…`, the pipe, and the sub-commands.

Exit codes: 0 nothing wrong found, 1 findings, 2 usage or input error (in `run` mode: the child's).
"""
from __future__ import annotations

import argparse
import sys

from vllm_doctor import __version__
from vllm_doctor.cli.common import add_common, exit_code, fail, load_rules, options_from

EXAMPLES = """\
examples:
  vllm-doctor vllm_startup.log                 diagnose a saved log
  vllm-doctor --format json worker*.log        several files, machine-readable
  vllm serve MODEL -tp 4 2>&1 | vllm-doctor    sit in the pipe: output passes through, diagnosis on stderr
  vllm-doctor --cmd "vllm serve m -tp 3" x.log give the launch command the log lacks
  vllm-doctor --facts gpus.json x.log          use facts saved on the machine that wrote the log
  vllm-doctor rules                            list the rule catalog
  vllm-doctor explain tp-heads-indivisible     what a rule means and how its fix is computed

sub-commands (each has its own --help):
  run -- vllm serve MODEL -tp 4                run the server, pass its output through, diagnose it (--retry)
  tui x.log                                    interactive triage session (also over a pipe)
  check vllm serve MODEL -tp 3                 predict failures of a command before running it
  plan ./Llama-3-70B --gpus 4                  every tensor/pipeline layout vLLM accepts, ranked
  facts [--format json]                        what this machine has (GPUs, driver, env); save as a snapshot
  diagnose x.log                               the same as `vllm-doctor x.log`
"""
SUBCOMMANDS = ("diagnose", "rules", "explain", "facts", "run", "tui", "check", "plan")


def _diagnose_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-doctor", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Tell why a vLLM server failed to start (or died) and print the command that works.")
    p.add_argument("logs", nargs="*", metavar="LOG", help="log files; '-' or a pipe reads standard input")
    add_common(p)
    p.add_argument("--report", metavar="FILE", help="write the report to FILE (pipe mode: instead of stderr)")
    p.add_argument("--version", action="version", version=f"vllm-doctor {__version__}")
    p.add_argument("--tui", action="store_true", help="open the interactive triage session (vllm-doctor tui)")
    # live modes (pipe / follow: vllm_doctor.cli.pipe, vllm_doctor.cli.follow)
    p.add_argument("--follow", metavar="FILE", help="diagnose a log a server is still writing (tail -F)")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS",
                   help="with --follow: stop once a failure was reported and the log was silent this long")
    p.add_argument("--settle", type=float, help=argparse.SUPPRESS)
    return p


def cmd_diagnose(argv: list[str]) -> int:
    args = _diagnose_parser().parse_args(argv)
    if args.tui:
        from vllm_doctor.cli.tui import run_from_args

        return run_from_args(args)
    from vllm_doctor.diagnosis.saved import InputError, diagnose_paths
    from vllm_doctor.reports.emit import emit
    from vllm_doctor.facts.snapshot import SnapshotError
    from vllm_doctor.rules.catalog import CatalogError
    catalog = load_rules(args.rules_dir)
    paths = args.logs
    if args.follow:
        if paths:
            return fail("--follow takes one file; do not give other logs")
        from vllm_doctor.cli.follow import run_follow

        return run_follow(catalog, args, options_from(args, produced_here=True))
    if not paths or paths == ["-"]:
        if not paths and sys.stdin.isatty():
            _diagnose_parser().print_usage(sys.stderr)
            return fail("give a log file, '-' for standard input, or pipe vLLM's output in")
        from vllm_doctor.cli.pipe import run_pipe

        return run_pipe(catalog, args, options_from(args, produced_here=True))
    if "-" in paths:
        return fail("'-' (standard input) cannot be mixed with files")
    typo = _subcommand_typo(paths[0])
    if typo:
        return fail(f"no file '{paths[0]}' and no sub-command of that name; did you mean 'vllm-doctor {typo}'?")
    try:
        diagnosis = diagnose_paths(paths, catalog, options_from(args))
    except InputError as exc:
        return fail(str(exc))
    except (SnapshotError, CatalogError) as exc:
        return fail(str(exc))
    except Exception as exc:  # anything else still ends in one line, never a traceback
        return fail(f"{type(exc).__name__}: {exc}")
    if args.report:
        try:
            with open(args.report, "w", encoding="utf-8") as out:
                emit(diagnosis, args, out)
        except OSError as exc:
            return fail(f"cannot write {args.report}: {exc.strerror}")
    else:
        emit(diagnosis, args)
    return exit_code(diagnosis)


def cmd_rules(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="vllm-doctor rules", description="List the rule catalog.")
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text",
                   help="markdown prints the table kept in the README")
    p.add_argument("--rules-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    catalog = load_rules(args.rules_dir)
    rules = sorted(catalog.rules.values(), key=lambda r: (r.family, r.id))
    if args.format == "markdown":
        from vllm_doctor.reports.rule_pages import rules_markdown

        sys.stdout.write(rules_markdown(catalog))
    elif args.format == "json":
        import json

        print(json.dumps([{"id": r.id, "title": r.title, "severity": r.severity, "family": r.family}
                          for r in rules], indent=2))
    else:
        for r in rules:
            print(f"{r.id:34s} {r.severity:8s} {r.family:12s} {r.title}")
    return 0


def cmd_explain(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="vllm-doctor explain", description="Print a rule's page.",
                                epilog="example: vllm-doctor explain tp-heads-indivisible")
    p.add_argument("rule", help="a rule id (see `vllm-doctor rules`)")
    p.add_argument("--rules-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from vllm_doctor.reports.rule_pages import rule_page
    catalog = load_rules(args.rules_dir)
    rule = catalog.rules.get(args.rule)
    if rule is None:
        import difflib

        close = [r for r in sorted(catalog.rules) if r.startswith(args.rule)] or \
            difflib.get_close_matches(args.rule, list(catalog.rules), n=1, cutoff=0.5)
        return fail(f"no rule '{args.rule}'" + (f"; did you mean '{close[0]}'?" if close else ""))
    sys.stdout.write(rule_page(rule))
    return 0


def cmd_facts(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="vllm-doctor facts", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Show what the doctor knows about this machine (and a model); --format json saves a snapshot.",
        epilog="examples:\n  vllm-doctor facts\n  vllm-doctor facts --format json > gpus.json   "
               "(then elsewhere: vllm-doctor --facts gpus.json vllm.log)\n  vllm-doctor facts --model ./Llama-3-8B")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--model", metavar="PATH_OR_ID", help="also read this model's config.json")
    p.add_argument("--facts", metavar="SNAPSHOT", help="show a saved snapshot instead of this machine")
    p.add_argument("--online", action="store_true", help="allow Hugging Face hub look-ups")
    p.add_argument("--no-color", action="store_true")
    args = p.parse_args(argv)
    from vllm_doctor.facts import Facts
    from vllm_doctor.facts.gather import gather_facts
    from vllm_doctor.facts.snapshot import SnapshotError
    from vllm_doctor.reports.facts_report import render_facts_text, render_snapshot
    from vllm_doctor.reports.text import use_color

    facts = Facts()
    try:
        notices = gather_facts(facts, model=args.model, online=args.online, live=not args.facts,
                               snapshot=args.facts)
    except SnapshotError as exc:
        return fail(str(exc))
    if args.format == "json":
        sys.stdout.write(render_snapshot(facts))
    else:
        sys.stdout.write(render_facts_text(facts, notices, color=use_color(sys.stdout) and not args.no_color))
    return 0


def _subcommand_typo(word: str) -> str | None:
    """`vllm-doctor explian`: a first word that is no file but looks like a sub-command's name."""
    import difflib
    import os

    if os.path.exists(word) or "/" in word or "." in word:
        return None
    close = difflib.get_close_matches(word, SUBCOMMANDS, n=1, cutoff=0.75)
    return close[0] if close else None


def hoist_subcommand(argv: list[str]) -> list[str]:
    """`vllm-doctor --no-live check CMD` means `vllm-doctor check --no-live CMD`: options written before
    a sub-command's name move after it (that sub-command's parser then judges them). The first word
    that is neither an option nor an option's value decides; `--` ends the search."""
    if not argv or not argv[0].startswith("-") or argv[0] in ("-", "--"):
        return argv
    takes_value = {opt for action in _diagnose_parser()._actions if action.nargs != 0
                   for opt in action.option_strings}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--" or word == "-":
            return argv
        if not word.startswith("-"):
            return [word, *argv[:i], *argv[i + 1:]] if word in SUBCOMMANDS else argv
        i += 2 if word in takes_value else 1
    return argv


def main(argv: list[str] | None = None) -> int:
    argv = hoist_subcommand(list(sys.argv[1:] if argv is None else argv))
    try:
        if argv and argv[0] in SUBCOMMANDS:
            name, rest = argv[0], argv[1:]
            handler = COMMANDS.get(name)
            if handler is None:
                return fail(f"'{name}' is not available in this build")
            return handler(rest)
        return cmd_diagnose(argv)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # the reader went away (`| head`): nothing left to say to it
        return 0
    except Exception as exc:  # a malformed rule file (CatalogError) on any sub-command: one line, exit 2
        from vllm_doctor.rules.catalog import CatalogError

        if isinstance(exc, CatalogError):
            return fail(str(exc))
        raise


COMMANDS = {"diagnose": cmd_diagnose, "rules": cmd_rules, "explain": cmd_explain, "facts": cmd_facts}


def cmd_run(argv: list[str]) -> int:
    from vllm_doctor.cli.run import cmd_run as run

    return run(argv)


COMMANDS["run"] = cmd_run


def cmd_tui(argv: list[str]) -> int:
    from vllm_doctor.cli.tui import main as tui_main

    return tui_main(argv)


COMMANDS["tui"] = cmd_tui


def cmd_check(argv: list[str]) -> int:
    from vllm_doctor.cli.check import cmd_check as check

    return check(argv)


def cmd_plan(argv: list[str]) -> int:
    from vllm_doctor.cli.plan import cmd_plan as plan

    return plan(argv)


COMMANDS["check"] = cmd_check
COMMANDS["plan"] = cmd_plan
