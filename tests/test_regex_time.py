"""The search bound is this thread's CPU time, not the process's (src/vllm_doctor/regex_time.py).

The regex module's own `timeout` counts every thread's CPU time; threads that leave the GIL (here
hashlib over 64 MiB, as the doctor's scan threads do with their automata) use it up while a search
that fits its budget runs. Measured with the control: the plain timeout stops that search, `timed`
lets it finish, and still stops a search that needs more than its budget of its own thread's time."""
from __future__ import annotations

import hashlib
import threading
import time

import pytest
import regex

from vllm_doctor.regex_time import timed

BACKTRACKS = regex.compile(r"(a|aa)+b")      # exponential in the run of a's: a search of known cost


def own_cpu(n: int) -> float:
    start = time.thread_time()
    BACKTRACKS.search("a" * n)
    return time.thread_time() - start


def calibrated(seconds: float) -> int:
    """The shortest run of a's whose search takes at least `seconds` of this thread's CPU time."""
    n = 18
    while own_cpu(n) < seconds:
        n += 1
    return n


@pytest.fixture
def busy_threads():
    """Four threads spending CPU time outside the GIL while the test searches."""
    stop = threading.Event()
    data = b"x" * (64 << 20)

    def burn():
        while not stop.is_set():
            hashlib.sha256(data).digest()

    threads = [threading.Thread(target=burn, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    yield
    stop.set()
    for t in threads:
        t.join(10)


def test_a_search_within_its_budget_finishes_while_other_threads_run(busy_threads):
    n = calibrated(0.04)
    own = sorted(own_cpu(n) for _ in range(3))[1]     # this search's own thread time, under the same load
    # The budget is 1.5 times that: the search fits it; and while it runs, the busy threads keep every other core
    # busy, so the process's clock gains at least twice the search's own time and runs past the budget. (A fixed
    # 0.15 s budget over a search of 0.04-0.06 s failed the control whenever the search had a core to itself.)
    budget = 1.5 * own
    with pytest.raises(TimeoutError):                 # the control: the process's clock runs out
        BACKTRACKS.search("a" * n, timeout=budget)
    assert timed(BACKTRACKS, "search", "a" * n, budget=budget) is None      # searched to the end: no b


def test_a_search_past_its_budget_is_stopped(busy_threads):
    budget = 0.05
    n = calibrated(0.05) + 4         # about seven times the budget
    with pytest.raises(TimeoutError):                 # stopped: how soon after its budget is bench/'s to measure
        timed(BACKTRACKS, "search", "a" * n, budget=budget)


def test_the_result_is_the_method_s_own():
    assert timed(regex.compile(r"(\d+) GiB"), "search", "needs 12 GiB", budget=0.005).group(1) == "12"
    assert timed(regex.compile(r"\d+"), "findall", "1 2 3", budget=0.005) == ["1", "2", "3"]
    assert timed(regex.compile(r"x"), "match", "yx", budget=0.005) is None
