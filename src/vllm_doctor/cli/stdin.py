"""`vllm-doctor -`: standard input as a saved log, read to its end with nothing copied to stdout and
reported as a file is (the pipe, with no file argument, is cli/pipe.py)."""
from __future__ import annotations

import os
import stat
import sys

from vllm_doctor.findings import Diagnosis

STDIN = "<stdin>"


def diagnose_stdin(catalog, options) -> Diagnosis:
    """`vllm-doctor -`: standard input as a saved log (compressed or UTF-16 too), split into runs as a file
    is (diagnosis/runs.py). Raises InputError."""
    from vllm_doctor.diagnosis.runs import RunSplitter
    from vllm_doctor.diagnosis.saved import finish, finish_runs, new_diagnoser, scan_stream

    stream, how = _open_stdin()
    runs = RunSplitter(lambda: new_diagnoser(catalog, options))
    with stream:
        scan_stream(stream, STDIN, runs, name="standard input")
    diagnosis = finish_runs(runs.runs, finish, options, dropped=(runs.dropped, runs.dropped_lines))
    if how:
        diagnosis.notices.insert(0, f"standard input: {how}")
    return diagnosis


def _open_stdin():
    """(byte stream, how it was read) for standard input through sources.files.open_log, which sniffs the
    first bytes and then seeks back: a redirected file is opened as it is, a pipe or terminal is first
    copied to an unnamed temporary file."""
    import tempfile

    from vllm_doctor.diagnosis.saved import InputError
    from vllm_doctor.sources.files import LogFormatError, open_log

    try:
        fd = sys.stdin.fileno()
        seekable = stat.S_ISREG(os.fstat(fd).st_mode)
    except (AttributeError, OSError, ValueError):
        raise InputError("standard input is closed") from None
    if seekable:
        source = os.dup(fd)
    else:
        if sys.stdin.isatty():
            print("vllm-doctor: reading the log from the terminal; end it with Ctrl-D", file=sys.stderr)
        with tempfile.TemporaryFile(prefix="vllm-doctor-stdin-") as spool:
            _copy(fd, spool.fileno())
            source = os.dup(spool.fileno())
    try:
        os.lseek(source, 0, os.SEEK_SET)      # open_log sniffs from where the descriptor stands
        return open_log(source)
    except LogFormatError as exc:   # its message starts with the "path" it was given: here a descriptor
        raise InputError("standard input" + str(exc)[len(str(source)):]) from None
    except OSError as exc:
        raise InputError(f"cannot read standard input: {exc.strerror or exc}") from None


def _copy(src: int, dst: int) -> None:
    from vllm_doctor.diagnosis.saved import InputError
    from vllm_doctor.sources.scan import BLOCK
    from vllm_doctor.streams.output import read_blocks, write_all

    blocks = read_blocks(src, BLOCK)
    while True:
        try:
            block = next(blocks, None)
        except OSError as exc:
            raise InputError(f"cannot read standard input: {exc.strerror or exc}") from None
        if block is None:
            return
        try:
            write_all(dst, block)
        except OSError as exc:
            raise InputError(f"cannot keep standard input in a temporary file: {exc.strerror or exc}") from None
