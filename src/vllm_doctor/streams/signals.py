"""Signals as bytes on a descriptor, so a select loop sees them between whole writes."""
from __future__ import annotations

import os
import signal


class SignalTrap:
    """Catch signals as bytes on a descriptor (select on `fd`); `take()` returns those that arrived."""

    def __init__(self, signums=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)) -> None:
        self.signums = tuple(signums)
        self.fd = -1
        self._w = -1
        self._old: dict[int, object] = {}
        self._old_wakeup = -1
        self.active = False

    def __enter__(self) -> "SignalTrap":
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        try:
            self._old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return self
        self.fd, self._w = r, w
        for s in self.signums:
            try:
                self._old[s] = signal.signal(s, _ignore)
            except (OSError, ValueError):
                pass
        self.active = True
        return self

    def take(self) -> list[int]:
        if self.fd < 0:
            return []
        got: list[int] = []
        while True:
            try:
                data = os.read(self.fd, 256)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if not data:
                break
            got += [b for b in data if b in self.signums]
        return got

    def __exit__(self, *exc) -> None:
        if not self.active:
            return
        for s, old in self._old.items():
            try:
                signal.signal(s, old)
            except (OSError, ValueError, TypeError):
                pass
        try:
            signal.set_wakeup_fd(self._old_wakeup)
        except (ValueError, OSError):
            pass
        for fd in (self.fd, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.active = False


def _ignore(signum, frame) -> None:     # the wakeup fd carries the signal; nothing to do here
    return None
