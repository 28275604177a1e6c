"""A regex search bounded by the CPU time of the thread that runs it.

The regex module's `timeout` counts the process's CPU time, every thread's: while a search runs, the
start-up warm-up thread, the copy thread and the scan threads (which leave the GIL) use up the same
budget. Under load a 136-character line of a linear pattern timed out at 5 ms that way, and the pipe's
early notice of nccl-shm never came. So a search that runs out of time before its own thread has used
the budget is tried again with a clock that allows for the other threads' share of it: a pattern that
really backtracks uses its budget in its own thread and is stopped as before, after at most about twice
the budget of its own thread's time."""
from __future__ import annotations

import time

import regex

BUDGET = 0.005        # CPU seconds of its own thread a search of one log line or frame may take
ATTEMPTS = 4
MAX_SHARE = 64.0      # the most the other threads are allowed of the clock, as a multiple of the budget


def timed(compiled: regex.Pattern, method: str, text: str, *args, budget: float = BUDGET):
    """`compiled.<method>(text, *args)` ("search", "match", "findall"), stopped once this thread has spent
    `budget` CPU seconds in it; raises TimeoutError then."""
    call = getattr(compiled, method)
    limit = budget
    for _ in range(ATTEMPTS):
        own, shared = time.thread_time(), time.process_time()
        try:
            return call(text, *args, timeout=limit)
        except TimeoutError:
            own, shared = time.thread_time() - own, time.process_time() - shared
            if own >= budget:
                raise
            # the others took shared - own of the clock while this thread took own: allow for that again
            limit = budget * min(MAX_SHARE, max(2.0, 1.5 * shared / max(own, 1e-4)))
    raise TimeoutError(f"regex search kept losing its clock to other threads ({ATTEMPTS} attempts)")
