"""Command line: `vllm-doctor [diagnose] LOG…`, the pipe, and the sub-commands.

Exit codes: 0 nothing wrong found, 1 findings, 2 usage or input error (in `run` mode: the child's).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from vllm_doctor import __version__
from vllm_doctor.numbers import seconds       # finite, >= 0: `nan`/`inf`/-1 are argparse's usage error
from vllm_doctor.cli.common import add_common, check_ignore, command_parser, exit_code, fail, internal_error, interrupted, \
    load_rules, options_from, report_written, silence_stdout, std_streams_present, wrapped

EXAMPLES = """\
examples:
  vllm-doctor vllm_startup.log                 diagnose a saved log
  vllm-doctor --format json worker*.log        several files, machine-readable
  vllm serve MODEL -tp 4 2>&1 | vllm-doctor    sit in the pipe: output passes through, diagnosis on stderr
  vllm-doctor --cmd "vllm serve m -tp 3" x.log give the launch command the log lacks
  vllm-doctor --facts gpus.json x.log          use facts saved on the machine that wrote the log
  vllm-doctor -q x.log                         only the corrected command, for $(…) in scripts
  vllm-doctor --format github x.log            GitHub Actions annotations (concise: one line each)
  vllm-doctor --ignore nccl-p2p x.log          leave a rule's findings out (the exit code follows)
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
DIAGNOSE_EXAMPLES = """\
examples:
  vllm-doctor diagnose vllm_startup.log              one saved log: the root cause and the corrected command
  vllm-doctor diagnose - < server.log                a saved log on standard input (nothing is echoed)
  vllm-doctor diagnose --format json w0.log w1.log   several files of one launch, machine-readable
  vllm-doctor diagnose --report report.txt x.log     the report in a file instead of the terminal
"""
SUBCOMMANDS = ("diagnose", "rules", "explain", "facts", "run", "tui", "check", "plan", "health")


def _diagnose_parser(prog: str = "vllm-doctor", epilog: str = EXAMPLES) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog,
        description=wrapped("Tell why a vLLM server failed to start (or died) and print the command that works. "
                            "With no LOG and vLLM's output piped in, the output passes through unchanged and the "
                            "diagnosis goes to stderr."))
    p.add_argument("logs", nargs="*", metavar="LOG",
                   help="saved log files; '-' reads a saved log from standard input (nothing is echoed)")
    add_common(p)
    p.add_argument("--report", metavar="FILE", help="write the report to FILE instead of the terminal")
    p.add_argument("--version", action="version", version=f"vllm-doctor {__version__}")
    p.add_argument("--tui", action="store_true", help="open the interactive triage session (vllm-doctor tui)")
    # live modes (pipe / follow: vllm_doctor.cli.pipe, vllm_doctor.cli.follow)
    p.add_argument("--follow", metavar="FILE", help="diagnose a log a server is still writing (tail -F)")
    p.add_argument("--idle-exit", type=seconds, metavar="SECONDS",
                   help="with --follow: stop once the log shows a failure (one a rule names or a traceback "
                        "none explains) and has been silent this long")
    p.add_argument("--settle", type=seconds, help=argparse.SUPPRESS)
    return p


def cmd_diagnose(argv: list[str], parser: argparse.ArgumentParser | None = None) -> int:
    parser = parser or _diagnose_parser()
    refused = refuse_misplaced(argv, parser)
    if refused is not None:
        return refused
    args = parser.parse_args(argv)
    if args.tui:
        from vllm_doctor.cli.tui import run_from_args

        return run_from_args(args)
    paths = args.logs
    piped = not args.follow and not paths and sys.stdin is not None and not sys.stdin.isatty()
    try:
        catalog = load_rules(args.rules_dir)
    except Exception as exc:
        from vllm_doctor.rules.catalog import CatalogError

        if not (piped and isinstance(exc, CatalogError)):
            raise
        # the server's output is already flowing into us: say it once, then pass every byte on (exit 2)
        fail(str(exc))
        from vllm_doctor.streams.pipe import copy_only

        copy_only(sys.stdin.fileno(), sys.stdout.fileno())
        return 2
    if (error := check_ignore(args, catalog)) is not None:
        return fail(error)
    if args.follow:
        if paths:
            return fail("--follow takes one file; do not give other logs")
        from vllm_doctor.cli.follow import run_follow

        rc = run_follow(catalog, args, options_from(args, produced_here=True))
        if rc != 2:
            report_written(args)
        return rc
    if not paths:
        if sys.stdin is None:
            return fail("standard input is closed: give a log file")
        if sys.stdin.isatty():
            parser.print_usage(sys.stderr)
            return fail("give a log file, '-' for standard input, or pipe vLLM's output in")
        from vllm_doctor.cli.pipe import run_pipe

        return run_pipe(catalog, args, options_from(args, produced_here=True))
    if "-" in paths and paths != ["-"]:
        return fail("'-' (standard input) cannot be mixed with files")
    return diagnose_saved(paths, catalog, args)


