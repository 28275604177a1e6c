"""`vllm-doctor tui` and `--tui`: parse, check the inputs, open the triage app (Textual is imported only
here, when the app is asked for)."""
from __future__ import annotations

import argparse
import os
import sys

from vllm_doctor.cli.common import add_common, check_ignore, command_parser, fail as _fail, load_rules, options_from


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "tui", "Interactive triage of a vLLM log: findings, fix, evidence, facts and the full log.",
        ["vllm-doctor tui vllm.log", "vllm-doctor tui --follow server.log", "vllm serve M 2>&1 | vllm-doctor tui -",
         "vllm-doctor tui -- vllm serve M -tp 4"])
    p.add_argument("logs", nargs="*", metavar="LOG", help="log files ('-' or a pipe: standard input)")
    p.add_argument("--follow", metavar="FILE", help="a log a server is still writing: keep reading as it grows")
    add_common(p, "tui")
    return p


def main(argv: list[str]) -> int:
    run_argv: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, run_argv = argv[:cut], argv[cut + 1:]
        if not run_argv:
            return _fail("give the command to run after '--'")
    args = _parser().parse_args(argv)
    return run_from_args(args, run_argv)


def _can_open_tty() -> bool:
    try:
        os.close(os.open("/dev/tty", os.O_RDWR))
    except OSError:
        return False
    return True


def no_terminal(mode: str) -> str | None:
    """Why the app cannot run here (None: it can). Without a terminal on stdout Textual would write
    its escape codes into a file or a pipe and wait for keys that never come. `mode`: files, follow,
    pipe or run (the text command to suggest instead)."""
    instead = {"files": "vllm-doctor LOG", "follow": "vllm-doctor --follow FILE",
               "pipe": "... | vllm-doctor", "run": "vllm-doctor run -- CMD"}[mode]
    hint = f"; without one, run `{instead}` for the text report"
    if not sys.stdout.isatty():
        return "the TUI needs a terminal (standard output is not one)" + hint
    keys_from_stdin = mode != "pipe" and sys.stdin.isatty()
    if not keys_from_stdin and not _can_open_tty():
        return "the TUI needs a terminal to read keys from (no /dev/tty)" + hint
    return None


def _keys_from_tty() -> None:
    """Standard input is not the terminal (`vllm-doctor tui x.log < /dev/null`): Textual reads its keys
    from fd 0, so fd 0 becomes /dev/tty (no_terminal() checked that it opens)."""
    if not sys.stdin.isatty():
        tty = os.open("/dev/tty", os.O_RDWR)
        os.dup2(tty, 0)
        os.close(tty)


def _check_paths(paths: list[str]) -> str | None:
    if "-" in paths:
        return "'-' (standard input) cannot be mixed with files"
    for path in paths:
        if os.path.isdir(path):
            return f"cannot read {path}: is a directory"
        if not os.access(path, os.R_OK):
            return f"cannot read {path}: no such file or not readable"
    return None


def _mode(paths: list[str], follow: bool, run_argv: list[str] | None) -> str:
    if run_argv:
        return "run"
    if follow:
        return "follow"
    return "pipe" if not paths or paths == ["-"] else "files"


def _usage_error(paths: list[str], follow: bool, run_argv: list[str] | None) -> str | None:
    """The inputs' own problems, named before the terminal's (a typo is worth knowing first)."""
    mode = _mode(paths, follow, run_argv)
    if mode == "run" and paths:
        return "give log files or a command after '--', not both"
    if mode == "pipe" and sys.stdin.isatty():
        return "give a log file, '-' with a pipe on standard input, or '-- COMMAND'"
    return _check_paths(paths) if mode in ("files", "follow") else None


def _start_feed(mode: str, run_argv: list[str] | None):
    """The live source of a pipe or a wrapped command (None for files); raises OSError."""
    if mode == "run":
        from vllm_doctor.tui.live import run_feed

        _keys_from_tty()
        return run_feed(run_argv)
    if mode == "pipe":
        from vllm_doctor.tui.live import stdin_feed

        return stdin_feed()
    _keys_from_tty()
    return None


def run_from_args(args, run_argv: list[str] | None = None) -> int:
    """Open the app for parsed diagnose/tui arguments: files, a pipe on stdin, or a command to run."""
    from vllm_doctor.rules.catalog import CatalogError

    try:
        catalog = load_rules(args.rules_dir)
    except CatalogError as exc:
        return _fail(str(exc))
    if (error := check_ignore(args, catalog)) is not None:
        return _fail(error)
    paths = list(getattr(args, "logs", None) or [])
    follow_path = getattr(args, "follow", None)
    follow = isinstance(follow_path, str) and bool(follow_path)
    if follow:
        if paths:
            return _fail("--follow takes one file; do not give other logs")
        paths = [follow_path]
    mode = _mode(paths, follow, run_argv)
    problem = _usage_error(paths, follow, run_argv) or no_terminal(mode)
    if problem:
        return _fail(problem)
    # a wrapped command, a pipe or a followed file is output made here now; saved files: facts.origin decides
    options = options_from(args, produced_here=mode != "files")
    if run_argv and not options.command:        # the launch command is known: as `vllm-doctor run`
        import shlex

        options.command = shlex.join(run_argv)
    try:
        feed = _start_feed(mode, run_argv)
    except OSError as exc:
        if mode == "run":
            return _fail(f"cannot run {run_argv[0]}: {exc.strerror or exc}")
        return _fail(f"no terminal to read keys from (/dev/tty: {exc.strerror or exc})")
    from vllm_doctor.reports.anonymize import for_args

    return _run_app(paths, catalog, options, follow, feed, bool(run_argv), mask=for_args(args))


def _run_app(paths: list[str], catalog, options, follow: bool, feed, wrapped: bool, mask=None) -> int:
    title = None
    if feed is not None:
        paths, title = [feed.path], feed.title
    from vllm_doctor.tui.app import TriageApp

    app = TriageApp(paths, catalog, options, title=title, follow=follow, feed=feed, mask=mask)
    try:
        app.run()
    finally:
        if feed is not None:
            feed.stop()
            feed.cleanup()
    if feed is not None and feed.returncode is not None and wrapped:
        return feed.returncode
    diagnosis = app.diagnosis
    return 1 if diagnosis is not None and diagnosis.findings else 0
