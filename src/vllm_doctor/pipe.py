"""Pipe mode: every input byte passes to stdout unchanged; the diagnosis goes to stderr (or --report)."""
from __future__ import annotations

import os
import sys

from vllm_doctor.engine import Diagnoser
from vllm_doctor.facts import Facts
from vllm_doctor.sources.scan import BLOCK, Scanner


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def run_pipe(catalog, args, options) -> int:
    from vllm_doctor.cli import emit, exit_code
    from vllm_doctor.diagnose import finish

    diagnoser = Diagnoser(catalog, Facts())
    scanner = Scanner(diagnoser.scan_literals, diagnoser, source="<stdin>")
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    passthrough = True
    try:
        while True:
            block = os.read(stdin, BLOCK)
            if not block:
                break
            if passthrough:
                try:
                    _write_all(stdout, block)
                except BrokenPipeError:
                    passthrough = False   # the reader went away; keep diagnosing
            scanner.feed(block)
    except KeyboardInterrupt:
        pass
    scanner.close()
    diagnosis = finish(diagnoser, options, scanner.lineno)
    if args.report:
        with open(args.report, "w", encoding="utf-8") as out:
            emit(diagnosis, args, out)
    else:
        emit(diagnosis, args, sys.stderr)
    return exit_code(diagnosis)