def diagnose_saved(paths: list[str], catalog, args) -> int:
    """Saved logs (files, or `-`: standard input read to its end): the report on stdout or --report."""
    from vllm_doctor.diagnosis.ignore import drop_ignored
    from vllm_doctor.diagnosis.saved import InputError, diagnose_paths
    from vllm_doctor.facts.snapshot import SnapshotError
    from vllm_doctor.reports.emit import emit
    from vllm_doctor.rules.catalog import CatalogError

    try:
        if paths == ["-"]:
            from vllm_doctor.cli.stdin import diagnose_stdin

            diagnosis = diagnose_stdin(catalog, options_from(args))
        else:
            diagnosis = diagnose_paths(paths, catalog, options_from(args))
        drop_ignored(diagnosis, args.ignored_rules)
    except (InputError, SnapshotError, CatalogError) as exc:
        return fail(str(exc))
    except Exception as exc:  # anything else still ends in one line, never a traceback
        return internal_error(exc)
    if args.report:
        try:
            with open(args.report, "w", encoding="utf-8") as out:
                emit(diagnosis, args, out)
        except OSError as exc:
            return fail(f"cannot write {args.report}: {exc.strerror}")
        report_written(args)
    else:
        try:
            emit(diagnosis, args)
            sys.stdout.flush()
        except BrokenPipeError:          # `| head`: the reader saw what it wanted; the verdict stands
            silence_stdout()
        except OSError as exc:
            silence_stdout()
            return fail(f"cannot write the report to standard output: {exc.strerror or exc}")
    return exit_code(diagnosis)


def _rules_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "rules", "List the rule catalog: every failure the doctor recognises, with its severity and family.",
        ["vllm-doctor rules", "vllm-doctor rules --format json",
         "vllm-doctor rules --format markdown       (the table kept in the README)"])
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text",
                   help="markdown prints the table kept in the README")
    p.add_argument("--rules-dir", help=argparse.SUPPRESS)
    return p


def cmd_rules(argv: list[str]) -> int:
    args = _rules_parser().parse_args(argv)
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
        from vllm_doctor.reports.rule_pages import rules_text
        from vllm_doctor.reports.text import terminal_width

        sys.stdout.write(rules_text(rules, terminal_width(sys.stdout)))
    return 0


def _explain_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "explain", "Print a rule's page: what the failure means, why vLLM checks it, a real log line, how the "
                   "fix is chosen and which versions print it.",
        ["vllm-doctor explain tp-heads-indivisible", "vllm-doctor explain port-in-use",
         "vllm-doctor explain TP-Heads-Indivisible    (ids are not case-sensitive)"])
    p.add_argument("rule", help="a rule id, any case (see `vllm-doctor rules`)")
    p.add_argument("--rules-dir", help=argparse.SUPPRESS)
    return p


def cmd_explain(argv: list[str]) -> int:
    args = _explain_parser().parse_args(argv)
    from vllm_doctor.reports.rule_pages import rule_page
    catalog = load_rules(args.rules_dir)
    rule_id, meant = catalog.rule_named(args.rule)
    if rule_id is None:
        hint = f"did you mean '{meant}'?" if meant else "`vllm-doctor rules` lists them"
        return fail(f"no rule '{args.rule}'; {hint}")
    rule = catalog.rules[rule_id]
    from vllm_doctor.reports.rule_pages import fit_page
    from vllm_doctor.reports.text import terminal_width

    sys.stdout.write(fit_page(rule_page(rule), terminal_width(sys.stdout)))
    return 0


def cmd_facts(argv: list[str]) -> int:
    from vllm_doctor.cli.facts import cmd_facts as facts

    return facts(argv)


def _subcommand_typo(word: str) -> str | None:
    """`vllm-doctor explian`: a first word that is no file but looks like a sub-command's name."""
    import difflib
    import os

    if os.path.exists(word) or "/" in word or "." in word:
        return None
    close = difflib.get_close_matches(word, SUBCOMMANDS, n=1, cutoff=0.75)
    return close[0] if close else None


def _first_word(argv: list[str], parser: argparse.ArgumentParser) -> int | None:
    """Index of the first word that is neither an option nor an option's value (after `--`: the next)."""
    takes_value = {opt for action in parser._actions if action.nargs != 0 for opt in action.option_strings}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return i + 1 if i + 1 < len(argv) else None
        if word == "-" or not word.startswith("-"):
            return i
        i += 2 if word in takes_value else 1
    return None




def is_launch_command(words: list[str]) -> bool:
    """`vllm serve …`, `python -m vllm.entrypoints…`, `docker run … vllm/vllm-openai …` (after any
    `NAME=value` prefixes): a command line, where a log file was expected."""
    import os

    from vllm_doctor.command.layout import ENV_ASSIGNMENT, PYTHON    # the command model's own spellings

    while words and ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]
    if not words:
        return False
    program = os.path.basename(words[0])
    if program == "vllm":
        return True
    if PYTHON.match(program) and "-m" in words[:-1]:
        return words[words.index("-m") + 1].startswith("vllm")
    if program in ("docker", "podman", "nvidia-docker") and words[1:2] == ["run"]:
        return any("vllm" in word.lower() for word in words[2:])
    return False


