"""Run mode: `vllm-doctor run [options] [--] CMD ARGS…` starts the server and diagnoses it live.

* The child runs in its own process group, stdin from /dev/null; its stdout and stderr are merged
  into our stdout (default, like `2>&1 |`) or kept apart (`--separate`: stdout → stdout, stderr →
  stderr); every byte is shown as it arrives and diagnosed on the side, as in pipe mode.
* Signals: Ctrl-C (SIGINT) is forwarded to the child's group so the server shuts down cleanly; if it
  is still running `--kill-after` seconds later (or on a second Ctrl-C) the group gets SIGTERM, then
  SIGKILL. SIGTERM and SIGHUP are forwarded as they are. When the child has exited, whatever is left in
  its process group (workers it spawned) is terminated: the doctor never leaves an orphaned server.
* The exact launch command is known, so the corrected command in the report is exact.
* Exit code: the child's (128+N when signal N killed it; 127/126 when it cannot be started).
* `--retry` runs the corrected command once, after a confirmation prompt (unless `--yes`), exactly
  as a person would paste it into a shell; that run is diagnosed too and gives the exit code. Nothing
  is ever run that the user did not ask for.
"""
from __future__ import annotations

import argparse
import os
import select
import shlex
import signal
import subprocess
import sys
import time

from vllm_doctor.diagnosis.live import LiveSession, Notifier, SignalTrap, final_report, write_all
from vllm_doctor.sources.scan import BLOCK

KILL_AFTER_S = 10.0     # after forwarding Ctrl-C, how long the server gets before SIGTERM
TERM_GRACE_S = 3.0      # after SIGTERM, before SIGKILL
LINGER_S = 2.0          # after the child exits, how long its output pipes may stay open (workers)


def _parser() -> argparse.ArgumentParser:
    from vllm_doctor.cli.main import add_common

    p = argparse.ArgumentParser(
        prog="vllm-doctor run", usage="vllm-doctor run [options] [--] CMD [ARGS ...]",
        description="Start a vLLM server, show its output live, diagnose it, exit with its exit code.")
    add_common(p)
    p.add_argument("--report", metavar="FILE", help="write the final report to FILE instead of stderr")
    p.add_argument("--separate", action="store_true",
                   help="keep the server's stdout and stderr apart (default: merged into stdout)")
    p.add_argument("--retry", action="store_true", help="after a failure, run the corrected command once")
    p.add_argument("-y", "--yes", action="store_true", help="with --retry: do not ask for confirmation")
    p.add_argument("--kill-after", type=float, default=KILL_AFTER_S, metavar="SECONDS",
                   help=f"after Ctrl-C, terminate the server if still running this long (default {KILL_AFTER_S:g})")
    p.add_argument("--settle", type=float, default=None, help=argparse.SUPPRESS)
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
    from vllm_doctor.cli.main import fail, load_rules, options_from
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
        from vllm_doctor.tui import run_from_args

        args.logs = []
        return run_from_args(args, args.command)
    try:
        catalog = load_rules(args.rules_dir)
    except CatalogError as exc:
        return fail(str(exc))
    options = options_from(args)
    user_cmd = args.cmd or shlex.join(args.command)
    options.command = user_cmd
    rc, diagnosis = run_once(args.command, catalog, args, options)
    if diagnosis is None or not args.retry:
        return rc
    return retry(diagnosis, rc, catalog, args)


def retry(diagnosis, rc: int, catalog, args) -> int:
    from vllm_doctor.cli.main import options_from

    note = Notifier(sys.stderr)
    fixed = next((f for f in diagnosis.findings if f.fix_command), None)
    if fixed is None:
        note.write("vllm-doctor: --retry: no corrected command to run\n")
        return rc
    env_text = " ".join(f"{k}={shlex.quote(v)}" for k, v in fixed.env.items() if f"{k}=" not in fixed.fix_command)
    shown = f"{env_text} {fixed.fix_command}".strip()
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
    options = options_from(args)
    options.command = fixed.fix_command
    env = dict(os.environ)
    env.update({k: str(v) for k, v in fixed.env.items()})
    shell = os.environ.get("SHELL") if os.environ.get("SHELL", "").endswith(("/sh", "/bash", "/zsh")) else "/bin/sh"
    rc2, _ = run_once([shell or "/bin/sh", "-c", fixed.fix_command], catalog, args, options, env=env,
                      label=fixed.fix_command)
    return rc2


