"""How a run ended, decided before any cause is named: a traceback after a served run that someone stopped
is its shutdown, not its failure.

The evidence, from vLLM's source (0.6 → 0.34):
- *served*: the server reported ready (`server_ready` milestones), or its periodic stats line shows it at
  work (`Avg prompt throughput:`, milestone `serving`; a paste may start there).
- *stopped*: a line printed only on SIGINT/SIGTERM (milestone `stopped`, events/logfacts.STOP_MARKERS): the
  API server's `Shutting down FastAPI HTTP server.` (launcher.py, reached only from its signal handler,
  0.6–0.21) or the `[shutdown] …` sequence (0.23+: `API server: shutdown triggered`, `EngineCore: trigger
  received signal=`), `Received KeyboardInterrupt, shutting down API servers` (several API servers), or a
  terminal's `^C` at the start of a line. uvicorn's `Shutting down` / `Application shutdown complete` are
  no such evidence: they end a crash-triggered exit too.
- *shutdown noise*: after the stop, anything; before it, only tracebacks whose exception is a stop's own
  (KeyboardInterrupt, SystemExit, CancelledError, EngineDeadError): Ctrl-C reaches every process of the
  group at once, and an engine core that exits first makes the API server log `EngineDeadError` before its
  own marker (PR #49034 describes the race). A real root cause before the stop (a CUDA error traceback,
  `EngineCore encountered a fatal error`, a fatal rule match) is a crash that the user then stopped.
"""
from __future__ import annotations

from dataclasses import dataclass

# exceptions a stop raises in vLLM's processes (engine core and worker signal handlers raise SystemExit;
# asyncio tasks are cancelled; the API server's output handler sees the engine gone)
SHUTDOWN_EXCEPTIONS = ("KeyboardInterrupt", "SystemExit", "CancelledError", "EngineDeadError")


@dataclass(frozen=True)
class Outcome:
    served: int = 0       # sequence number of the first line showing the server up (0: it never was)
    stopped: int = 0      # ... of the first stop-signal line after it (0: none)

    @property
    def label(self) -> str:
        if self.served and self.stopped:
            return "served, then stopped"
        return "served" if self.served else "did not serve"

    def is_shutdown(self, seq: int, exc_type: str | None = None) -> bool:
        """Whether something at `seq` (a traceback of `exc_type`) belongs to a stop after a served run."""
        if not (self.served and self.stopped) or seq <= self.served:
            return False
        return seq > self.stopped or shutdown_exception(exc_type)


def shutdown_exception(exc_type: str | None) -> bool:
    return bool(exc_type) and exc_type.rsplit(".", 1)[-1] in SHUTDOWN_EXCEPTIONS


def decide(first_seen: dict[str, int], stops: list[int]) -> Outcome:
    """`first_seen`: milestone -> its first line (events/logfacts); `stops`: the stop lines, in order."""
    served = min((first_seen[m] for m in ("server_ready", "serving") if first_seen.get(m)), default=0)
    if not served:
        return Outcome()
    return Outcome(served, next((s for s in stops if s > served), 0))