def refuse_misplaced(argv: list[str], parser: argparse.ArgumentParser) -> int | None:
    """Exit 2 with a pointed one-line error when the first word is no file but a launch command or a
    mistyped sub-command, or when an option is a typo of one of ours; None when nothing is amiss."""
    import os

    at = _first_word(argv, parser)
    word = argv[at] if at is not None else None
    if word is not None and word != "-" and not os.path.exists(word):
        import shlex

        words = argv[at:]
        if len(words) == 1 and " " in word.strip():      # the command in one quoted argument
            try:
                words = shlex.split(word)
            except ValueError:
                pass
        if is_launch_command(words):
            shown = shlex.join(words)
            return fail(f"'{shown}' is a command, not a log; did you mean `vllm-doctor run -- {shown}` (run it "
                        f"and diagnose) or `vllm-doctor check -- {shown}` (predict without running)?")
        typo = _subcommand_typo(word)
        if typo:
            return fail(f"no file '{word}' and no sub-command of that name; did you mean 'vllm-doctor {typo}'?")
    check_options(parser, argv)
    return None


def check_options(parser: argparse.ArgumentParser, argv: list[str], *, stop_at_word: bool = False) -> None:
    """argparse's error for an unknown `--option`, plus the option it most likely is (Python 3.11's argparse
    has no such hint). Returns when every option is known; `stop_at_word`: the first plain word starts
    a command whose options are not ours (`run`, `check`)."""
    known = parser._option_string_actions
    shown = [opt for action in parser._actions if action.help != argparse.SUPPRESS
             for opt in action.option_strings if opt.startswith("--")]
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word == "--":
            return
        if word == "-" or not word.startswith("-"):
            if stop_at_word:
                return
            continue
        name = word.split("=", 1)[0]
        matches = [name] if name in known else [opt for opt in known if opt.startswith(name) and len(name) > 2]
        if len(matches) == 1:                  # known, or an abbreviation argparse accepts
            i += 1 if "=" not in word and known[matches[0]].nargs != 0 else 0
            continue
        if matches or not name.startswith("--"):
            continue
        import difflib

        close = difflib.get_close_matches(name, shown, n=1, cutoff=0.6)
        if close:
            parser.error(f"unrecognized arguments: {word}; did you mean {close[0]}?")


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
    std_streams_present()
    argv = hoist_subcommand(list(sys.argv[1:] if argv is None else argv))
    try:
        rc = _dispatch(argv)
        sys.stdout.flush()                # a full disk is found here, not in the interpreter's exit
        return rc
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # the reader went away (`| head`): nothing left to say to it
        silence_stdout()
        return 0
    except OSError as exc:    # stdout on a full disk (/dev/full), an I/O error: one line, exit 2
        silence_stdout()
        return fail(f"cannot write output: {exc.strerror or exc}")
    except Exception as exc:  # a malformed rule file (CatalogError) on any sub-command: one line, exit 2
        from vllm_doctor.rules.catalog import CatalogError

        if isinstance(exc, CatalogError):
            return fail(str(exc))
        if interrupted(exc):
            return 130
        raise


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        name, rest = argv[0], argv[1:]
        handler = COMMANDS.get(name)
        if handler is None:
            return fail(f"'{name}' is not available in this build")
        own = _sub_parser(name)
        if own is not None:
            check_options(own[0], rest, stop_at_word=own[1])
        return handler(rest)
    return cmd_diagnose(argv)


def _sub_parser(name: str) -> tuple[argparse.ArgumentParser, bool] | None:
    """The parser of a sub-command whose options `main` checks for typos, and whether its own options end
    at the first plain word (what follows is the server's command line). `diagnose` checks its own."""
    if name == "run":
        from vllm_doctor.cli.run import _parser as parser
    elif name == "check":
        from vllm_doctor.cli.check import _parser as parser
    elif name == "plan":
        from vllm_doctor.cli.plan import _parser as parser
    elif name == "tui":
        from vllm_doctor.cli.tui import _parser as parser
    elif name in ("facts", "health"):
        parser = importlib.import_module(f"vllm_doctor.cli.{name}")._parser
    else:
        parser = {"rules": _rules_parser, "explain": _explain_parser}.get(name)
    return (parser(), name in ("run", "check")) if parser else None


def cmd_diagnose_sub(argv: list[str]) -> int:
    """`vllm-doctor diagnose …`: the default mode, under its own name and help."""
    return cmd_diagnose(argv, _diagnose_parser("vllm-doctor diagnose", DIAGNOSE_EXAMPLES))


COMMANDS = {"diagnose": cmd_diagnose_sub, "rules": cmd_rules, "explain": cmd_explain, "facts": cmd_facts}


def cmd_run(argv: list[str]) -> int:
    from vllm_doctor.cli.run import cmd_run as run

    return run(argv)


COMMANDS["run"] = cmd_run


def cmd_health(argv: list[str]) -> int:
    return importlib.import_module("vllm_doctor.cli.health").cmd_health(argv)


COMMANDS["health"] = cmd_health


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
