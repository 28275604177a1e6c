"""The diagnosis of a big log, run in a child process (no Textual here).

Scanning a 1 GB log is CPU-bound Python: in a thread of the app it holds the interpreter lock, and the
screen, scrolling and search stall behind it (every read the log view does waits for the lock again).
`DiagnosisProcess` runs `diagnose_paths` in a child Python at low priority and sends back the
Diagnosis itself, pickled: the app gets the same Finding, Facts and Command objects the JSON report
serialises, not a re-parsed copy.

The child is a plain `python -c` started with subprocess (not multiprocessing: that re-imports the
main script, starts a resource tracker and passes sys.stderr's descriptor, which Textual replaces).
Requests and answers are pickles on its stdin and stdout; its stderr goes to /dev/null so nothing it
prints lands on the app's screen. A child that cannot start, dies, or whose result does not pickle is
reported as `Unavailable`, so the caller can diagnose in a thread instead.
"""
from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import threading

CHILD = ("import pickle, sys; sys.path[:0] = pickle.load(sys.stdin.buffer); "
         "from vllm_doctor.tui.worker import serve; serve()")


class Unavailable(Exception):
    """The child cannot do this diagnosis (could not start, died, or its result does not pickle)."""


class Cancelled(Exception):
    """The caller asked to stop while the child was still working."""


class ChildError(Exception):
    """The diagnosis itself failed in the child; str() is "ExceptionType: message" as the child saw it."""


def serve() -> None:
    """The child: read (catalog, options), then diagnose each list of paths it is sent and answer
    ("ok", Diagnosis), ("error", text) or ("unpicklable", text); None or end of input ends it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)      # ^C belongs to the app
    try:
        os.nice(10)                                   # the app's screen comes first
    except OSError:
        pass
    os.environ["CI"] = "1"                            # no progress bar
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr                           # a stray print must not corrupt the answers
    from vllm_doctor.diagnosis.saved import diagnose_paths

    try:
        catalog, options = pickle.load(stdin)
    except (EOFError, pickle.UnpicklingError):
        return
    while True:
        try:
            paths = pickle.load(stdin)
        except (EOFError, pickle.UnpicklingError, OSError):
            return
        if paths is None:
            return
        try:
            diagnosis = diagnose_paths(paths, catalog, options)
        except Exception as exc:
            reply = ("error", f"{type(exc).__name__}: {exc}")
        else:
            try:
                reply = ("ok", pickle.dumps(diagnosis, protocol=pickle.HIGHEST_PROTOCOL))
            except Exception as exc:
                reply = ("unpicklable", f"{type(exc).__name__}: {exc}")
        try:
            pickle.dump(reply, stdout, protocol=pickle.HIGHEST_PROTOCOL)
            stdout.flush()
        except OSError:
            return


class DiagnosisProcess:
    """One child that diagnoses on request; `close()` ends it (only it)."""

    def __init__(self, catalog, options) -> None:
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        except OSError as exc:
            raise Unavailable(f"cannot start the diagnosis process: {exc.strerror or exc}") from None
        self._lock = threading.Lock()
        try:
            self._send(list(sys.path))
            self._send((catalog, options))
        except Unavailable:
            self.close()
            raise

    def _send(self, obj) -> None:
        try:
            pickle.dump(obj, self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.process.stdin.flush()
        except (OSError, ValueError) as exc:
            raise Unavailable(f"the diagnosis process is gone: {exc}") from None
        except Exception as exc:          # the catalog or options do not pickle
            raise Unavailable(f"cannot send to the diagnosis process: {exc}") from None

    def diagnose(self, paths: list[str], stop: threading.Event | None = None, poll: float = 0.05):
        """The Diagnosis of `paths`. Raises Cancelled when `stop` is set, Unavailable when the child
        cannot answer, ChildError (the child's message) when the diagnosis itself failed."""
        with self._lock:
            self._send(list(paths))
            out = self.process.stdout
            try:
                while not select.select([out], [], [], poll)[0]:
                    if stop is not None and stop.is_set():
                        raise Cancelled()
                status, payload = pickle.load(out)
            except (EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
                raise Unavailable(f"the diagnosis process ended ({exc or 'no answer'})") from None
        if status == "ok":
            return pickle.loads(payload)
        if status == "unpicklable":
            raise Unavailable(payload)
        raise ChildError(payload)

    def close(self) -> None:
        proc = self.process
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except (OSError, ValueError):
                pass
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(1.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(1.0)
