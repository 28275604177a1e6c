"""`vllm-doctor tui` and `--tui`: parse, check the inputs, open the triage app (Textual is imported only
here, when the app is asked for)."""
from __future__ import annotations

import argparse
import os
import sys

from vllm_doctor.cli.common import add_common, fail as _fail, load_rules, options_from


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-doctor tui",
        description="Interactive triage of a vLLM log: findings, fix, evidence, facts and the full log.",
        epilog="examples:\n  vllm-doctor tui vllm.log\n  vllm-doctor tui --follow server.log\n"
               "  vllm serve M 2>&1 | vllm-doctor tui -\n  vllm-doctor tui -- vllm serve M -tp 4",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="*", metavar="LOG", help="log files ('-' or a pipe: standard input)")
    p.add_argument("--follow", metavar="FILE", help="a log a server is still writing: keep reading as it grows")
    add_common(p)
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


def run_from_args(args, run_argv: list[str] | None = None) -> int:
    """Open the app for parsed diagnose/tui arguments: files, a pipe on stdin, or a command to run."""
    from vllm_doctor.rules.catalog import CatalogError

    try:
        catalog = load_rules(args.rules_dir)
    except CatalogError as exc:
        return _fail(str(exc))
    paths = list(getattr(args, "logs", None) or [])
    follow_path = getattr(args, "follow", None)
    follow = isinstance(follow_path, str) and bool(follow_path)
    # a wrapped command, a pipe or a followed file is output made here now; saved files: facts.origin decides
    options = options_from(args, produced_here=bool(run_argv or follow or not paths or paths == ["-"]))
    if run_argv and not options.command:        # the launch command is known: as `vllm-doctor run`
        import shlex

        options.command = shlex.join(run_argv)
    if follow:
        if paths:
            return _fail("--follow takes one file; do not give other logs")
        paths = [follow_path]
    feed = None
    if run_argv:
        if paths:
            return _fail("give log files or a command after '--', not both")
        from vllm_doctor.tui.live import run_feed

        try:
            feed = run_feed(run_argv)
        except OSError as exc:
            return _fail(f"cannot run {run_argv[0]}: {exc.strerror or exc}")
    elif not paths or paths == ["-"]:
        if sys.stdin.isatty():
            return _fail("give a log file, '-' with a pipe on standard input, or '-- COMMAND'")
        from vllm_doctor.tui.live import stdin_feed

        try:
            feed = stdin_feed()
        except OSError as exc:
            return _fail(f"no terminal to read keys from (/dev/tty: {exc.strerror or exc})")
    else:
        if "-" in paths:
            return _fail("'-' (standard input) cannot be mixed with files")
        for path in paths:
            if os.path.isdir(path):
                return _fail(f"cannot read {path}: is a directory")
            if not os.access(path, os.R_OK):
                return _fail(f"cannot read {path}: no such file or not readable")
    if feed is not None:
        paths, title = [feed.path], feed.title
    else:
        title = None
    from vllm_doctor.tui.app import TriageApp

    app = TriageApp(paths, catalog, options, title=title, follow=follow, feed=feed)
    try:
        app.run()
    finally:
        if feed is not None:
            feed.stop()
            feed.cleanup()
    if feed is not None and feed.returncode is not None and run_argv:
        return feed.returncode
    diagnosis = app.diagnosis
    return 1 if diagnosis is not None and diagnosis.findings else 0
