"""Run mode: `vllm-doctor run [options] [--] CMD ARGS…` starts the server and diagnoses it live.

* The child runs in its own process group, stdin from /dev/null; its stdout and stderr are merged
  into our stdout (default, like `2>&1 |`) or kept apart (`--separate`: stdout → stdout, stderr →
  stderr); every byte is shown as it arrives and diagnosed on the side, as in pipe mode.
* Signals: Ctrl-C (SIGINT) is forwarded to the child's group so the server shuts down cleanly; if it
  is still running `--kill-after` seconds later (or on a second Ctrl-C) the group gets SIGTERM, then
  SIGKILL. SIGTERM and SIGHUP are forwarded as they are. When the child has exited, whatever is left in
  its process group (workers it spawned) is terminated: the doctor never leaves an orphaned server.
* The exact launch command is known, so the corrected command in the report is exact.
* Exit code: the child's (128+N when signal N killed it; 127/126 when it cannot be started), whatever
  the diagnosis did: an internal error in it stops the diagnosis with one line on stderr, never the copy
  nor the server (streams/guard.py), and no report follows.
* `--retry` runs the corrected command once, after a confirmation prompt (unless `--yes`), exactly
  as a person would paste it into a shell; that run is diagnosed too and gives the exit code. Nothing
  is ever run that the user did not ask for.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys

from vllm_doctor.cli.common import add_common, check_ignore, command_parser, fail, load_rules, options_from, \
    report_written
from vllm_doctor.diagnosis.live import LiveSession
from vllm_doctor.numbers import seconds       # finite, >= 0: `nan`/`inf`/-1 are argparse's usage error
from vllm_doctor.streams.child import KILL_AFTER_S, Child, exit_status, pump_child
from vllm_doctor.streams.guard import SafeSession
from vllm_doctor.streams.output import Notifier, final_report, live_streams, notice_mask
from vllm_doctor.streams.signals import SignalTrap



def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "run", "Start a vLLM server, show its output live, diagnose it, exit with its exit code. Failures are "
               "reported on stderr as soon as they are certain; Ctrl-C stops the server cleanly. The launch "
               "command is known, so the corrected command is exact.",
        ["vllm-doctor run -- vllm serve lmsys/vicuna-13b-v1.5 -tp 3",
         "vllm-doctor run --retry -- vllm serve MODEL -tp 3      (then offer the corrected command)",
         "vllm-doctor run --report diag.txt -- python -m vllm.entrypoints.openai.api_server --model MODEL",
         "vllm-doctor run --separate -- vllm serve MODEL > server.out 2> server.err"],
        usage="vllm-doctor run [options] [--] CMD [ARGS ...]")
    add_common(p, "run")
    p.add_argument("--report", metavar="FILE", help="write the final report to FILE instead of stderr")
    p.add_argument("--separate", action="store_true",
                   help="keep the server's stdout and stderr apart (default: merged into stdout)")
    p.add_argument("--retry", action="store_true", help="after a failure, run the corrected command once")
    p.add_argument("-y", "--yes", action="store_true", help="with --retry: do not ask for confirmation")
    p.add_argument("--kill-after", type=seconds, default=KILL_AFTER_S, metavar="SECONDS",
                   help=f"after Ctrl-C, terminate the server if still running this long (default {KILL_AFTER_S:g})")
    p.add_argument("--settle", type=seconds, default=None, help=argparse.SUPPRESS)
    p.add_argument("--tui", action="store_true", help="watch the run in the interactive triage session")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run")
    return p


def parse(argv: list[str]):
    p = _parser()
    if "--" in argv:
        i = argv.index("--")
        args = p.parse_args(argv[:i])
        args.command = argv[i + 1:]
    else:
        args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    return p, args


def cmd_run(argv: list[str]) -> int:
    from vllm_doctor.rules.catalog import CatalogError

    p, args = parse(argv)
    if not args.command:
        p.print_usage(sys.stderr)
        return fail("give the command to run, e.g. vllm-doctor run -- vllm serve MODEL")
    if args.kill_after < 0:
        return fail("--kill-after must be >= 0")
    if args.tui:
        if args.retry:
            return fail("--retry cannot be used with --tui")
        from vllm_doctor.cli.tui import run_from_args

        args.logs = []
        return run_from_args(args, args.command)
    try:
        catalog = load_rules(args.rules_dir)
    except CatalogError as exc:
        return fail(str(exc))
    if (error := check_ignore(args, catalog)) is not None:
        return fail(error)
    options = options_from(args, produced_here=True)
    user_cmd = args.cmd or shlex.join(args.command)
    options.command = user_cmd
    rc, diagnosis = run_once(args.command, catalog, args, options)
    if diagnosis is None or not args.retry:
        return rc
    return retry(diagnosis, rc, catalog, args)


def retry(diagnosis, rc: int, catalog, args) -> int:
    note = Notifier(sys.stderr, mask=notice_mask(args))
    # the combined fix (every finding's edits, environment prefixes included), and only when it is a command
    # line: a compose/pod-spec/LLM(...) edit or a flags-only change is nothing a shell can run
    fixed = diagnosis.combined
    if fixed is None or not fixed.runnable:
        note.write("vllm-doctor: --retry: no corrected command to run\n")
        return rc
    shown = note.mask(fixed.command) if note.mask else fixed.command    # --anonymize: the prompt too
    if not args.yes:
        if not sys.stdin.isatty():
            note.write("vllm-doctor: --retry needs a confirmation: run it in a terminal or add --yes\n")
            return rc
        try:
            answer = input(f"vllm-doctor: run the corrected command?\n  {shown}\n[y/N] ")
        except (EOFError, KeyboardInterrupt):
            note.write("\n")
            return rc
        if answer.strip().lower() not in ("y", "yes"):
            return rc
    note.write(f"vllm-doctor: retrying: {shown}\n")
    options = options_from(args, produced_here=True)
    options.command = fixed.command
    shell = os.environ.get("SHELL") if os.environ.get("SHELL", "").endswith(("/sh", "/bash", "/zsh")) else "/bin/sh"
    rc2, _ = run_once([shell or "/bin/sh", "-c", fixed.command], catalog, args, options, env=dict(os.environ),
                      label=fixed.command)
    return rc2


def run_once(command: list[str], catalog, args, options, env=None, label: str | None = None):
    """Run one command to its end; returns (exit code, Diagnosis or None)."""
    separate = args.separate
    # the same notifier as the pipe's (its --anonymize mask included); a JSON/markdown report on stderr
    # leaves it silent
    notifier = live_streams(args, sys.stderr)
    report_stream = sys.stderr
    source = "<output>" if not separate else "<stdout>"
    session = SafeSession(LiveSession(catalog, options, notifier, source=source, settle=args.settle or 0.5))
    with SignalTrap((signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)) as trap:
        try:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE if separate else subprocess.STDOUT,
                                    process_group=0, env=env, close_fds=True)
        except FileNotFoundError:
            fail(f"cannot run {label or command[0]}: command not found")
            return 127, None
        except PermissionError:
            fail(f"cannot run {label or command[0]}: permission denied")
            return 126, None
        except OSError as exc:
            fail(f"cannot run {label or command[0]}: {exc.strerror or exc}")
            return 126, None
        child = Child(proc)
        try:
            pump_child(child, session, trap, notifier, separate, args.kill_after)
        finally:
            child.reap_group()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
        rc = exit_status(proc.wait())
        # the child's last line may lack its newline: the report starts on a line of its own
        diagnosis, error = final_report(session, args, report_stream, "" if notifier.at_line_start else "\n")
    if error:
        fail(error)
    elif diagnosis is not None:         # None: the diagnosis stopped early (said on stderr)
        report_written(args)
    return rc, diagnosis


