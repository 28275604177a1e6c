"""What every sub-command's parser shares: the common options, the one-line error, the exit code."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_doctor.diagnosis.saved import Options


FORMATS = ("text", "json", "markdown", "concise", "github")


def wrapped(description: str) -> str:
    """A --help description wrapped to the terminal: argparse's raw formatter, which keeps the examples as typed,
    would print each paragraph as one line."""
    import shutil
    import textwrap

    width = max(40, min(shutil.get_terminal_size().columns, 100) - 2)
    return "\n\n".join(textwrap.fill(part, width) for part in description.split("\n\n"))


def command_parser(name: str, description: str, examples: list[str], usage: str | None = None
                   ) -> argparse.ArgumentParser:
    """A sub-command's parser: `vllm-doctor NAME`, its description, and an `examples:` epilog kept as typed."""
    return argparse.ArgumentParser(prog=f"vllm-doctor {name}", usage=usage, description=wrapped(description),
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="examples:\n" + "\n".join(f"  {line}" for line in examples))


# what the shared options mean in each mode; an option a mode has no use for is still accepted (scripts pass
# one option set to several modes) but left out of its --help
_CMD_HELP = {"logs": "the command that produced the log, if the log lacks it",
             "check": "the launch command to check, as one string (instead of after `--`)",
             "run": "the launch command to name in fixes, when it differs from the one after `--`",
             "tui": "the command that produced the log, if the log lacks it"}
_FACTS_HELP = {"logs": "facts snapshot (vllm-doctor facts --format json) or `vllm collect-env` output from the "
                       "machine that wrote the log",
               "check": "facts snapshot (vllm-doctor facts --format json) or `vllm collect-env` output from the "
                        "machine the command will run on",
               "run": "facts snapshot to use instead of this machine's",
               "tui": "facts snapshot (vllm-doctor facts --format json) or `vllm collect-env` output from the "
                      "machine that wrote the log"}
_NO_LIVE_HELP = {"check": "do not look at this machine's GPUs and environment (check against --facts or --gpus)"}


def add_common(p: argparse.ArgumentParser, mode: str = "logs") -> None:
    """The options every diagnosing mode shares (mode: logs, check, run, tui), each described for its mode."""
    hidden = lambda *modes: argparse.SUPPRESS if mode in modes else None  # noqa: E731
    p.add_argument("--format", choices=FORMATS, default="text",
                   help=hidden("tui") or "report format: text, json, markdown, concise (one line per finding) or "
                                         "github (GitHub Actions annotations)")
    p.add_argument("-q", "--command-only", action="store_true",
                   help=hidden("tui") or "print only the corrected command (nothing when there is none: why goes "
                                         "to stderr)")
    p.add_argument("--ignore", action="append", metavar="RULE",
                   help="do not report findings of RULE (repeat, or comma-separated); the exit code follows")
    p.add_argument("--cmd", metavar="COMMAND", help=_CMD_HELP[mode])
    p.add_argument("--model", metavar="PATH_OR_ID", help="model directory or hub id to read config.json from")
    p.add_argument("--facts", metavar="SNAPSHOT", help=_FACTS_HELP[mode])
    live = p.add_mutually_exclusive_group()
    live.add_argument("--live", action="store_true",
                      help=hidden("check", "run") or "use this machine's GPUs and environment for a saved log "
                           "(default: only when the log was evidently written here: its host name, IP, model path "
                           "or GPUs)")
    live.add_argument("--no-live", action="store_true",
                      help=_NO_LIVE_HELP.get(mode, "do not look at this machine's GPUs and environment"))
    p.add_argument("--online", action="store_true", help="allow Hugging Face hub look-ups (off by default)")
    p.add_argument("--no-color", action="store_true", help="plain output (also when NO_COLOR is set)")
    p.add_argument("--anonymize", action="store_true",
                   help="mask paths, host names, IPs, user names, tokens and API keys in the report")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="-v: the explanation, the arithmetic and the facts; -vv: also notes and provenance")
    p.add_argument("--all-runs", action="store_true",
                   help=hidden("check") or "several launches in the input: every run in full (default: the last "
                                           "run first, earlier runs one line each)")
    p.add_argument("--rules-dir", help=argparse.SUPPRESS)


def interrupted(exc: BaseException) -> bool:
    """Whether a Ctrl-C is behind this exception. A KeyboardInterrupt that lands inside a lock's wait
    (`threading.Condition.wait`, under `queue.get`) leaves the lock released, and the `with` around it
    then raises "RuntimeError: cannot release un-acquired lock" with the interrupt only as its context."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def internal_error(exc: BaseException, what: str = "") -> int:
    """An exception nobody foresaw, as one line and exit 2; one a Ctrl-C caused is exit 130."""
    if interrupted(exc):
        return 130
    detail = f"{type(exc).__name__}: {str(exc)[:160]}"
    return fail(f"{what} ({detail})" if what else detail)


def fail(message: str) -> int:
    try:
        print(f"vllm-doctor: error: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):    # stderr closed or full: the exit code still says it
        pass
    return 2


def silence_stdout() -> None:
    """stdout broke (the reader left, the disk is full): point descriptor 1 at /dev/null so that nothing,
    not even the interpreter's flush at exit, tries it again and prints "Exception ignored"."""
    import os

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass


def std_streams_present() -> None:
    """A descriptor closed by the caller (`vllm-doctor x.log >&-`) makes Python's sys.stdout/stderr None:
    give them /dev/null so the diagnosis runs and the exit code tells (stdin stays None: the modes that
    read it say "standard input is closed")."""
    import os

    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            try:
                setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))
            except OSError:
                pass


def load_rules(rules_dir: str | None):
    from vllm_doctor.rules.catalog import cached_catalog

    return cached_catalog(rules_dir)


def options_from(args, *, produced_here: bool = False) -> Options:
    """`produced_here`: the output is made on this machine now (pipe, run, --follow), so its facts belong.
    `args.ignore` must have been checked (ignored_rules) first."""
    from vllm_doctor.diagnosis.saved import Options

    live = False if args.no_live else True if (getattr(args, "live", False) or produced_here) else None
    return Options(command=args.cmd, model=args.model, snapshot=args.facts, live=live, online=args.online,
                   ignore=getattr(args, "ignored_rules", frozenset()))


def check_ignore(args, catalog) -> str | None:
    """Reads --ignore against the catalog into `args.ignored_rules`; an error line for an unknown rule."""
    from vllm_doctor.diagnosis.ignore import parse_ignore

    args.ignored_rules, error = parse_ignore(getattr(args, "ignore", None), catalog)
    return error


def report_written(args) -> None:
    """With --report the terminal would otherwise show nothing at all: say where the report went."""
    path = getattr(args, "report", None)
    if path:
        print(f"vllm-doctor: report written to {path}", file=sys.stderr)


def exit_code(diagnosis) -> int:
    """1 when any run of the input has findings (an earlier run's failure is still something wrong)."""
    return 1 if diagnosis.findings or any(e.findings for e in diagnosis.earlier) else 0
