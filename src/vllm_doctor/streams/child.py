"""The server as a child process: its own process group, output pumped through unchanged and fed to a
live session, signals forwarded with escalation, and nothing of its group left behind.

* Ctrl-C (SIGINT) is forwarded to the child's group so the server shuts down cleanly; if it is still
  running `kill_after` seconds later (or on a second Ctrl-C) the group gets SIGTERM, then SIGKILL.
  SIGTERM and SIGHUP are forwarded as they are.
* When the child has exited, whatever is left in its process group (workers it spawned) is terminated.
* The end of the child's output is not its end: a server that closes or redirects its stdout and stderr
  (`exec >server.log 2>&1`) keeps running, and is waited for (SIGCHLD wakes the loop).
* One thread reads, copies and diagnoses: each block is written through before it is fed, the pipes are
  widened to 1 MiB so that the server can write ahead while a block is diagnosed, and a feed is bounded in
  time (the rules' regexes have time limits); a slow diagnosis still delays Ctrl-C by at most one feed.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import time

from vllm_doctor.diagnosis.live import LiveSession
from vllm_doctor.sources.scan import BLOCK
from vllm_doctor.streams.output import Notifier, write_all
from vllm_doctor.streams.pipe import widen_pipe
from vllm_doctor.streams.signals import SignalTrap

KILL_AFTER_S = 10.0     # after forwarding Ctrl-C, how long the server gets before SIGTERM
TERM_GRACE_S = 3.0      # after SIGTERM, before SIGKILL
LINGER_S = 2.0          # after the child exits, how long its output pipes may stay open (workers)


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


def pump_child(child: Child, session: LiveSession, trap: SignalTrap, notifier: Notifier, separate: bool,
               kill_after: float) -> None:
    proc = child.proc
    outs: dict[int, tuple[int, str]] = {proc.stdout.fileno(): (1, "<stdout>" if separate else "<output>")}
    if separate:
        outs[proc.stderr.fileno()] = (2, "<stderr>")
    passthrough = {1: True, 2: True}
    open_fds = set(outs)
    for fd in open_fds:
        widen_pipe(fd)
    while True:
        now = time.monotonic()
        child.poll()
        if child.exited_at is not None:
            if not open_fds:
                break
            if now - child.exited_at >= LINGER_S:
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
