"""`python -m vllm_doctor` and the `vllm-doctor` script.

The CLI's modules load inside `main`, so that a Ctrl-C while they load is exit 130 like one a moment
later, not a traceback of whichever import it interrupted. Once the CLI has returned, Ctrl-C is ignored:
the report is written and the exit code decided, and an interrupt that lands in the interpreter's exit
(while it joins the scan threads) would otherwise turn a finished run's exit 1 into death by SIGINT.

A Ctrl-C that lands inside a finalizer (the regex module frees its compiled sets in `__del__`) is an
exception Python cannot raise there: it prints "Exception ignored in … KeyboardInterrupt" and goes on
as if no key had been pressed. `_redeliver` takes that message's place and raises the interrupt again,
a moment later, in the code the finalizer interrupted.

Nothing is loaded from disk at this module's top: a Ctrl-C there (`from __future__ …` reads a file) would be a
traceback before `main` could catch it. `sys` and `_signal` are built into the interpreter."""
import sys

REDELIVER_S = 0.01      # long enough for the finalizer (and the hook) to have returned


def _redeliver(unraisable) -> None:
    if unraisable.exc_type is not KeyboardInterrupt:
        sys.__unraisablehook__(unraisable)
        return
    import _thread
    import threading

    timer = threading.Timer(REDELIVER_S, _thread.interrupt_main)
    timer.daemon = True
    timer.start()


def main() -> int:
    sys.unraisablehook = _redeliver
    try:
        from vllm_doctor.cli.main import main as cli_main

        rc = cli_main()
    except KeyboardInterrupt:
        rc = 130
    import _signal      # built in: no file to read while a second Ctrl-C may come

    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