class Child:
    """The server process and its group, with the signal escalation."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pgid = proc.pid
        self.exited_at: float | None = None
        self.term_at: float | None = None       # when to escalate to SIGTERM
        self.kill_at: float | None = None       # when to escalate to SIGKILL
        self.interrupts = 0

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return bool(group_members(self.pgid, default=[self.pgid]))

    def poll(self) -> int | None:
        rc = self.proc.poll()
        if rc is not None and self.exited_at is None:
            self.exited_at = time.monotonic()
        return rc

    def escalate(self, now: float) -> None:
        if self.exited_at is not None:
            return
        if self.kill_at is not None and now >= self.kill_at:
            self.signal_group(signal.SIGKILL)
            self.kill_at = None
        elif self.term_at is not None and now >= self.term_at:
            self.signal_group(signal.SIGTERM)
            self.term_at = None
            self.kill_at = now + TERM_GRACE_S

    def deadline(self) -> float | None:
        times = [t for t in (self.term_at, self.kill_at) if t is not None]
        return min(times) if times else None

    def reap_group(self) -> None:
        """The child is gone: end what is left of its group (SIGTERM, then SIGKILL), bounded in time."""
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
        if not self.group_alive():
            return
        self.signal_group(signal.SIGTERM)
        end = time.monotonic() + TERM_GRACE_S
        while time.monotonic() < end and self.group_alive():
            time.sleep(0.02)
        if self.group_alive():
            self.signal_group(signal.SIGKILL)


def group_members(pgid: int, default=None) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc; `default` where /proc is missing."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return list(default or [])
    members = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(name))
    return members


def exit_status(returncode: int | None) -> int:
    if returncode is None:
        return 1
    return 128 - returncode if returncode < 0 else returncode


def run_once(command: list[str], catalog, args, options, env=None, label: str | None = None):
    """Run one command to its end; returns (exit code, Diagnosis or None)."""
    from vllm_doctor.cli.main import fail

    separate = args.separate
    notifier = Notifier(sys.stderr, color=False if args.no_color else None)
    report_stream = sys.stderr
    if args.format != "text" and not args.report:
        notifier = Notifier(None, enabled=False)   # stderr carries one JSON/markdown document
    session = LiveSession(catalog, options, notifier, source="<output>" if not separate else "<stdout>",
                          settle=args.settle or 0.5)
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
    return rc, diagnosis


def pump_child(child: Child, session: LiveSession, trap: SignalTrap, notifier: Notifier, separate: bool,
               kill_after: float) -> None:
    proc = child.proc
    outs: dict[int, tuple[int, str]] = {proc.stdout.fileno(): (1, "<stdout>" if separate else "<output>")}
    if separate:
        outs[proc.stderr.fileno()] = (2, "<stderr>")
    passthrough = {1: True, 2: True}
    open_fds = set(outs)
    while open_fds:
        now = time.monotonic()
        child.poll()
        if child.exited_at is not None and now - child.exited_at >= LINGER_S:
            # Workers still hold the pipes open after the server exited: end them, read what is left.
            child.reap_group()
            _drain(open_fds, outs, session, passthrough, notifier)
            return
        waits = [session.timeout(), 0.25]
        if child.deadline() is not None:
            waits.append(max(0.0, child.deadline() - now))
        if child.exited_at is not None:
            waits.append(max(0.0, child.exited_at + LINGER_S - now))
        timeout = min(w for w in waits if w is not None)
        watch = list(open_fds) + ([trap.fd] if trap.fd >= 0 else [])
        try:
            readable, _, _ = select.select(watch, [], [], timeout)
        except InterruptedError:
            continue
        if trap.fd in readable:
            for signum in trap.take():
                _on_signal(child, signum, notifier, kill_after)
        fed = False
        for fd in readable:
            if fd not in open_fds:
                continue
            try:
                block = os.read(fd, BLOCK)
            except InterruptedError:
                continue
            except OSError:
                block = b""
            if not block:
                open_fds.discard(fd)
                continue
            _show(block, outs[fd][0], passthrough, notifier)
            session.feed(block, outs[fd][1])
            fed = True
        if fed:
            session.poll()
        elif not [fd for fd in readable if fd != trap.fd]:
            session.poll(idle=True)
        child.escalate(time.monotonic())
    child.poll()


def _show(block: bytes, target: int, passthrough: dict[int, bool], notifier: Notifier) -> None:
    if not passthrough[target]:
        return
    try:
        write_all(target, block)
    except OSError:
        passthrough[target] = False     # our reader went away: keep running and diagnosing
        return
    if target == 2:
        notifier.passthrough(block)


def _drain(open_fds: set[int], outs, session: LiveSession, passthrough, notifier) -> None:
    for fd in list(open_fds):
        os.set_blocking(fd, False)
        while True:
            try:
                block = os.read(fd, BLOCK)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if not block:
                break
            _show(block, outs[fd][0], passthrough, notifier)
            session.feed(block, outs[fd][1])
        open_fds.discard(fd)
    session.poll()


def _on_signal(child: Child, signum: int, notifier: Notifier, kill_after: float) -> None:
    now = time.monotonic()
    if signum == signal.SIGCHLD:
        child.poll()
        return
    if child.exited_at is not None:
        return
    if signum == signal.SIGINT:
        child.interrupts += 1
        if child.interrupts == 1:
            notifier.write("vllm-doctor: stopping the server (Ctrl-C again to terminate it now)\n")
            child.signal_group(signal.SIGINT)
            child.term_at = now + kill_after
        elif child.interrupts == 2:
            notifier.write("vllm-doctor: terminating the server\n")
            child.signal_group(signal.SIGTERM)
            child.term_at = None
            child.kill_at = now + TERM_GRACE_S
        else:
            child.signal_group(signal.SIGKILL)
        return
    # SIGTERM / SIGHUP: pass it on, and make sure the group is gone soon after.
    child.signal_group(signum)
    if child.term_at is None and child.kill_at is None:
        child.kill_at = now + max(kill_after, TERM_GRACE_S)

