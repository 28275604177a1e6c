"""How a run ended, decided before any cause is named: a traceback after a served run that someone stopped
is its shutdown, not its failure.

The evidence, from vLLM's source (0.6 → 0.34):
- *served*: the server reported ready (`server_ready` milestones), or its periodic stats line shows it at
  work (`Avg prompt throughput:`, milestone `serving`; a paste may start there).
- *stopped*: a line printed only on SIGINT/SIGTERM (events/logfacts.STOP_MARKERS): the API server's
  `Shutting down FastAPI HTTP server.` (launcher.py, reached only from its signal handler, 0.6–0.21) or the
  `[shutdown] …` sequence (0.23+: `API server: shutdown triggered`, `EngineCore: trigger received
  signal=SIGINT` -- not SIGTERM, which vLLM's own process manager sends after a failure), `Received
  KeyboardInterrupt, shutting down API servers` (several API servers), a terminal's `^C` at the start of a
  line, or a KeyboardInterrupt traceback (a Ctrl-C during start-up). uvicorn's `Shutting down` /
  `Application shutdown complete` are no such evidence: they end a crash-triggered exit too.
- A run stopped during start-up is no failure either: what follows the stop is its noise, and what came
  before it (an error, a wait the user gave up on) is judged as it would be without the stop.
- *shutdown noise*: after the stop, anything; before it, only tracebacks whose exception is a stop's own
  (KeyboardInterrupt, SystemExit, CancelledError, EngineDeadError): Ctrl-C reaches every process of the
  group at once, and an engine core that exits first makes the API server log `EngineDeadError` before its
  own marker (PR #49034 describes the race). A real root cause before the stop (a CUDA error traceback,
  `EngineCore encountered a fatal error`, a fatal rule match) is a crash that the user then stopped.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_doctor.events.deaths import (ABORTED, CRASH_WORDS, RAY_OOM_WORDS, TOOL_FATAL, death_signal, platform_failed,
                                       signal_killed, victim)
from vllm_doctor.events.phases import PHASE_NAMES, classify_milestones
from vllm_doctor.events.tracebacks import EXCEPTION_REPR, failing

# exceptions that say someone stopped the process (Ctrl-C, a clean exit): vLLM's engine core and worker signal
# handlers raise SystemExit, asyncio tasks are cancelled
STOP_EXCEPTIONS = ("KeyboardInterrupt", "SystemExit", "CancelledError")
# ... and, once a stop is seen, the API server's output handler finding the engine gone
SHUTDOWN_EXCEPTIONS = STOP_EXCEPTIONS + ("EngineDeadError",)
# Raised only by a process closing its own messaging, whatever made it exit: pyzmq raises ContextTerminated
# (ETERM) on a socket whose context was terminated, and vLLM terminates its contexts in its shutdown paths (an
# offline LLM's exit printed it, PR #13565). Never a cause: the failure, if any, is another traceback.
EXIT_ONLY_EXCEPTIONS = ("ContextTerminated",)


@dataclass(frozen=True)
class Outcome:
    served: int = 0       # sequence number of the first line showing the server up (0: it never was)
    stopped: int = 0      # ... of the first stop after it, or in a run that never served, of the first stop
    progress: int = 0     # ... of the last start-up phase first reached (the latest milestone's first line)

    @property
    def label(self) -> str:
        if self.stopped:
            return "served, then stopped" if self.served else "stopped during start-up"
        return "served" if self.served else "did not serve"

    def is_shutdown(self, seq: int, exc_type: str | None = None) -> bool:
        """Whether something at `seq` (a traceback of `exc_type`) belongs to the stop, not to a failure."""
        if not self.stopped or seq <= self.served:
            return False
        return seq >= self.stopped or (bool(self.served) and shutdown_exception(exc_type))


def short_name(exc_type: str | None) -> str:
    """`vllm.v1.engine.exceptions.EngineDeadError` -> `EngineDeadError`."""
    return (exc_type or "").rsplit(".", 1)[-1]


def shutdown_exception(exc_type: str | None) -> bool:
    return short_name(exc_type) in SHUTDOWN_EXCEPTIONS


def interrupted_at(tracebacks) -> list[int]:
    """Where a KeyboardInterrupt traceback begins (the first traceback of its chain: an interrupt during an
    import prints the import's own error first, "During handling of the above exception …"): a Ctrl-C, or
    SIGTERM during start-up (`KeyboardInterrupt: terminated`)."""
    starts = []
    for tb in tracebacks:
        if short_name(tb.exc_type) == "KeyboardInterrupt":
            start, node, hops = tb.start_seq or tb.end_seq, tb.cause, 0
            while node is not None and hops < 32:
                start, node, hops = min(start, node.start_seq or start), node.cause, hops + 1
            starts.append(start)
    return starts


# vLLM's own milestones: its launch, loading and engine lines, and its own ready lines (uvicorn's are any ASGI app's)
VLLM_PROGRESS = ("launched", "weights_loading", "weights_loaded", "kv_cache_sized", "graph_capture", "engine_ready",
                 "vllm_ready")


def vllm_ready(first_seen: dict[str, int], last_seen: dict[str, int], failures: list[int]) -> int:
    """The last line saying the server came up, where it is vLLM's: after a failure only a vLLM that started again
    counts (a milestone of VLLM_PROGRESS after the failure), not a wrapper's fallback app printing uvicorn's
    `Application startup complete` (MinerU's pipeline server after its vLLM died); then the first ready line, where
    it came before every failure, else none."""
    last = last_seen.get("server_ready", 0)
    before = [seq for seq in failures if seq < last]
    if not before or any(last_seen.get(m, 0) > max(before) for m in VLLM_PROGRESS):
        return last
    first = first_seen.get("server_ready", 0)
    return first if first < min(before) else 0


def decide(first_seen: dict[str, int], stops: list[int]) -> Outcome:
    """`first_seen`: milestone -> its first line (events/logfacts); `stops`: the stop lines and interrupts."""
    stops = sorted(s for s in stops if s)
    served = min((first_seen[m] for m in ("server_ready", "serving", "http_served") if first_seen.get(m)), default=0)
    return Outcome(served, next((s for s in stops if s > served), 0), max(first_seen.values(), default=0))


def exit_only(tb) -> bool:
    return short_name(tb.exc_type) in EXIT_ONLY_EXCEPTIONS


def _exit_tracebacks(tracebacks) -> list:
    """The failing tracebacks when every one is a process closing its messaging at exit; else []."""
    noise = [tb for tb in tracebacks if failing(tb)]
    return noise if noise and all(tb.exc_type and exit_only(tb) for tb in noise) else []


def exit_noise_only(tracebacks, other_errors: int) -> bool:
    """Every failing traceback is a process closing its messaging at exit (EXIT_ONLY_EXCEPTIONS) and no ERROR line
    outside them says more (`died unexpectedly`, `failed to start`; `other_errors` counts those, and argparse
    errors, over the whole log): an exit, not a failure."""
    return bool(_exit_tracebacks(tracebacks)) and other_errors == 0


def exit_notice(tracebacks) -> list[str]:
    """A run with no finding whose only failing tracebacks are a process closing its messaging: say so."""
    noise = _exit_tracebacks(tracebacks)
    if not noise:
        return []
    kinds = sorted({short_name(tb.exc_type) for tb in noise})
    return [f"the only traceback{'s' if len(noise) > 1 else ''} ({', '.join(kinds)}) "
            f"{'are' if len(noise) > 1 else 'is'} a process closing its messaging as it exits, not a failure; "
            "if the run failed, its cause is in lines this log does not hold"]


def stop_notice(outcome: Outcome, tracebacks, stop_lines: dict) -> list[str]:
    """A run with no finding that was stopped, with tracebacks after the stop: say they were its shutdown.
    `stop_lines`: the stop lines by sequence number (a KeyboardInterrupt's traceback is none of them)."""
    if not outcome.stopped:
        return []
    noise = [tb for tb in tracebacks if failing(tb) and outcome.is_shutdown(tb.end_seq or tb.start_seq, tb.exc_type)]
    if not noise:
        return []
    stop = stop_lines.get(outcome.stopped)
    if stop is not None:
        where = f"{stop.source or 'line'}:{stop.lineno}: {stop.message.strip()[:80]}"
    else:
        where = "a KeyboardInterrupt traceback"
    kinds = sorted({short_name(tb.exc_type) or "a cut traceback" for tb in noise})
    what = "the server served, then was stopped" if outcome.served else "start-up was stopped by a signal"
    many = len(noise) != 1
    return [f"{what} ({where}); the {len(noise)} traceback{'s' if many else ''} after it ({', '.join(kinds)}) "
            f"{'are' if many else 'is'} its shutdown, not a failure"]


def fatal_lines(outcome: Outcome, unexplained, ready: int, peers_gone=()) -> list:
    """Lines outside any traceback that say a process died, for the failure no rule names: a death while
    serving (died_while_serving), a fatal C++ check (Ray's `C`, glog's `F`: CRITICAL) or an uncaught C++
    exception (events/deaths.ABORTED), which abort their process, a native compiler's fatal error (TOOL_FATAL: the
    kernel being built does not exist), a process's crash signal as a shell, a native handler or faulthandler reports
    it (events/deaths.death_signal: `Killed`, `*** SIGSEGV received at time=…`, `Fatal Python error: Aborted`), Ray's OOM killer killing a worker for host
    memory (its `Memory on the node (IP: …)` report, per task or aggregated), and a peer that closed its connection
    (events/deaths.PEER_GONE: a rank of the group went away; the tracker leaves out those after PyTorch's
    exit-time warning) -- none an all-clear unless it belongs to a stop. `peers_gone`: (seq, line)."""
    return died_while_serving(outcome, unexplained) + [
        line for line, tb, seq in unexplained
        if tb is None and (line.level == "CRITICAL" or ABORTED in line.message or RAY_OOM_WORDS in line.message
                           or any(w in line.message for w in TOOL_FATAL) or death_signal(line.message)
                           or platform_failed(line.message))
        and seq > ready
        and not outcome.is_shutdown(seq, None)] + [
        line for seq, line in peers_gone if seq > ready and not outcome.is_shutdown(seq, None)] + stopped_at_error(
        outcome, unexplained) + killed_by_signal(outcome, unexplained, ready) + engine_loop_ended(
        outcome, unexplained, ready)


# The engine loop's own record of the exception that ended it: V0's MQLLMEngine.start (engine/multiprocessing/
# engine.py, 0.6-0.10) logs `logger.exception(repr(e))`, `AssertionError('…')`, as its process exits. A request's
# error is its handler's (events/requests.HANDLER), never these modules'.
ENGINE_LOOPS = re.compile(r"(?:engine|llm_engine|async_llm_engine)\.py:\d{1,6}")


def engine_loop_ended(outcome: Outcome, unexplained, ready: int) -> list:
    """An engine loop's ERROR record of the exception that ended it (ENGINE_LOOPS), outside a traceback, after
    start-up and outside a stop: the engine is gone however the server went on answering."""
    return [line for line, tb, seq in unexplained
            if tb is None and line.level == "ERROR" and seq > ready and line.fileinfo
            and ENGINE_LOOPS.fullmatch(line.fileinfo) and (m := EXCEPTION_REPR.match(line.message.strip()))
            and short_name(m.group("type")) not in STOP_EXCEPTIONS and not outcome.is_shutdown(seq, None)]


def killed_by_signal(outcome: Outcome, unexplained, ready: int) -> list:
    """A line that names a process killed by a signal no stop sends (events/deaths.killed: SIGKILL, SIGSEGV, …),
    outside a stop: however the run went on, a process was killed (the OOM killer, a crash in native code).
    Exit codes 0 and None end healthy offline runs, and SIGINT/SIGTERM deaths are a stop's."""
    return [line for line, tb, seq in unexplained if tb is None and seq > ready and "died" in line.message
            and victim(line) is not None and signal_killed(line.message) and not outcome.is_shutdown(seq, None)]


def stopped_at_error(outcome: Outcome, unexplained) -> list:
    """ERROR lines no rule reads, outside any traceback, in a start-up that never served nor was stopped, after
    which it reached no new phase: where the log ends, the last thing it says is that error (a paste of the
    error alone, or a launcher's own ERROR record of it). An ERROR that start-up went on past is no failure; nor
    is a process's death or a signal noticed (`Engine core proc … died unexpectedly`, `*** SIGTERM received`):
    they also end healthy offline runs, and their own readings (died_while_serving, events/nodes.py) decide."""
    if outcome.served or outcome.stopped:
        return []
    return [line for line, tb, seq in unexplained if tb is None and line.level == "ERROR" and seq > outcome.progress
            and not any(w in line.message for w in CRASH_WORDS) and victim(line) is None]


def died_while_serving(outcome: Outcome, unexplained) -> list:
    """vLLM's `Engine core proc … died unexpectedly` (0.10-0.18) or the executor's `Worker proc … died
    unexpectedly` in a run that served, no stop signal in the log: a process died under the server (a kill,
    a segfault). The same line ends healthy offline runs and races a Ctrl-C (PR #28898, #49034), so it counts
    only with a served run and without a stop. A paste may start at the death and show the serving only in
    the API server's stats after it (a worker died with 46 requests running): served anywhere counts.
    `unexplained`: the engine's (line, traceback, seq) of error lines no pattern matched."""
    if not outcome.served or outcome.stopped:
        return []
    return [line for line, _, seq in unexplained if "died unexpectedly" in line.message]


def all_clear_notices(outcome: Outcome, tracebacks, stop_lines: dict, milestones) -> list[str]:
    """What a run with no finding says about how it ended: a stop's tracebacks, an exit's, or a start-up the log
    leaves unfinished."""
    return (stop_notice(outcome, tracebacks, stop_lines) or exit_notice(tracebacks)
            or unfinished_notice(outcome, milestones))


def unfinished_notice(outcome: Outcome, milestones) -> list[str]:
    """A start-up that reached a phase and then ends, never ready, never stopped, nothing failing: a paste cut
    there, or a server still waiting there (a hang prints nothing). Say so instead of a bare all-clear."""
    phase = classify_milestones(set(milestones or ()))
    if outcome.served or outcome.stopped or phase is None or phase == "serving":
        return []
    return [f"the log ends during start-up ({PHASE_NAMES[phase]}) before the server said it was ready: if it is "
            "still running, it waits there; rerun with VLLM_LOGGING_LEVEL=DEBUG (and NCCL_DEBUG=INFO with several "
            "GPUs) to see on what"]
